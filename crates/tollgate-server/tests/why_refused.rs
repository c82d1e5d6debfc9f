//! "Why was I refused?": the explain mode of `/v1/check` (each rule's state, counting nothing,
//! for token holders only) and the decision log (a line per refusal, sampled and capped), over
//! the real router with an in-memory policy database.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tollgate_config::Config;
use tollgate_core::MemoryBackend;
use tollgate_limiter::Limiter;
use tollgate_server::{AppState, router};
use tollgate_store::{Actor, Role, Store};
use tower::ServiceExt as _;

const CONFIG: &str = r#"
[policies.api]
rules = [
  { name = "hourly", algorithm = "fixed_window", limit = 3, period = "1h" },
  { algorithm = "sliding_window_log", limit = 100, period = "1h" },
]

[policies.trial]
mode = "shadow"
rules = [{ name = "daily", algorithm = "fixed_window", limit = 1, period = "1d" }]
"#;

struct Server {
    app: Router,
    state: AppState,
    /// An unrestricted viewer's token, and one limited to the app "shop".
    viewer: String,
    shopper: String,
    admin: String,
}

async fn server(config: &str) -> Server {
    let config = Config::from_toml(config, "test.toml").unwrap();
    let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", config.limiter_settings());
    let store = Store::connect("sqlite::memory:").await.unwrap();
    let token = |name: &'static str, role, apps: Option<Vec<String>>| {
        let store = store.clone();
        async move { store.create_token(Actor::operator("test"), name, role, apps).await.unwrap().1 }
    };
    let viewer = token("viewer", Role::Viewer, None).await;
    let shopper = token("shopper", Role::Viewer, Some(vec!["shop".into()])).await;
    let admin = token("ops", Role::Admin, None).await;
    let state = AppState::new(limiter, config).with_store(store).await.unwrap();
    Server { app: router(state.clone()), state, viewer, shopper, admin }
}

impl Server {
    /// POSTs `body` to `uri` with the headers given; the status, the headers and the body.
    async fn post(&self, uri: &str, headers: &[(&str, &str)], body: Value) -> (StatusCode, Value) {
        let mut request = Request::post(uri).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response =
            self.app.clone().oneshot(request.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn check(&self, body: Value) -> (StatusCode, Value) {
        self.post("/v1/check", &[], body).await
    }

    async fn explain(&self, token: &str, body: Value) -> (StatusCode, Value) {
        let auth = format!("Bearer {token}");
        self.post("/v1/check?explain=1", &[("authorization", &auth)], body).await
    }
}

#[tokio::test]
async fn explaining_needs_a_token_and_says_so_before_reading_the_body() {
    let s = server(CONFIG).await;
    let body = json!({"key": "k", "policy": "api"});
    for (uri, headers) in [
        ("/v1/check?explain=1", vec![]),
        ("/v1/check?explain=true", vec![]),
        ("/v1/check", vec![("tollgate-explain", "1")]),
        ("/v1/check?explain=1", vec![("authorization", "Bearer tg_not_a_token")]),
        ("/v1/check?explain=1", vec![("authorization", "Basic dXNlcjpwYXNz")]),
    ] {
        let (status, problem) = s.post(uri, &headers, body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} {headers:?}: {problem}");
        assert_eq!(problem["type"].as_str().unwrap().rsplit('#').next(), Some("unauthorized"));
        assert!(problem["detail"].as_str().unwrap().contains("token"), "{problem}");
    }
    // A stranger learns nothing of the body's mistakes either.
    let (status, _) = s.post("/v1/check?explain=1", &[], json!({"nonsense": true})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A flag that is neither yes nor no is a mistake, named.
    let (status, problem) = s.post("/v1/check?explain=maybe", &[], body.clone()).await;
    assert_eq!((status, problem["field"].as_str()), (StatusCode::BAD_REQUEST, Some("explain")));
    // explain=0 is an ordinary check, token or not.
    let (status, decision) = s.post("/v1/check?explain=0", &[], body.clone()).await;
    assert_eq!((status, decision["remaining"].as_u64()), (StatusCode::OK, Some(2)));
    assert!(decision.get("explain").is_none());
}

#[tokio::test]
async fn an_explanation_names_the_refusing_rule_and_counts_nothing() {
    let s = server(CONFIG).await;
    let bob = json!({"key": "bob", "policy": "api"});
    // Explained any number of times, bob's count does not move.
    for _ in 0..5 {
        let (status, e) = s.explain(&s.viewer, bob.clone()).await;
        assert_eq!(status, StatusCode::OK, "{e}");
        assert_eq!(e["explain"], true);
        assert_eq!((e["allowed"].as_bool(), e["rules"][0]["remaining"].as_u64()), (Some(true), Some(3)));
        assert_eq!(e["refused_by"], json!([]));
    }
    for _ in 0..3 {
        assert_eq!(s.check(bob.clone()).await.0, StatusCode::OK);
    }
    let (status, refused) = s.check(bob.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    let (status, e) = s.explain(&s.viewer, bob.clone()).await;
    assert_eq!(status, StatusCode::OK, "an explanation is not a refusal");
    assert_eq!(e["allowed"], false);
    assert_eq!(e["refused_by"], json!(["hourly"]), "{e}");
    assert_eq!(
        (e["policy"].as_str(), e["mode"].as_str(), e["key"].as_str()),
        (Some("api"), Some("enforce"), Some("bob"))
    );
    let hourly = &e["rules"][0];
    assert_eq!(
        (hourly["allowed"].as_bool(), hourly["limit"].as_u64(), hourly["remaining"].as_u64()),
        (Some(false), Some(3), Some(0))
    );
    assert!(hourly["retry_after_ms"].as_u64().unwrap() > 0);
    // The second rule, unnamed, is named as the decision names it, and admits.
    assert_eq!(e["rules"][1]["name"], refused["rules"][1]["name"]);
    assert_eq!(
        (e["rules"][1]["name"].as_str(), e["rules"][1]["allowed"].as_bool()),
        (Some("sliding_window_log.1"), Some(true))
    );
    assert_eq!(e["rules"][1]["remaining"].as_u64(), Some(97));

    // A cost is explained as asked: 2 units of carol's 3 fit, then not 2 of the 1 left.
    let carol = |cost: u64| json!({"key": "carol", "policy": "api", "cost": cost});
    assert_eq!(s.explain(&s.viewer, carol(2)).await.1["allowed"], true);
    assert_eq!(s.check(carol(2)).await.0, StatusCode::OK);
    let (_, e) = s.explain(&s.viewer, carol(2)).await;
    assert_eq!((e["allowed"].as_bool(), e["rules"][0]["remaining"].as_u64()), (Some(false), Some(1)));
    assert_eq!(e["refused_by"], json!(["hourly"]));
    assert_eq!(s.explain(&s.viewer, carol(1)).await.1["allowed"], true);
    // A check's mistakes are an explanation's too.
    let (status, problem) = s.explain(&s.viewer, carol(4)).await;
    assert_eq!((status, problem["field"].as_str()), (StatusCode::BAD_REQUEST, Some("cost")));
    let (status, _) = s.explain(&s.viewer, json!({"key": "x", "policy": "nope"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Shadow mode: would be refused, but let through.
    let dan = json!({"key": "dan", "policy": "trial"});
    assert_eq!(s.check(dan.clone()).await.0, StatusCode::OK);
    let (_, e) = s.explain(&s.viewer, dan).await;
    assert_eq!(
        (e["mode"].as_str(), e["allowed"].as_bool(), e["shadow_denied"].as_bool()),
        (Some("shadow"), Some(true), Some(true))
    );
    assert_eq!(e["refused_by"], json!(["daily"]));

    // Inline rules, and the header instead of the query.
    let inline =
        json!({"key": "erin", "limits": [{"algorithm": "gcra", "limit": 1, "period": "1m", "burst": 1}]});
    assert_eq!(s.check(inline.clone()).await.0, StatusCode::OK);
    let auth = format!("Bearer {}", s.viewer);
    let (status, e) =
        s.post("/v1/check", &[("authorization", &auth), ("tollgate-explain", "1")], inline).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((e["policy"].as_str(), e["refused_by"].clone()), (Some("inline"), json!(["gcra.0"])));
}

#[tokio::test]
async fn consumers_are_explained_by_period() {
    let s = server(CONFIG).await;
    let auth = format!("Bearer {}", s.admin);
    let limit = json!({"per_second": -1, "per_minute": 1, "per_hour": -1, "per_day": 50, "per_week": -1, "per_month": -1});
    let (status, _) = s.post("/v1/admin/consumers/acme/limits", &[("authorization", &auth)], limit).await;
    assert_eq!(status, StatusCode::CREATED);
    let acme = json!({"consumer": "acme"});
    let (status, _) = s.check(acme.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let (_, e) = s.explain(&s.viewer, acme).await;
    assert_eq!((e["policy"].as_str(), e["key"].as_str()), (Some("consumer"), Some("consumer:acme")));
    let names: Vec<&str> =
        e["rules"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["per_minute", "per_day"]);
    // Unless the minute turned since the check, per_minute is spent.
    assert!(e["refused_by"] == json!(["per_minute"]) || e["rules"][0]["remaining"] == 1, "{e}");
    assert_eq!(e["rules"][1]["remaining"].as_u64(), Some(49));
    // A consumer without limits is unlimited: nothing refuses.
    let (_, e) = s.explain(&s.viewer, json!({"consumer": "nobody"})).await;
    assert_eq!((e["allowed"].as_bool(), e["rules"].clone()), (Some(true), json!([])));
}

#[tokio::test]
async fn a_token_of_some_apps_explains_only_their_policies() {
    let s = server(CONFIG).await;
    let auth = format!("Bearer {}", s.admin);
    for (name, apps) in
        [("shop-api", json!(["shop"])), ("blog-api", json!(["blog"])), ("both", json!(["shop", "blog"]))]
    {
        let policy = json!({"name": name, "apps": apps, "rules": [{"algorithm": "fixed_window", "limit": 5, "period": "1h"}]});
        let (status, body) = s.post("/v1/admin/policies", &[("authorization", &auth)], policy).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let key = |policy: &str| json!({"key": "k", "policy": policy});
    let (status, e) = s.explain(&s.shopper, key("shop-api")).await;
    assert_eq!((status, e["rules"][0]["remaining"].as_u64()), (StatusCode::OK, Some(5)));
    for refused in [
        key("blog-api"),
        key("both"),
        key("api"),
        json!({"consumer": "acme"}),
        json!({"key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "period": "1h"}]}),
    ] {
        let (status, problem) = s.explain(&s.shopper, refused.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{refused}: {problem}");
        assert!(problem["detail"].as_str().unwrap().contains("shopper"), "{problem}");
    }
    // Unrestricted tokens explain everything.
    assert_eq!(s.explain(&s.viewer, key("blog-api")).await.0, StatusCode::OK);
}

/// Every log line written by this test binary, as JSON.
fn log_lines() -> &'static Mutex<Vec<u8>> {
    static LINES: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(|| {
        #[derive(Clone, Copy)]
        struct Sink;
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                log_lines().lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber =
            tracing_subscriber::fmt().json().with_env_filter("info").with_writer(move || Sink).finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        Mutex::new(Vec::new())
    })
}

/// The decision log's lines about `policy` so far, their fields.
fn denials(policy: &str) -> Vec<Value> {
    let text = String::from_utf8(log_lines().lock().unwrap().clone()).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "tollgate::decisions" && l["fields"]["policy"] == policy)
        .map(|l| l["fields"].clone())
        .collect()
}

#[tokio::test]
async fn refusals_are_logged_once_each_with_the_hashed_key() {
    let _ = log_lines();
    let s = server(&format!("{CONFIG}\n[policies.logged]\nrules = [{{ name = \"per_hour\", algorithm = \"fixed_window\", limit = 2, period = \"1h\" }}]\n[decision_log]\nenabled = true\n")).await;
    let alice = json!({"key": "alice", "policy": "logged"});
    for _ in 0..2 {
        assert_eq!(s.check(alice.clone()).await.0, StatusCode::OK);
    }
    assert!(denials("logged").is_empty(), "admissions are not logged");
    assert_eq!(s.check(alice.clone()).await.0, StatusCode::TOO_MANY_REQUESTS);
    let lines = denials("logged");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["message"], "request refused");
    assert_eq!(line["rule"], "per_hour");
    // printf %s alice | sha256sum | cut -c1-32
    assert_eq!(line["key"], "sha256:2bd806c97f0e00af1a1fc3328fa763a9");
    assert_eq!(
        (line["limit"].as_u64(), line["remaining"].as_u64(), line["cost"].as_u64()),
        (Some(2), Some(0), Some(1))
    );
    assert!(line["retry_after_ms"].as_u64().unwrap() > 0);
    assert_eq!(
        (line["shadow"].as_bool(), line["degraded"].as_bool(), line["suppressed"].as_u64()),
        (Some(false), Some(false), Some(0))
    );
    // An explanation is no refusal, and is not logged.
    assert_eq!(s.explain(&s.viewer, alice.clone()).await.0, StatusCode::OK);
    assert_eq!(denials("logged").len(), 1);

    // A reload turns it to plain keys, then off.
    let reloaded = |extra: &str| {
        Config::from_toml(&format!("{CONFIG}\n[policies.logged]\nrules = [{{ name = \"per_hour\", algorithm = \"fixed_window\", limit = 2, period = \"1h\" }}]\n{extra}"), "t").unwrap()
    };
    s.state.replace_config(reloaded("[decision_log]\nenabled = true\nkey = \"plain\"\n"));
    assert_eq!(s.check(alice.clone()).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denials("logged").last().unwrap()["key"], "alice");
    s.state.replace_config(reloaded(""));
    assert_eq!(s.check(alice.clone()).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denials("logged").len(), 2, "off after the reload");
}

#[tokio::test]
async fn a_flood_of_refusals_writes_a_bounded_number_of_lines() {
    let _ = log_lines();
    let s = server(&format!("{CONFIG}\n[policies.flood]\nrules = [{{ algorithm = \"fixed_window\", limit = 1, period = \"1h\" }}]\n[decision_log]\nenabled = true\nmax_per_second = 5\n")).await;
    let body = json!({"key": "mallory", "policy": "flood"});
    assert_eq!(s.check(body.clone()).await.0, StatusCode::OK);
    const REFUSALS: u64 = 3000;
    let start = Instant::now();
    for _ in 0..REFUSALS {
        assert_eq!(s.check(body.clone()).await.0, StatusCode::TOO_MANY_REQUESTS);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let lines = denials("flood");
    // The cap is a GCRA of 5 a second, 5 at once: at most 5 + 5 per second elapsed.
    let bound = 5 + (5.0 * elapsed).ceil() as usize;
    assert!(lines.len() >= 5, "the first refusals are written: {}", lines.len());
    assert!(
        lines.len() <= bound,
        "{} lines for {REFUSALS} refusals in {elapsed:.2}s (at most {bound})",
        lines.len()
    );
    // No refusal is lost from the account: each is written or counted as suppressed by a later line.
    let suppressed: u64 = lines.iter().map(|l| l["suppressed"].as_u64().unwrap()).sum();
    assert!(lines.len() as u64 + suppressed <= REFUSALS);
    assert_eq!(lines[0]["rule"], "fixed_window.0");
}

#[tokio::test]
async fn shadow_refusals_are_logged_as_such_and_sampling_thins_them() {
    let _ = log_lines();
    let s = server(&format!("{CONFIG}\n[policies.shadowed]\nmode = \"shadow\"\nrules = [{{ name = \"one\", algorithm = \"fixed_window\", limit = 1, period = \"1h\" }}]\n[decision_log]\nenabled = true\nsample_rate = 0.25\nmax_per_second = 10000\n")).await;
    let body = json!({"key": "k", "policy": "shadowed"});
    for _ in 0..41 {
        assert_eq!(s.check(body.clone()).await.0, StatusCode::OK);
    }
    let lines = denials("shadowed");
    assert_eq!(lines.len(), 10, "a quarter of the 40 would-be refusals");
    assert!(
        lines.iter().all(|l| l["shadow"] == true && l["message"] == "request would be refused (shadow mode)")
    );
    assert_eq!(lines[1]["suppressed"].as_u64(), Some(3), "the three sampled away before it");
}
