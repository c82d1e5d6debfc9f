"""Load generator for the Python `limits` package on Redis, a contender of bench/compare.

One process. `--concurrency` workers each keep one `hit()` in flight on a key drawn at random
from `--keys` keys, with one of the package's own clients:

- ``coredis``: ``limits.aio`` with ``async+redis://`` storage (the package's default async
  implementation, coredis), ``--concurrency`` asyncio tasks;
- ``redispy``: ``limits.aio`` with ``implementation="redispy"`` (redis.asyncio, hiredis
  parser), ``--concurrency`` asyncio tasks;
- ``sync``: the synchronous ``limits`` API with ``redis://`` storage (redis-py, hiredis) and
  ``--concurrency`` threads sharing one storage (its connection pool).

``--uvloop`` runs the asyncio clients on uvloop's event loop.

Protocol with bench/compare: warm up for ``--warmup`` seconds, print ``{"phase":"warm"}`` on
stdout, wait for a line on stdin (the driver resets Redis's statistics meanwhile), run the
measured phase for ``--duration`` seconds, print one JSON line with counts and latencies, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import platform
import sys
import threading
import time

import limits
import limits.aio.storage
import limits.aio.strategies
import limits.storage
import limits.strategies

STRATEGIES = {
    "fixed_window": "FixedWindowRateLimiter",
    "sliding_window_counter": "SlidingWindowCounterRateLimiter",
    "moving_window": "MovingWindowRateLimiter",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379")
    parser.add_argument("--algorithm", choices=sorted(STRATEGIES), default="fixed_window")
    parser.add_argument("--client", choices=["coredis", "redispy", "sync"], default="coredis")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--period", type=int, default=1, help="seconds")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--no-handshake", action="store_true")
    return parser.parse_args()


class Phase:
    """Counts and latencies (microseconds) of one phase."""

    def __init__(self) -> None:
        self.allowed = 0
        self.denied = 0
        self.errors = 0
        self.first_error: str | None = None
        self.latencies: list[int] = []
        self.seconds = 0.0

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = repr(exc)


def key_stream(seed: int, keys: int):
    """xorshift32 per worker: a cheap, well-spread key choice."""
    state = (seed * 2654435761) & 0xFFFFFFFF or 1
    while True:
        state ^= (state << 13) & 0xFFFFFFFF
        state ^= state >> 17
        state ^= (state << 5) & 0xFFFFFFFF
        yield f"k{state % keys}"


async def async_phase(limiter, item, args, seconds: float) -> Phase:
    phase = Phase()
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    record = phase.latencies.append

    async def worker(seed: int) -> None:
        keys = key_stream(seed, args.keys)
        while clock() < deadline:
            key = next(keys)
            sent = clock()
            try:
                if await limiter.hit(item, key):
                    phase.allowed += 1
                else:
                    phase.denied += 1
            except Exception as exc:  # noqa: BLE001 - counted, like the other contenders
                phase.error(exc)
            record((clock() - sent) // 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i + 1) for i in range(args.concurrency)))
    phase.seconds = time.perf_counter() - start
    return phase


def sync_phase(limiter, item, args, seconds: float) -> Phase:
    phase = Phase()
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    lock = threading.Lock()

    def worker(seed: int) -> None:
        keys = key_stream(seed, args.keys)
        allowed = denied = 0
        latencies: list[int] = []
        while clock() < deadline:
            key = next(keys)
            sent = clock()
            try:
                if limiter.hit(item, key):
                    allowed += 1
                else:
                    denied += 1
            except Exception as exc:  # noqa: BLE001
                with lock:
                    phase.error(exc)
            latencies.append((clock() - sent) // 1000)
        with lock:
            phase.allowed += allowed
            phase.denied += denied
            phase.latencies.extend(latencies)

    threads = [threading.Thread(target=worker, args=(i + 1,)) for i in range(args.concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase.seconds = time.perf_counter() - start
    return phase


def wait_for_go(args) -> None:
    if not args.no_handshake:
        sys.stdout.write('{"phase":"warm"}\n')
        sys.stdout.flush()
        sys.stdin.readline()


def report(args, phase: Phase, client: str) -> None:
    latencies = sorted(phase.latencies)

    def quantile(q: float) -> int:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0

    decisions = phase.allowed + phase.denied
    versions = {"python": platform.python_version()}
    for package in ("limits", "coredis", "redis", "hiredis", "uvloop"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    result = {
        "contender": "limits",
        "client": client,
        "seconds": phase.seconds,
        "decisions": decisions,
        "decisions_per_second": decisions / phase.seconds if phase.seconds else 0.0,
        "allowed": phase.allowed,
        "denied": phase.denied,
        "errors": phase.errors,
        "first_error": phase.first_error,
        "latency_us": {
            "p50": quantile(0.50),
            "p90": quantile(0.90),
            "p99": quantile(0.99),
            "max": latencies[-1] if latencies else 0,
        },
        "versions": versions,
    }
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


async def run_async(args) -> None:
    url = "async+" + args.url
    if args.client == "redispy":
        storage = limits.aio.storage.RedisStorage(url, implementation="redispy")
        client = "limits.aio, redis.asyncio (hiredis)"
    else:
        storage = limits.aio.storage.RedisStorage(url)
        client = "limits.aio, coredis"
    client += f", {args.concurrency} asyncio tasks"
    if args.uvloop:
        client += ", uvloop"
    limiter = getattr(limits.aio.strategies, STRATEGIES[args.algorithm])(storage)
    item = limits.RateLimitItemPerSecond(args.limit, args.period)
    await async_phase(limiter, item, args, args.warmup)
    if not args.no_handshake:
        await asyncio.get_running_loop().run_in_executor(None, wait_for_go, args)
    phase = await async_phase(limiter, item, args, args.duration)
    report(args, phase, client)


def run_sync(args) -> None:
    storage = limits.storage.RedisStorage(args.url, max_connections=max(args.concurrency, 1))
    limiter = getattr(limits.strategies, STRATEGIES[args.algorithm])(storage)
    item = limits.RateLimitItemPerSecond(args.limit, args.period)
    sync_phase(limiter, item, args, args.warmup)
    wait_for_go(args)
    phase = sync_phase(limiter, item, args, args.duration)
    report(args, phase, f"limits (sync), redis-py (hiredis), {args.concurrency} threads")


def main() -> None:
    args = parse_args()
    if args.client == "sync":
        run_sync(args)
    elif args.uvloop:
        import uvloop

        uvloop.run(run_async(args))
    else:
        asyncio.run(run_async(args))


if __name__ == "__main__":
    main()
