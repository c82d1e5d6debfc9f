//! The web console: its page and assets as served, the live route, and the end-to-end browser
//! tests (`tests/browser/console.mjs` in Debian's chromium through playwright-core).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Tollgate, bootstrap_token, inside_window};
use serde_json::{Value, json};

const CONFIG: &str = r#"
[policies.from_file]
rules = [{ algorithm = "fixed_window", limit = 2, period = "1h", align = "first_hit", name = "hourly" }]
"#;

/// A server on a fresh database, with an admin and a viewer token.
async fn setup() -> (Tollgate, String, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("console.db").display());
    let admin = bootstrap_token(&database, "root", "admin", None);
    let viewer = bootstrap_token(&database, "watcher", "viewer", None);
    let server = Tollgate::start(CONFIG, &["--database", &database]).await;
    (server, admin, viewer, dir)
}

async fn get(server: &Tollgate, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = server.client.get(server.url(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_types_and_validators() {
    let (server, _, _, _dir) = setup().await;
    for path in ["/console", "/console/"] {
        let r = get(&server, path, None).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
        assert_eq!(r.headers()["cache-control"], "no-cache");
        let csp = r.headers()["content-security-policy"].to_str().unwrap().to_owned();
        assert!(csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"), "{csp}");
        let html = r.text().await.unwrap();
        assert!(html.contains(r#"<script type="module" src="/console/assets/app.js">"#));
        assert!(!html.contains("http://") && !html.contains("https://"), "nothing from the network");
    }
    for (file, kind) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("pages.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ] {
        let r = get(&server, &format!("/console/assets/{file}"), None).await;
        assert_eq!(r.status(), 200, "{file}");
        assert_eq!(r.headers()["content-type"], kind, "{file}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        let etag = r.headers()["etag"].clone();
        let again = server
            .client
            .get(server.url(&format!("/console/assets/{file}")))
            .header("if-none-match", etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{file} revalidates");
    }
    let r = get(&server, "/console/assets/nope.js", None).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn me_and_the_live_route_follow_the_token() {
    let (server, admin, viewer, dir) = setup().await;
    let r = get(&server, "/v1/admin/me", None).await;
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let me: Value = get(&server, "/v1/admin/me", Some(&viewer)).await.json().await.unwrap();
    assert_eq!((me["name"].as_str(), me["role"].as_str()), (Some("watcher"), Some("viewer")));
    assert!(me.get("secret").is_none() && me.get("hash").is_none(), "{me}");

    // Checks are recorded per second; peeks are not.
    for _ in 0..3 {
        server.check(json!({"key": "k1", "policy": "from_file"})).await;
    }
    server.check(json!({"key": "k2", "policy": "from_file"})).await;
    server.check(json!({"key": "k1", "policy": "from_file", "cost": 0})).await;
    let r = get(&server, "/v1/admin/live/policies/from_file", None).await;
    assert_eq!(r.status(), 401);
    let r = get(&server, "/v1/admin/live/policies/from_file", Some(&viewer)).await;
    assert_eq!(r.status(), 200);
    let live: Value = r.json().await.unwrap();
    let sum =
        |series: &str| live[series].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum::<u64>();
    assert_eq!(live["allowed"].as_array().unwrap().len(), 900);
    assert_eq!((sum("allowed"), sum("denied")), (3, 1), "{live}");
    let nearest = live["nearest"].as_array().unwrap();
    assert_eq!(nearest[0]["key"], "k1", "{live}");
    assert_eq!((nearest[0]["remaining"].as_u64(), nearest[0]["limit"].as_u64()), (Some(0), Some(2)));
    assert_eq!(nearest[0]["rule"], "hourly");
    assert!(nearest[0]["reset_in_ms"].as_u64().unwrap() > 3_500_000);
    assert_eq!((nearest[1]["key"].as_str(), nearest[1]["remaining"].as_u64()), (Some("k2"), Some(1)));
    assert_eq!(live["bounds"], json!({"window_secs": 900, "top_keys": 20, "max_policies": 256}));

    // A token limited to some apps sees the live data of those apps' policies only.
    let create = |name: &str, app: &str| {
        server
            .client
            .post(server.url("/v1/admin/policies"))
            .bearer_auth(&admin)
            .json(&json!({"name": name, "apps": [app], "rules": [{"algorithm": "fixed_window", "limit": 5, "period": "1m"}]}))
            .send()
    };
    assert_eq!(create("shop-api", "shop").await.unwrap().status(), 201);
    assert_eq!(create("blog-api", "blog").await.unwrap().status(), 201);
    let database = format!("sqlite://{}", dir.path().join("console.db").display());
    let shop = bootstrap_token(&database, "shopper", "viewer", Some("shop"));
    let me: Value = get(&server, "/v1/admin/me", Some(&shop)).await.json().await.unwrap();
    assert_eq!(me["apps"], json!(["shop"]));
    assert_eq!(get(&server, "/v1/admin/live/policies/shop-api", Some(&shop)).await.status(), 200);
    assert_eq!(get(&server, "/v1/admin/live/policies/blog-api", Some(&shop)).await.status(), 404);
    assert_eq!(get(&server, "/v1/admin/live/policies/blog-api", Some(&admin)).await.status(), 200);

    // A known policy without traffic: empty series; an unknown one: 404 problem+json.
    let r = get(&server, "/v1/admin/live/policies/consumer", Some(&admin)).await;
    assert_eq!(r.status(), 200);
    let r = get(&server, "/v1/admin/live/policies/nope", Some(&admin)).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

/// What the browser tests need, or why they cannot run.
fn browser_setup() -> Result<(PathBuf, String), String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("node is not installed (apt-get install nodejs npm)".into());
    }
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !std::path::Path::new(&chromium).exists() {
        return Err(format!("{chromium} is missing (apt-get install chromium)"));
    }
    if !dir.join("node_modules/playwright-core/package.json").exists() {
        return Err(format!("playwright-core is missing (npm ci --prefix {})", dir.display()));
    }
    Ok((dir, chromium))
}

/// `CI` set (and not `false` or `0`): missing browser tools fail the test instead of skipping it.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

#[tokio::test]
async fn the_console_works_in_a_real_browser() {
    let (dir, chromium) = match browser_setup() {
        Ok(found) => found,
        Err(why) if !in_ci() => {
            eprintln!("SKIPPED the browser tests: {why} (scripts/test installs it; with CI set this fails)");
            return;
        }
        Err(why) => panic!("the browser tests cannot run: {why}"),
    };
    // The consumer step counts three calls in one clock hour.
    inside_window(3600, 120).await;
    let (server, admin, viewer, _db) = setup().await;
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shots = shots.canonicalize().unwrap();
    let run = tokio::process::Command::new("node")
        .arg(dir.join("console.mjs"))
        .current_dir(&dir)
        .env("TOLLGATE_URL", &server.base)
        .env("ADMIN_TOKEN", &admin)
        .env("VIEWER_TOKEN", &viewer)
        .env("SCREENSHOT_DIR", &shots)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser tests finish within 4 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "the browser tests failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.logs()
    );
    assert!(stdout.contains("ok - all steps passed"), "{stdout}");
    for line in stdout.lines().filter(|l| l.starts_with("screenshot ")) {
        let path = line.trim_start_matches("screenshot ");
        assert!(std::path::Path::new(path).exists(), "{path}");
    }
}
