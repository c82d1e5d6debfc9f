//! The answers the layer gives itself: RFC 9457 problems over HTTP, statuses under gRPC, and
//! CORS headers so a browser app can read them.

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::ResponseBody;
use crate::headers::RATE_LIMIT_HEADERS;

const API_DOCS: &str = "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#";

/// Which origins a layer's own answers (429, and its 400, 401 and 503) allow to read them.
/// Without it, a browser hides a 429 from the page's script behind a CORS error, because the
/// app's CORS layer (inside this one) never saw the request.
#[derive(Clone, Debug)]
pub struct Cors {
    origin: Origin,
    credentials: bool,
}

#[derive(Clone, Debug)]
enum Origin {
    Any,
    Mirror,
    Exact(HeaderValue),
}

impl Cors {
    /// `Access-Control-Allow-Origin: *`.
    pub fn any_origin() -> Self {
        Cors { origin: Origin::Any, credentials: false }
    }

    /// The request's own `Origin`, echoed (with `Vary: Origin`): for apps that already decide
    /// which origins to allow.
    pub fn mirror_origin() -> Self {
        Cors { origin: Origin::Mirror, credentials: false }
    }

    /// One origin, such as `https://app.example.com`.
    pub fn origin(origin: HeaderValue) -> Self {
        Cors { origin: Origin::Exact(origin), credentials: false }
    }

    /// Adds `Access-Control-Allow-Credentials: true` (not valid with
    /// [`any_origin`](Cors::any_origin), which browsers then refuse).
    pub fn allow_credentials(mut self) -> Self {
        self.credentials = true;
        self
    }

    pub(crate) fn apply(&self, headers: &mut HeaderMap, request_origin: Option<&HeaderValue>) {
        let origin = match &self.origin {
            Origin::Any => HeaderValue::from_static("*"),
            Origin::Exact(v) => v.clone(),
            Origin::Mirror => {
                headers.append(header::VARY, HeaderValue::from_static("origin"));
                match request_origin {
                    Some(o) => o.clone(),
                    None => return,
                }
            }
        };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(RATE_LIMIT_HEADERS));
        if self.credentials {
            headers.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
    }
}

/// An RFC 9457 problem.
#[derive(Debug, Serialize)]
pub(crate) struct Problem {
    #[serde(rename = "type")]
    kind: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
    /// The request part at fault, as the server's problems name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'static str>,
    #[serde(skip)]
    grpc_status: u8,
}

impl Problem {
    pub(crate) fn rate_limited(policy: &str, retry_after_secs: u64) -> Self {
        Problem {
            // The problem type's own entry, not the layer's README section: the same answer
            // comes from `tollgate proxy`, whose clients never saw the layer.
            kind: format!("{API_DOCS}rate-limited"),
            title: "Too many requests",
            status: 429,
            detail: format!("the rate limit of policy {policy:?} is reached; retry in {retry_after_secs} s"),
            policy: Some(policy.to_owned()),
            field: None,
            grpc_status: 8, // RESOURCE_EXHAUSTED
        }
    }

    /// A request path that is refused, or not canonical under `NonCanonicalPaths::Reject`.
    pub(crate) fn invalid_path(detail: String) -> Self {
        Problem {
            kind: format!("{API_DOCS}invalid-request"),
            title: "Invalid request",
            status: 400,
            detail,
            policy: None,
            field: Some("path"),
            grpc_status: 3, // INVALID_ARGUMENT
        }
    }

    pub(crate) fn key_refused(status: StatusCode, detail: String) -> Self {
        let (slug, title, grpc_status) = if status == StatusCode::UNAUTHORIZED {
            ("unauthorized", "Unauthorized", 16) // UNAUTHENTICATED
        } else {
            ("invalid-request", "Invalid request", 3) // INVALID_ARGUMENT
        };
        Problem {
            kind: format!("{API_DOCS}{slug}"),
            title,
            status: status.as_u16(),
            detail,
            policy: None,
            field: None,
            grpc_status,
        }
    }

    pub(crate) fn unavailable(detail: String) -> Self {
        Problem {
            kind: format!("{API_DOCS}backend-unavailable"),
            title: "Rate-limit backend unavailable",
            status: 503,
            detail,
            policy: None,
            field: None,
            grpc_status: 14, // UNAVAILABLE
        }
    }

    pub(crate) fn internal() -> Self {
        Problem {
            kind: format!("{API_DOCS}internal"),
            title: "Internal error",
            status: 500,
            detail: "the rate limiter is misconfigured; see the service's logs".into(),
            policy: None,
            field: None,
            grpc_status: 13, // INTERNAL
        }
    }

    /// The answer: problem+json, or under gRPC a trailers-only response (HTTP 200, the status in
    /// `grpc-status` and `grpc-message`). `headers` (rate-limit headers, `Retry-After`) go on
    /// either; gRPC carries them as metadata.
    pub(crate) fn into_response<B>(self, grpc: bool, headers: HeaderMap) -> Response<ResponseBody<B>> {
        let mut response = if grpc {
            let mut r = Response::new(ResponseBody::full(bytes::Bytes::new()));
            let h = r.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            h.insert("grpc-status", HeaderValue::from(u16::from(self.grpc_status)));
            if let Ok(message) = HeaderValue::try_from(grpc_message(&self.detail)) {
                h.insert("grpc-message", message);
            }
            r
        } else {
            let body = serde_json::to_vec(&self).unwrap_or_default();
            let mut r = Response::new(ResponseBody::full(body));
            *r.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            r
        };
        response.headers_mut().extend(headers);
        response
    }
}

/// gRPC's `grpc-message`: percent-encoded outside printable ASCII (and `%` itself).
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether the request is gRPC (`application/grpc`, `application/grpc+proto`, ...).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.get(..16).is_some_and(|p| p.eq_ignore_ascii_case("application/grpc")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("50% off \"x\" é"), "50%25 off \"x\" %C3%A9");
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
        assert!(is_grpc(&h));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_grpc(&h));
    }
}
