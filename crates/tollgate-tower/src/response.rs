//! The answers the layer gives itself: RFC 9457 problems over HTTP, statuses under gRPC, and
//! CORS headers so a browser app can read them.

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
pub(crate) use tollgate_http::Problem;
use tollgate_http::headers::RATE_LIMIT_HEADERS;
use tollgate_http::problem::PROBLEM_JSON;

use crate::ResponseBody;

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

/// 400 or 401: the layer cannot read the request's key (by the key's [`Rejection`](crate::Rejection)).
pub(crate) fn key_refused(status: StatusCode, detail: String) -> Problem {
    if status == StatusCode::UNAUTHORIZED {
        Problem::unauthorized(detail)
    } else {
        Problem::new(status, "invalid-request", "Invalid request", detail)
    }
}

/// 500: a layer whose policy the limiter refuses (a bug in the app's setup, not the client's).
pub(crate) fn misconfigured() -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        "the rate limiter is misconfigured; see the service's logs",
    )
}

/// 503: the backend failed under a closed failure policy. `Retry-After`, if any, is the
/// decision's, among the headers [`answer`] is given.
pub(crate) fn backend_unavailable(detail: String) -> Problem {
    Problem { retry_after: None, ..Problem::unavailable(detail) }
}

/// The answer to a request the layer refuses: problem+json, or under gRPC a trailers-only
/// response (HTTP 200, the status in `grpc-status` and `grpc-message`). `headers` (rate-limit
/// headers, `Retry-After`) go on either; gRPC carries them as metadata.
pub(crate) fn answer<B>(problem: Problem, grpc: bool, headers: HeaderMap) -> Response<ResponseBody<B>> {
    let mut response = if grpc {
        let mut r = Response::new(ResponseBody::full(bytes::Bytes::new()));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from(u16::from(problem.grpc_code())));
        if let Ok(message) = HeaderValue::try_from(grpc_message(&problem.detail)) {
            h.insert("grpc-message", message);
        }
        r
    } else {
        let mut r = Response::new(ResponseBody::full(problem.to_json()));
        *r.status_mut() = problem.status_code();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        r
    };
    response.headers_mut().extend(headers);
    response
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
