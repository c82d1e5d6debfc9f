//! The OpenAPI document, generated from the handlers and types themselves so it cannot drift.

use utoipa::OpenApi;

use crate::{admin, api, console, consumers, live, ops, problem};

/// Tollgate's HTTP API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Rate-limit decisions over HTTP, and the management API (bearer tokens). Errors are RFC 9457 problem+json."
    ),
    paths(
        api::check,
        api::acquire,
        api::release,
        api::reset,
        ops::healthz,
        ops::readyz,
        ops::info,
        ops::metrics,
        ops::envoy_json,
        consumers::call_limits,
        admin::list_policies,
        admin::get_policy,
        admin::create_policy,
        admin::update_policy,
        admin::delete_policy,
        admin::list_tokens,
        admin::create_token,
        admin::delete_token,
        admin::audit,
        admin::list_consumer_limits,
        admin::create_consumer_limit,
        admin::update_consumer_limit,
        admin::delete_consumer_limit,
        console::me,
        live::policy_live
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route of [`crate::router`], with its methods; keep in step with it. Not the API,
    /// so not described: the console's page and assets (`/console`, `/console/`,
    /// `/console/assets/{file}`) and `/openapi.json` itself.
    const ROUTES: &[(&str, &[&str])] = &[
        ("/v1/check", &["post"]),
        ("/v1/acquire", &["post"]),
        ("/v1/release", &["post"]),
        ("/v1/reset", &["post"]),
        ("/v1/info", &["get"]),
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
        ("/metrics", &["get"]),
        ("/json", &["post"]),
        ("/v1/consumers/{consumer}/call-limits", &["get"]),
        ("/v1/admin/policies", &["get", "post"]),
        ("/v1/admin/policies/{name}", &["get", "put", "delete"]),
        ("/v1/admin/tokens", &["get", "post"]),
        ("/v1/admin/tokens/{name}", &["delete"]),
        ("/v1/admin/audit", &["get"]),
        ("/v1/admin/consumers/{consumer}/limits", &["get", "post"]),
        ("/v1/admin/consumers/{consumer}/limits/{id}", &["put", "delete"]),
        ("/v1/admin/me", &["get"]),
        ("/v1/admin/live/policies/{name}", &["get"]),
    ];

    #[test]
    fn every_route_is_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        for (path, methods) in ROUTES {
            for method in *methods {
                assert!(
                    doc["paths"][path][method].is_object(),
                    "{method} {path} is missing from /openapi.json"
                );
            }
        }
        let described = doc["paths"].as_object().unwrap().len();
        assert_eq!(described, ROUTES.len(), "a described path is not in ROUTES");
    }
}
