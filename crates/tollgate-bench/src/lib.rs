//! `tollgate bench`: a load generator users point at their own Redis, Tollgate server or
//! Envoy-protocol service, reporting decisions per second, admitted and denied, latency
//! percentiles, and (against Redis) microseconds of Redis CPU per decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::RedisBackend;

/// The algorithm the load is decided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchAlgorithm {
    /// Clock-aligned fixed window.
    FixedWindow,
    /// Exact sliding window (a log).
    SlidingWindowLog,
    /// Weighted two-window approximation.
    SlidingWindowCounter,
    /// Token bucket (capacity = limit, refilled at limit per period).
    TokenBucket,
    /// GCRA (limit per period, burst = limit).
    Gcra,
}

/// `tollgate bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to load: redis://host:port (Tollgate's Redis client path, in this process),
    /// http://host:port (a `tollgate serve`'s POST /v1/check), or grpc://host:port (Envoy's
    /// ShouldRateLimit).
    #[arg(long, value_name = "URL")]
    target: String,
    /// The algorithm deciding each request.
    #[arg(long, value_enum, default_value = "gcra")]
    algorithm: BenchAlgorithm,
    /// Requests each key may make per period.
    #[arg(long, default_value_t = 1000)]
    limit: u64,
    /// The period (1ms .. 1y). The grpc target needs a whole unit: 1s, 1m, 1h or 1d.
    #[arg(long, default_value = "1s")]
    period: Period,
    /// Size of the key space; each request picks a key at random.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Key churn: the key space slides steadily so that it is entirely new keys every DURATION
    /// (old keys go idle and expire), as users come and go. Off by default.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    churn: Option<Duration>,
    /// http target: check under this policy of the server's configuration instead of sending
    /// the rules (--algorithm, --limit, --period) with each request.
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Requests per second at most, spread evenly over the workers (a steady load whatever the
    /// machine's other work); as fast as answers come without it.
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<f64>,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Redis target: connections to open.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Redis target: most decisions per script call (1 = no coalescing).
    #[arg(long, default_value_t = 32)]
    coalesce: usize,
    /// Redis target: answer denials locally until they expire, as `tollgate serve` does by
    /// default (off here, so every decision reaches Redis unless asked).
    #[arg(long)]
    deny_cache: bool,
    /// Print the summary as JSON (for scripts) instead of a table.
    #[arg(long)]
    json: bool,
}

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct Summary {
    target: String,
    algorithm: BenchAlgorithm,
    keys: u64,
    /// Seconds in which the whole key space is replaced, with --churn.
    churn_seconds: Option<f64>,
    concurrency: usize,
    /// The requests per second asked for, with --rate.
    rate: Option<f64>,
    seconds: f64,
    decisions: u64,
    decisions_per_second: f64,
    allowed: u64,
    denied: u64,
    errors: u64,
    latency_us: Latency,
    /// Redis target only: microseconds of Redis CPU per decision (`INFO commandstats`).
    redis_cpu_us_per_decision: Option<f64>,
    /// Redis target only: script calls per decision (below 1 when coalesced).
    redis_calls_per_decision: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: u64,
    p90: u64,
    p99: u64,
    max: u64,
}

/// One way of asking for a decision.
#[derive(Clone)]
enum Client {
    Redis(Arc<RedisBackend>, RuleSet),
    /// The URL, and what each request names its rules by: `limits` (inline) or `policy`.
    Http(reqwest::Client, String, (&'static str, serde_json::Value)),
    Grpc(RateLimitServiceClient<tonic::transport::Channel>, RateLimitOverride),
}

impl Client {
    /// Decides one request for `key`: Ok(admitted).
    async fn decide(&mut self, key: &str) -> anyhow::Result<bool> {
        match self {
            Client::Redis(backend, rules) => Ok(backend.check(key, rules, 1).await?.allowed()),
            Client::Http(http, url, (field, rules)) => {
                let body = serde_json::json!({ "key": key, *field: rules });
                let response = http.post(url.as_str()).json(&body).send().await?;
                match response.status().as_u16() {
                    200 => Ok(true),
                    429 => Ok(false),
                    status => bail!("POST /v1/check answered {status}: {}", response.text().await?),
                }
            }
            Client::Grpc(client, limit) => {
                let descriptor = RateLimitDescriptor {
                    entries: vec![Entry { key: "bench_key".into(), value: key.into() }],
                    limit: Some(*limit),
                    ..Default::default()
                };
                let request = RateLimitRequest {
                    domain: "tollgate-bench".into(),
                    descriptors: vec![descriptor],
                    hits_addend: 1,
                };
                let response = client.should_rate_limit(request).await?.into_inner();
                Ok(response.overall_code() == Code::Ok)
            }
        }
    }
}

fn rule(args: &BenchArgs) -> Rule {
    let (limit, period) = (args.limit, args.period);
    match args.algorithm {
        BenchAlgorithm::FixedWindow => Rule::fixed_window(limit, period),
        BenchAlgorithm::SlidingWindowLog => Rule::sliding_window_log(limit, period),
        BenchAlgorithm::SlidingWindowCounter => Rule::sliding_window_counter(limit, period),
        BenchAlgorithm::TokenBucket => Rule::token_bucket(limit, limit, period),
        BenchAlgorithm::Gcra => Rule::gcra(limit, period, limit),
    }
}

/// `EVALSHA` + `EVAL` calls and microseconds so far, from `INFO commandstats`.
async fn script_stats(url: &str) -> anyhow::Result<(u64, f64)> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await?;
    let mut calls = 0;
    let mut usec = 0.0;
    for line in info.lines().filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:")) {
        for field in line.split(':').nth(1).unwrap_or("").split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                Some(("usec", v)) => usec += v.parse::<f64>().unwrap_or(0.0),
                _ => {}
            }
        }
    }
    Ok((calls, usec))
}

async fn client(args: &BenchArgs) -> anyhow::Result<Client> {
    let rules = RuleSet::new([rule(args)]).context("--limit / --period")?;
    let target = args.target.as_str();
    if ["redis://", "rediss://", "redis+cluster://", "rediss+cluster://"]
        .iter()
        .any(|s| target.starts_with(s))
    {
        let backend = RedisBackend::builder(target)
            .prefix("tollgate-bench")
            .connections(args.connections)
            .coalesce(args.coalesce)
            .deny_cache(args.deny_cache)
            .timeout(Duration::from_secs(5))
            .build()?;
        backend.ping().await.context("Redis does not answer")?;
        Ok(Client::Redis(Arc::new(backend), rules))
    } else if let Some(rest) = target.strip_prefix("http://") {
        let rules = match &args.policy {
            Some(policy) => ("policy", serde_json::Value::from(policy.as_str())),
            None => ("limits", serde_json::to_value(rules.rules().collect::<Vec<_>>())?),
        };
        let url = format!("http://{}/v1/check", rest.trim_end_matches('/'));
        Ok(Client::Http(reqwest::Client::new(), url, rules))
    } else if let Some(rest) = target.strip_prefix("grpc://") {
        let unit = match args.period.as_micros() {
            1_000_000 => Unit::Second,
            60_000_000 => Unit::Minute,
            3_600_000_000 => Unit::Hour,
            86_400_000_000 => Unit::Day,
            _ => {
                bail!("the grpc target limits by the request's own limit, a fixed window of 1s, 1m, 1h or 1d")
            }
        };
        if args.algorithm != BenchAlgorithm::FixedWindow {
            bail!(
                "the grpc target limits by the request's own limit, which is a fixed window: use --algorithm fixed-window"
            );
        }
        let requests_per_unit = u32::try_from(args.limit).context("--limit too large for the grpc target")?;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{rest}"))?.connect().await?;
        Ok(Client::Grpc(
            RateLimitServiceClient::new(channel),
            RateLimitOverride { requests_per_unit, unit: unit as i32 },
        ))
    } else {
        bail!("--target must start with redis://, rediss://, http:// or grpc://")
    }
}

/// Latencies from 1 us to 60 s, to 3 significant figures (longer ones count as 60 s).
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Counters the workers share with the progress bar.
#[derive(Default)]
struct Counts {
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

/// Runs the load and prints the summary.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.keys == 0 || args.concurrency == 0 {
        bail!("--keys and --concurrency must be above 0");
    }
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a number of requests per second above 0");
    }
    if args.churn.is_some_and(|c| c.is_zero()) {
        bail!("--churn must be above 0");
    }
    if args.policy.is_some() && !args.target.starts_with("http://") {
        bail!("--policy names a policy of a server's configuration: it needs an http:// target");
    }
    let summary = measure(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary);
    }
    Ok(())
}

/// The run itself (also used by tests).
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Summary> {
    let client = client(args).await?;
    // Redis CPU is read from one server's INFO, so not on a cluster.
    let redis_url = (matches!(client, Client::Redis(..)) && !args.target.contains("+cluster://"))
        .then(|| args.target.clone());
    let before = match &redis_url {
        Some(url) => Some(script_stats(url).await?),
        None => None,
    };
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut workers = Vec::with_capacity(args.concurrency);
    for worker in 0..args.concurrency {
        let (mut client, counts, keys, churn) = (client.clone(), counts.clone(), args.keys, args.churn);
        // With --rate, each worker sends one request every `pace`, the workers staggered.
        let pace = args.rate.map(|rate| Duration::from_secs_f64(args.concurrency as f64 / rate));
        let mut next =
            start + pace.map_or(Duration::ZERO, |p| p.mul_f64(worker as f64 / args.concurrency as f64));
        workers.push(tokio::spawn(async move {
            let mut histogram = histogram();
            // xorshift64*: a cheap, well-spread key choice per worker.
            let mut state =
                0x9E37_79B9_7F4A_7C15u64 ^ (worker as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
            while Instant::now() < deadline {
                if let Some(pace) = pace {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
                    if Instant::now() >= deadline {
                        break;
                    }
                    // Behind (answers came slowly): go on from now rather than catch up in a burst.
                    next = (next + pace).max(Instant::now());
                }
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let sent = Instant::now();
                // With churn, the window of keys slides by `keys` every `churn`.
                let offset = churn.map_or(0, |churn| {
                    (sent.duration_since(start).as_secs_f64() / churn.as_secs_f64() * keys as f64) as u64
                });
                let key = format!("k{}", offset + state.wrapping_mul(0x2545_F491_4F6C_DD1D) % keys);
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
        }));
    }
    let bar =
        if args.json { ProgressBar::hidden() } else { ProgressBar::new(args.duration.as_millis() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {elapsed}/{duration} {msg}")
            .expect("a valid progress template"),
    );
    while start.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(200).min(args.duration)).await;
        let done = counts.allowed.load(Ordering::Relaxed) + counts.denied.load(Ordering::Relaxed);
        bar.set_position(start.elapsed().as_millis() as u64);
        bar.set_message(format!("{:.0} decisions/s", done as f64 / start.elapsed().as_secs_f64()));
    }
    let mut latency = histogram();
    for worker in workers {
        latency.add(worker.await?).context("merging latency histograms")?;
    }
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let (allowed, denied, errors) = (
        counts.allowed.load(Ordering::Relaxed),
        counts.denied.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
    );
    let decisions = allowed + denied;
    let (mut cpu, mut calls) = (None, None);
    if let (Some(url), Some((calls_before, usec_before))) = (&redis_url, before) {
        let (calls_after, usec_after) = script_stats(url).await?;
        if decisions > 0 {
            cpu = Some((usec_after - usec_before) / decisions as f64);
            calls = Some((calls_after - calls_before) as f64 / decisions as f64);
        }
    }
    Ok(Summary {
        target: args.target.clone(),
        algorithm: args.algorithm,
        keys: args.keys,
        churn_seconds: args.churn.map(|c| c.as_secs_f64()),
        concurrency: args.concurrency,
        rate: args.rate,
        seconds,
        decisions,
        decisions_per_second: decisions as f64 / seconds,
        allowed,
        denied,
        errors,
        latency_us: Latency {
            p50: latency.value_at_quantile(0.50),
            p90: latency.value_at_quantile(0.90),
            p99: latency.value_at_quantile(0.99),
            max: latency.max(),
        },
        redis_cpu_us_per_decision: cpu,
        redis_calls_per_decision: calls,
    })
}

fn print_table(s: &Summary) {
    let row = |name: &str, value: String| println!("{name:<28} {value}");
    row("target", s.target.clone());
    row("algorithm", format!("{:?}", s.algorithm));
    row("keys / concurrency", format!("{} / {}", s.keys, s.concurrency));
    if let Some(churn) = s.churn_seconds {
        row("key churn", format!("a new key space every {churn:.0} s"));
    }
    row("decisions/s", format!("{:.0} ({} in {:.1} s)", s.decisions_per_second, s.decisions, s.seconds));
    row("allowed / denied / errors", format!("{} / {} / {}", s.allowed, s.denied, s.errors));
    let l = &s.latency_us;
    row("latency p50 / p90 / p99 / max", format!("{} / {} / {} / {} us", l.p50, l.p90, l.p99, l.max));
    if let (Some(cpu), Some(calls)) = (s.redis_cpu_us_per_decision, s.redis_calls_per_decision) {
        row("Redis CPU per decision", format!("{cpu:.2} us ({calls:.3} script calls per decision)"));
    }
}
