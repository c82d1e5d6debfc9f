//! Operations routes: liveness, readiness, info, metrics and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_limiter::BreakerState;

use utoipa::ToSchema;

use crate::state::AppState;

/// `GET /healthz` and `GET /readyz` bodies.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable` when the backend does not answer.
    pub status: &'static str,
    /// The backend (`memory` or `redis`).
    pub backend: String,
}

/// `GET /v1/info` body.
#[derive(Debug, Serialize, ToSchema)]
pub struct Info {
    /// Whether rate limiting is in force (always true for a running server).
    pub enabled: bool,
    /// The primary backend: `memory` or `redis`.
    pub backend: String,
    /// The engine deciding inside Redis: `module` (the Tollgate Redis module) or `lua`;
    /// absent for the memory backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    /// Whether the primary backend answers right now.
    pub backend_available: bool,
    /// `closed` while the backend is used; `open` while it is bypassed after failures.
    pub breaker: &'static str,
    /// What is answered while the backend fails: `local`, `open` or `closed`.
    pub on_failure: &'static str,
    /// The server's version.
    pub version: &'static str,
    /// The policy database: `sqlite`, `postgres`, or absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<&'static str>,
    /// Names of the configuration file's policies. The database's are not named here: this
    /// route answers anyone, and stored policies belong to apps whose tokens alone may see them
    /// (`GET /v1/admin/policies`).
    pub policies: Vec<String>,
    /// How many of the database's policies are in force (enabled, and not shadowed by a file
    /// policy of the same name).
    pub stored_policies: usize,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
pub async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health { status: "ok", backend: state.limiter.backend_name().to_owned() })
}

/// The backend answers (503 when it does not, whatever the failure policy).
#[utoipa::path(get, path = "/readyz", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let backend = state.limiter.backend_name().to_owned();
    match state.limiter.ping().await {
        Ok(()) => (StatusCode::OK, Json(Health { status: "ok", backend })),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, Json(Health { status: "unavailable", backend })),
    }
}

/// What is running, and whether its backend answers. Anonymous: it names the file's policies
/// and counts the database's.
#[utoipa::path(get, path = "/v1/info", responses((status = 200, body = Info)))]
pub async fn info(State(state): State<AppState>) -> Json<Info> {
    let limiter = &state.limiter;
    let config = state.config();
    Json(Info {
        enabled: true,
        backend: limiter.backend_name().to_owned(),
        backend_available: limiter.ping().await.is_ok(),
        engine: limiter.backend_engine(),
        breaker: match limiter.breaker_state() {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
        },
        on_failure: limiter.failure_policy().as_str(),
        version: env!("CARGO_PKG_VERSION"),
        database: state.store.as_ref().map(|s| match s.driver() {
            tollgate_store::Driver::Sqlite => "sqlite",
            tollgate_store::Driver::Postgres => "postgres",
        }),
        policies: config.policies.iter().map(|(name, _)| name.to_owned()).collect(),
        stored_policies: state.stored.load().keys().filter(|n| config.policies.get(n).is_none()).count(),
    })
}

/// Gauge: reserved units this instance holds now (counted by the backend, not yet admitted),
/// read from the limiter at each scrape. With the admitted count, it bounds under-admission:
/// under overload a window admits at least its limit less the units held idle across instances.
pub const RESERVE_HELD: &str = "tollgate_reserve_held_units";

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    // A gauge of the present, not a count of events: set from the table as it is now.
    metrics::gauge!(RESERVE_HELD).set(state.limiter().reserve_stats().held as f64);
    let body = state.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
