//! The OpenAPI document, generated from the handlers and types themselves so it cannot drift.

use utoipa::OpenApi;

use tollgate_http::Problem;

use crate::{admin, api, console, consumers, decision, explain, ops};

/// `POST /json`: Envoy's rate-limit request and answer as JSON (upstream's endpoint), 200 when
/// every descriptor is OK, 429 when one is over its limit. Served by `tollgate_envoy::json::router`,
/// which `tollgate serve` merges into this router ([`crate::router_with`]); described here so that
/// `/openapi.json` covers the whole service.
#[utoipa::path(post, path = "/json", request_body(content = Object, description = "Envoy's RateLimitRequest in protobuf's JSON mapping"), responses((status = 200, description = "Every descriptor OK: RateLimitResponse as JSON"), (status = 429, description = "A descriptor over its limit"), (status = 400, body = Problem, content_type = "application/problem+json")))]
#[allow(dead_code)] // documentation only
fn envoy_json() {}

/// `GET /healthcheck`: upstream's health check, `OK` (200) or 500. Served by
/// `tollgate_envoy::ops::router`, merged as `/json` is.
#[utoipa::path(get, path = "/healthcheck", responses((status = 200, description = "OK", content_type = "text/plain"), (status = 500, description = "The backend does not answer, or no Envoy configuration is loaded when one is required", content_type = "text/plain")))]
#[allow(dead_code)] // documentation only
fn envoy_healthcheck() {}

/// `GET /rlconfig`: the loaded Envoy configuration as upstream prints it, a line per limit.
/// Served by `tollgate_envoy::ops::router`.
#[utoipa::path(get, path = "/rlconfig", responses((status = 200, description = "A line per limit: `<domain>.<key_value>...: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false`", content_type = "text/plain")))]
#[allow(dead_code)] // documentation only
fn envoy_rlconfig() {}

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
        envoy_json,
        envoy_healthcheck,
        envoy_rlconfig,
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
        admin::policy_live
    ),
    components(schemas(
        api::CheckRequest,
        api::AcquireRequest,
        api::ReleaseRequest,
        api::ResetRequest,
        decision::DecisionBody,
        decision::RuleBody,
        explain::ExplainBody,
        Problem,
        ops::Health,
        ops::Info,
    ))
)]
pub struct ApiDoc;

/// The served document: the derived one, with what derivation cannot say ([`crate::contract`]).
pub fn document() -> serde_json::Value {
    crate::contract::complete(serde_json::to_value(ApiDoc::openapi()).unwrap_or_default())
}

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
        ("/healthcheck", &["get"]),
        ("/rlconfig", &["get"]),
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

    #[test]
    fn a_lists_limit_is_described_by_the_stores_bounds() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let expected = format!("1 to {}, default {}", tollgate_store::MAX_PAGE, tollgate_store::DEFAULT_PAGE);
        for path in ["/v1/admin/policies", "/v1/admin/tokens", "/v1/admin/audit"] {
            let params = doc["paths"][path]["get"]["parameters"].as_array().expect("parameters");
            let limit = params.iter().find(|p| p["name"] == "limit").expect("a limit parameter");
            assert_eq!(limit["description"], expected.as_str(), "{path}");
        }
    }
}
