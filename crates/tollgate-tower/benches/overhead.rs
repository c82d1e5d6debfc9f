//! The layer's cost per request: the same axum app called in-process through
//! `tower::ServiceExt::oneshot`, with and without the layer (memory backend).
//!
//! `cargo bench -p tollgate-tower --bench overhead`

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use tollgate_core::{Period, Rule, RuleSet};
use tollgate_limiter::Policy;
use tollgate_tower::{Key, TollgateLayer, in_memory};
use tower::ServiceExt;

fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello" }))
}

fn layer(key: Key, limit: u64) -> TollgateLayer {
    let rules = RuleSet::new([Rule::fixed_window(limit, Period::HOUR)]).unwrap();
    TollgateLayer::builder(in_memory())
        .key(key)
        .default_policy(Policy::enforce("bench", rules))
        .build()
        .unwrap()
}

fn request(peer: u32) -> Request<Body> {
    let mut req = Request::get("/hello").body(Body::empty()).unwrap();
    req.extensions_mut().insert(SocketAddr::from((Ipv4Addr::from(peer), 40000)));
    req
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

    // Admitted, 10,000 keys in turn (a new state per key at first, then found).
    let many = app().layer(layer(Key::peer_ip(), 1_000_000_000_000));
    let next = AtomicU32::new(0);
    group.bench_function("layer_admitted_10k_keys", |b| {
        b.iter(|| {
            let peer = 0x0a00_0000 + next.fetch_add(1, Ordering::Relaxed) % 10_000;
            rt.block_on(many.clone().oneshot(request(peer))).unwrap()
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
