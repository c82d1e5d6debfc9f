//! The OpenAPI document, generated from the handlers and types themselves so it cannot drift.

use utoipa::OpenApi;

use crate::{api, ops, problem};

/// Tollgate's HTTP API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Rate-limit decisions over HTTP. Errors are RFC 9457 problem+json."
    ),
    paths(
        api::check,
        api::acquire,
        api::release,
        api::reset,
        ops::healthz,
        ops::readyz,
        ops::info,
        ops::metrics
    ),
    components(schemas(
        api::CheckRequest,
        api::AcquireRequest,
        api::ReleaseRequest,
        api::ResetRequest,
        api::DecisionBody,
        api::RuleBody,
        problem::Problem,
        ops::Health,
        ops::Info,
    ))
)]
pub struct ApiDoc;
