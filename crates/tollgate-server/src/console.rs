//! The web console at `/console`: a single page of plain ES modules and CSS, embedded in the
//! binary (no build step, nothing fetched from the network at run time), over the management
//! API. Also `GET /v1/admin/me`, which tells the page the signed-in token's role and apps.

use axum::Json;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use tollgate_store::TokenRecord;

use crate::auth::Caller;

use tollgate_http::Problem;

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset { name: $name, content_type: $type, body: include_bytes!(concat!("../console/", $name)) }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Everything under `/console/assets/`.
const ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("chart.js", JS),
    asset!("rules.js", JS),
    asset!("pages.js", JS),
    asset!("dom.js", JS),
    asset!("favicon.svg", "image/svg+xml"),
];

const INDEX: &[u8] = include_bytes!("../console/index.html");

/// A strong validator for `body` (FNV-1a, 64 bits): assets change only with the binary.
fn etag_of(body: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

/// `body` with its type, an ETag, `Cache-Control: no-cache` (revalidate every time: names are
/// not versioned, and a 304 costs nothing), and 304 when `If-None-Match` matches.
fn serve(headers: &HeaderMap, content_type: &'static str, body: &'static [u8]) -> Response {
    let tag = etag_of(body);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut response = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { body.into_response() };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if let Ok(tag) = HeaderValue::from_str(&tag) {
        h.insert(header::ETAG, tag);
    }
    response
}

/// `GET /console`: the page.
pub async fn index(headers: HeaderMap) -> Response {
    let mut response = serve(&headers, "text/html; charset=utf-8", INDEX);
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// `GET /console/assets/{file}`. A name that does not decode (`%ff`: not UTF-8) names no asset
/// either: 404 as a problem, like every other refusal, never axum's plain-text rejection.
pub async fn asset(headers: HeaderMap, uri: Uri, file: Result<Path<String>, PathRejection>) -> Response {
    match file.ok().and_then(|Path(file)| ASSETS.iter().find(|a| a.name == file)) {
        Some(a) => serve(&headers, a.content_type, a.body),
        None => Problem::not_found(uri.path()).into_response(),
    }
}

/// The token of the request: its `name`, `role` and `apps` (any role), so a page can offer
/// what the token may do.
#[utoipa::path(get, path = "/v1/admin/me", tag = "management", responses((status = 200, description = "The token: `name`, `role`, `apps` (absent: every app), `created_by`, `created_at`"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json")))]
pub async fn me(caller: Caller) -> Json<TokenRecord> {
    Json(caller.token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        let sources = ASSETS.iter().map(|a| a.body).chain([INDEX]);
        for text in sources.filter_map(|b| std::str::from_utf8(b).ok()) {
            for part in text.split("./").skip(1).chain(text.split("/console/assets/").skip(1)) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
                    .collect();
                if name.ends_with(".js") || name.ends_with(".css") || name.ends_with(".svg") {
                    assert!(ASSETS.iter().any(|a| a.name == name), "{name} is referenced but not embedded");
                }
            }
        }
    }

    #[test]
    fn revalidation_answers_304() {
        let mut headers = HeaderMap::new();
        let first = serve(&headers, JS, b"x");
        let tag = first.headers()[header::ETAG].clone();
        assert_eq!(first.headers()[header::CACHE_CONTROL], "no-cache");
        headers.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(serve(&headers, JS, b"x").status(), StatusCode::NOT_MODIFIED);
        assert_eq!(serve(&headers, JS, b"y").status(), StatusCode::OK);
    }
}
