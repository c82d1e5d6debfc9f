//! The JSON bodies of the HTTP decision API: `POST /v1/check`, `/v1/acquire`, `/v1/release`,
//! `/v1/reset` and `/json` (Envoy's request as JSON), through the real router over the memory
//! backend, with the built-in configuration's policies and an Envoy domain. Bad input is the
//! client's fault: the answer is never a 5xx (a panic in a handler becomes a 500 there).
//!
//! Input: `route\nbody`, route one of `check`, `acquire`, `release`, `reset`, `json`; without
//! a known route line the whole input is a `/v1/check` body.
#![no_main]

use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::http::{Request, header};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;
use tollgate_config::Config;
use tollgate_core::MemoryBackend;
use tollgate_envoy::{Domain, EnvoyService};
use tollgate_limiter::Limiter;
use tollgate_server::{AppState, router_with};
use tower::ServiceExt as _;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 100}
        shadow_mode: true
  - key: tenant
    value: acme
    rate_limits:
      - {unit: second, requests_per_unit: 30, unit_multiplier: 30, algorithm: sliding_window_counter}
      - {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 20}
"#;

static RUNTIME: LazyLock<Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap());
static CONFIG: LazyLock<Config> = LazyLock::new(Config::builtin);
static DOMAIN: LazyLock<Domain> = LazyLock::new(|| Domain::from_yaml(ENVOY, "edge.yaml").unwrap());

fn split(data: &[u8]) -> (&'static str, &[u8]) {
    const ROUTES: [(&str, &str); 5] = [
        ("check", "/v1/check"),
        ("acquire", "/v1/acquire"),
        ("release", "/v1/release"),
        ("reset", "/v1/reset"),
        ("json", "/json"),
    ];
    if let Some(nl) = data.iter().position(|&b| b == b'\n') {
        let (name, body) = (&data[..nl], &data[nl + 1..]);
        if let Some((_, path)) = ROUTES.iter().find(|(n, _)| n.as_bytes() == name) {
            return (path, body);
        }
    }
    ("/v1/check", data)
}

fuzz_target!(|data: &[u8]| {
    let (path, body) = split(data);
    // A fresh backend for every input, so that a crash replays alone.
    let config = CONFIG.clone();
    let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", config.limiter_settings());
    let envoy = EnvoyService::new(limiter.clone(), vec![DOMAIN.clone()]);
    let app = router_with(AppState::new(limiter, config), tollgate_envoy::json::router(envoy));
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .unwrap();
    let response = RUNTIME.block_on(app.oneshot(request)).unwrap();
    let status = response.status();
    assert!(!status.is_server_error(), "POST {path} {:?} answered {status}", String::from_utf8_lossy(body));
});
