//! A catalogue of bad requests against the real binary: every one is answered 4xx with an RFC
//! 9457 `application/problem+json` body (`type`, `title`, `status` equal to the HTTP status, a
//! non-empty `detail`) and, when one field is at fault, `field` naming it; none is a 5xx, and the
//! server keeps answering afterwards. The limits just inside the bounds are accepted.

mod common;

use common::Tollgate;
use serde_json::json;

/// One bad request: name, method and path, content type, body, expected status, and the field
/// the problem must name (`None`: the problem has no `field`).
type Case = (&'static str, &'static str, Option<&'static str>, String, u16, Option<&'static str>);

const JSON: Option<&str> = Some("application/json");

/// A fixed-window rule of `limit` per hour, as JSON text.
fn window(limit: u64) -> String {
    format!(r#"{{"algorithm": "fixed_window", "limit": {limit}, "period": "1h"}}"#)
}

/// A `/v1/check` body with one inline rule given as JSON text.
fn one_rule(rule: &str) -> String {
    format!(r#"{{"key": "k", "limits": [{rule}]}}"#)
}

fn rules(n: u64) -> String {
    let rules: Vec<String> = (1..=n).map(window).collect();
    format!(r#"{{"key": "k", "limits": [{}]}}"#, rules.join(", "))
}

#[rustfmt::skip] // a table: one case a line
fn catalogue() -> Vec<Case> {
    let check = "POST /v1/check";
    let acquire = "POST /v1/acquire";
    let release = "POST /v1/release";
    let reset = "POST /v1/reset";
    let fw = |params: &str| one_rule(&format!(r#"{{"algorithm": "fixed_window", {params}}}"#));
    let key_513 = format!(r#"{{"key": "{}", "policy": "default"}}"#, "k".repeat(513));
    let key_514_utf8 = format!(r#"{{"key": "{}", "policy": "default"}}"#, "é".repeat(257));
    let name_200 = one_rule(&format!(
        r#"{{"name": "{}", "algorithm": "fixed_window", "limit": 1, "period": "1h"}}"#,
        "n".repeat(200)
    ));
    let over_64k = format!(r#"{{"key": "k", "policy": "default"}}{}"#, " ".repeat(64 * 1024));
    vec![
        // The body is not a JSON object.
        ("not JSON", check, JSON, s("key=k&policy=default"), 400, None),
        ("truncated JSON", check, JSON, s(r#"{"key": "k", "policy": "def"#), 400, None),
        ("trailing garbage", check, JSON, s(r#"{"key": "k", "policy": "default"} x"#), 400, None),
        ("two objects", check, JSON, s(r#"{"key": "k", "policy": "default"}{}"#), 400, None),
        ("JSON array, empty", check, JSON, s("[]"), 400, Some("body")),
        // serde reads structs from sequences too: a positional array must not pass for an object.
        ("JSON array, positional", check, JSON, s(r#"["k", "default"]"#), 400, Some("body")),
        ("JSON array, positional, to acquire", acquire, JSON, s(r#"["k", "uploads"]"#), 400, Some("body")),
        ("JSON array, positional, to reset", reset, JSON, s(r#"["k", "default"]"#), 400, Some("body")),
        ("JSON number", check, JSON, s("42"), 400, Some("body")),
        ("JSON string", check, JSON, s(r#""k""#), 400, Some("body")),
        ("JSON null", check, JSON, s("null"), 400, Some("body")),
        ("empty body", check, JSON, s(""), 400, None),
        ("lone surrogate escape", check, JSON, s(r#"{"key": "\udc00", "policy": "default"}"#), 400, None),
        // The key.
        ("missing key", check, JSON, s(r#"{"policy": "default"}"#), 400, Some("key")),
        ("empty key", check, JSON, s(r#"{"key": "", "policy": "default"}"#), 400, Some("key")),
        ("key of 513 bytes", check, JSON, key_513, 400, Some("key")),
        ("key of 257 two-byte chars", check, JSON, key_514_utf8, 400, Some("key")),
        ("key as number", check, JSON, s(r#"{"key": 42, "policy": "default"}"#), 400, Some("key")),
        ("key null", check, JSON, s(r#"{"key": null, "policy": "default"}"#), 400, Some("key")),
        ("key twice", check, JSON, s(r#"{"key": "a", "key": "b", "policy": "default"}"#), 400, Some("key")),
        // Top-level fields.
        ("unknown top-level field", check, JSON, s(r#"{"key": "k", "policy": "default", "kye": 1}"#), 400, Some("kye")),
        ("policy and limits", check, JSON, format!(r#"{{"key": "k", "policy": "default", "limits": [{}]}}"#, window(1)), 400, Some("limits")),
        ("neither policy nor limits", check, JSON, s(r#"{"key": "k"}"#), 400, Some("policy")),
        ("unknown policy", check, JSON, s(r#"{"key": "k", "policy": "nope"}"#), 404, Some("policy")),
        ("policy as number", check, JSON, s(r#"{"key": "k", "policy": 1}"#), 400, Some("policy")),
        ("limits an object", check, JSON, format!(r#"{{"key": "k", "limits": {}}}"#, window(1)), 400, Some("limits")),
        ("limits empty", check, JSON, s(r#"{"key": "k", "limits": []}"#), 400, Some("limits")),
        ("17 rules", check, JSON, rules(17), 400, Some("limits")),
        // Rules.
        ("unknown algorithm", check, JSON, one_rule(r#"{"algorithm": "leaky_bucket", "limit": 1, "period": "1h"}"#), 400, Some("limits[0].algorithm")),
        ("algorithm as number", check, JSON, one_rule(r#"{"algorithm": 0, "limit": 1, "period": "1h"}"#), 400, Some("limits[0].algorithm")),
        ("missing algorithm", check, JSON, one_rule(r#"{"limit": 1, "period": "1h"}"#), 400, Some("limits[0].algorithm")),
        ("rule not an object", check, JSON, one_rule("5"), 400, Some("limits[0]")),
        ("unknown rule parameter", check, JSON, fw(r#""limit": 1, "period": "1h", "perod": "2h""#), 400, Some("limits[0].perod")),
        ("missing gcra burst", check, JSON, one_rule(r#"{"algorithm": "gcra", "limit": 1, "period": "1s"}"#), 400, Some("limits[0].burst")),
        ("limit 0", check, JSON, fw(r#""limit": 0, "period": "1h""#), 400, Some("limits[0].limit")),
        ("limit -1", check, JSON, fw(r#""limit": -1, "period": "1h""#), 400, Some("limits[0].limit")),
        ("limit 1.5", check, JSON, fw(r#""limit": 1.5, "period": "1h""#), 400, Some("limits[0].limit")),
        ("limit as string", check, JSON, fw(r#""limit": "1", "period": "1h""#), 400, Some("limits[0].limit")),
        ("limit 10^13", check, JSON, fw(r#""limit": 10000000000000, "period": "1h""#), 400, Some("limits[0].limit")),
        ("period \"soon\"", check, JSON, fw(r#""limit": 1, "period": "soon""#), 400, Some("limits[0].period")),
        ("period \"0s\"", check, JSON, fw(r#""limit": 1, "period": "0s""#), 400, Some("limits[0].period")),
        ("period 0", check, JSON, fw(r#""limit": 1, "period": 0"#), 400, Some("limits[0].period")),
        ("period \"400d\"", check, JSON, fw(r#""limit": 1, "period": "400d""#), 400, Some("limits[0].period")),
        ("period \"1500ns\"", check, JSON, fw(r#""limit": 1, "period": "1500ns""#), 400, Some("limits[0].period")),
        ("align \"sometimes\"", check, JSON, fw(r#""limit": 1, "period": "1h", "align": "sometimes""#), 400, Some("limits[0].align")),
        ("sliding_window_log limit 20000", check, JSON, one_rule(r#"{"algorithm": "sliding_window_log", "limit": 20000, "period": "1h"}"#), 400, Some("limits[0].limit")),
        ("duplicate rules", check, JSON, format!(r#"{{"key": "k", "limits": [{}, {{"name": "again", "algorithm": "fixed_window", "limit": 1, "period": "1h"}}]}}"#, window(1)), 400, Some("limits[1]")),
        ("gcra burst 0", check, JSON, one_rule(r#"{"algorithm": "gcra", "limit": 10, "period": "1s", "burst": 0}"#), 400, Some("limits[0].burst")),
        ("token_bucket refill 0", check, JSON, one_rule(r#"{"algorithm": "token_bucket", "capacity": 10, "refill": 0, "per": "1s"}"#), 400, Some("limits[0].refill")),
        ("token_bucket too slow to be exact", check, JSON, one_rule(r#"{"algorithm": "token_bucket", "capacity": 1000000000000, "refill": 1, "per": "1y"}"#), 400, Some("limits[0]")),
        ("rule name of 200 bytes", check, JSON, name_200, 400, Some("limits[0].name")),
        ("rule name a number", check, JSON, fw(r#""limit": 1, "period": "1h", "name": 7"#), 400, Some("limits[0].name")),
        // Cost.
        ("cost -1", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": -1}"#), 400, Some("cost")),
        ("cost \"1\"", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": "1"}"#), 400, Some("cost")),
        // 1.0 is the integer 1 (JSON Schema says so, and clients generated from the OpenAPI
        // document may send it); 1.5 is not a count.
        ("cost 1.5", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": 1.5}"#), 400, Some("cost")),
        ("cost above capacity", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": 11}"#), 400, Some("cost")),
        ("cost 10^13", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": 10000000000000}"#), 400, Some("cost")),
        ("cost 2^64", check, JSON, s(r#"{"key": "k", "policy": "default", "cost": 18446744073709551616}"#), 400, Some("cost")),
        // Concurrency and leases.
        ("concurrency rule in /v1/check", check, JSON, one_rule(r#"{"algorithm": "concurrency", "limit": 2, "lease": "30s"}"#), 400, Some("limits")),
        ("concurrency policy in /v1/check", check, JSON, s(r#"{"key": "k", "policy": "uploads"}"#), 400, Some("policy")),
        ("acquire without a concurrency rule", acquire, JSON, s(r#"{"key": "k", "policy": "default"}"#), 400, Some("policy")),
        ("acquire unknown policy", acquire, JSON, s(r#"{"key": "k", "policy": "nope"}"#), 404, Some("policy")),
        ("acquire limit without lease", acquire, JSON, s(r#"{"key": "k", "limit": 2}"#), 400, Some("lease")),
        ("acquire neither policy nor limit", acquire, JSON, s(r#"{"key": "k"}"#), 400, Some("policy")),
        ("acquire policy and limit", acquire, JSON, s(r#"{"key": "k", "policy": "uploads", "limit": 2}"#), 400, Some("limit")),
        ("acquire limit 0", acquire, JSON, s(r#"{"key": "k", "limit": 0, "lease": "30s"}"#), 400, Some("limit")),
        ("acquire limit 20000", acquire, JSON, s(r#"{"key": "k", "limit": 20000, "lease": "30s"}"#), 400, Some("limit")),
        ("acquire lease \"soon\"", acquire, JSON, s(r#"{"key": "k", "limit": 2, "lease": "soon"}"#), 400, Some("lease")),
        ("acquire cost above the concurrency limit", acquire, JSON, s(r#"{"key": "k", "policy": "uploads", "cost": 3}"#), 400, Some("cost")),
        ("acquire with limits", acquire, JSON, format!(r#"{{"key": "k", "limits": [{}]}}"#, window(1)), 400, Some("limits")),
        ("release bad lease_id", release, JSON, s(r#"{"key": "k", "policy": "uploads", "lease_id": "x y"}"#), 400, Some("lease_id")),
        ("release empty lease_id", release, JSON, s(r#"{"key": "k", "policy": "uploads", "lease_id": ""}"#), 400, Some("lease_id")),
        ("release lease_id of 65 chars", release, JSON, format!(r#"{{"key": "k", "policy": "uploads", "lease_id": "{}"}}"#, "a".repeat(65)), 400, Some("lease_id")),
        ("release lease_id missing", release, JSON, s(r#"{"key": "k", "policy": "uploads"}"#), 400, Some("lease_id")),
        ("release cost 0", release, JSON, s(r#"{"key": "k", "policy": "uploads", "lease_id": "abc", "cost": 0}"#), 400, Some("cost")),
        ("release without a concurrency rule", release, JSON, s(r#"{"key": "k", "policy": "default", "lease_id": "abc"}"#), 400, Some("policy")),
        // Reset.
        ("reset neither policy nor limits", reset, JSON, s(r#"{"key": "k"}"#), 400, Some("policy")),
        ("reset empty key", reset, JSON, s(r#"{"key": "", "policy": "default"}"#), 400, Some("key")),
        ("reset unknown policy", reset, JSON, s(r#"{"key": "k", "policy": "nope"}"#), 404, Some("policy")),
        ("reset with cost", reset, JSON, s(r#"{"key": "k", "policy": "default", "cost": 1}"#), 400, Some("cost")),
        // HTTP.
        ("body over 64 KiB", check, JSON, over_64k, 413, None),
        ("content-type text/plain", check, Some("text/plain"), s(r#"{"key": "k", "policy": "default"}"#), 415, None),
        ("content-type form", check, Some("application/x-www-form-urlencoded"), s("key=k&policy=default"), 415, None),
        ("no content-type", check, None, s(r#"{"key": "k", "policy": "default"}"#), 415, None),
        ("GET /v1/check", "GET /v1/check", None, s(""), 405, None),
        ("PUT /v1/acquire", "PUT /v1/acquire", JSON, s(r#"{"key": "k", "policy": "uploads"}"#), 405, None),
        ("POST /healthz", "POST /healthz", JSON, s("{}"), 405, None),
        ("DELETE /v1/reset", "DELETE /v1/reset", None, s(""), 405, None),
        ("unknown route", "POST /nope", JSON, s("{}"), 404, None),
        ("unknown route, GET", "GET /v2/check", None, s(""), 404, None),
    ]
}

/// Sends one case; answers the status, the content type and the body text.
async fn send(server: &Tollgate, case: &Case) -> (u16, Option<String>, String) {
    let (_, route, content_type, body, _, _) = case;
    let (method, path) = route.split_once(' ').expect("routes are \"METHOD /path\"");
    let method: reqwest::Method = method.parse().unwrap();
    let mut req = server.client.request(method, server.url(path));
    if let Some(ct) = content_type {
        req = req.header("content-type", *ct);
    }
    if !body.is_empty() {
        req = req.body(body.clone());
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("{}: {e}", case.0));
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    (status, ct, r.text().await.unwrap())
}

/// What is wrong with the answer to `case`, if anything.
fn mismatch(case: &Case, status: u16, content_type: Option<&str>, text: &str) -> Option<String> {
    let (name, route, _, _, expected_status, expected_field) = case;
    let mut wrong = Vec::new();
    if status != *expected_status {
        return Some(format!(
            "{name} ({route}): status {status}, expected {expected_status}\n    answer: {text}"
        ));
    }
    if let Some(body) = common::problem_shape(status, content_type, text, &mut wrong) {
        // The problem type is the documented anchor for the status.
        let slug = match (*expected_status, expected_field) {
            (400, None) => "malformed-body",
            (400, Some(_)) => "invalid-request",
            (404, Some(_)) => "unknown-policy",
            (404, None) => "not-found",
            (405, _) => "method-not-allowed",
            (413, _) => "body-too-large",
            (415, _) => "unsupported-media-type",
            _ => "",
        };
        let kind = body["type"].as_str().unwrap_or_default();
        if !kind.starts_with("http") || !kind.ends_with(&format!("#{slug}")) {
            wrong.push(format!("type {kind:?} is not the #{slug} anchor"));
        }
        let field = body.get("field").map(|f| f.as_str().unwrap_or("<not a string>"));
        if field != *expected_field {
            wrong.push(format!("field {field:?}, expected {expected_field:?}"));
        }
    }
    (!wrong.is_empty()).then(|| format!("{name} ({route}): {}\n    answer: {text}", wrong.join("; ")))
}

#[tokio::test]
async fn every_bad_request_gets_a_problem_naming_its_field() {
    let cases = catalogue();
    assert!(cases.len() >= 35, "{} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names are unique");

    let server = Tollgate::start_builtin(&[]).await;
    let mut failures = Vec::new();
    for case in &cases {
        let (status, content_type, text) = send(&server, case).await;
        if let Some(m) = mismatch(case, status, content_type.as_deref(), &text) {
            failures.push(m);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad requests were not answered as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn no_bad_request_is_a_server_error_and_the_server_keeps_answering() {
    let server = Tollgate::start_builtin(&[]).await;
    let mut cases = catalogue();
    // Odd input beyond the catalogue: only "not a 5xx" is asserted for these.
    let extra: Vec<Case> = vec![
        ("deep nesting", "POST /v1/check", JSON, "[".repeat(10_000), 400, None),
        (
            "deep nesting in limits",
            "POST /v1/check",
            JSON,
            format!(r#"{{"key": "k", "limits": {}}}"#, "[".repeat(5_000)),
            400,
            None,
        ),
        (
            "huge number",
            "POST /v1/check",
            JSON,
            format!(r#"{{"key": "k", "policy": "default", "cost": 1{}}}"#, "0".repeat(400)),
            400,
            None,
        ),
        (
            "NUL in key",
            "POST /v1/check",
            JSON,
            s(
                r#"{"key": "a\u0000b", "limits": [{"algorithm": "gcra", "limit": 1, "period": "1y", "burst": 1}]}"#,
            ),
            200,
            None,
        ),
        (
            "lone surrogate in key",
            "POST /v1/check",
            JSON,
            s(r#"{"key": "\ud800", "policy": "default"}"#),
            400,
            None,
        ),
        (
            "control characters in rule name",
            "POST /v1/check",
            JSON,
            s(
                r#"{"key": "k", "limits": [{"name": "a\"b\n\\c;d=e, f", "algorithm": "fixed_window", "limit": 1, "period": "1h"}]}"#,
            ),
            200,
            None,
        ),
        (
            "non-ASCII rule name",
            "POST /v1/check",
            JSON,
            s(
                r#"{"key": "k", "limits": [{"name": "débit ⏱", "algorithm": "fixed_window", "limit": 2, "period": "1h"}]}"#,
            ),
            200,
            None,
        ),
        (
            "period 1y",
            "POST /v1/check",
            JSON,
            s(
                r#"{"key": "k", "limits": [{"algorithm": "sliding_window_counter", "limit": 1000000000000, "period": "1y"}]}"#,
            ),
            200,
            None,
        ),
        (
            "gcra largest exact",
            "POST /v1/check",
            JSON,
            s(
                r#"{"key": "k", "limits": [{"algorithm": "gcra", "limit": 1000000000000, "period": "1ms", "burst": 1000000000000}]}"#,
            ),
            400,
            None,
        ),
        (
            "release on a fresh key",
            "POST /v1/release",
            JSON,
            s(r#"{"key": "fresh", "limit": 1, "lease": "1ms", "lease_id": "abc", "cost": 10000}"#),
            200,
            None,
        ),
        (
            "content-type with parameters",
            "POST /v1/check",
            Some("application/json; charset=utf-8; x=\"y\""),
            s(r#"{"key": "k", "policy": "default"}"#),
            200,
            None,
        ),
        (
            "content-type garbage",
            "POST /v1/check",
            Some(";;;"),
            s(r#"{"key": "k", "policy": "default"}"#),
            415,
            None,
        ),
    ];
    cases.extend(extra);
    let mut errors = Vec::new();
    for case in &cases {
        let (status, _, text) = send(&server, case).await;
        if status >= 500 {
            errors.push(format!("{} ({}): {status} {text}", case.0, case.1));
        }
    }
    // Bytes that are not UTF-8 at all.
    for body in [&b"{\"key\": \"\xff\xfe\", \"policy\": \"default\"}"[..], b"\xff", b"\x00\x00\x00\x00"] {
        let r = server.post_raw("/v1/check", Some("application/json"), body.to_vec()).await;
        let status = r.status().as_u16();
        let content_type = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        let text = r.text().await.unwrap();
        let case: Case = ("not UTF-8", "POST /v1/check", JSON, String::new(), 400, None);
        if let Some(m) = mismatch(&case, status, content_type.as_deref(), &text) {
            errors.push(format!("{body:?}: {m}"));
        }
    }
    assert!(errors.is_empty(), "server errors:\n{}\n\nlogs:\n{}", errors.join("\n"), server.logs());

    let (status, _) = server.get_text("/healthz").await;
    assert_eq!(status, 200);
    let (status, body) = server.check(json!({"key": "after-the-catalogue", "policy": "login"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["remaining"], 2, "{body}");
    let (status, text) = server.get_text("/metrics").await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn values_at_the_bounds_are_accepted() {
    // The built-in configuration with a state budget that fits the engine's largest inline rules
    // (a log or a concurrency limit of 10,000: up to 2.9 MB per key); under the default budget
    // they are refused (tests/state_budget.rs).
    let builtin =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tollgate.example.toml")).unwrap();
    assert!(builtin.contains("max_request_state = 262144"));
    let config = builtin.replace("max_request_state = 262144", "max_request_state = 4194304");
    let server = Tollgate::start(&config, &[]).await;
    let rule_of_name = |len: usize| {
        one_rule(&format!(
            r#"{{"name": "{}", "algorithm": "fixed_window", "limit": 1, "period": "1h"}}"#,
            "n".repeat(len)
        ))
    };
    let accepted: Vec<(&str, &str, String)> = vec![
        (
            "key of 512 bytes",
            "/v1/check",
            format!(r#"{{"key": "{}", "policy": "default"}}"#, "k".repeat(512)),
        ),
        (
            "key of 256 two-byte chars",
            "/v1/check",
            format!(r#"{{"key": "{}", "policy": "default"}}"#, "é".repeat(256)),
        ),
        ("16 rules", "/v1/check", rules(16)),
        ("rule name of 128 bytes", "/v1/check", rule_of_name(128)),
        (
            "limit 10^12",
            "/v1/check",
            one_rule(r#"{"algorithm": "fixed_window", "limit": 1000000000000, "period": "1h"}"#),
        ),
        (
            "sliding_window_log limit 10000",
            "/v1/check",
            one_rule(r#"{"algorithm": "sliding_window_log", "limit": 10000, "period": "1h"}"#),
        ),
        (
            "period 1ms",
            "/v1/check",
            one_rule(r#"{"algorithm": "fixed_window", "limit": 1, "period": "1ms"}"#),
        ),
        ("period 1y", "/v1/check", one_rule(r#"{"algorithm": "fixed_window", "limit": 1, "period": "1y"}"#)),
        (
            "period in milliseconds",
            "/v1/check",
            one_rule(r#"{"algorithm": "fixed_window", "limit": 1, "period": 3600000}"#),
        ),
        (
            "align first_hit",
            "/v1/check",
            one_rule(r#"{"algorithm": "fixed_window", "limit": 1, "period": "1h", "align": "first_hit"}"#),
        ),
        ("cost equal to capacity", "/v1/check", s(r#"{"key": "capacity", "policy": "default", "cost": 10}"#)),
        ("cost 0", "/v1/check", s(r#"{"key": "k", "policy": "default", "cost": 0}"#)),
        (
            "body just under 64 KiB",
            "/v1/check",
            format!(r#"{{"key": "k", "policy": "login"}}{}"#, " ".repeat(64 * 1024 - 100)),
        ),
        (
            "acquire concurrency limit 10000",
            "/v1/acquire",
            s(r#"{"key": "k", "limit": 10000, "lease": "1s"}"#),
        ),
        (
            "release cost 10000",
            "/v1/release",
            s(r#"{"key": "k", "limit": 10000, "lease": "1s", "lease_id": "abc", "cost": 10000}"#),
        ),
        (
            "release lease_id of 64 chars",
            "/v1/release",
            format!(r#"{{"key": "k", "policy": "uploads", "lease_id": "{}"}}"#, "a-_Z9".repeat(12) + "abcd"),
        ),
    ];
    for (i, (name, path, body)) in accepted.into_iter().enumerate() {
        // A key of its own per case: rules alike share state whatever their names.
        let body = body.replacen(r#""key": "k""#, &format!(r#""key": "bound-{i}""#), 1);
        let r = server.post_raw(path, Some("application/json"), body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "{name}: {text}");
    }
    // 16 rules are also fine for a reset, and a content type with parameters is JSON.
    let r = server.post_raw("/v1/reset", Some("application/json; charset=utf-8"), rules(16)).await;
    assert_eq!(r.status().as_u16(), 204);
    let r = server
        .post_raw("/v1/check", Some("application/problem+json"), r#"{"key": "k", "policy": "login"}"#)
        .await;
    assert_eq!(r.status().as_u16(), 200, "any application/*+json is JSON");
}

fn s(t: &str) -> String {
    t.to_owned()
}

#[tokio::test]
async fn method_not_allowed_lists_the_allowed_methods() {
    let server = Tollgate::start_builtin(&[]).await;
    for (method, path, allowed) in [
        (reqwest::Method::GET, "/v1/check", "POST"),
        (reqwest::Method::DELETE, "/v1/release", "POST"),
        (reqwest::Method::POST, "/healthz", "GET"),
        (reqwest::Method::PUT, "/metrics", "GET"),
    ] {
        let r = server.client.request(method.clone(), server.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method} {path}");
        let allow = r.headers().get("allow").map(|v| v.to_str().unwrap().to_owned());
        let allow = allow.unwrap_or_else(|| panic!("{method} {path}: no Allow header"));
        assert!(allow.split(',').any(|m| m.trim() == allowed), "{method} {path}: Allow: {allow}");
        assert!(!allow.split(',').any(|m| m.trim() == method.as_str()), "{method} {path}: Allow: {allow}");
    }
}
