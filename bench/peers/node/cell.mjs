// Load generator for redis-cell's CL.THROTTLE (GCRA in a Redis module) on ioredis, the module
// contender of bench/compare. The same shape as rlf.mjs, so that the two Node clients differ only
// in the request they send: one process, one event loop, one ioredis connection
// (`enableOfflineQueue: false`); `--concurrency` async loops each keep one CL.THROTTLE in flight
// on a key drawn at random from `--keys` keys.
//
// The limit is Tollgate's `Rule::gcra(limit, period, burst = limit)` (what `tollgate bench
// --algorithm gcra` and, equivalently, `token-bucket` decide by): `limit` requests at once from
// an idle key, then one every period / limit. CL.THROTTLE admits `max_burst + 1` at once and
// refills `count` per `period` seconds, so max_burst = limit - 1 and count = limit. bench/compare
// checks that mapping before it measures (a burst and a refill on one key, against both).
//
// Protocol with bench/compare: warm up for --warmup seconds, print {"phase":"warm"} on stdout,
// wait for a line on stdin (the driver resets Redis's statistics meanwhile), run the measured
// phase for --duration seconds, print one JSON line with the counts and latencies, exit.
//
// Usage: node cell.mjs --url redis://127.0.0.1:PORT --limit 1000 --period 1 --keys 10000
//          --concurrency 10 --duration 10 --warmup 2 [--auto-pipelining] [--no-handshake]

import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const Redis = require('ioredis');

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string', default: 'redis://127.0.0.1:6379' },
    limit: { type: 'string', default: '1000' },
    period: { type: 'string', default: '1' }, // seconds (whole: CL.THROTTLE's unit)
    keys: { type: 'string', default: '10000' },
    concurrency: { type: 'string', default: '10' },
    duration: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '2' },
    'auto-pipelining': { type: 'boolean', default: false },
    'no-handshake': { type: 'boolean', default: false },
  },
});
const limit = Number(opts.limit);
const period = Number(opts.period);
const keys = Number(opts.keys);
const concurrency = Number(opts.concurrency);
if (!Number.isInteger(period) || period < 1) {
  throw new Error('--period must be a whole number of seconds (CL.THROTTLE period)');
}
if (!Number.isInteger(limit) || limit < 1) {
  throw new Error('--limit must be a whole number above 0');
}
// Burst and rate as strings once: every command sends the same four arguments after the key.
const maxBurst = String(limit - 1);
const countPerPeriod = String(limit);
const periodSeconds = String(period);

const redis = new Redis(opts.url, {
  enableOfflineQueue: false,
  enableAutoPipelining: opts['auto-pipelining'],
});
await new Promise((resolve, reject) => {
  redis.once('ready', resolve);
  redis.once('error', reject);
});

// One phase: `concurrency` loops until the deadline; latencies in microseconds.
async function phase(seconds) {
  const counts = { allowed: 0, denied: 0, errors: 0 };
  const latencies = [];
  const deadline = performance.now() + seconds * 1000;
  let firstError = null;
  async function worker(seed) {
    // xorshift32 per worker, as rlf.mjs: a cheap, well-spread key choice.
    let state = (seed * 2654435761) >>> 0 || 1;
    while (performance.now() < deadline) {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      state >>>= 0;
      const key = `cell-bench:k${state % keys}`;
      const sent = performance.now();
      try {
        // Reply: [limited (0 or 1), limit, remaining, retry after s, reset after s].
        const reply = await redis.call('cl.throttle', key, maxBurst, countPerPeriod, periodSeconds, '1');
        if (reply[0] === 0) {
          counts.allowed++;
        } else {
          counts.denied++;
        }
      } catch (error) {
        counts.errors++;
        firstError ??= String(error);
      }
      latencies.push((performance.now() - sent) * 1000);
    }
  }
  const start = performance.now();
  await Promise.all(Array.from({ length: concurrency }, (_, i) => worker(i + 1)));
  const elapsed = (performance.now() - start) / 1000;
  return { counts, latencies, seconds: elapsed, firstError };
}

function quantile(sorted, q) {
  if (sorted.length === 0) return 0;
  return Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]);
}

await phase(Number(opts.warmup));
if (!opts['no-handshake']) {
  process.stdout.write('{"phase":"warm"}\n');
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once('line', resolve));
  lines.close();
}
const { counts, latencies, seconds, firstError } = await phase(Number(opts.duration));
const sorted = Float64Array.from(latencies).sort();
const decisions = counts.allowed + counts.denied;
process.stdout.write(
  JSON.stringify({
    contender: 'redis-cell',
    client: `ioredis, one connection, enableOfflineQueue false, autopipelining ${opts['auto-pipelining'] ? 'on' : 'off'}; CL.THROTTLE key ${maxBurst} ${countPerPeriod} ${periodSeconds} 1`,
    seconds,
    decisions,
    decisions_per_second: decisions / seconds,
    ...counts,
    first_error: firstError,
    latency_us: {
      p50: quantile(sorted, 0.5),
      p90: quantile(sorted, 0.9),
      p99: quantile(sorted, 0.99),
      max: Math.round(sorted[sorted.length - 1] ?? 0),
    },
    versions: {
      node: process.versions.node,
      ioredis: require('ioredis/package.json').version,
    },
  }) + '\n',
);
redis.disconnect();
