//! Canonical paths (issue 18): every spelling of `/login` gets `/login`'s policy and reaches the
//! service as the canonical path, or is refused with 400; none is limited by the default policy
//! while the service would serve it as `/login`. Requests are written on raw connections, since
//! HTTP clients normalise paths themselves.

mod common;

use axum::Router;
use axum::extract::Extension;
use axum::http::Uri;
use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_tower::{NonCanonicalPaths, PathCase, RateLimitInfo, Route, TollgateLayer};

/// Answers `<policy> <the URI the service got>` (`unlimited` for no policy).
async fn seen(info: Option<Extension<RateLimitInfo>>, uri: Uri) -> String {
    let policy = info.map_or_else(|| "unlimited".to_owned(), |Extension(i)| i.policy.name.to_string());
    format!("{policy} {uri}")
}

fn builder() -> tollgate_tower::Builder {
    let (limiter, _clock) = manual_limiter();
    TollgateLayer::builder(limiter)
        .default_policy(per_minute("default", 1_000_000))
        .route(Route::limit("/login", per_minute("login", 1_000_000)))
        .route(Route::limit("/api/{*rest}", per_minute("api", 1_000_000)))
}

async fn serve_layer(layer: TollgateLayer) -> String {
    serve(Router::new().fallback(seen), layer).await
}

/// A raw `GET <target>`: the status and the body.
async fn raw_get(base: &str, target: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// What a spelling must get: `/login`'s policy (or another's) and the URI the service sees, or a
/// 400 naming `path`.
enum Expect {
    Seen(&'static str, &'static str),
    Refused,
}

async fn check_table(base: &str, table: &[(&str, Expect)]) {
    let mut wrong = Vec::new();
    for (target, expect) in table {
        let (status, body) = raw_get(base, target).await;
        match expect {
            Expect::Seen(policy, uri) => {
                let want = format!("{policy} {uri}");
                if (status, body.as_str()) != (200, want.as_str()) {
                    wrong.push(format!("{target}: expected 200 {want:?}, got {status} {body:?}"));
                }
            }
            Expect::Refused => {
                let problem: Value = serde_json::from_str(&body).unwrap_or_default();
                if status != 400 || problem["field"] != "path" || problem["status"] != 400 {
                    wrong.push(format!("{target}: expected a 400 naming path, got {status} {body:?}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{} spellings answered wrongly:\n{}", wrong.len(), wrong.join("\n"));
}

/// The spellings a server resolves to `/login` (or refuses), and those it does not.
fn spellings() -> Vec<(&'static str, Expect)> {
    use Expect::*;
    vec![
        ("/login", Seen("login", "/login")),
        ("//login", Seen("login", "/login")),
        ("/./login", Seen("login", "/login")),
        ("/%6Cogin", Seen("login", "/login")),
        ("/%6c%6f%67%69%6e", Seen("login", "/login")),
        ("/x/../login", Seen("login", "/login")),
        ("/login;x", Seen("login", "/login")),
        ("/login;jsessionid=1?a=b", Seen("login", "/login?a=b")),
        ("/..;/login", Seen("login", "/login")),
        ("/%2e%2e/login", Seen("login", "/login")),
        ("/x/%2E%2E/login", Seen("login", "/login")),
        ("/x/.%2e/login", Seen("login", "/login")),
        ("/../../../../login", Seen("login", "/login")),
        ("/a//../login", Seen("login", "/login")),
        ("/login/", Seen("login", "/login/")),
        ("/login//", Seen("login", "/login/")),
        ("/login/.", Seen("login", "/login/")),
        ("/login?x", Seen("login", "/login?x")),
        ("/login?x=/../y", Seen("login", "/login?x=/../y")),
        ("/login#frag", Seen("login", "/login")),
        ("/api//v1/../keys", Seen("api", "/api/keys")),
        ("/api/../login", Seen("login", "/login")),
        ("/static/..%2F..%2Flogin", Refused),
        ("/%2Flogin", Refused),
        ("/%2flogin", Refused),
        ("/login%00", Refused),
        ("/login%0d%0aX-Injected:%201", Refused),
        ("/x\\..\\login", Refused),
        ("/x%5C..%5Clogin", Refused),
        ("/%256Cogin", Refused),
        ("/%zzlogin", Refused),
        ("/login%", Refused),
        ("/%ff", Refused),
        ("/%c0%ae%c0%ae/login", Refused),
        // Not /login: the default policy, passed on as sent (or as its canonical form).
        ("/LOGIN", Seen("default", "/LOGIN")),
        ("/logins", Seen("default", "/logins")),
        ("/login.html", Seen("default", "/login.html")),
        ("/caf%c3%a9", Seen("default", "/caf%C3%A9")),
        ("/a%3Bb", Seen("default", "/a%3Bb")),
    ]
}

#[tokio::test]
async fn spellings_of_a_route_get_its_policy_and_the_service_sees_the_canonical_path() {
    let base = serve_layer(builder().build().unwrap()).await;
    check_table(&base, &spellings()).await;

    // Very long paths: 60 KB of `a/../` still resolves to /login; past the URI limit of the
    // http crate (64 KiB), hyper answers 414 before the layer runs.
    let long = format!("/{}login", "a/../".repeat(12_000));
    assert_eq!(raw_get(&base, &long).await, (200, "login /login".into()));
    let deep = format!("{}/login", "/x".repeat(30_000));
    assert_eq!(raw_get(&base, &deep).await, (200, format!("default {deep}")));
    let (status, _) = raw_get(&base, &format!("/{}", "a".repeat(70_000))).await;
    assert_eq!(status, 414);
}

#[tokio::test]
async fn case_insensitive_matching_takes_any_case_and_passes_it_on() {
    let layer = builder().path_case(PathCase::Insensitive).build().unwrap();
    let base = serve_layer(layer).await;
    use Expect::*;
    check_table(
        &base,
        &[
            ("/LOGIN", Seen("login", "/LOGIN")),
            ("/LoGiN/", Seen("login", "/LoGiN/")),
            ("//Login;x", Seen("login", "/Login")),
            ("/%4C%4F%47%49%4E", Seen("login", "/LOGIN")),
            ("/API/Keys", Seen("api", "/API/Keys")),
            ("/logins", Seen("default", "/logins")),
        ],
    )
    .await;
}

#[tokio::test]
async fn reject_mode_refuses_every_spelling_but_the_canonical_one() {
    let layer = builder().non_canonical_paths(NonCanonicalPaths::Reject).build().unwrap();
    let base = serve_layer(layer).await;
    let table: Vec<(&str, Expect)> = spellings()
        .into_iter()
        .map(|(target, expect)| {
            // Escapes that differ only in the case of their hex digits pass, unchanged.
            if target == "/caf%c3%a9" {
                return (target, Expect::Seen("default", "/caf%c3%a9"));
            }
            let canonical = match &expect {
                // A path the service saw unchanged is canonical (its query and fragment aside).
                Expect::Seen(_, uri) => target.split(['?', '#']).next() == uri.split('?').next(),
                Expect::Refused => false,
            };
            (target, if canonical { expect } else { Expect::Refused })
        })
        .collect();
    assert!(table.iter().filter(|(_, e)| matches!(e, Expect::Refused)).count() >= 25);
    check_table(&base, &table).await;

    // The problem names the canonical form.
    let (status, body) = raw_get(&base, "/x/../login").await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 400);
    assert_eq!(
        problem["type"],
        "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#invalid-request"
    );
    assert!(problem["detail"].as_str().unwrap().contains("\"/login\""), "{problem}");
}

#[tokio::test]
async fn patterns_that_no_canonical_path_matches_are_refused_at_build() {
    let (limiter, _clock) = manual_limiter();
    for pattern in ["/a//b", "/a/./b", "/a/../b", "/%6Cogin", "/login;x", "/a%2Fb", "login"] {
        let err = TollgateLayer::builder(limiter.clone())
            .route(Route::limit(pattern, per_minute("p", 1)))
            .build()
            .unwrap_err();
        assert!(matches!(err, tollgate_tower::BuildError::NonCanonicalPattern { .. }), "{pattern}: {err}");
    }
    // A trailing slash, and case under case-insensitive matching, make one pattern: its routes
    // are tried in order rather than conflicting.
    TollgateLayer::builder(limiter.clone())
        .route(Route::limit("/login", per_minute("a", 1)))
        .route(Route::limit("/login/", per_minute("b", 1)))
        .route(Route::limit("/users/{id}", per_minute("c", 1)))
        .build()
        .unwrap();
    TollgateLayer::builder(limiter)
        .path_case(PathCase::Insensitive)
        .route(Route::limit("/Login", per_minute("a", 1)))
        .route(Route::limit("/login", per_minute("b", 1)))
        .build()
        .unwrap();
}
