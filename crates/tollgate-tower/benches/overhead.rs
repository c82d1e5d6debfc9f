//! The layer's cost per request: the same axum app called in-process through
//! `tower::ServiceExt::oneshot`, with and without the layer (memory backend).
//!
//! `cargo bench -p tollgate-tower --bench overhead`

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::middleware::StateInformationMiddleware;
use http::Request;
use tollgate_core::{Period, Rule, RuleSet};
use tollgate_limiter::Policy;
use tollgate_tower::{HeaderSet, Key, TollgateLayer, in_memory};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello" }))
}

fn layer(key: Key, limit: u64) -> TollgateLayer {
    layer_writing(key, limit, HeaderSet::All)
}

fn layer_writing(key: Key, limit: u64, headers: HeaderSet) -> TollgateLayer {
    let rules = RuleSet::new([Rule::fixed_window(limit, Period::HOUR)]).unwrap();
    TollgateLayer::builder(in_memory())
        .key(key)
        .default_policy(Policy::enforce("bench", rules))
        .headers(headers)
        .build()
        .unwrap()
}

/// A request from `peer`, its address where each layer reads it: Tollgate's `Key::peer_ip()`
/// from the `SocketAddr`, tower_governor's `PeerIpKeyExtractor` from axum's `ConnectInfo`.
fn request(peer: u32) -> Request<Body> {
    let mut req = Request::get("/hello").body(Body::empty()).unwrap();
    let addr = SocketAddr::from((Ipv4Addr::from(peer), 40000));
    req.extensions_mut().insert(addr);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// tower_governor's layer (the peer in the same run): keyed by peer IP, a quota every request
/// fits, with its `x-ratelimit-*` headers on (Tollgate's layer always writes its headers).
fn governor_layer(burst: u32) -> GovernorLayer<PeerIpKeyExtractor, StateInformationMiddleware, Body> {
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1))
        .burst_size(burst)
        .use_headers()
        .finish()
        .unwrap();
    GovernorLayer::new(config)
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("per_request");

    let plain = app();
    group.bench_function("no_layer", |b| {
        b.iter(|| rt.block_on(plain.clone().oneshot(request(0x0a00_0001))).unwrap())
    });

    // Admitted, one key: the check, headers on the response, the info in the extensions.
    let one_key = app().layer(layer(Key::peer_ip(), 1_000_000_000_000));
    group.bench_function("layer_admitted_one_key", |b| {
        b.iter(|| {
            let r = rt.block_on(one_key.clone().oneshot(request(0x0a00_0001))).unwrap();
            assert_eq!(r.status(), 200);
            r
        })
    });

    // The same, writing `X-RateLimit-*` only: the closest to tower_governor's `use_headers()`
    // (two `x-ratelimit-*` headers), for a comparison at equal work.
    let legacy = app().layer(layer_writing(Key::peer_ip(), 1_000_000_000_000, HeaderSet::Legacy));
    group.bench_function("layer_admitted_one_key_legacy_headers", |b| {
        b.iter(|| {
            let r = rt.block_on(legacy.clone().oneshot(request(0x0a00_0001))).unwrap();
            assert_eq!(r.status(), 200);
            r
        })
    });

    // Admitted, 10,000 keys in turn (a new state per key at first, then found).
    let many = app().layer(layer(Key::peer_ip(), 1_000_000_000_000));
    let next = AtomicU32::new(0);
    group.bench_function("layer_admitted_10k_keys", |b| {
        b.iter(|| {
            let peer = 0x0a00_0000 + next.fetch_add(1, Ordering::Relaxed) % 10_000;
            rt.block_on(many.clone().oneshot(request(peer))).unwrap()
        })
    });

    // The peer, the same two cases.
    let governed = app().layer(governor_layer(1_000_000_000));
    group.bench_function("tower_governor_admitted_one_key", |b| {
        b.iter(|| {
            let r = rt.block_on(governed.clone().oneshot(request(0x0a00_0001))).unwrap();
            assert_eq!(r.status(), 200);
            r
        })
    });
    let governed_many = app().layer(governor_layer(1_000_000_000));
    let next_peer = AtomicU32::new(0);
    group.bench_function("tower_governor_admitted_10k_keys", |b| {
        b.iter(|| {
            let peer = 0x0a00_0000 + next_peer.fetch_add(1, Ordering::Relaxed) % 10_000;
            rt.block_on(governed_many.clone().oneshot(request(peer))).unwrap()
        })
    });

    // Refused: the 429 with its problem+json body, the app never called.
    let refused = app().layer(layer(Key::peer_ip(), 1));
    rt.block_on(refused.clone().oneshot(request(0x0a00_0001))).unwrap();
    group.bench_function("layer_refused_429", |b| {
        b.iter(|| {
            let r = rt.block_on(refused.clone().oneshot(request(0x0a00_0001))).unwrap();
            assert_eq!(r.status(), 429);
            r
        })
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
