//! The load: `--concurrency` workers, each sending one request after another (or at its turn,
//! with `--rate`) for a key of its own random sequence, recording every latency; and the
//! progress bar while they run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_config::RedisTopology;

use crate::BenchArgs;
use crate::report::{RedisCost, ScriptStats, Summary, Tally, histogram};
use crate::target::Client;

/// Counters the workers share with the progress bar.
#[derive(Default)]
struct Counts {
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn tally(&self) -> Tally {
        Tally {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// The run itself (also used by tests).
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Summary> {
    let client = Client::connect(args).await?;
    // Redis CPU is read from one server's INFO, so not on a cluster (nor behind Sentinel).
    let stats_url =
        (RedisTopology::of_url(&args.target) == Ok(RedisTopology::Single)).then_some(&args.target);
    let before = match stats_url {
        Some(url) => Some(ScriptStats::read(url).await?),
        None => None,
    };
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|n| tokio::spawn(Worker::new(args, n, start).run(client.clone(), counts.clone())))
        .collect();
    let bar = progress(args, start, &counts).await;
    let mut latency = histogram();
    for worker in workers {
        latency.add(worker.await?).context("merging latency histograms")?;
    }
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let tally = counts.tally();
    let redis = match (stats_url, before) {
        (Some(url), Some(before)) => {
            RedisCost::between(before, ScriptStats::read(url).await?, tally.decisions())
        }
        _ => None,
    };
    Ok(Summary::new(args, seconds, tally, &latency, redis))
}

/// Shows decisions per second until the run's end (hidden with `--json`); the bar, to clear.
async fn progress(args: &BenchArgs, start: Instant, counts: &Counts) -> ProgressBar {
    let bar =
        if args.json { ProgressBar::hidden() } else { ProgressBar::new(args.duration.as_millis() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {elapsed}/{duration} {msg}")
            .expect("a valid progress template"),
    );
    while start.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(200).min(args.duration)).await;
        let done = counts.tally().decisions();
        bar.set_position(start.elapsed().as_millis() as u64);
        bar.set_message(format!("{:.0} decisions/s", done as f64 / start.elapsed().as_secs_f64()));
    }
    bar
}

/// One worker: its schedule and its keys.
struct Worker {
    start: Instant,
    deadline: Instant,
    /// With --rate, each worker sends one request every `pace`, the workers staggered.
    pace: Option<Duration>,
    /// With --rate, when the next request is due.
    next: Instant,
    keys: Keys,
}

impl Worker {
    /// Worker `n` of a run started at `start`.
    fn new(args: &BenchArgs, n: usize, start: Instant) -> Worker {
        let pace = args.rate.map(|rate| Duration::from_secs_f64(args.concurrency as f64 / rate));
        let stagger = pace.map_or(Duration::ZERO, |p| p.mul_f64(n as f64 / args.concurrency as f64));
        Worker {
            start,
            deadline: start + args.duration,
            pace,
            next: start + stagger,
            keys: Keys::new(n, args.keys, args.churn),
        }
    }

    /// Sends requests until the deadline; the latencies.
    async fn run(mut self, mut client: Client, counts: Arc<Counts>) -> Histogram<u64> {
        let mut histogram = histogram();
        while Instant::now() < self.deadline {
            if !self.wait_turn().await {
                break;
            }
            self.keys.step();
            let sent = Instant::now();
            let key = self.keys.at(sent.duration_since(self.start));
            let counter = match client.decide(&key).await {
                Ok(true) => &counts.allowed,
                Ok(false) => &counts.denied,
                Err(_) => &counts.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            histogram.saturating_record(sent.elapsed().as_micros() as u64);
            // Answers from the local denial cache never wait: let the other tasks run.
            tokio::task::yield_now().await;
        }
        histogram
    }

    /// With --rate, waits for this worker's next turn; false when the run ends first.
    async fn wait_turn(&mut self) -> bool {
        let Some(pace) = self.pace else {
            return true;
        };
        tokio::time::sleep_until(tokio::time::Instant::from_std(self.next)).await;
        if Instant::now() >= self.deadline {
            return false;
        }
        // Behind (answers came slowly): go on from now rather than catch up in a burst.
        self.next = (self.next + pace).max(Instant::now());
        true
    }
}

/// A worker's key choice: xorshift64*, cheap and well spread, over a key space that slides
/// with `--churn`.
struct Keys {
    state: u64,
    /// The size of the key space.
    keys: u64,
    churn: Option<Duration>,
}

impl Keys {
    fn new(worker: usize, keys: u64, churn: Option<Duration>) -> Keys {
        let state = 0x9E37_79B9_7F4A_7C15u64 ^ (worker as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
        Keys { state, keys, churn }
    }

    fn step(&mut self) {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
    }

    /// The key of the current step, `elapsed` into the run: with churn, the window of keys
    /// slides by `keys` every `churn`.
    fn at(&self, elapsed: Duration) -> String {
        let offset = self
            .churn
            .map_or(0, |churn| (elapsed.as_secs_f64() / churn.as_secs_f64() * self.keys as f64) as u64);
        format!("k{}", offset + self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) % self.keys)
    }
}
