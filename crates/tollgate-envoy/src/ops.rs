//! Upstream's operational endpoints, served on the HTTP port beside `POST /json` (the binary
//! merges this [`router`] into the server's): `GET /healthcheck` and `GET /rlconfig`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::EnvoyService;

/// What `/healthcheck` answers, as upstream's health checker decides it.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// Ask the backend at every check (upstream's `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`);
    /// otherwise only until it first answers, as upstream's Redis component turns healthy
    /// once its connection is made at startup and stays so.
    pub check_backend: bool,
    /// Unhealthy while no domain is loaded (upstream's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub needs_config: bool,
    /// Whether the backend has answered once.
    answered: Arc<AtomicBool>,
    /// Set on SIGTERM: unhealthy from then on (upstream's `sigterm` component).
    terminating: Arc<AtomicBool>,
}

impl Health {
    /// A health check with upstream's two options.
    pub fn new(check_backend: bool, needs_config: bool) -> Self {
        Health { check_backend, needs_config, answered: Arc::default(), terminating: Arc::default() }
    }

    /// Unhealthy from now on, as upstream's health turns on SIGTERM.
    pub fn terminate(&self) {
        self.terminating.store(true, Ordering::Release);
    }

    /// Whether `service` is healthy, as `/healthcheck` and the gRPC health service answer;
    /// the reason when it is not. Asks the backend when it must (bounded by the backend's own
    /// timeout, `[backend] timeout`).
    pub async fn check(&self, service: &EnvoyService) -> Result<(), &'static str> {
        if self.terminating.load(Ordering::Acquire) {
            return Err("shutting down");
        }
        if self.needs_config && !service.has_domains() {
            return Err("no rate limit configuration loaded");
        }
        if self.check_backend || !self.answered.load(Ordering::Acquire) {
            match service.limiter().ping().await {
                Ok(()) => self.answered.store(true, Ordering::Release),
                Err(e) => {
                    tracing::debug!(error = %e, "healthcheck: the backend does not answer");
                    return Err("the backend does not answer");
                }
            }
        }
        Ok(())
    }
}

/// `GET /healthcheck` and `GET /rlconfig` for `service`.
pub fn router(service: EnvoyService, health: Health) -> axum::Router {
    axum::Router::new()
        .route("/healthcheck", get(healthcheck))
        .with_state((service.clone(), health))
        .merge(axum::Router::new().route("/rlconfig", get(rlconfig)).with_state(service))
}

fn text(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// 200 `OK` when healthy, as upstream answers; 500 otherwise (upstream sends no body; this
/// says why).
async fn healthcheck(State((service, health)): State<(EnvoyService, Health)>) -> Response {
    match health.check(&service).await {
        Ok(()) => text(StatusCode::OK, "OK".into()),
        Err(why) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
    }
}

/// The loaded configuration as upstream's `/rlconfig` prints it (see
/// [`Domain::dump`](crate::Domain::dump)), domain by domain in name order.
async fn rlconfig(State(service): State<EnvoyService>) -> Response {
    text(StatusCode::OK, service.dump())
}
