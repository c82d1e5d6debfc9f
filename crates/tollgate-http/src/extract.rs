//! Request extractors for axum that answer every malformed request with a [`Problem`]
//! (RFC 9457) naming the offending field: JSON bodies, path parameters and query strings.

use std::borrow::Cow;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::Problem;

/// A JSON body, deserialized with every error answered as a [`Problem`] naming its field.
pub struct ApiJson<T>(pub T);

/// The JSON API's body limit (the server's and Envoy's `/json`), enforced by [`ApiJson`] and by
/// the router's `DefaultBodyLimit` for the other extractors.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else { return false };
    // Compared without case, in place: no lower-cased copy per request.
    let mime = value.split(';').next().unwrap_or("").trim().as_bytes();
    let (prefix, suffix) = (b"application/".as_slice(), b"+json".as_slice());
    mime.eq_ignore_ascii_case(b"application/json")
        || (mime.len() >= prefix.len() + suffix.len()
            && mime[..prefix.len()].eq_ignore_ascii_case(prefix)
            && mime[mime.len() - suffix.len()..].eq_ignore_ascii_case(suffix))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let JsonBody(bytes) = JsonBody::from_request(req, state).await?;
        parse(&bytes).map(ApiJson)
    }
}

/// A JSON body's bytes, checked as [`ApiJson`] checks them (content type, size), for a handler
/// that reads them with [`parse`] into a type borrowing from them.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = Problem;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Problem> {
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(Problem::unsupported_media_type());
        }
        read_body(req.into_body()).await.map(JsonBody)
    }
}

/// The body, refused past [`MAX_BODY_BYTES`]. A body that arrives in one piece (the usual JSON
/// request) is kept as it came: no boxed, limited wrapper and no list of pieces to join, which
/// axum's `Bytes` extractor makes for every request.
async fn read_body(mut body: Body) -> Result<Bytes, Problem> {
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        return Err(Problem::too_large(MAX_BODY_BYTES));
    }
    let mut whole = Bytes::new();
    let mut joined: Option<Vec<u8>> = None;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Problem::malformed(format!("Failed to buffer the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        let read = joined.as_ref().map_or(whole.len(), Vec::len);
        if read + data.len() > MAX_BODY_BYTES {
            return Err(Problem::too_large(MAX_BODY_BYTES));
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if whole.is_empty() => whole = data,
            None => {
                let mut both = Vec::with_capacity(whole.len() + data.len());
                both.extend_from_slice(&whole);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(whole, Bytes::from))
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

/// Reads an optional string field as text borrowed from the body, unless the JSON string has
/// escapes to undo: `#[serde(default, borrow, deserialize_with = "borrowed_text")]` on an
/// `Option<Cow<'a, str>>`. (serde borrows a `Cow<str>` field marked `borrow`, but copies one
/// inside an `Option` into a new `String` every time.)
pub fn borrowed_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Text<'de>>::deserialize(d)?.map(|text| text.0))
}

/// Deserializes `bytes`, naming the field of the first error.
///
/// A number with an integral value is an integer wherever one is expected, however it is
/// spelled (`2.0`, `2e3`): JSON does not tell them apart, nor does the JSON Schema of the
/// OpenAPI document, so clients generated from it may send either.
pub fn parse<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, Problem> {
    // serde's derived structs also read arrays, by position; a request is an object.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
        return Err(Problem::invalid("body", "the body must be a JSON object"));
    }
    // Read plainly first: tracking each field's path costs as much again, and only an error
    // needs it, so a request that fails is read a second time to name its field.
    let mut de = serde_json::Deserializer::from_slice(bytes);
    if let Ok(value) = T::deserialize(&mut de)
        && de.end().is_ok()
    {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(&mut de) {
        Ok(value) => {
            de.end().map_err(|e| Problem::malformed(e.to_string()))?;
            Ok(value)
        }
        // The rare retry, through a value whose integral floats became integers; the common
        // case pays nothing for it.
        Err(e) if e.inner().to_string().starts_with("invalid type: floating point") => {
            let mut value = serde_json::from_slice::<UniqueValue>(bytes).map_err(|_| field_problem(e))?.0;
            integral_floats_to_integers(&mut value);
            serde_path_to_error::deserialize(value).map_err(field_problem)
        }
        Err(e) => Err(field_problem(e)),
    }
}

/// The problem of a deserialization error, naming its field.
fn field_problem(e: serde_path_to_error::Error<serde_json::Error>) -> Problem {
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
}

/// Replaces, at any depth, each float with an integral value that an `f64` holds exactly
/// (within ±2^53) by that integer. A float zero stays a float (and is refused where an integer
/// is expected): `-0` and an underflow such as `1E-400` parse to it, and neither is a zero the
/// client meant to send.
fn integral_floats_to_integers(value: &mut serde_json::Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f != 0.0
                && f.fract() == 0.0
                && f.abs() <= EXACT
            {
                // In range and integral: the cast is exact.
                *value = if f >= 0.0 { (f as u64).into() } else { (f as i64).into() };
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        serde_json::Value::Object(members) => members.values_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
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

    fn in_pieces(pieces: &[&'static [u8]]) -> Body {
        let frames = pieces.iter().map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p)));
        Body::from_stream(tokio_stream::iter(frames.collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_piece_or_many_and_refused_past_the_limit() {
        assert_eq!(read_body(Body::from("{}")).await.unwrap(), "{}");
        assert_eq!(read_body(in_pieces(&[b"{\"key\"", b"", b":\"k\"}"])).await.unwrap(), r#"{"key":"k"}"#);
        assert_eq!(read_body(in_pieces(&[])).await.unwrap(), "");
        // Over the limit by its declared length, or only once the pieces add up.
        let big: &'static [u8] = Box::leak(vec![b' '; MAX_BODY_BYTES].into_boxed_slice());
        assert_eq!(read_body(Body::from(big)).await.unwrap().len(), MAX_BODY_BYTES);
        assert_eq!(read_body(Body::from([big, b"x"].concat())).await.unwrap_err().status, 413);
        assert_eq!(read_body(in_pieces(&[b"{", big])).await.unwrap_err().status, 413);
        assert_eq!(read_body(in_pieces(&[big, b"", b"x"])).await.unwrap_err().status, 413);
    }

    #[test]
    fn text_is_borrowed_from_the_body_unless_it_has_escapes() {
        #[derive(Deserialize)]
        struct Asked<'a> {
            #[serde(default, borrow, deserialize_with = "borrowed_text")]
            key: Option<Cow<'a, str>>,
        }
        let body = br#"{"key":"user-1"}"#;
        let asked: Asked<'_> = parse(body).unwrap();
        assert!(matches!(asked.key, Some(Cow::Borrowed("user-1"))));
        let asked: Asked<'_> = parse(br#"{"key":"us\u0065r-\"1\""}"#).unwrap();
        assert!(matches!(asked.key, Some(Cow::Owned(ref k)) if k == "user-\"1\""));
        assert!(parse::<Asked<'_>>(b"{}").unwrap().key.is_none());
        assert!(parse::<Asked<'_>>(br#"{"key":null}"#).unwrap().key.is_none());
        let problem = parse::<Asked<'_>>(br#"{"key":7}"#).err().unwrap();
        assert_eq!(problem.status, 400);
        assert!(format!("{problem:?}").contains("key"), "{problem:?}");
    }

    #[test]
    fn json_media_types_are_told_apart_without_case() {
        let json = |v: &str| is_json(Some(&HeaderValue::from_str(v).unwrap()));
        for yes in [
            "application/json",
            "Application/JSON",
            " application/json ; charset=utf-8",
            "application/problem+json",
            "APPLICATION/VND.API+JSON",
        ] {
            assert!(json(yes), "{yes}");
        }
        for no in [
            "",
            "text/json",
            "application/jsonx",
            "application/x-json",
            "text/plain+json",
            "+json",
            "application/json+",
            "applicatio/+json",
            "é/+json",
        ] {
            assert!(!json(no), "{no}");
        }
        assert!(!is_json(None));
    }

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
    fn integral_floats_are_integers_and_others_are_refused_by_field() {
        let req: Req =
            parse(br#"{"key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5.0, "period": 1e3}]}"#)
                .unwrap();
        let rule = &req.limits.unwrap()[0];
        assert_eq!(rule, &tollgate_core::Rule::fixed_window(5, tollgate_core::Period::SECOND));
        let body = |limit: &str| {
            format!(
                r#"{{"key": "k", "limits": [{{"algorithm": "fixed_window", "limit": {limit}, "period": "1s"}}]}}"#
            )
        };
        for limit in ["5.5", "-1.0", "1e300", "-0", "0.0", "1E-400"] {
            assert_eq!(field(&body(limit)).as_deref(), Some("limits[0].limit"), "{limit}");
        }
        // The retry still refuses a member given twice.
        let twice = r#"{"limits": [{"algorithm": "fixed_window", "limit": 5.0, "period": "1s"}], "key": "k", "key": "j"}"#;
        assert!(parse::<Req>(twice.as_bytes()).is_err());
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
