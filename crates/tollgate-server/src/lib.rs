//! Tollgate's HTTP decision API over a [`tollgate_limiter::Limiter`]: the routes, the
//! rate-limit headers, RFC 9457 errors, Prometheus metrics and the OpenAPI document. Knows
//! nothing of Redis or Lua; the binary (`crates/tollgate`) picks the backend.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_config::Config;
//! use tollgate_core::MemoryBackend;
//! use tollgate_limiter::Limiter;
//! use tollgate_server::{AppState, router};
//!
//! let config = Config::builtin();
//! let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", config.limiter_settings());
//! let app: axum::Router = router(AppState::new(limiter, config));
//! ```
//!
//! Every module is private: the crate's surface is [`router`] (or [`router_with`], to serve
//! more routes, such as Envoy's `/json`, under the same limits and error answers), [`AppState`]
//! and [`prometheus`] (with [`per_thread`], the recorder layer it installs, and the [`Metrics`]
//! handle that renders the scrape).

mod admin;
mod api;
mod auth;
mod console;
mod consumers;
mod contract;
mod decision;
mod explain;
mod live;
mod openapi;
mod ops;
mod recorder;
mod state;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tollgate_http::Problem;
use tollgate_http::extract::MAX_BODY_BYTES;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

pub use recorder::{Metrics, PerThread, per_thread};
pub use state::{AppState, prometheus};

async fn not_found(uri: Uri) -> Problem {
    Problem::not_found(uri.path())
}

async fn method_not_allowed() -> Problem {
    Problem::method_not_allowed()
}

async fn openapi() -> impl IntoResponse {
    axum::Json(Opening::of(openapi::document()))
}

/// The document with `openapi` and `info` first, where readers look (a JSON map would sort
/// `components` first).
#[derive(serde::Serialize)]
struct Opening {
    openapi: serde_json::Value,
    info: serde_json::Value,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl Opening {
    fn of(document: serde_json::Value) -> Self {
        let mut rest = match document {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let openapi = rest.remove("openapi").unwrap_or_default();
        let info = rest.remove("info").unwrap_or_default();
        Opening { openapi, info, rest }
    }
}

/// The HTTP API's routes over `state`.
pub fn router(state: AppState) -> Router {
    router_with(state, Router::new())
}

/// The HTTP API's routes over `state`, and `more` routes (such as
/// `tollgate_envoy::json::router`): all under the body limit, the problem+json fallbacks, tracing
/// and the panic guard.
pub fn router_with(state: AppState, more: Router) -> Router {
    Router::new()
        .route("/v1/check", post(api::check))
        .route("/v1/acquire", post(api::acquire))
        .route("/v1/release", post(api::release))
        .route("/v1/reset", post(api::reset))
        .route("/v1/info", get(ops::info))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/admin/policies", get(admin::list_policies).post(admin::create_policy))
        .route(
            "/v1/admin/policies/{name}",
            get(admin::get_policy).put(admin::update_policy).delete(admin::delete_policy),
        )
        .route("/v1/admin/tokens", get(admin::list_tokens).post(admin::create_token))
        .route("/v1/admin/tokens/{name}", axum::routing::delete(admin::delete_token))
        .route("/v1/admin/audit", get(admin::audit))
        .route(
            "/v1/admin/consumers/{consumer}/limits",
            get(admin::list_consumer_limits).post(admin::create_consumer_limit),
        )
        .route(
            "/v1/admin/consumers/{consumer}/limits/{id}",
            axum::routing::put(admin::update_consumer_limit).delete(admin::delete_consumer_limit),
        )
        .route("/v1/consumers/{consumer}/call-limits", get(consumers::call_limits))
        .route("/v1/admin/me", get(console::me))
        .route("/v1/admin/live/policies/{name}", get(admin::policy_live))
        .route("/console", get(console::index))
        .route("/console/", get(console::index))
        .route("/console/assets/{file}", get(console::asset))
        .with_state(state)
        .merge(more)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .layer(CatchPanicLayer::custom(|_| Problem::internal().into_response()))
}
