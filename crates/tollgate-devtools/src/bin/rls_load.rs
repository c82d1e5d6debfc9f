//! A small load client for the Envoy rate-limit service: `concurrency` tasks calling
//! `ShouldRateLimit` over one HTTP/2 connection each for `seconds`, each request one descriptor
//! `remote_address=<random of 10,000>` in domain `edge`; then the same load of the standard
//! gRPC health check through the same server, as the reference (the gRPC stack alone, no
//! decision). Prints calls/s and latency percentiles of both, and their ratios.
//!
//! `cargo run --release -p tollgate-devtools --bin rls_load -- http://127.0.0.1:8081 32 10`

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

struct Run {
    calls: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// `concurrency` tasks each calling `call` on its own connection until `seconds` have passed.
async fn run<F, Fut>(
    target: &str,
    concurrency: usize,
    seconds: u64,
    call: F,
) -> Result<Run, Box<dyn std::error::Error>>
where
    F: Fn(tonic::transport::Channel, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let channel = tonic::transport::Endpoint::from_shared(target.to_owned())?.connect().await?;
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = task as u64;
            while Instant::now() < deadline {
                i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let start = Instant::now();
                call(channel.clone(), i).await;
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
    Ok(Run { calls: all.len(), per_second: all.len() as f64 / seconds as f64, p50: at(0.5), p99: at(0.99) })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let target = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let concurrency: usize = args.get(2).map_or(Ok(32), |a| a.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(10), |a| a.parse())?;
    let decide = run(&target, concurrency, seconds, |channel, i| async move {
        let value = format!("10.0.{}.{}", (i >> 40) % 100, (i >> 20) % 100);
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "remote_address".into(), value }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        RateLimitServiceClient::new(channel).should_rate_limit(request).await.expect("ShouldRateLimit");
    })
    .await?;
    let health = run(&target, concurrency, seconds, |channel, _| async move {
        let mut client = tonic::client::Grpc::new(channel);
        client.ready().await.expect("ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        client.unary(tonic::Request::new(HealthCheckRequest::default()), path, codec).await.expect("Check");
    })
    .await?;
    println!("| call | calls/s | p50 | p99 |");
    println!("| --- | --- | --- | --- |");
    for (name, r) in [("ShouldRateLimit", &decide), ("Health/Check (reference)", &health)] {
        println!("| {name} | {:.0} | {:?} | {:?} |", r.per_second, r.p50, r.p99);
    }
    println!(
        "ShouldRateLimit / health: {:.2}x calls/s, p50 {:.2}x, p99 {:.2}x ({} and {} calls, concurrency {concurrency}, {seconds} s each)",
        decide.per_second / health.per_second,
        decide.p50.as_secs_f64() / health.p50.as_secs_f64(),
        decide.p99.as_secs_f64() / health.p99.as_secs_f64(),
        decide.calls,
        health.calls
    );
    Ok(())
}

/// `grpc.health.v1.HealthCheckRequest` (field 1: service), enough to call the health service
/// without another crate.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (field 1: status).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}
