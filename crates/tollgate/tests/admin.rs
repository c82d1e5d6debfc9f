//! The management API against the real binary: bootstrap a token with the CLI, the role x
//! route x app matrix, policies created through the API and enforced by /v1/check, optimistic
//! concurrency, the audit trail, and two instances on one PostgreSQL seeing a change.

mod common;

use std::time::{Duration, Instant};

use common::{Tollgate, bootstrap_token};
use reqwest::Method;
use serde_json::{Value, json};
use tollgate_testkit::PostgresServer;

const FILE_CONFIG: &str = r#"
[policies.from_file]
rules = [{ algorithm = "fixed_window", limit = 5, period = "1h" }]
"#;

struct Admin<'a> {
    server: &'a Tollgate,
}

impl Admin<'_> {
    async fn call(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        self.call_with(token, method, path, body, None).await
    }

    async fn call_with(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
        if_match: Option<&str>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = self.server.client.request(method, self.server.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        if let Some(version) = if_match {
            req = req.header("if-match", version);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null), headers)
    }
}

fn policy(name: &str, limit: u64, apps: &[&str]) -> Value {
    json!({"name": name, "rules": [{"algorithm": "fixed_window", "limit": limit, "period": "1h"}], "apps": apps})
}

async fn setup() -> (Tollgate, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("admin.db").display());
    let root = bootstrap_token(&database, "root", "admin", None);
    let server = Tollgate::start(FILE_CONFIG, &["--database", &database]).await;
    // Keep the directory alive as long as the server: leak it into the test's lifetime.
    std::mem::forget(dir);
    (server, database, root)
}

#[tokio::test]
async fn a_policy_created_through_the_api_is_enforced_and_audited() {
    let (server, _, root) = setup().await;
    let admin = Admin { server: &server };
    let (status, body, headers) =
        admin.call(Some(&root), Method::POST, "/v1/admin/policies", Some(policy("api", 2, &["shop"]))).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(headers["etag"], "\"1\"");
    assert_eq!(headers["location"], "/v1/admin/policies/api");
    assert_eq!((body["created_by"].as_str(), body["version"].as_i64()), (Some("root"), Some(1)));

    let check = json!({"key": "k", "policy": "api"});
    assert_eq!(server.check(check.clone()).await.0, 200);
    assert_eq!(server.check(check.clone()).await.0, 200);
    assert_eq!(server.check(check.clone()).await.0, 429);

    // Stale If-Match: 412; current: applied at once.
    let (status, body, _) = admin
        .call_with(Some(&root), Method::PUT, "/v1/admin/policies/api", Some(json!({"rules": [{"algorithm": "fixed_window", "limit": 10, "period": "1h"}], "apps": ["shop"]})), Some("\"7\""))
        .await;
    assert_eq!(status, 412, "{body}");
    assert!(body["type"].as_str().unwrap().ends_with("#stale-version"));
    let (status, body, headers) = admin
        .call_with(Some(&root), Method::PUT, "/v1/admin/policies/api", Some(json!({"rules": [{"algorithm": "fixed_window", "limit": 10, "period": "1h"}], "apps": ["shop"]})), Some("\"1\""))
        .await;
    assert_eq!(
        (status, &headers["etag"]),
        (200, &"\"2\"".parse::<reqwest::header::HeaderValue>().unwrap()),
        "{body}"
    );
    assert_eq!(server.check(check.clone()).await.1["limit"], 10);

    // Validation errors name the field.
    let (status, body, _) =
        admin.call(Some(&root), Method::POST, "/v1/admin/policies", Some(policy("bad", 0, &[]))).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("rules[0].limit")), "{body}");
    let (status, body, _) = admin
        .call(
            Some(&root),
            Method::POST,
            "/v1/admin/policies",
            Some(json!({"name": "x", "rules": [], "colour": 1})),
        )
        .await;
    assert_eq!((status, body["field"].as_str()), (400, Some("colour")), "{body}");

    // File policies are listed, read-only, and their names are taken.
    let (status, body, _) = admin.call(Some(&root), Method::GET, "/v1/admin/policies", None).await;
    assert_eq!(status, 200);
    let names: Vec<_> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["source"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("api", "database"), ("from_file", "file")]);
    let (status, ..) =
        admin.call(Some(&root), Method::POST, "/v1/admin/policies", Some(policy("from_file", 1, &[]))).await;
    assert_eq!(status, 409);
    let (status, ..) = admin.call(Some(&root), Method::DELETE, "/v1/admin/policies/from_file", None).await;
    assert_eq!(status, 409);

    // Deleted: unknown to /v1/check.
    let (status, ..) = admin.call(Some(&root), Method::DELETE, "/v1/admin/policies/api", None).await;
    assert_eq!(status, 204);
    assert_eq!(server.check(check).await.0, 404);

    // The audit trail: newest first, with the author and the before/after.
    let (status, body, _) = admin.call(Some(&root), Method::GET, "/v1/admin/audit", None).await;
    assert_eq!(status, 200);
    let items = body["items"].as_array().unwrap();
    let actions: Vec<_> = items
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["kind"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        &actions[..3],
        [("delete", "policy", "root"), ("update", "policy", "root"), ("create", "policy", "root")]
    );
    assert_eq!(items[1]["before"]["rules"][0]["limit"], 2);
    assert_eq!(items[1]["after"]["rules"][0]["limit"], 10);
}

#[tokio::test]
async fn roles_and_apps_are_checked_on_every_route() {
    let (server, _, root) = setup().await;
    let admin = Admin { server: &server };
    let mut tokens = std::collections::BTreeMap::new();
    for (name, role, apps) in [
        ("viewer", "viewer", None),
        ("shop-viewer", "viewer", Some(vec!["shop"])),
        ("editor", "editor", None),
        ("shop-editor", "editor", Some(vec!["shop"])),
        ("shop-admin", "admin", Some(vec!["shop"])),
    ] {
        let (status, body, _) = admin
            .call(
                Some(&root),
                Method::POST,
                "/v1/admin/tokens",
                Some(json!({"name": name, "role": role, "apps": apps})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        tokens.insert(name, body["secret"].as_str().unwrap().to_owned());
    }
    tokens.insert("root", root.clone());
    for (name, apps) in
        [("shop-policy", vec!["shop"]), ("blog-policy", vec!["blog"]), ("global-policy", vec![])]
    {
        let (status, ..) =
            admin.call(Some(&root), Method::POST, "/v1/admin/policies", Some(policy(name, 1, &apps))).await;
        assert_eq!(status, 201);
    }

    // Without a token, or with a wrong one: 401 and a challenge.
    for token in [None, Some("tg_not-a-token")] {
        let (status, body, headers) = admin.call(token, Method::GET, "/v1/admin/policies", None).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(headers["www-authenticate"], "Bearer realm=\"tollgate\"");
    }

    let shop = |limit| {
        Some(
            json!({"rules": [{"algorithm": "fixed_window", "limit": limit, "period": "1h"}], "apps": ["shop"]}),
        )
    };
    let blog =
        Some(json!({"rules": [{"algorithm": "fixed_window", "limit": 3, "period": "1h"}], "apps": ["blog"]}));
    // (route, method, body) x token -> status. 200/201/204 allowed; 403 refused; 404 invisible.
    type Row<'a> = (&'a str, Method, &'a str, Option<Value>, [u16; 6]);
    //                                                    viewer shop-viewer editor shop-editor shop-admin root
    let matrix: Vec<Row> = vec![
        ("list policies", Method::GET, "/v1/admin/policies", None, [200, 200, 200, 200, 200, 200]),
        (
            "get shop policy",
            Method::GET,
            "/v1/admin/policies/shop-policy",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
        (
            "get blog policy",
            Method::GET,
            "/v1/admin/policies/blog-policy",
            None,
            [200, 404, 200, 404, 404, 200],
        ),
        (
            "get global policy",
            Method::GET,
            "/v1/admin/policies/global-policy",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
        (
            "update shop policy",
            Method::PUT,
            "/v1/admin/policies/shop-policy",
            shop(2),
            [403, 403, 200, 200, 200, 200],
        ),
        (
            "update blog policy",
            Method::PUT,
            "/v1/admin/policies/blog-policy",
            blog.clone(),
            [403, 403, 200, 403, 403, 200],
        ),
        (
            "move shop policy to blog",
            Method::PUT,
            "/v1/admin/policies/shop-policy",
            blog,
            [403, 403, 200, 403, 403, 200],
        ),
        (
            "update global policy",
            Method::PUT,
            "/v1/admin/policies/global-policy",
            Some(json!({"rules": [{"algorithm": "fixed_window", "limit": 4, "period": "1h"}]})),
            [403, 403, 200, 403, 403, 200],
        ),
        (
            "create shop policy",
            Method::POST,
            "/v1/admin/policies",
            Some(policy("new-shop", 1, &["shop"])),
            [403, 403, 201, 201, 201, 201],
        ),
        (
            "create global policy",
            Method::POST,
            "/v1/admin/policies",
            Some(policy("new-global", 1, &[])),
            [403, 403, 201, 403, 403, 201],
        ),
        ("list tokens", Method::GET, "/v1/admin/tokens", None, [403, 403, 403, 403, 200, 200]),
        (
            "create shop token",
            Method::POST,
            "/v1/admin/tokens",
            Some(json!({"name": "t-shop", "role": "viewer", "apps": ["shop"]})),
            [403, 403, 403, 403, 201, 201],
        ),
        (
            "create global token",
            Method::POST,
            "/v1/admin/tokens",
            Some(json!({"name": "t-all", "role": "viewer"})),
            [403, 403, 403, 403, 403, 201],
        ),
        ("read audit", Method::GET, "/v1/admin/audit", None, [200, 200, 200, 200, 200, 200]),
        (
            "list consumer limits",
            Method::GET,
            "/v1/admin/consumers/acme/limits",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
        (
            "create consumer limit",
            Method::POST,
            "/v1/admin/consumers/acme/limits",
            Some(
                json!({"per_second": 5, "per_minute": -1, "per_hour": -1, "per_day": -1, "per_week": -1, "per_month": -1}),
            ),
            [403, 403, 201, 403, 403, 201],
        ),
        (
            "read call limits",
            Method::GET,
            "/v1/consumers/acme/call-limits",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
    ];
    let order = ["viewer", "shop-viewer", "editor", "shop-editor", "shop-admin", "root"];
    let mut failures = Vec::new();
    for (what, method, path, body, expected) in &matrix {
        for (who, want) in order.iter().zip(expected) {
            // Creations need a fresh name per caller; PUTs are idempotent enough.
            let body = body.clone().map(|mut b| {
                if *method == Method::POST && b.get("name").is_some() {
                    let name = format!("{}-{who}", b["name"].as_str().unwrap());
                    b["name"] = json!(name);
                }
                b
            });
            let (status, answer, _) = admin.call(Some(&tokens[who]), method.clone(), path, body).await;
            if status != *want {
                failures.push(format!("{what} as {who}: got {status}, expected {want}: {answer}"));
            }
            if status == 403 {
                assert!(answer["type"].as_str().unwrap().ends_with("#forbidden"), "{answer}");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // A restricted viewer's list holds only what it may see; token changes are in the audit
    // for admins only.
    let (_, body, _) =
        admin.call(Some(&tokens["shop-viewer"]), Method::GET, "/v1/admin/policies", None).await;
    let names: Vec<_> =
        body["items"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect();
    assert!(!names.iter().any(|n| n.starts_with("blog")), "{names:?}");
    let (_, body, _) =
        admin.call(Some(&tokens["viewer"]), Method::GET, "/v1/admin/audit?limit=200", None).await;
    assert!(body["items"].as_array().unwrap().iter().all(|e| e["kind"] != "token"));
    let (_, body, _) = admin.call(Some(&root), Method::GET, "/v1/admin/audit?limit=200", None).await;
    assert!(body["items"].as_array().unwrap().iter().any(|e| e["kind"] == "token"));

    // Deleting a token revokes it at once.
    let (status, ..) = admin.call(Some(&root), Method::DELETE, "/v1/admin/tokens/viewer", None).await;
    assert_eq!(status, 204);
    let (status, ..) = admin.call(Some(&tokens["viewer"]), Method::GET, "/v1/admin/policies", None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn two_instances_on_one_postgres_see_a_change_within_a_second() {
    let postgres = PostgresServer::start();
    let database = postgres.fresh_database();
    let root = bootstrap_token(&database, "root", "admin", None);
    let redis = tollgate_testkit::RedisServer::start();
    // Counts from Redis only (no local answers on a slow machine), so the total is exact.
    let exact = "[backend]\non_failure = \"closed\"\ntimeout = \"5s\"\n";
    let a = Tollgate::start(exact, &["--database", &database, "--redis", &redis.url()]).await;
    let b = Tollgate::start(exact, &["--database", &database, "--redis", &redis.url()]).await;
    let check = json!({"key": "k", "policy": "shared"});
    assert_eq!(b.check(check.clone()).await.0, 404);

    let mut delays = Vec::new();
    for (round, limit) in [(0, 3), (1, 4), (2, 5)] {
        let admin = Admin { server: &a };
        let (method, path) = if round == 0 {
            (Method::POST, "/v1/admin/policies".to_owned())
        } else {
            (Method::PUT, "/v1/admin/policies/shared".to_owned())
        };
        let mut body = policy("shared", limit, &[]);
        if round > 0 {
            body.as_object_mut().unwrap().remove("name");
        }
        let (status, answer, _) = admin.call(Some(&root), method, &path, Some(body)).await;
        assert!(status == 201 || status == 200, "{answer}");
        let changed = Instant::now();
        loop {
            let (status, body) = b.check(json!({"key": "k", "policy": "shared", "cost": 0})).await;
            if status != 404 && body["limit"] == limit {
                delays.push(changed.elapsed());
                break;
            }
            assert!(changed.elapsed() < Duration::from_secs(5), "instance B never saw limit {limit}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!("propagation to the second instance: {delays:?}");
    assert!(delays.iter().all(|d| *d < Duration::from_secs(1)), "{delays:?}");

    // Both count in the one Redis: 5 admitted in all, whichever instance is asked.
    let mut statuses = Vec::new();
    for i in 0..7 {
        let server = if i % 2 == 0 { &a } else { &b };
        statuses.push(server.check(check.clone()).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
}

fn cli(server: &Tollgate, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .env("TOLLGATE_SERVER", &server.base)
        .env("TOLLGATE_TOKEN", token)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_applies_lists_and_deletes_over_the_api() {
    let (server, _, root) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policies.toml");
    let write = |limit: u64| {
        std::fs::write(
            &file,
            format!(
                "[policies.cli_a]\nrules = [{{ algorithm = \"fixed_window\", limit = {limit}, period = \"1h\" }}]\n\
                 [policies.cli_b]\napps = [\"shop\"]\nmode = \"shadow\"\n\
                 rules = [{{ algorithm = \"gcra\", limit = 5, period = \"1s\", burst = 2 }}]\n"
            ),
        )
        .unwrap();
    };
    write(1);
    let path = file.to_str().unwrap();
    let (ok, _, stderr) = cli(&server, &root, &["policy", "apply", path]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("created policy \"cli_a\"") && stderr.contains("created policy \"cli_b\""),
        "{stderr}"
    );
    assert_eq!(server.check(json!({"key": "k", "policy": "cli_a"})).await.0, 200);
    assert_eq!(server.check(json!({"key": "k", "policy": "cli_a"})).await.0, 429);

    write(3);
    let (ok, _, stderr) = cli(&server, &root, &["policy", "apply", path]);
    assert!(ok && stderr.contains("updated policy \"cli_a\""), "{stderr}");
    let (ok, stdout, _) = cli(&server, &root, &["policy", "get", "cli_a"]);
    let got: Value = serde_json::from_str(&stdout).unwrap();
    assert!(ok);
    assert_eq!((got["version"].as_i64(), &got["rules"][0]["limit"]), (Some(2), &json!(3)));
    let (_, stdout, _) = cli(&server, &root, &["policy", "list"]);
    let list: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "cli_a, cli_b and the file's");

    // A mistake is refused with the field, and the command fails.
    std::fs::write(
        &file,
        "[policies.cli_a]\nrules = [{ algorithm = \"fixed_window\", limit = 0, period = \"1h\" }]\n",
    )
    .unwrap();
    let (ok, _, stderr) = cli(&server, &root, &["policy", "apply", path]);
    assert!(!ok && stderr.contains("rules[0].limit"), "{stderr}");
    let (ok, _, stderr) = cli(&server, "tg_wrong", &["policy", "list"]);
    assert!(!ok && stderr.contains("401"), "{stderr}");

    let (ok, _, _) = cli(&server, &root, &["policy", "delete", "cli_b"]);
    assert!(ok);
    assert_eq!(server.check(json!({"key": "k", "policy": "cli_b"})).await.0, 404);

    // Consumers.
    let (ok, stdout, stderr) =
        cli(&server, &root, &["consumer", "add-limit", "c1", "--per-hour", "2", "--per-day", "-1"]);
    assert!(ok, "{stderr}");
    let record: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(record["per_hour"], 2);
    server.check(json!({"consumer": "c1"})).await;
    let (ok, stdout, _) = cli(&server, &root, &["consumer", "call-limits", "c1"]);
    let usage: Value = serde_json::from_str(&stdout).unwrap();
    assert!(ok);
    assert_eq!(usage["limits"]["per_hour"], 2);
    let (ok, ..) = cli(&server, &root, &["consumer", "delete-limit", "c1", record["id"].as_str().unwrap()]);
    assert!(ok);
    let (_, stdout, _) = cli(&server, &root, &["consumer", "limits", "c1"]);
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap()["items"], json!([]));
}
