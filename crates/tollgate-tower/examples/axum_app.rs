//! An axum app behind the Tollgate layer: copy it as a start.
//!
//! ```sh
//! cargo run -p tollgate-tower --example axum_app            # counters in this process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate-tower --example axum_app
//! curl -i localhost:3000/hello                              # x-ratelimit-* headers
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code} ' -X POST localhost:3000/login; done
//! # 200 200 200 200 200 429
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Extension;
use axum::routing::{get, post};
use http::Method;
use tollgate_core::Period;
use tollgate_limiter::{Limiter, LimiterSettings};
use tollgate_redis::RedisBackend;
use tollgate_tower::{Cors, Key, RateLimitInfo, Route, TollgateLayer, in_memory, requests_per_period};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Shared counters in Redis when there are several instances; else in this process.
    let limiter = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let redis = RedisBackend::builder(url).build()?;
            // On a Redis failure, each instance limits on its own (the default failure policy).
            Limiter::new(Arc::new(redis), "redis", LimiterSettings::default())
        }
        Err(_) => in_memory(),
    };

    let layer = TollgateLayer::builder(limiter)
        // API clients by their key; anonymous ones by address (IPv6 by /56). Behind a load
        // balancer, use Key::client_ip(TrustedProxies::parse(["10.0.0.0/8"])?) instead.
        .key(Key::header("x-api-key").or(Key::peer_ip()))
        .default_policy(requests_per_period(60, Period::MINUTE)?)
        .route(
            Route::limit("/login", requests_per_period(5, Period::MINUTE)?)
                .methods([Method::POST])
                .key(Key::peer_ip()),
        )
        .exempt("/healthz")
        // Let a browser app read the 429 and its Retry-After.
        .cors(Cors::any_origin())
        .build()?;

    let app = Router::new()
        .route("/hello", get(hello))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // The peer address reaches the layer through ConnectInfo.
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}

/// The layer tells the handler what it decided.
async fn hello(Extension(limit): Extension<RateLimitInfo>) -> String {
    format!("hello; {} left under {}\n", limit.verdict.decision.remaining(), limit.policy.name)
}
