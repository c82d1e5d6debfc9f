//! One way of asking for a decision per kind of target: Tollgate's Redis client in this
//! process, a server's `POST /v1/check`, or Envoy's `ShouldRateLimit`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_config::RedisTopology;
use tollgate_core::{Backend, Rule, RuleSet};
use tollgate_redis::RedisBackend;

use crate::{BenchAlgorithm, BenchArgs};

/// What each HTTP request names its rules by.
#[derive(Clone)]
pub(crate) enum HttpRules {
    /// `limits`: the rules themselves, inline.
    Inline(serde_json::Value),
    /// `policy`: a policy of the server's configuration.
    Policy(String),
}

/// One way of asking for a decision.
#[derive(Clone)]
pub(crate) enum Client {
    Redis(Arc<RedisBackend>, RuleSet),
    /// The `/v1/check` URL, and the rules each request names.
    Http(reqwest::Client, String, HttpRules),
    Grpc(RateLimitServiceClient<tonic::transport::Channel>, RateLimitOverride),
}

impl Client {
    /// A client for `args.target`, checked to answer (Redis) or to express the rules (gRPC).
    pub(crate) async fn connect(args: &BenchArgs) -> anyhow::Result<Client> {
        let rules = RuleSet::new([rule(args)]).context("--limit / --period")?;
        let target = args.target.as_str();
        // The Redis schemes are tollgate-config's to list (its error names them all).
        let not_redis = match RedisTopology::of_url(target) {
            Ok(_) => return redis(args, rules).await,
            Err(e) => e,
        };
        if let Some(rest) = target.strip_prefix("http://") {
            http(args, rest, &rules)
        } else if let Some(rest) = target.strip_prefix("grpc://") {
            grpc(args, rest).await
        } else {
            bail!("--target must start with http:// or grpc://, or be a Redis URL: {not_redis}")
        }
    }

    /// Decides one request for `key`: Ok(admitted).
    pub(crate) async fn decide(&mut self, key: &str) -> anyhow::Result<bool> {
        match self {
            Client::Redis(backend, rules) => Ok(backend.check(key, rules, 1).await?.allowed()),
            Client::Http(http, url, rules) => {
                let body = match rules {
                    HttpRules::Inline(limits) => serde_json::json!({ "key": key, "limits": limits }),
                    HttpRules::Policy(policy) => serde_json::json!({ "key": key, "policy": policy }),
                };
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

/// The rule of `--algorithm`, `--limit` and `--period`.
fn rule(args: &BenchArgs) -> Rule {
    let (limit, period) = (args.limit, args.period);
    match args.algorithm() {
        BenchAlgorithm::FixedWindow => Rule::fixed_window(limit, period),
        BenchAlgorithm::SlidingWindowLog => Rule::sliding_window_log(limit, period),
        BenchAlgorithm::SlidingWindowCounter => Rule::sliding_window_counter(limit, period),
        BenchAlgorithm::TokenBucket => Rule::token_bucket(limit, limit, period),
        BenchAlgorithm::Gcra => Rule::gcra(limit, period, limit),
    }
}

async fn redis(args: &BenchArgs, rules: RuleSet) -> anyhow::Result<Client> {
    let backend = RedisBackend::builder(&args.target)
        .prefix("tollgate-bench")
        .connections(args.connections)
        .coalesce(args.coalesce)
        .deny_cache(args.deny_cache)
        .engine(args.redis_engine)
        .timeout(Duration::from_secs(5))
        .build()?;
    backend.ping().await.context("Redis does not answer")?;
    if args.redis_engine == tollgate_redis::Engine::Module {
        backend.require_module().await.context("--redis-engine module")?;
    }
    Ok(Client::Redis(Arc::new(backend), rules))
}

fn http(args: &BenchArgs, host: &str, rules: &RuleSet) -> anyhow::Result<Client> {
    let rules = match &args.policy {
        Some(policy) => HttpRules::Policy(policy.clone()),
        None => HttpRules::Inline(serde_json::to_value(rules.rules().collect::<Vec<_>>())?),
    };
    let url = format!("http://{}/v1/check", host.trim_end_matches('/'));
    Ok(Client::Http(reqwest::Client::new(), url, rules))
}

/// The gRPC target limits by the request's own limit, which upstream's protocol writes as a
/// fixed window of a whole unit.
async fn grpc(args: &BenchArgs, host: &str) -> anyhow::Result<Client> {
    let unit = match args.period.as_micros() {
        1_000_000 => Unit::Second,
        60_000_000 => Unit::Minute,
        3_600_000_000 => Unit::Hour,
        86_400_000_000 => Unit::Day,
        _ => {
            bail!("the grpc target limits by the request's own limit, a fixed window of 1s, 1m, 1h or 1d")
        }
    };
    if args.algorithm() != BenchAlgorithm::FixedWindow {
        bail!(
            "the grpc target limits by the request's own limit, which is a fixed window: use --algorithm fixed_window"
        );
    }
    let requests_per_unit = u32::try_from(args.limit).context("--limit too large for the grpc target")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{host}"))?.connect().await?;
    Ok(Client::Grpc(
        RateLimitServiceClient::new(channel),
        RateLimitOverride { requests_per_unit, unit: unit as i32 },
    ))
}
