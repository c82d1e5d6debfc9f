//! [`Problem`]: errors as RFC 9457 `application/problem+json`, one type for every front end.

use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// Where the problem types are documented (`docs/api.md`, one heading per type).
const TYPE_BASE: &str = "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#";

/// An error answer (RFC 9457), as the server, the tower layer and the proxy give it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URI naming the kind of problem. Held as its anchor in docs/api.md (`rate-limited`),
    /// written as the whole URI.
    #[serde(rename = "type", serialize_with = "type_uri")]
    pub kind: &'static str,
    /// A short summary of the kind of problem.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What is wrong with this request.
    pub detail: String,
    /// For 429s: the policy whose limit is reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The request field at fault, as a path like `limits[0].period`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For 503s: seconds to wait before retrying.
    #[serde(skip)]
    pub retry_after: Option<u32>,
}

impl Problem {
    /// A problem of the type documented under `slug` in docs/api.md.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            kind: slug,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            policy: None,
            field: None,
            retry_after: None,
        }
    }

    /// 429: `policy`'s limit is reached (the tower layer's and the proxy's answer; the decision
    /// API answers 429 with its decision body instead).
    pub fn rate_limited(policy: &str, retry_after_secs: u64) -> Self {
        let mut p = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many requests",
            format!("the rate limit of policy {policy:?} is reached; retry in {retry_after_secs} s"),
        );
        p.policy = Some(policy.to_owned());
        p
    }

    /// 400: a field's value is not acceptable.
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        let mut p = Self::new(StatusCode::BAD_REQUEST, "invalid-request", "Invalid request", detail);
        p.field = Some(field.into());
        p
    }

    /// 400: inline rules whose state for one key could take more than the server's budget
    /// (`[server] max_request_state`); `field` is where the rules are (`limits`, or `limit` for
    /// an inline concurrency rule).
    pub fn state_too_large(field: impl Into<String>, footprint: u64, budget: u64) -> Self {
        let mut p = Self::new(
            StatusCode::BAD_REQUEST,
            "state-too-large",
            "Inline rules could store too much",
            format!(
                "these inline rules could store up to {footprint} bytes of state per key, above this \
                 server's budget of {budget} bytes ([server] max_request_state): sliding logs take \
                 about {} bytes per unit of limit and concurrency rules {} per lease; lower the \
                 limits, use sliding_window_counter or another constant-size algorithm, or name a \
                 configured policy",
                tollgate_core::footprint::LOG_ENTRY_BYTES,
                tollgate_core::footprint::LEASE_BYTES,
            ),
        );
        p.field = Some(field.into());
        p
    }

    /// 403: this server takes no inline rules (`[server] inline_limits = false`); `field` is
    /// where they were given.
    pub fn inline_limits_disabled(field: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::FORBIDDEN,
            "inline-limits-disabled",
            "Inline rules are disabled",
            "this server applies only its configured policies ([server] inline_limits = false): \
             name a policy instead of giving rules",
        );
        p.field = Some(field.into());
        p
    }

    /// 400: the body is not JSON at all.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed-body", "Malformed JSON body", detail)
    }

    /// 404: no policy of that name.
    pub fn unknown_policy(name: &str) -> Self {
        let mut p = Self::new(
            StatusCode::NOT_FOUND,
            "unknown-policy",
            "Unknown policy",
            format!("there is no policy named {name:?}"),
        );
        p.field = Some("policy".into());
        p
    }

    /// 404: no such route.
    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", format!("no route for {path}"))
    }

    /// 405: the route exists, the method does not.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this route does not accept that method; see /openapi.json",
        )
    }

    /// 413: the body is larger than allowed.
    pub fn too_large(max: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Body too large",
            format!("the request body is larger than {max} bytes"),
        )
    }

    /// 415: the body is not declared as JSON.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "send the body as JSON, with Content-Type: application/json",
        )
    }

    /// 503: the backend failed and the failure policy is `closed`.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend-unavailable",
            "Rate-limit backend unavailable",
            detail,
        );
        p.retry_after = Some(1);
        p
    }

    /// 401: no token, or an unknown one.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", detail)
    }

    /// 403: the token's role or apps do not allow this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// 404: not found in the management API (a policy, a token).
    pub fn no_such(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 409: the name is taken, or the item is read-only.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    /// 412: `If-Match` names a version that is no longer current.
    pub fn stale(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PRECONDITION_FAILED, "stale-version", "Stale version", detail)
    }

    /// 503: the policy database failed.
    pub fn database_unavailable(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unavailable",
            "Policy database unavailable",
            detail,
        );
        p.retry_after = Some(1);
        p
    }

    /// 500: a bug. Answered rather than dropping the connection.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "an internal error occurred",
        )
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The gRPC status code of the same meaning, for answers to gRPC requests.
    pub fn grpc_code(&self) -> u8 {
        match self.status {
            400 | 413 | 415 => 3, // INVALID_ARGUMENT
            401 => 16,            // UNAUTHENTICATED
            403 => 7,             // PERMISSION_DENIED
            404 => 5,             // NOT_FOUND
            409 | 412 => 9,       // FAILED_PRECONDITION
            429 => 8,             // RESOURCE_EXHAUSTED
            503 => 14,            // UNAVAILABLE
            408 => 4,             // DEADLINE_EXCEEDED
            _ => 13,              // INTERNAL
        }
    }

    /// The problem+json body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The answer: the status, `Content-Type: application/problem+json`, `Retry-After` when
    /// set, and the JSON body.
    pub fn into_http_response(self) -> http::Response<Vec<u8>> {
        let mut response = http::Response::new(self.to_json());
        *response.status_mut() = self.status_code();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

fn type_uri<S: serde::Serializer>(slug: &&'static str, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{TYPE_BASE}{slug}"))
}

/// The media type of a [`Problem`].
pub const PROBLEM_JSON: &str = "application/problem+json";

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        self.into_http_response().map(axum::body::Body::from)
    }
}
