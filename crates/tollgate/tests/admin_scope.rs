//! Issue 18, the management API's scope and authorisation holes, against the real binary: a
//! scoped admin revoking tokens past the first page, audit entries of tokens a scoped admin
//! cannot list, stored policy names on the anonymous `/v1/info`, other apps' callers in the
//! live view, the console's plain-text refusal, the `BEARER` scheme, and body rules answered
//! before the role check. Each test fails on the code before the fix.

mod common;

use common::{Tollgate, bootstrap_token, problem_shape};
use reqwest::Method;
use serde_json::{Value, json};
use tollgate_testkit::PostgresServer;

const FILE_CONFIG: &str = r#"
[policies.from_file]
rules = [{ name = "hourly", algorithm = "fixed_window", limit = 2, period = "1h" }]
"#;

/// Sends a management request; answers the status and the body (Null when not JSON), after
/// checking that every refusal is a problem+json.
async fn call(
    server: &Tollgate,
    auth: Option<&str>,
    method: Method,
    path: &str,
    body: Option<(&str, Vec<u8>)>,
) -> (u16, Value) {
    let mut req = server.client.request(method.clone(), server.url(path));
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    if let Some((content_type, bytes)) = body {
        req = req.header("content-type", content_type).body(bytes);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let content_type = r.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = r.text().await.unwrap();
    if status >= 400 {
        let mut wrong = Vec::new();
        problem_shape(status, content_type.as_deref(), &text, &mut wrong);
        assert!(wrong.is_empty(), "{method} {path}: {wrong:?}: {text}");
    }
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// A body: its content type and bytes.
type Body = Option<(&'static str, Vec<u8>)>;

/// A request of a route (method, path, body) and a token without the route's role.
type Unauthorised<'a> = (Method, &'a str, fn() -> Body, &'a str);

fn json_body(value: Value) -> Body {
    Some(("application/json", value.to_string().into_bytes()))
}

async fn start_on(database: &str) -> (Tollgate, String) {
    let root = bootstrap_token(database, "zz-root", "admin", None);
    let server = Tollgate::start(FILE_CONFIG, &["--database", database]).await;
    (server, root)
}

async fn create_token(server: &Tollgate, by: &str, name: &str, role: &str, apps: Option<&[&str]>) -> String {
    let (status, body) = call(
        server,
        Some(&bearer(by)),
        Method::POST,
        "/v1/admin/tokens",
        json_body(json!({"name": name, "role": role, "apps": apps})),
    )
    .await;
    assert_eq!(status, 201, "{name}: {body}");
    body["secret"].as_str().unwrap().to_owned()
}

/// The issue's high finding: once a scoped admin has made more than a page (200) of tokens,
/// the target of its delete fell off the page the check looked in, and the delete went ahead.
async fn scoped_admin_cannot_revoke_beyond_its_apps(database: &str) {
    let (server, root) = start_on(database).await;
    create_token(&server, &root, "zz-blog", "admin", Some(&["blog"])).await;
    create_token(&server, &root, "zz-both", "viewer", Some(&["shop", "blog"])).await;
    let shop_admin = create_token(&server, &root, "shop-admin", "admin", Some(&["shop"])).await;
    // More than a page of its own tokens, all sorting before the targets.
    for i in 0..=tollgate_store::MAX_PAGE {
        create_token(&server, &shop_admin, &format!("shop-{i:03}"), "viewer", Some(&["shop"])).await;
    }
    let (_, first) =
        call(&server, Some(&bearer(&root)), Method::GET, "/v1/admin/tokens?limit=200", None).await;
    let names: Vec<&str> =
        first["items"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 200);
    assert!(!names.iter().any(|n| n.starts_with("zz-")), "the targets are past the first page");

    for target in ["zz-root", "zz-blog", "zz-both"] {
        let path = format!("/v1/admin/tokens/{target}");
        let (status, body) = call(&server, Some(&bearer(&shop_admin)), Method::DELETE, &path, None).await;
        assert_eq!(status, 403, "{target}: {body}");
        assert!(body["type"].as_str().unwrap().ends_with("#forbidden"), "{body}");
        assert!(
            !body["detail"].as_str().unwrap().contains("\"blog\""),
            "the target's apps are not told: {body}"
        );
    }
    // The unrestricted admin still works; the scoped one still revokes its own.
    let (status, _) = call(&server, Some(&bearer(&root)), Method::GET, "/v1/admin/tokens", None).await;
    assert_eq!(status, 200);
    let (status, _) =
        call(&server, Some(&bearer(&shop_admin)), Method::DELETE, "/v1/admin/tokens/shop-200", None).await;
    assert_eq!(status, 204);
    let (status, _) =
        call(&server, Some(&bearer(&shop_admin)), Method::DELETE, "/v1/admin/tokens/shop-200", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_scoped_admin_cannot_revoke_tokens_beyond_its_apps_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    scoped_admin_cannot_revoke_beyond_its_apps(&format!("sqlite://{}", dir.path().join("t.db").display()))
        .await;
}

#[tokio::test]
async fn a_scoped_admin_cannot_revoke_tokens_beyond_its_apps_on_postgres() {
    let postgres = PostgresServer::start();
    scoped_admin_cannot_revoke_beyond_its_apps(&postgres.fresh_database()).await;
}

async fn start() -> (Tollgate, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("t.db").display());
    let (server, root) = start_on(&database).await;
    (server, root, dir)
}

fn policy(name: &str, apps: &[&str]) -> Body {
    json_body(
        json!({"name": name, "apps": apps, "rules": [{"algorithm": "fixed_window", "limit": 5, "period": "1h"}]}),
    )
}

#[tokio::test]
async fn scoped_tokens_read_no_audit_of_tokens_they_cannot_list() {
    let (server, root, _dir) = start().await;
    let shop_admin = create_token(&server, &root, "shop-admin", "admin", Some(&["shop"])).await;
    create_token(&server, &root, "blog-viewer", "viewer", Some(&["blog"])).await;
    create_token(&server, &root, "everything", "viewer", None).await;
    create_token(&server, &shop_admin, "shop-viewer", "viewer", Some(&["shop"])).await;
    let (status, _) =
        call(&server, Some(&bearer(&root)), Method::POST, "/v1/admin/policies", policy("blog-p", &["blog"]))
            .await;
    assert_eq!(status, 201);

    let audit = |token: String| {
        let server = &server;
        async move {
            let (status, body) =
                call(server, Some(&bearer(&token)), Method::GET, "/v1/admin/audit?limit=200", None).await;
            assert_eq!(status, 200);
            body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| format!("{} {}", e["kind"].as_str().unwrap(), e["subject"].as_str().unwrap()))
                .collect::<Vec<_>>()
        }
    };
    // What it can list, it can read the history of; nothing else.
    assert_eq!(audit(shop_admin.clone()).await, ["token shop-viewer", "token shop-admin"]);
    let (_, listed) = call(&server, Some(&bearer(&shop_admin)), Method::GET, "/v1/admin/tokens", None).await;
    let listed: Vec<&str> =
        listed["items"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(listed, ["shop-admin", "shop-viewer"]);
    assert_eq!(audit(root).await.len(), 6, "the bootstrap token, four tokens and a policy");
}

/// Found attacking the fix: the token list's cursor was the last token of the unfiltered page,
/// so a scoped admin paging with `limit=1` read the names of tokens beyond its apps.
#[tokio::test]
async fn a_scoped_admin_pages_through_its_own_tokens_only() {
    let (server, root, _dir) = start().await;
    create_token(&server, &root, "a-blog", "admin", Some(&["blog"])).await;
    create_token(&server, &root, "b-shop", "viewer", Some(&["shop"])).await;
    create_token(&server, &root, "c-both", "viewer", Some(&["shop", "blog"])).await;
    let shop_admin = create_token(&server, &root, "shop-admin", "admin", Some(&["shop"])).await;
    let mut seen = Vec::new();
    let mut path = "/v1/admin/tokens?limit=1".to_owned();
    for _ in 0..10 {
        let r = server.client.get(server.url(&path)).bearer_auth(&shop_admin).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        let items = body["items"].as_array().unwrap();
        // Names in the page and its cursor (`created_by` is who made a token, as the audit's
        // `actor` is: shown).
        let named: Vec<&str> =
            items.iter().map(|t| t["name"].as_str().unwrap()).chain(body["next"].as_str()).collect();
        for hidden in ["a-blog", "c-both", "zz-root"] {
            assert!(!named.contains(&hidden), "{path}: {body}");
        }
        assert_eq!(items.len(), 1, "every page is full but the last: {body}");
        seen.push(items[0]["name"].as_str().unwrap().to_owned());
        match body["next"].as_str() {
            Some(next) => path = format!("/v1/admin/tokens?limit=1&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["b-shop", "shop-admin"]);
}

#[tokio::test]
async fn anonymous_info_names_no_stored_policy() {
    let (server, root, _dir) = start().await;
    for (name, apps) in [("secret-shop-api", vec!["shop"]), ("secret-global", vec![])] {
        let (status, _) =
            call(&server, Some(&bearer(&root)), Method::POST, "/v1/admin/policies", policy(name, &apps))
                .await;
        assert_eq!(status, 201);
    }
    let (status, text) = server.get_text("/v1/info").await;
    assert_eq!(status, 200);
    assert!(!text.contains("secret-"), "{text}");
    let info: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((&info["policies"], &info["stored_policies"]), (&json!(["from_file"]), &json!(2)), "{info}");
    // The stored policies are in force all the same.
    assert_eq!(server.check(json!({"key": "k", "policy": "secret-global"})).await.0, 200);
}

#[tokio::test]
async fn scoped_viewers_see_no_other_apps_callers_in_the_live_view() {
    let (server, root, _dir) = start().await;
    let shop = create_token(&server, &root, "shop-viewer", "viewer", Some(&["shop"])).await;
    for (name, apps) in
        [("shop-api", vec!["shop"]), ("global-api", vec![]), ("shared-api", vec!["shop", "blog"])]
    {
        let (status, _) =
            call(&server, Some(&bearer(&root)), Method::POST, "/v1/admin/policies", policy(name, &apps))
                .await;
        assert_eq!(status, 201);
    }
    for policy in ["shop-api", "global-api", "shared-api", "from_file"] {
        assert_eq!(
            server.check(json!({"key": format!("caller-of-{policy}"), "policy": policy})).await.0,
            200
        );
    }
    let inline = json!({"key": "inline-caller", "limits": [{"algorithm": "fixed_window", "limit": 3, "period": "1h"}]});
    assert_eq!(server.check(inline).await.0, 200);

    let live = |token: String, policy: &'static str| {
        let server = &server;
        async move {
            call(
                server,
                Some(&bearer(&token)),
                Method::GET,
                &format!("/v1/admin/live/policies/{policy}"),
                None,
            )
            .await
        }
    };
    // The pseudo-policies count every app's callers: not for a scoped token.
    for pseudo in ["inline", "consumer", "anonymous"] {
        assert_eq!(live(shop.clone(), pseudo).await.0, 404, "{pseudo}");
        assert_eq!(live(root.clone(), pseudo).await.0, 200, "{pseudo}");
    }
    let (_, body) = live(root.clone(), "inline").await;
    assert_eq!(body["nearest"][0]["key"], "inline-caller", "{body}");
    // Its own app's policy: keys shown. Global or shared ones: counts only.
    let (status, body) = live(shop.clone(), "shop-api").await;
    assert_eq!(
        (status, &body["nearest"][0]["key"], &body["keys_withheld"]),
        (200, &json!("caller-of-shop-api"), &json!(false)),
        "{body}"
    );
    for policy in ["global-api", "shared-api", "from_file"] {
        let (status, body) = live(shop.clone(), policy).await;
        assert_eq!(
            (status, &body["nearest"], &body["keys_withheld"]),
            (200, &json!([]), &json!(true)),
            "{policy}: {body}"
        );
        assert_eq!(
            body["allowed"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum::<u64>(),
            1,
            "{policy}"
        );
        let (_, body) = live(root.clone(), policy).await;
        assert_eq!(body["nearest"][0]["key"], format!("caller-of-{policy}"), "{policy}: {body}");
    }
}

#[tokio::test]
async fn console_refusals_are_problems() {
    let (server, _, _dir) = start().await;
    for path in ["/console/assets/%ff", "/console/assets/%FF%FE.js", "/console/assets/nope.js"] {
        let (status, body) = call(&server, None, Method::GET, path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = call(&server, None, Method::GET, "/console/assets/app%2Ejs", None).await;
    assert_eq!(status, 200, "a percent-encoded name of an asset is that asset");
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_nothing_else_is_a_bearer() {
    let (server, root, _dir) = start().await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        for spaces in [" ", "   "] {
            let auth = format!("{scheme}{spaces}{root}");
            let (status, body) = call(&server, Some(&auth), Method::GET, "/v1/admin/me", None).await;
            assert_eq!((status, body["name"].as_str()), (200, Some("zz-root")), "{auth:?}");
        }
    }
    for auth in [
        format!("Basic {root}"),
        format!("Bearer{root}"),
        format!("Bearer\t{root}"),
        format!("Token {root}"),
        format!("Bearers {root}"),
        "Bearer ".to_owned(),
        "BEARER".to_owned(),
        format!("BEARER tg_{}", "0".repeat(64)),
    ] {
        let (status, _) = call(&server, Some(&auth), Method::GET, "/v1/admin/me", None).await;
        assert_eq!(status, 401, "{auth:?}");
    }
}

/// Every management route refuses a caller without the role before reading its path, query
/// or body: a viewer's bad body is 403, a stranger's 401, never the body's 400 or 415.
#[tokio::test]
async fn authorization_comes_before_any_parsing_on_every_management_route() {
    let (server, root, _dir) = start().await;
    let viewer = create_token(&server, &root, "viewer", "viewer", None).await;
    let editor = create_token(&server, &root, "editor", "editor", None).await;
    let garbage = || Some(("application/json", b"{\"rules\": [".to_vec()));
    let wrong_type = || Some(("text/plain", b"hello".to_vec()));
    let unknown_field = || json_body(json!({"colour": 1}));
    // (method, path, body, a token without the route's role)
    let cases: Vec<Unauthorised> = vec![
        (Method::POST, "/v1/admin/policies", garbage, &viewer),
        (Method::POST, "/v1/admin/policies", wrong_type, &viewer),
        (Method::PUT, "/v1/admin/policies/from_file", unknown_field, &viewer),
        (Method::PUT, "/v1/admin/policies/%FF", garbage, &viewer),
        (Method::DELETE, "/v1/admin/policies/%FF", || None, &viewer),
        (Method::GET, "/v1/admin/tokens?limit=NaN", || None, &editor),
        (Method::POST, "/v1/admin/tokens", garbage, &editor),
        (Method::POST, "/v1/admin/tokens", unknown_field, &editor),
        (Method::DELETE, "/v1/admin/tokens/%FF", || None, &editor),
        (Method::POST, "/v1/admin/consumers/acme/limits", wrong_type, &viewer),
        (Method::POST, "/v1/admin/consumers/%C0%AF/limits", unknown_field, &viewer),
        (Method::PUT, "/v1/admin/consumers/acme/limits/x", garbage, &viewer),
        (Method::DELETE, "/v1/admin/consumers/acme/limits/x", || None, &viewer),
    ];
    let mut failures = Vec::new();
    for (method, path, body, lacking) in &cases {
        let (status, answer) = call(&server, Some(&bearer(lacking)), method.clone(), path, body()).await;
        if status != 403 {
            failures.push(format!("{method} {path} without the role: {status}, expected 403: {answer}"));
        }
        let (status, answer) = call(&server, None, method.clone(), path, body()).await;
        if status != 401 {
            failures.push(format!("{method} {path} without a token: {status}, expected 401: {answer}"));
        }
    }
    // Read routes of any role: a stranger's bad query or path is 401.
    for path in [
        "/v1/admin/policies?limit=NaN",
        "/v1/admin/audit?after=x&limit=-1",
        "/v1/admin/policies/%FF",
        "/v1/admin/live/policies/%FF",
        "/v1/consumers/%FF/call-limits",
        "/v1/admin/consumers/%FF/limits",
    ] {
        let (status, answer) = call(&server, None, Method::GET, path, None).await;
        if status != 401 {
            failures.push(format!("GET {path} without a token: {status}, expected 401: {answer}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
