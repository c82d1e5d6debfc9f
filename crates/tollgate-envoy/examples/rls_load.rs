//! A small load client for the Envoy rate-limit service: `concurrency` tasks calling
//! `ShouldRateLimit` over one HTTP/2 connection each for `seconds`, each request one descriptor
//! `remote_address=<random of 10,000>` in domain `edge`. Prints calls/s and latency percentiles.
//!
//! `cargo run --release -p tollgate-envoy --example rls_load -- http://127.0.0.1:8081 32 10`

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let target = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let concurrency: usize = args.get(2).map_or(Ok(32), |a| a.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(10), |a| a.parse())?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let mut client = RateLimitServiceClient::connect(target.clone()).await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = task as u64;
            while Instant::now() < deadline {
                i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let value = format!("10.0.{}.{}", (i >> 40) % 100, (i >> 20) % 100);
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry { key: "remote_address".into(), value }],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                };
                let start = Instant::now();
                client.should_rate_limit(request).await.expect("ShouldRateLimit");
                latencies.push(start.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    all.sort();
    let at = |p: f64| all[((all.len() as f64 - 1.0) * p) as usize];
    println!(
        "{} calls in {seconds} s at concurrency {concurrency}: {:.0} calls/s, p50 {:?}, p99 {:?}, max {:?}",
        all.len(),
        all.len() as f64 / seconds as f64,
        at(0.5),
        at(0.99),
        all[all.len() - 1]
    );
    Ok(())
}
