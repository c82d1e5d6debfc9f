//! Errors as RFC 9457 `application/problem+json`, and the JSON body extractor that turns every
//! malformed request into one, naming the offending field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

/// Where the problem types are documented (`docs/api.md`, one heading per type).
const TYPE_BASE: &str = "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#";

/// An error answer (RFC 9457).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of problem.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What is wrong with this request.
    pub detail: String,
    /// The request field at fault, as a path like `limits[0].period`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For 503s: seconds to wait before retrying.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl Problem {
    fn new(status: StatusCode, slug: &str, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("{TYPE_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            retry_after: None,
        }
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
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self.retry_after;
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A JSON body, deserialized with every error answered as a [`Problem`] naming its field.
pub struct ApiJson<T>(pub T);

/// The body limit, enforced by the router's `DefaultBodyLimit`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else { return false };
    let mime = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(Problem::unsupported_media_type());
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Problem::too_large(MAX_BODY_BYTES)
            } else {
                Problem::malformed(rejection.body_text())
            }
        })?;
        parse(&bytes).map(ApiJson)
    }
}

/// A path parameter, like axum's `Path`, whose rejections (such as percent-encoded bytes that
/// are not UTF-8) are problems rather than plain text.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| match rejection.status().is_server_error() {
                // A route declared without the parameters its handler reads: a bug.
                true => Problem::internal(),
                false => Problem::invalid("path", rejection.body_text()),
            })
    }
}

/// A query string, like axum's `Query`, whose rejections are problems naming the parameter.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| {
                let text = rejection.body_text();
                let detail = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
                // "limit: invalid digit found in string" names the parameter.
                let field = detail
                    .split_once(": ")
                    .map(|(name, _)| name)
                    .filter(|name| {
                        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
                    .unwrap_or("query");
                Problem::invalid(field, detail)
            })
    }
}

/// A JSON object read with no member name twice at any depth: `serde_json`'s `Map` and `Value`
/// silently keep the last of a repeated member, where the derived request types refuse it.
pub struct UniqueObject(pub serde_json::Map<String, serde_json::Value>);

struct UniqueValue(serde_json::Value);

impl<'de> serde::Deserialize<'de> for UniqueValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for UniqueObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match <UniqueValue as serde::Deserialize>::deserialize(d)?.0 {
            serde_json::Value::Object(map) => Ok(UniqueObject(map)),
            _ => Err(serde::de::Error::custom("the body must be a JSON object")),
        }
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = UniqueValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_str<E>(self, v: &str) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<UniqueValue, E> {
        Ok(UniqueValue(v.into()))
    }
    fn visit_unit<E>(self) -> Result<UniqueValue, E> {
        Ok(UniqueValue(serde_json::Value::Null))
    }
    fn visit_none<E>(self) -> Result<UniqueValue, E> {
        Ok(UniqueValue(serde_json::Value::Null))
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<UniqueValue, D::Error> {
        <UniqueValue as serde::Deserialize>::deserialize(d)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueValue, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(UniqueValue(items.into()))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueValue, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let UniqueValue(value) = map.next_value()?;
            if object.contains_key(&name) {
                return Err(serde::de::Error::custom(format_args!("duplicate field `{name}`")));
            }
            object.insert(name, value);
        }
        Ok(UniqueValue(object.into()))
    }
}

/// Deserializes `bytes`, naming the field of the first error.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    // serde's derived structs also read arrays, by position; a request is an object.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
        return Err(Problem::invalid("body", "the body must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.inner();
        if inner.is_syntax() || inner.is_eof() {
            return Problem::malformed(inner.to_string());
        }
        let path = e.path().to_string();
        let message = inner.to_string();
        let field = named_field(&message).map_or(path.clone(), |name| join(&path, name));
        // serde's messages end with " at line 1 column 42", which means nothing to an API client.
        let detail = message.split(" at line ").next().unwrap_or(&message).to_owned();
        Problem::invalid(if field == "." { "body".into() } else { field }, detail)
    })?;
    de.end().map_err(|e| Problem::malformed(e.to_string()))?;
    Ok(value)
}

/// The field a serde message is about when it names one (unknown or missing fields are reported
/// at their parent's path).
fn named_field(message: &str) -> Option<&str> {
    ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next())
}

fn join(path: &str, name: &str) -> String {
    // Unknown fields are reported at their own path, missing ones at their parent's.
    if path == "." {
        name.to_owned()
    } else if path == name || path.ends_with(&format!(".{name}")) {
        path.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Req {
        key: String,
        limits: Option<Vec<tollgate_core::Rule>>,
    }

    fn field(body: &str) -> Option<String> {
        parse::<Req>(body.as_bytes()).unwrap_err().field
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field(r#"{"key": 1}"#).as_deref(), Some("key"));
        assert_eq!(field(r#"{}"#).as_deref(), Some("key"));
        assert_eq!(field(r#"{"key": "k", "kye": 1}"#).as_deref(), Some("kye"));
        assert_eq!(
            field(r#"{"key": "k", "limits": [{"algorithm": "fixed_window", "limit": 1, "period": "soon"}]}"#)
                .as_deref(),
            Some("limits[0].period")
        );
        assert_eq!(
            field(r#"{"key": "k", "limits": [{"algorithm": "fixed_window", "limit": 1, "period": "1s", "x": 1}]}"#)
                .as_deref(),
            Some("limits[0].x")
        );
    }

    #[test]
    fn syntax_errors_and_trailing_bytes_are_malformed() {
        for body in [r#"{"key": "#, r#"{"key": "k"} x"#, "", "[]x"] {
            let p = parse::<Req>(body.as_bytes()).unwrap_err();
            assert_eq!(p.status, 400, "{body}");
        }
        assert!(parse::<Req>(br#"{"key": "k"} x"#).unwrap_err().kind.ends_with("malformed-body"));
    }
}
