//! Hostile input (issue 9, "Bad input"): a catalogue of named requests over HTTP (the decision
//! API, the Envoy JSON route and the management API) and gRPC (`ShouldRateLimit`), run against
//! the memory backend and against a private Redis. Every bad request gets a 4xx with an RFC 9457
//! problem (gRPC: a non-OK status other than UNKNOWN and INTERNAL; a message that does not parse
//! as protobuf gets INVALID_ARGUMENT, not tonic's INTERNAL); every hostile-but-legal key gets the answer a
//! fresh key gets. Victim keys have spent part of their quota first; after the catalogue their
//! remaining counts are exactly unchanged, and on Redis the set of keys is exactly the one the
//! legal requests should have created. Look-alike keys (`a}b`, `{a}`, `a%7D`, NUL, CRLF, the key
//! prefix, ...) each get state of their own.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::time::Duration;

use common::Tollgate;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// Policies of the file: `victim` is a 10-a-day window starting at the first hit (no clock
/// boundary can reset it during the test).
const CONFIG: &str = r#"
[backend]
on_failure = "closed"
timeout = "5s"

[policies.victim]
rules = [{ name = "daily", algorithm = "fixed_window", limit = 10, period = "1d", align = "first_hit" }]

[policies.pool]
rules = [{ name = "in_flight", algorithm = "concurrency", limit = 2, lease = "30s" }]
"#;

/// Envoy domain `edge`: token buckets of 10 a day (no window boundary either).
const YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 10, algorithm: token_bucket}
  - key: user
    descriptors:
      - key: tier
        rate_limit: {unit: day, requests_per_unit: 10, algorithm: token_bucket}
"#;

const JSON: Option<&str> = Some("application/json");

/// HTTP victims: key, units spent under `victim` before the catalogue.
const HTTP_VICTIMS: [(&str, u64); 2] = [("victim", 4), ("a", 3)];
/// Envoy victims: entries, hits spent before the catalogue.
const ENVOY_VICTIMS: [(&[(&str, &str)], u64); 2] =
    [(&[("remote_address", "victim")], 4), (&[("user", "u"), ("tier", "gold")], 2)];

// ---------------------------------------------------------------------------------------------
// HTTP

/// What an HTTP case must be answered.
#[derive(Clone, Debug)]
enum Expect {
    /// This 4xx, with a problem+json body.
    Problem(u16),
    /// 200 with a decision of a fresh key under `victim` after one unit: `remaining` 9. The key
    /// is named so the Redis key set can be predicted.
    Fresh(String),
    /// 204: a reset of a legal key, which forgets that key's state and no other's.
    Reset(String),
}

struct HttpCase {
    name: String,
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
    expect: Expect,
}

fn case(name: &str, path: &str, body: impl Into<Vec<u8>>, expect: Expect) -> HttpCase {
    HttpCase {
        name: name.to_owned(),
        method: "POST",
        path: path.to_owned(),
        content_type: JSON,
        headers: Vec::new(),
        body: body.into(),
        expect,
    }
}

fn bad(name: &str, path: &str, body: impl Into<Vec<u8>>, status: u16) -> HttpCase {
    case(name, path, body, Expect::Problem(status))
}

/// A `/v1/check` of `key` under `victim`, one unit: must answer as for a fresh key.
fn fresh(name: &str, key: &str) -> HttpCase {
    let body = json!({"key": key, "policy": "victim"}).to_string();
    case(name, "/v1/check", body, Expect::Fresh(key.to_owned()))
}

/// A `/v1/reset` of `key` under `victim`: 204, and it must not reset anyone else.
fn reset(name: &str, key: &str) -> HttpCase {
    case(
        name,
        "/v1/reset",
        json!({"key": key, "policy": "victim"}).to_string(),
        Expect::Reset(key.to_owned()),
    )
}

/// `{"key": "k", "policy": "victim", "cost": <raw>}`.
fn cost(raw: &str) -> String {
    format!(r#"{{"key": "hostile-cost", "policy": "victim", "cost": {raw}}}"#)
}

/// One inline fixed-window rule with `params` spliced in raw.
fn inline(params: &str) -> String {
    format!(r#"{{"key": "hostile-inline", "limits": [{{"algorithm": "fixed_window", {params}}}]}}"#)
}

/// The `/json` (Envoy over HTTP) body for one `remote_address` descriptor with `extra` spliced in.
fn envoy_json(top: &str, descriptor_extra: &str) -> String {
    format!(
        r#"{{"domain": "edge", "descriptors": [{{"entries": [{{"key": "remote_address", "value": "hostile-json"}}]{descriptor_extra}}}]{top}}}"#
    )
}

#[rustfmt::skip] // a table: one case a line
fn http_catalogue() -> Vec<HttpCase> {
    let (check, acquire, release, reset_path, envoy) =
        ("/v1/check", "/v1/acquire", "/v1/release", "/v1/reset", "/json");
    let deep_array = format!(r#"{{"key": "k", "policy": "victim", "cost": {}1{}}}"#, "[".repeat(10_000), "]".repeat(10_000));
    let deep_object = format!("{}1{}", r#"{"k":"#.repeat(10_000), "}".repeat(10_000));
    let deep_limits = format!(r#"{{"key": "k", "limits": {}}}"#, "[".repeat(10_000));
    let over_limit = format!(r#"{{"key": "{}", "policy": "victim"}}"#, "k".repeat(70 * 1024));
    let key_60k = format!(r#"{{"key": "{}", "policy": "victim"}}"#, "v".repeat(60_000));
    let key_513 = format!(r#"{{"key": "victim{}", "policy": "victim"}}"#, "\\u0000".repeat(507));
    let key_511_plus_2 = format!(r#"{{"key": "{}é", "policy": "victim"}}"#, "v".repeat(511));
    let key_many_escapes = format!(r#"{{"key": "{}", "policy": "victim"}}"#, "{}%".repeat(171));
    let long_name = format!(r#"{{"key": "k", "limits": [{{"name": "{}", "algorithm": "fixed_window", "limit": 1, "period": "1h"}}]}}"#, "n".repeat(129));
    let many_descriptors = format!(
        r#"{{"domain": "edge", "descriptors": [{}]}}"#,
        vec![r#"{"entries": [{"key": "remote_address", "value": "x"}]}"#; 65].join(", ")
    );
    let long_value = format!(
        r#"{{"domain": "edge", "descriptors": [{{"entries": [{{"key": "remote_address", "value": "{}"}}]}}]}}"#,
        "v".repeat(257)
    );
    let mut cases = vec![
        // Numbers where `cost` goes: beyond u64 and i64, negative, floats, NaN and Infinity,
        // exponents, strings, other bases.
        bad("cost 2^64", check, cost("18446744073709551616"), 400),
        bad("cost u64::MAX", check, cost("18446744073709551615"), 400),
        bad("cost i64::MAX + 1", check, cost("9223372036854775808"), 400),
        bad("cost 10^12 + 1", check, cost("1000000000001"), 400),
        bad("cost 10^400 spelled out", check, cost(&format!("1{}", "0".repeat(400))), 400),
        bad("cost -1", check, cost("-1"), 400),
        bad("cost i64::MIN - 1", check, cost("-9223372036854775809"), 400),
        bad("cost -0", check, cost("-0"), 400),
        bad("cost 1.5", check, cost("1.5"), 400),
        // `1.0` is the integer 1 (JSON Schema's reading, which the OpenAPI document follows):
        // tollgate-http's extract tests hold that, and that `-0` and `1E-400` stay refused.
        bad("cost NaN", check, cost("NaN"), 400),
        bad("cost Infinity", check, cost("Infinity"), 400),
        bad("cost -Infinity", check, cost("-Infinity"), 400),
        bad("cost 1e400", check, cost("1e400"), 400),
        bad("cost 1e3", check, cost("1e3"), 400),
        bad("cost 1E-400", check, cost("1E-400"), 400),
        bad("cost \"1\"", check, cost(r#""1""#), 400),
        bad("cost \"NaN\"", check, cost(r#""NaN""#), 400),
        bad("cost 0x10", check, cost("0x10"), 400),
        bad("cost true", check, cost("true"), 400),
        bad("cost [1]", check, cost("[1]"), 400),
        // Numbers in rules.
        bad("limit 2^64", check, inline(r#""limit": 18446744073709551616, "period": "1h""#), 400),
        bad("limit -5", check, inline(r#""limit": -5, "period": "1h""#), 400),
        bad("limit 1e400", check, inline(r#""limit": 1e400, "period": "1h""#), 400),
        bad("limit NaN", check, inline(r#""limit": NaN, "period": "1h""#), 400),
        bad("period 2^64 ms", check, inline(r#""limit": 1, "period": 18446744073709551616"#), 400),
        bad("period -1 ms", check, inline(r#""limit": 1, "period": -1"#), 400),
        bad("period \"-1s\"", check, inline(r#""limit": 1, "period": "-1s""#), 400),
        bad("period \"1e400s\"", check, inline(r#""limit": 1, "period": "1e400s""#), 400),
        bad("period \"NaNs\"", check, inline(r#""limit": 1, "period": "NaNs""#), 400),
        bad("period \"99999999999999999999d\"", check, inline(r#""limit": 1, "period": "99999999999999999999d""#), 400),
        bad("token_bucket refill 2^64", check, r#"{"key": "k", "limits": [{"algorithm": "token_bucket", "capacity": 10, "refill": 18446744073709551616, "per": "1s"}]}"#, 400),
        bad("gcra burst -1", check, r#"{"key": "k", "limits": [{"algorithm": "gcra", "limit": 10, "period": "1s", "burst": -1}]}"#, 400),
        // Duplicate members: the first or the last must not silently win.
        bad("duplicate key member", check, r#"{"key": "hostile-dup", "key": "victim", "policy": "victim"}"#, 400),
        bad("duplicate cost member", check, r#"{"key": "victim", "policy": "victim", "cost": 0, "cost": 5}"#, 400),
        bad("duplicate policy member", check, r#"{"key": "victim", "policy": "pool", "policy": "victim"}"#, 400),
        bad("duplicate rule parameter", check, inline(r#""limit": 1, "limit": 1000, "period": "1h""#), 400),
        // Nesting.
        bad("10,000 nested arrays as cost", check, deep_array, 400),
        bad("10,000 nested objects", check, deep_object, 400),
        bad("10,000 open arrays as limits", check, deep_limits, 400),
        bad("10,000 nested arrays, bare", check, "[".repeat(10_000) + &"]".repeat(10_000), 400),
        // Size and encoding.
        bad("body of 70 KiB", check, over_limit, 413),
        bad("key of 60,000 bytes", check, key_60k, 400),
        bad("key of 513 bytes, NULs", check, key_513, 400),
        bad("key of 511 bytes and a two-byte char", check, key_511_plus_2, 400),
        bad("key of 513 bytes of braces and percents", check, key_many_escapes, 400),
        bad("invalid UTF-8 in key", check, &b"{\"key\": \"victim\xff\", \"policy\": \"victim\"}"[..], 400),
        bad("overlong UTF-8 for '}'", check, &b"{\"key\": \"victim\xc1\xbd\", \"policy\": \"victim\"}"[..], 400),
        bad("UTF-8 encoded surrogate", check, &b"{\"key\": \"victim\xed\xa0\x80\", \"policy\": \"victim\"}"[..], 400),
        bad("invalid UTF-8 in a member name", check, &b"{\"key\": \"victim\", \"policy\xff\": \"victim\"}"[..], 400),
        bad("UTF-8 byte order mark", check, &b"\xef\xbb\xbf{\"key\": \"victim\", \"policy\": \"victim\"}"[..], 400),
        bad("UTF-16 body", check, "{\"key\": \"victim\", \"policy\": \"victim\"}".encode_utf16().flat_map(u16::to_le_bytes).collect::<Vec<u8>>(), 400),
        bad("lone surrogate escape in key", check, r#"{"key": "victim\udfff", "policy": "victim"}"#, 400),
        bad("raw NUL between tokens", check, &b"{\"key\": \"victim\",\x00 \"policy\": \"victim\"}"[..], 400),
        bad("raw newline inside the key string", check, "{\"key\": \"vic\ntim\", \"policy\": \"victim\"}", 400),
        bad("rule name of 129 bytes", check, long_name, 400),
        // Policies named to escape or inject.
        bad("policy with CRLF", check, r#"{"key": "k", "policy": "victim\r\nx-injected: 1"}"#, 404),
        bad("policy path traversal", check, r#"{"key": "k", "policy": "../victim"}"#, 404),
        bad("policy with NUL", check, r#"{"key": "k", "policy": "victim\u0000"}"#, 404),
        bad("policy of 60,000 bytes", check, format!(r#"{{"key": "k", "policy": "{}"}}"#, "p".repeat(60_000)), 404),
        // Consumer and anonymous checks.
        bad("consumer with CRLF", check, r#"{"consumer": "acme\r\nx-injected: 1"}"#, 400),
        bad("consumer with NUL", check, r#"{"consumer": "acme\u0000"}"#, 400),
        bad("consumer of 60,000 bytes", check, format!(r#"{{"consumer": "{}"}}"#, "c".repeat(60_000)), 400),
        bad("consumer with key", check, r#"{"consumer": "acme", "key": "victim"}"#, 400),
        bad("consumer cost 2^64", check, r#"{"consumer": "acme", "cost": 18446744073709551616}"#, 400),
        bad("anonymous_ip with CRLF", check, r#"{"anonymous_ip": "203.0.113.7\r\n"}"#, 400),
        bad("anonymous_ip with a zone", check, r#"{"anonymous_ip": "fe80::1%eth0}"}"#, 400),
        bad("anonymous_ip as a number", check, r#"{"anonymous_ip": 3405803783}"#, 400),
        // Acquire and release.
        bad("acquire cost u64::MAX", acquire, r#"{"key": "victim", "policy": "pool", "cost": 18446744073709551615}"#, 400),
        bad("acquire limit -1", acquire, r#"{"key": "victim", "limit": -1, "lease": "1s"}"#, 400),
        bad("acquire limit 10^12", acquire, r#"{"key": "victim", "limit": 1000000000000, "lease": "1s"}"#, 400),
        bad("acquire lease 1e400", acquire, r#"{"key": "victim", "limit": 1, "lease": 1e400}"#, 400),
        bad("acquire lease \"0s\"", acquire, r#"{"key": "victim", "limit": 1, "lease": "0s"}"#, 400),
        bad("acquire under a window policy", acquire, r#"{"key": "victim", "policy": "victim"}"#, 400),
        bad("acquire key of 513 bytes", acquire, format!(r#"{{"key": "{}", "policy": "pool"}}"#, "k".repeat(513)), 400),
        bad("release lease_id with NUL", release, r#"{"key": "victim", "policy": "pool", "lease_id": "ab\u0000cd"}"#, 400),
        bad("release lease_id of 60,000 chars", release, format!(r#"{{"key": "victim", "policy": "pool", "lease_id": "{}"}}"#, "a".repeat(60_000)), 400),
        bad("release lease_id with braces", release, r#"{"key": "victim", "policy": "pool", "lease_id": "{victim}"}"#, 400),
        bad("release cost -1", release, r#"{"key": "victim", "policy": "pool", "lease_id": "abc", "cost": -1}"#, 400),
        bad("release cost 2^64", release, r#"{"key": "victim", "policy": "pool", "lease_id": "abc", "cost": 18446744073709551616}"#, 400),
        // Reset.
        bad("reset key of 513 bytes", reset_path, format!(r#"{{"key": "{}", "policy": "victim"}}"#, "v".repeat(513)), 400),
        bad("reset duplicate key member", reset_path, r#"{"key": "hostile-dup", "key": "victim", "policy": "victim"}"#, 400),
        bad("reset invalid UTF-8 key", reset_path, &b"{\"key\": \"victim\xc0\", \"policy\": \"victim\"}"[..], 400),
        // Envoy's request as JSON.
        bad("json hitsAddend -1", envoy, envoy_json(r#", "hitsAddend": -1"#, ""), 400),
        bad("json hitsAddend 2^32", envoy, envoy_json(r#", "hitsAddend": 4294967296"#, ""), 400),
        bad("json hitsAddend 1e400", envoy, envoy_json(r#", "hitsAddend": 1e400"#, ""), 400),
        bad("json descriptor hitsAddend 2^64", envoy, envoy_json("", r#", "hitsAddend": 18446744073709551616"#), 400),
        bad("json descriptor hitsAddend NaN", envoy, envoy_json("", r#", "hitsAddend": NaN"#), 400),
        bad("json empty domain", envoy, r#"{"domain": "", "descriptors": []}"#, 400),
        bad("json 65 descriptors", envoy, many_descriptors, 400),
        bad("json value of 257 bytes", envoy, long_value, 400),
        bad("json unit FORTNIGHT", envoy, envoy_json("", r#", "limit": {"requestsPerUnit": 1, "unit": "FORTNIGHT"}"#), 400),
        bad("json requestsPerUnit -5", envoy, envoy_json("", r#", "limit": {"requestsPerUnit": -5, "unit": "DAY"}"#), 400),
        bad("json duplicate domain", envoy, r#"{"domain": "other", "domain": "edge", "descriptors": []}"#, 400),
        bad("json invalid UTF-8 value", envoy, &b"{\"domain\": \"edge\", \"descriptors\": [{\"entries\": [{\"key\": \"remote_address\", \"value\": \"victim\xff\"}]}]}"[..], 400),
        bad("json 10,000 nested arrays", envoy, format!(r#"{{"domain": "edge", "descriptors": {}}}"#, "[".repeat(10_000)), 400),
        // Legal keys crafted to collide with the victims' state, or with each other's: each is a
        // fresh key. `a` is a victim; its Redis key is `tollgate:{a}:h`.
        fresh("key a}b", "a}b"),
        fresh("key {a}", "{a}"),
        fresh("key a}", "a}"),
        fresh("key {a", "{a"),
        fresh("key a%7D (the escape of a})", "a%7D"),
        fresh("key %7Ba%7D", "%7Ba%7D"),
        fresh("key a%", "a%"),
        fresh("key a}:h", "a}:h"),
        fresh("key a}:h{", "a}:h{"),
        fresh("key tollgate:{a}:h (the victim's Redis key)", "tollgate:{a}:h"),
        fresh("key tollgate:{a} (the victim's hash tag)", "tollgate:{a}"),
        fresh("key a:h", "a:h"),
        fresh("key }", "}"),
        fresh("key {", "{"),
        fresh("key {}", "{}"),
        fresh("key %", "%"),
        fresh("key :", ":"),
        fresh("key tollgate", "tollgate"),
        fresh("key NUL", "\0"),
        fresh("key victim NUL", "victim\0"),
        fresh("key victim NUL x", "victim\0x"),
        fresh("key victim CRLF", "victim\r\n"),
        fresh("key victim CRLF header", "victim\r\nx-injected: 1\r\n\r\n"),
        fresh("key victim space", "victim "),
        fresh("key Victim", "Victim"),
        fresh("key fullwidth victim", "ｖｉｃｔｉｍ"),
        fresh("key precomposed é", "é"),
        fresh("key decomposed é", "e\u{301}"),
        fresh("key of 512 bytes of braces", &"{}".repeat(256)),
        // Tollgate's own namespaces are refused, so no key can equal an internal one.
        bad("key equal to an Envoy descriptor's", "/v1/check", json!({"key": "envoy:edge|remote_address=victim", "policy": "victim"}).to_string(), 400),
        bad("key equal to a hashed Envoy key", "/v1/check", json!({"key": "envoy#00", "policy": "victim"}).to_string(), 400),
        bad("key equal to a consumer's", "/v1/check", json!({"key": "consumer:victim", "policy": "victim"}).to_string(), 400),
        bad("key equal to an anonymous caller's", "/v1/check", json!({"key": "anonymous:10.0.0.1", "policy": "victim"}).to_string(), 400),
        bad("reset of a consumer's key", "/v1/reset", json!({"key": "consumer:victim", "policy": "victim"}).to_string(), 400),
        bad("acquire under an Envoy key", "/v1/acquire", json!({"key": "envoy:edge", "limit": 2, "lease": "30s"}).to_string(), 400),
        // Resets of look-alike keys answer 204 and reset nobody else.
        reset("reset victim NUL", "victim\0"),
        reset("reset {victim}", "{victim}"),
        reset("reset victim%7D", "victim%7D"),
        reset("reset tollgate:{victim}:h", "tollgate:{victim}:h"),
        reset("reset victim}:h{a", "victim}:h{a"),
        reset("reset * (a glob)", "*"),
        reset("reset victim*", "victim*"),
    ];
    // Content types and headers.
    let plain = r#"{"key": "victim", "policy": "victim", "cost": 10}"#;
    for (name, ct) in [
        ("content-type text/plain", Some("text/plain")),
        ("content-type application/jsonx", Some("application/jsonx")),
        ("content-type json without a type", Some("json")),
        ("content-type multipart", Some("multipart/form-data; boundary=x")),
        ("content-type application/json-seq", Some("application/json-seq")),
        ("no content-type", None),
    ] {
        cases.push(HttpCase { content_type: ct, ..bad(name, check, plain, 415) });
    }
    cases.push(HttpCase {
        headers: vec![("content-type", b"application/json\xff".to_vec())],
        content_type: None,
        ..bad("content-type with a non-ASCII byte", check, plain, 415)
    });
    // Issue 18, cost model: inline rules whose state for one key could exceed
    // `[server] max_request_state` (256 KiB by default) are refused before any state is stored.
    let logs = |n: usize, limit: u64, period: &str, cost: u64| {
        let rules: Vec<Value> = (0..n)
            .map(|i| json!({"algorithm": "sliding_window_log", "limit": limit - i as u64, "period": period}))
            .collect();
        json!({"key": "hostile-state", "limits": rules, "cost": cost}).to_string()
    };
    cases.extend([
        bad("16 year-long logs of 10,000, cost 10,000 (20.8 MB)", check, logs(16, 10_000, "365d", 10_000), 400),
        bad("16 logs of 10,000 over 1ms (1,000 entries each)", check, logs(16, 10_000, "1ms", 1), 400),
        bad("one year-long log of 10,000 (1.3 MB)", check, logs(1, 10_000, "365d", 1), 400),
        bad("peek under 16 huge logs", check, logs(16, 10_000, "365d", 0), 400),
        bad("acquire inline limit 10,000 (2.9 MB of leases)", acquire, r#"{"key": "hostile-state", "limit": 10000, "lease": "365d", "cost": 10000}"#, 400),
        bad("acquire inline limit 1,000", acquire, r#"{"key": "hostile-state", "limit": 1000, "lease": "1s"}"#, 400),
    ]);
    // Issue 18, Redis loose ends: a reset is one Lua script (reset.lua) whose arguments are
    // field counts and field names; keys that look like them, or that escape to three times
    // their length in the Redis key name, reset themselves and nobody else.
    cases.extend([
        reset("reset 0 (a field count)", "0"),
        reset("reset victim 1 daily", "victim 1 daily"),
        reset("reset h (the shared hash's name)", "h"),
        reset("reset of 512 bytes of %", &"%".repeat(512)),
    ]);
    cases
}

/// Management API cases, with an admin token (and, for issue 18's scope cases, an unrestricted
/// viewer and an admin limited to the app `shop`).
#[rustfmt::skip]
fn admin_catalogue(token: &str, viewer: &str, shop_admin: &str) -> Vec<HttpCase> {
    let auth = |c: HttpCase| HttpCase { headers: vec![("authorization", format!("Bearer {token}").into_bytes())], ..c };
    let policy = |name: &str, rules: &str| format!(r#"{{"name": {name}, "rules": [{rules}]}}"#);
    let fw = r#"{"algorithm": "fixed_window", "limit": 1, "period": "1h"}"#;
    let limits = |member: &str| format!(r#"{{"per_second": 1{member}}}"#);
    let (policies, consumer) = ("/v1/admin/policies", "/v1/admin/consumers/hostile/limits");
    let mut cases = vec![
        auth(bad("admin policy named victim (the file's)", policies, policy(r#""victim""#, fw), 409)),
        auth(bad("admin policy name with braces", policies, policy(r#""a{b}""#, fw), 400)),
        auth(bad("admin policy name with CRLF", policies, policy(r#""a\r\nlocation: http://evil""#, fw), 400)),
        auth(bad("admin policy name ../victim", policies, policy(r#""../victim""#, fw), 400)),
        auth(bad("admin policy name of 65 bytes", policies, policy(&format!(r#""{}""#, "p".repeat(65)), fw), 400)),
        auth(bad("admin policy limit 1e400", policies, policy(r#""hostile""#, r#"{"algorithm": "fixed_window", "limit": 1e400, "period": "1h"}"#), 400)),
        auth(bad("admin policy 10,000 nested rules", policies, format!(r#"{{"name": "hostile", "rules": {}}}"#, "[".repeat(10_000)), 400)),
        auth(bad("admin policy duplicate name member", policies, r#"{"name": "hostile", "name": "victim", "rules": []}"#, 400)),
        auth(bad("admin policy duplicate apps member", policies, r#"{"name": "hostile", "apps": ["shop"], "rules": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}], "apps": []}"#, 400)),
        auth(bad("admin policy duplicate rule parameter", policies, r#"{"name": "hostile", "rules": [{"algorithm": "fixed_window", "limit": 1, "period": "1h", "limit": 1000}]}"#, 400)),
        auth(HttpCase { method: "GET", ..bad("admin policy name of invalid UTF-8 in the path", "/v1/admin/policies/%FF%FE", "", 400) }),
        auth(HttpCase { method: "GET", ..bad("admin consumer id of invalid UTF-8 in the path", "/v1/admin/consumers/%C0%AF/limits", "", 400) }),
        auth(HttpCase { method: "GET", ..bad("call-limits of invalid UTF-8 in the path", "/v1/consumers/%FF/call-limits", "", 400) }),
        auth(HttpCase { method: "GET", ..bad("admin audit limit NaN", "/v1/admin/audit?limit=NaN", "", 400) }),
        auth(bad("admin limits per_minute -2", consumer, limits(r#", "per_minute": -2"#), 400)),
        auth(bad("admin limits per_hour 10^13", consumer, limits(r#", "per_hour": 10000000000000"#), 400)),
        auth(bad("admin limits per_day NaN", consumer, limits(r#", "per_day": NaN"#), 400)),
        auth(bad("admin limits per_week 1.5", consumer, limits(r#", "per_week": 1.5"#), 400)),
        auth(bad("admin limits per_month 2^64", consumer, limits(r#", "per_month": 18446744073709551616"#), 400)),
        auth(bad("admin limits from not a date", consumer, limits(r#", "from": "yesterday""#), 400)),
        auth(bad("admin limits scope with NUL", consumer, limits(r#", "scope": "/a\u0000""#), 400)),
        auth(bad("admin consumer id with CRLF", "/v1/admin/consumers/a%0D%0Ab/limits", limits(""), 400)),
        auth(bad("admin token role root", "/v1/admin/tokens", r#"{"name": "evil", "role": "root"}"#, 400)),
        auth(HttpCase { method: "GET", ..bad("admin list limit -1", "/v1/admin/policies?limit=-1", "", 400) }),
        auth(HttpCase { method: "GET", ..bad("admin list limit 2^64", "/v1/admin/policies?limit=18446744073709551616", "", 400) }),
        HttpCase {
            headers: vec![("authorization", b"Bearer tg_\xff\xfe".to_vec())],
            method: "GET",
            ..bad("admin token of non-ASCII bytes", policies, "", 401)
        },
        HttpCase {
            headers: vec![("authorization", format!("Bearer {}", "t".repeat(60_000)).into_bytes())],
            method: "GET",
            ..bad("admin token of 60,000 bytes", policies, "", 401)
        },
        HttpCase {
            headers: vec![("authorization", format!("Bearer {token}").into_bytes()), ("authorization", b"Bearer other".to_vec())],
            method: "GET",
            ..bad("admin two authorization headers", policies, "", 401)
        },
    ];
    // Issue 18, management API scope and authorisation: the role is checked before the path,
    // query or body are read; a scoped admin reaches nothing beyond its apps (the store checks
    // the target row inside the write's transaction); the Bearer scheme is matched in any case
    // and no other scheme passes; the console's refusals are problems.
    let header = |name: &'static str, value: String| (name, value.into_bytes());
    let as_viewer = |c: HttpCase| HttpCase { headers: vec![header("authorization", format!("Bearer {viewer}"))], ..c };
    let as_shop_admin = |c: HttpCase| HttpCase { headers: vec![header("authorization", format!("bearer {shop_admin}"))], ..c };
    let with_auth = |value: String, c: HttpCase| HttpCase { headers: vec![header("authorization", value)], ..c };
    let get = |c: HttpCase| HttpCase { method: "GET", ..c };
    let delete = |c: HttpCase| HttpCase { method: "DELETE", ..c };
    let put = |c: HttpCase| HttpCase { method: "PUT", ..c };
    let six = r#"{"per_second": 1, "per_minute": -1, "per_hour": -1, "per_day": -1, "per_week": -1, "per_month": -1}"#;
    cases.extend([
        get(bad("console asset of invalid UTF-8", "/console/assets/%ff", "", 404)),
        get(bad("console asset of invalid UTF-8 with a known suffix", "/console/assets/%C0%AFapp.js", "", 404)),
        get(bad("console asset unknown", "/console/assets/evil.js", "", 404)),
        get(with_auth("BEARER tg_0000".into(), bad("admin BEARER scheme, unknown token", policies, "", 401))),
        get(with_auth(format!("Basic {token}"), bad("admin Basic scheme with a real token", policies, "", 401))),
        get(with_auth(format!("Bearer\t{token}"), bad("admin Bearer and a tab", policies, "", 401))),
        get(with_auth(format!("Bearer{token}"), bad("admin Bearer without a space", policies, "", 401))),
        get(with_auth(format!("Bearers {token}"), bad("admin Bearers scheme", policies, "", 401))),
        bad("admin stranger's malformed policy", policies, r#"{"rules": ["#, 401),
        HttpCase { content_type: Some("text/plain"), ..bad("admin stranger's policy as text", policies, "x", 401) },
        as_viewer(bad("admin viewer's malformed policy", policies, r#"{"rules": ["#, 403)),
        as_viewer(HttpCase { content_type: Some("text/plain"), ..bad("admin viewer's policy as text", policies, "x", 403) }),
        as_viewer(put(bad("admin viewer's update at a path of invalid UTF-8", "/v1/admin/policies/%FF", "{", 403))),
        as_viewer(bad("admin viewer's consumer limit with an unknown member", consumer, r#"{"colour": 1}"#, 403)),
        as_viewer(bad("admin viewer's token of role root", "/v1/admin/tokens", r#"{"name": "evil", "role": "root"}"#, 403)),
        as_viewer(get(bad("admin viewer's tokens page of NaN", "/v1/admin/tokens?limit=NaN", "", 403))),
        as_viewer(delete(bad("admin viewer revokes the admin", "/v1/admin/tokens/hostile", "", 403))),
        as_shop_admin(delete(bad("admin scoped admin revokes the unrestricted admin", "/v1/admin/tokens/hostile", "", 403))),
        as_shop_admin(bad("admin scoped admin mints an unrestricted admin", "/v1/admin/tokens", r#"{"name": "escalate", "role": "admin"}"#, 403)),
        as_shop_admin(bad("admin scoped admin mints a token of another app", "/v1/admin/tokens", r#"{"name": "escalate", "role": "admin", "apps": ["shop", "blog"]}"#, 403)),
        as_shop_admin(bad("admin scoped admin creates a global policy", policies, policy(r#""escalate""#, fw), 403)),
        as_shop_admin(bad("admin scoped admin sets a consumer limit", consumer, six, 403)),
        as_shop_admin(put(bad("admin scoped admin moves a policy to no app", "/v1/admin/policies/hostile-global", format!(r#"{{"rules": [{fw}]}}"#), 403))),
        as_shop_admin(delete(bad("admin scoped admin deletes a global policy", "/v1/admin/policies/hostile-global", "", 403))),
        as_shop_admin(get(bad("admin scoped admin reads the inline callers", "/v1/admin/live/policies/inline", "", 404))),
        as_shop_admin(get(bad("admin scoped admin reads the anonymous callers", "/v1/admin/live/policies/anonymous", "", 404))),
    ]);
    cases
}

/// Sends one case; answers the status, the headers and the body.
async fn send(server: &Tollgate, case: &HttpCase) -> (u16, reqwest::header::HeaderMap, String) {
    let method: reqwest::Method = case.method.parse().unwrap();
    let mut req = server.client.request(method, server.url(&case.path));
    if let Some(ct) = case.content_type {
        req = req.header("content-type", ct);
    }
    for (name, value) in &case.headers {
        req = req.header(*name, reqwest::header::HeaderValue::from_bytes(value).unwrap());
    }
    if !case.body.is_empty() {
        req = req.body(case.body.clone());
    }
    let r = tokio::time::timeout(Duration::from_secs(20), req.send())
        .await
        .unwrap_or_else(|_| panic!("{}: no answer within 20 s", case.name));
    let r = match r {
        Ok(r) => r,
        // A request the server refuses before reading it all may end the connection.
        Err(e) => return (0, Default::default(), format!("no answer: {e}")),
    };
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap_or_default())
}

/// What is wrong with the answer to `case`, if anything.
fn http_mismatch(
    case: &HttpCase,
    status: u16,
    headers: &reqwest::header::HeaderMap,
    text: &str,
) -> Option<String> {
    let mut wrong = Vec::new();
    if headers.keys().any(|h| h.as_str().starts_with("x-injected") || h == "set-cookie" || h == "location") {
        wrong.push(format!("injected header: {headers:?}"));
    }
    match &case.expect {
        Expect::Problem(expected) => {
            if status != *expected {
                wrong.push(format!("status {status}, expected {expected}"));
            }
            let ct = headers.get("content-type").and_then(|v| v.to_str().ok());
            common::problem_shape(status, ct, text, &mut wrong);
        }
        Expect::Fresh(_) => {
            let body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if status != 200 || body["allowed"] != true || body["remaining"] != 9 || body["limit"] != 10 {
                wrong.push(format!("status {status}, expected 200 with remaining 9 of 10 (a fresh key)"));
            }
        }
        Expect::Reset(_) => {
            if status != 204 {
                wrong.push(format!("status {status}, expected 204"));
            }
        }
    }
    (!wrong.is_empty()).then(|| {
        let shown: String = text.chars().take(400).collect();
        format!("{} ({} {}): {}\n    answer: {shown}", case.name, case.method, case.path, wrong.join("; "))
    })
}

/// Requests malformed below JSON, written on a raw connection: each must be answered 4xx (by
/// hyper, before the API, so without a problem body) or the connection closed; never a 5xx or a
/// hang.
fn raw_catalogue() -> Vec<(&'static str, Vec<u8>)> {
    let post = |headers: &str, body: &str| {
        format!("POST /v1/check HTTP/1.1\r\nhost: x\r\n{headers}\r\n{body}").into_bytes()
    };
    let body = r#"{"key": "victim", "policy": "victim", "cost": 10}"#;
    let mut cases = vec![
        (
            "raw: two content-lengths",
            post(
                &format!(
                    "content-type: application/json\r\ncontent-length: 5\r\ncontent-length: {}\r\n",
                    body.len()
                ),
                body,
            ),
        ),
        (
            "raw: content-length longer than the body",
            post(
                &format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len() + 100),
                body,
            ),
        ),
        (
            "raw: content-length 2^64",
            post("content-type: application/json\r\ncontent-length: 18446744073709551616\r\n", body),
        ),
        ("raw: content-length -1", post("content-type: application/json\r\ncontent-length: -1\r\n", body)),
        (
            "raw: content-length 10^15, no body",
            post("content-type: application/json\r\ncontent-length: 1000000000000000\r\n", ""),
        ),
        (
            "raw: NUL in a header value",
            post(&format!("content-type: application/json\0\r\ncontent-length: {}\r\n", body.len()), body),
        ),
        (
            "raw: bare LF header injection",
            post(
                &format!(
                    "content-type: application/json\nx-injected: 1\r\ncontent-length: {}\r\n",
                    body.len()
                ),
                body,
            ),
        ),
        (
            "raw: obs-fold header",
            post(
                &format!(
                    "content-type: application/json\r\n x-injected: 1\r\ncontent-length: {}\r\n",
                    body.len()
                ),
                body,
            ),
        ),
        (
            "raw: space before colon",
            post(&format!("content-type : application/json\r\ncontent-length: {}\r\n", body.len()), body),
        ),
        (
            "raw: chunk size 2^64",
            post(
                "content-type: application/json\r\ntransfer-encoding: chunked\r\n",
                "10000000000000000\r\n{}\r\n0\r\n\r\n",
            ),
        ),
        (
            "raw: chunked over 64 KiB",
            post(
                "content-type: application/json\r\ntransfer-encoding: chunked\r\n",
                &format!("{:x}\r\n{}\r\n0\r\n\r\n", 70_000, " ".repeat(70_000)),
            ),
        ),
        (
            "raw: 200 KiB of headers",
            post(
                &format!(
                    "content-type: application/json\r\nx-big: {}\r\ncontent-length: {}\r\n",
                    "h".repeat(200 * 1024),
                    body.len()
                ),
                body,
            ),
        ),
        // Issue 18, connections: bodies announced above the limit are refused (413) before
        // they are read, with or without Expect; a head cut short is closed, never waited on.
        (
            "raw: expect 100-continue, content-length 10 MB",
            post(
                "content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 10485760\r\n",
                "",
            ),
        ),
        (
            "raw: content-length 10 MB, no body",
            post("content-type: application/json\r\ncontent-length: 10485760\r\n", ""),
        ),
        (
            "raw: expect 100-continue, content-length just over 64 KiB",
            post("content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 65537\r\n", ""),
        ),
        ("raw: half a head", b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-ty".to_vec()),
        ("raw: nothing at all", Vec::new()),
    ];
    // Issue 18, canonical paths: the API has one spelling per route. Each of these, which
    // nginx, Spring, werkzeug or http.server would serve as /v1/check, must be a 4xx, and
    // must not spend the victim's unit (which the victims' unchanged state proves).
    let spend_one = r#"{"key": "victim", "policy": "victim", "cost": 1}"#;
    for (name, path) in [
        ("raw: path //v1/check", "//v1/check"),
        ("raw: path /v1//check", "/v1//check"),
        ("raw: path /v1/./check", "/v1/./check"),
        ("raw: path /v1/x/../check", "/v1/x/../check"),
        ("raw: path /v1/%2e%2e/v1/check", "/v1/%2e%2e/v1/check"),
        ("raw: path /v1/%63heck", "/v1/%63heck"),
        ("raw: path /v1/check;x", "/v1/check;x"),
        ("raw: path /v1/check/", "/v1/check/"),
        ("raw: path /V1/CHECK", "/V1/CHECK"),
        ("raw: path /v1%2Fcheck", "/v1%2Fcheck"),
        ("raw: path /v1/check%00", "/v1/check%00"),
        ("raw: path /v1\\check", "/v1\\check"),
        ("raw: path /v1/check%zz", "/v1/check%zz"),
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{spend_one}",
            spend_one.len()
        );
        cases.push((name, request.into_bytes()));
    }
    cases
}

/// Sends raw bytes; answers the status of the first response (0 when the connection closed
/// without one).
fn send_raw(base: &str, bytes: &[u8]) -> u16 {
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before the whole request is written.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no answer within 10 s: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ").and_then(|t| t.get(..3)).and_then(|s| s.parse().ok()).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// gRPC

/// What a gRPC case must be answered.
#[derive(Clone, Debug)]
enum GrpcExpect {
    /// This error status.
    Status(tonic::Code),
    /// OK with these statuses: code and `limit_remaining` (None: no current limit), and the
    /// engine key each limited descriptor is counted under, for the Redis key set.
    Answer(Code, Vec<(Code, Option<u32>)>, Vec<String>),
}

enum Payload {
    Typed(RateLimitRequest),
    /// Protobuf bytes written by hand.
    Raw(Vec<u8>),
    /// A call that sends no message at all.
    Nothing,
}

struct GrpcCase {
    name: &'static str,
    payload: Payload,
    expect: GrpcExpect,
}

fn entries(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..Default::default()
    }
}

fn rls(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: 0 }
}

fn address(value: &str) -> RateLimitDescriptor {
    entries(&[("remote_address", value)])
}

/// The documented engine key of a descriptor: `envoy:<domain>|key=value|...`, `%`, `|`, `=`
/// escaped.
fn engine_key(domain: &str, pairs: &[(&str, &str)]) -> String {
    let escape = |s: &str| s.replace('%', "%25").replace('|', "%7C").replace('=', "%3D");
    let mut key = format!("envoy:{}", escape(domain));
    for (k, v) in pairs {
        key.push_str(&format!("|{}={}", escape(k), escape(v)));
    }
    key
}

/// One fresh `remote_address` value: OK, 9 of 10 left.
fn fresh_address(name: &'static str, value: &'static str) -> GrpcCase {
    GrpcCase {
        name,
        payload: Payload::Typed(rls("edge", vec![address(value)])),
        expect: GrpcExpect::Answer(
            Code::Ok,
            vec![(Code::Ok, Some(9))],
            vec![engine_key("edge", &[("remote_address", value)])],
        ),
    }
}

fn invalid(name: &'static str, req: RateLimitRequest) -> GrpcCase {
    GrpcCase { name, payload: Payload::Typed(req), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) }
}

/// Protobuf by hand: a length-delimited field.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut n = bytes.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(bytes);
    out
}

/// A request of `domain` with one descriptor of one entry, all as raw bytes.
fn raw_request(domain: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let entry = [field(1, key), field(2, value)].concat();
    let descriptor = field(1, &entry);
    [field(1, domain), field(2, &descriptor)].concat()
}

#[rustfmt::skip]
fn grpc_catalogue() -> Vec<GrpcCase> {
    let with = |mut d: RateLimitDescriptor, f: &dyn Fn(&mut RateLimitDescriptor)| { f(&mut d); d };
    let hits = |value: u64| move |d: &mut RateLimitDescriptor| d.hits_addend = Some(UInt64Value { value });
    let over = |requests_per_unit: u32, unit: i32| move |d: &mut RateLimitDescriptor| d.limit = Some(RateLimitOverride { requests_per_unit, unit });
    let long = "v".repeat(257);
    let seventeen: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let seventeen: Vec<(&str, &str)> = seventeen.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let big_key = "k".repeat(10_000);
    let sixteen_long: Vec<(String, String)> = (0..16).map(|i| (format!("{i:0>256}"), "w".repeat(256))).collect();
    let sixteen_long: Vec<(&str, &str)> = sixteen_long.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut request_hits = rls("edge", vec![address("hostile-huge-request-hits")]);
    request_hits.hits_addend = u32::MAX;
    vec![
        invalid("empty domain", rls("", vec![address("victim")])),
        invalid("domain of 257 bytes", rls(&"d".repeat(257), vec![address("victim")])),
        invalid("domain of 1 MiB", rls(&"d".repeat(1 << 20), vec![address("victim")])),
        invalid("65 descriptors", rls("edge", vec![address("victim"); 65])),
        invalid("5,000 descriptors", rls("edge", vec![address("victim"); 5_000])),
        invalid("100,000 empty descriptors", rls("edge", vec![RateLimitDescriptor::default(); 100_000])),
        GrpcCase {
            name: "a descriptor without entries (matches nothing, as upstream)",
            payload: Payload::Typed(rls("edge", vec![RateLimitDescriptor::default()])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, None)], vec![]),
        },
        invalid("no descriptors at all", rls("edge", vec![])),
        invalid("17 entries", rls("edge", vec![entries(&seventeen)])),
        invalid("empty entry key", rls("edge", vec![entries(&[("", "victim")])])),
        invalid("entry value of 257 bytes", rls("edge", vec![address(&long)])),
        invalid("entry key of 10,000 bytes", rls("edge", vec![entries(&[(&big_key, "x")])])),
        invalid("a bad descriptor after the victim's", rls("edge", vec![with(address("victim"), &hits(5)), address(&long)])),
        invalid("descriptor hits_addend u64::MAX", rls("edge", vec![with(address("hostile-u64-hits"), &hits(u64::MAX))])),
        invalid("descriptor hits_addend 10^12 + 1, with the victim", rls("edge", vec![address("victim"), with(address("hostile-10e12-hits"), &hits(1_000_000_000_001))])),
        invalid("override unit UNKNOWN", rls("edge", vec![with(address("victim"), &over(1, 0))])),
        invalid("override unit 99", rls("edge", vec![with(address("victim"), &over(1, 99))])),
        invalid("override unit -1", rls("edge", vec![with(address("victim"), &over(1, -1))])),
        GrpcCase {
            name: "message over 4 MiB",
            payload: Payload::Typed(rls(&"d".repeat(5 << 20), vec![address("victim")])),
            expect: GrpcExpect::Status(tonic::Code::OutOfRange),
        },
        // Over the limit whatever the state: refused, and nothing counted (the victim neither).
        GrpcCase {
            name: "request hits_addend u32::MAX",
            payload: Payload::Typed(request_hits),
            expect: GrpcExpect::Answer(Code::OverLimit, vec![(Code::OverLimit, Some(0))], vec![]),
        },
        GrpcCase {
            name: "descriptor hits_addend 11 beside the victim",
            payload: Payload::Typed(rls("edge", vec![address("victim"), with(address("hostile-11-hits"), &hits(11))])),
            expect: GrpcExpect::Answer(Code::OverLimit, vec![(Code::Ok, Some(6)), (Code::OverLimit, Some(0))], vec![]),
        },
        // Legal, crafted: each counted apart from the victim and from each other.
        fresh_address("value victim|x=y", "victim|x=y"),
        fresh_address("value victim%7Cx%3Dy (the escape)", "victim%7Cx%3Dy"),
        fresh_address("value victim%", "victim%"),
        fresh_address("value victim}", "victim}"),
        fresh_address("value {victim}", "{victim}"),
        fresh_address("value victim NUL", "victim\0"),
        fresh_address("value victim CRLF", "victim\r\n"),
        fresh_address("value tollgate:{envoy:edge|remote_address=victim}:h", "tollgate:{envoy:edge|remote_address=victim}:h"),
        fresh_address("empty value", ""),
        GrpcCase {
            name: "two entries that read like the victim's one",
            payload: Payload::Typed(rls("edge", vec![entries(&[("user", "u|tier=gold")]), entries(&[("user", "u"), ("tier", "gold|")])])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, None), (Code::Ok, Some(9))], vec![engine_key("edge", &[("user", "u"), ("tier", "gold|")])]),
        },
        GrpcCase {
            name: "domain with a separator",
            payload: Payload::Typed(rls("edge|remote_address=victim", vec![address("victim")])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, None)], vec![]),
        },
        GrpcCase {
            name: "16 entries of 256-byte keys and values (a hashed key)",
            payload: Payload::Typed(rls("edge", vec![with(entries(&sixteen_long), &over(5, Unit::Day as i32))])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, Some(4))], vec!["envoy#".to_owned()]),
        },
        GrpcCase {
            name: "override requests_per_unit u32::MAX",
            payload: Payload::Typed(rls("edge", vec![with(address("hostile-max-override"), &over(u32::MAX, Unit::Day as i32))])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, Some(u32::MAX - 1))], vec![engine_key("edge", &[("remote_address", "hostile-max-override")])]),
        },
        // A limit of 0 refuses (upstream's answer) without counting anything.
        GrpcCase {
            name: "override requests_per_unit 0 on the victim",
            payload: Payload::Typed(rls("edge", vec![with(address("victim"), &over(0, Unit::Day as i32))])),
            expect: GrpcExpect::Answer(Code::OverLimit, vec![(Code::OverLimit, Some(0))], vec![]),
        },
        // A request's own limit in a domain the server does not know is ignored, as upstream.
        GrpcCase {
            name: "override in an unknown domain",
            payload: Payload::Typed(rls("elsewhere", vec![with(address("victim"), &over(1, Unit::Day as i32))])),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, None)], vec![]),
        },
        // Bytes that are not a valid request: the caller's fault, INVALID_ARGUMENT (tonic alone
        // answers INTERNAL, as gRPC's status guide has it; crates/tollgate-envoy/src/server.rs).
        GrpcCase { name: "invalid UTF-8 domain", payload: Payload::Raw(raw_request(b"edge\xff", b"remote_address", b"victim")), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "invalid UTF-8 entry key", payload: Payload::Raw(raw_request(b"edge", b"remote_address\xc0", b"victim")), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "invalid UTF-8 entry value", payload: Payload::Raw(raw_request(b"edge", b"remote_address", b"victim\xed\xa0\x80")), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "truncated message", payload: Payload::Raw(raw_request(b"edge", b"remote_address", b"victim")[..12].to_vec()), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "length beyond the message", payload: Payload::Raw(vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, b'e']), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "hits_addend varint of 11 bytes", payload: Payload::Raw([field(1, b"edge"), vec![0x18], vec![0xff; 10], vec![0x01]].concat()), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "wire type 7 (none such)", payload: Payload::Raw([field(1, b"edge"), vec![0x17]].concat()), expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        GrpcCase { name: "no message at all", payload: Payload::Nothing, expect: GrpcExpect::Status(tonic::Code::InvalidArgument) },
        // Parses: protobuf's last-one-wins for a repeated scalar, and unknown fields skipped.
        GrpcCase {
            name: "domain twice (the last wins), raw",
            payload: Payload::Raw([field(1, b"other"), raw_request(b"edge", b"remote_address", b"hostile-raw-dup")].concat()),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, Some(9))], vec![engine_key("edge", &[("remote_address", "hostile-raw-dup")])]),
        },
        GrpcCase {
            name: "unknown field 99, raw",
            payload: Payload::Raw([raw_request(b"edge", b"remote_address", b"hostile-raw-unknown"), vec![0x9a, 0x06, 0x01, b'x']].concat()),
            expect: GrpcExpect::Answer(Code::Ok, vec![(Code::Ok, Some(9))], vec![engine_key("edge", &[("remote_address", "hostile-raw-unknown")])]),
        },
    ]
}

/// Sends bytes as they are.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

/// Sends protobuf bytes written by hand; answers the response's bytes, undecoded (a raw case
/// that succeeds is checked by peeking at what it counted).
async fn send_grpc_raw(channel: Channel, bytes: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(bytes), path, RawCodec).await.map(tonic::Response::into_inner)
}

/// Calls `ShouldRateLimit` sending no message (a client stream that ends at once).
async fn send_grpc_nothing(channel: Channel) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let nothing = tonic::codegen::tokio_stream::empty::<Vec<u8>>();
    grpc.client_streaming(tonic::Request::new(nothing), path, RawCodec).await.map(tonic::Response::into_inner)
}

/// The remaining count of one descriptor, peeked (hits 0).
async fn envoy_remaining(client: &mut RateLimitServiceClient<Channel>, pairs: &[(&str, &str)]) -> u32 {
    let mut d = entries(pairs);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let r = client.should_rate_limit(rls("edge", vec![d])).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].code(), Code::Ok, "{pairs:?}: {r:?}");
    r.statuses[0].limit_remaining
}

/// The remaining count of an HTTP key under `victim`, peeked (cost 0).
async fn http_remaining(server: &Tollgate, key: &str) -> u64 {
    let (status, body) = server.check(json!({"key": key, "policy": "victim", "cost": 0})).await;
    assert_eq!(status, 200, "{key:?}: {body}");
    body["remaining"].as_u64().unwrap()
}

/// `<prefix>:{<key>}:`, as crates/tollgate-redis/src/keys.rs documents it.
fn tagged(key: &str) -> String {
    let escaped = key.replace('%', "%25").replace('{', "%7B").replace('}', "%7D");
    format!("tollgate:{{{escaped}}}:")
}

// ---------------------------------------------------------------------------------------------
// The run

struct Run {
    server: Tollgate,
    client: RateLimitServiceClient<Channel>,
    channel: Channel,
    token: String,
    /// Issue 18: an unrestricted viewer, and an admin limited to the app `shop`.
    viewer: String,
    shop_admin: String,
    _dir: tempfile::TempDir,
}

async fn start(redis: Option<&tollgate_testkit::RedisServer>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let database = format!("sqlite://{}", dir.path().join("tollgate.db").display());
    let token = common::bootstrap_token(&database, "hostile", "admin", None);
    let viewer = common::bootstrap_token(&database, "hostile-viewer", "viewer", None);
    let shop_admin = common::bootstrap_token(&database, "hostile-shop-admin", "admin", Some("shop"));
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    // All or nothing: under upstream's default each descriptor is charged on its own, so the
    // legal request "descriptor hits_addend 11 beside the victim" would spend a unit of the
    // victim's (its descriptor is named, and admitted) while the request is refused. That is
    // the victim's descriptor being used, not a hostile request reaching another's state; this
    // test asserts the victims' state is exactly unchanged, which holds only when a refused
    // request is charged to none of its descriptors.
    let mut args = vec![
        "--grpc-listen",
        &listen,
        "--envoy-config",
        yaml.to_str().unwrap(),
        "--database",
        &database,
        "--envoy-all-or-nothing",
    ];
    let url = redis.map(tollgate_testkit::RedisServer::url);
    if let Some(url) = &url {
        args.extend(["--redis", url.as_str()]);
    }
    let server = Tollgate::start(CONFIG, &args).await;
    let channel = Channel::from_shared(format!("http://{listen}")).unwrap().connect().await.unwrap();
    let client = RateLimitServiceClient::new(channel.clone());
    // Issue 18: a global policy for the scoped admin's attempts on it.
    let r = server
        .client
        .post(server.url("/v1/admin/policies"))
        .bearer_auth(&token)
        .json(&json!({"name": "hostile-global", "rules": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    Run { server, client, channel, token, viewer, shop_admin, _dir: dir }
}

/// Spends the victims' quotas, runs every catalogue, and checks the victims after. Answers the
/// engine keys the legal requests were counted under (the victims' included).
async fn run_catalogue(run: &mut Run, backend: &str) -> Vec<String> {
    let server = &run.server;
    let mut legal_keys: Vec<String> = Vec::new();

    // The victims spend part of their quotas.
    for (key, spent) in HTTP_VICTIMS {
        let (status, body) = server.check(json!({"key": key, "policy": "victim", "cost": spent})).await;
        assert_eq!((status, &body["remaining"]), (200, &json!(10 - spent)), "{body}");
        legal_keys.push(key.to_owned());
    }
    for (pairs, spent) in ENVOY_VICTIMS {
        let mut d = entries(pairs);
        d.hits_addend = Some(UInt64Value { value: spent });
        let r = run.client.should_rate_limit(rls("edge", vec![d])).await.unwrap().into_inner();
        assert_eq!(r.statuses[0].limit_remaining, 10 - u32::try_from(spent).unwrap(), "{r:?}");
        legal_keys.push(engine_key("edge", pairs));
    }
    let mut before = Vec::new();
    for (key, _) in HTTP_VICTIMS {
        before.push(http_remaining(server, key).await);
    }
    for (pairs, _) in ENVOY_VICTIMS {
        before.push(u64::from(envoy_remaining(&mut run.client, pairs).await));
    }
    assert_eq!(before, [6, 7, 6, 8], "{backend}: the victims' state before");

    let mut failures = Vec::new();
    let mut counts = [0usize; 4];

    // HTTP.
    let mut http = http_catalogue();
    http.extend(admin_catalogue(&run.token, &run.viewer, &run.shop_admin));
    counts[0] = http.len();
    let mut names: Vec<&str> = http.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), http.len(), "HTTP case names are unique");
    for case in &http {
        let (status, headers, text) = send(server, case).await;
        if let Some(m) = http_mismatch(case, status, &headers, &text) {
            failures.push(format!("{backend}: {m}"));
        }
        match &case.expect {
            Expect::Fresh(key) => legal_keys.push(key.clone()),
            // The catalogue runs in order: a reset forgets what an earlier case counted.
            Expect::Reset(key) => legal_keys.retain(|k| k != key),
            Expect::Problem(_) => {}
        }
    }

    // Raw HTTP/1.1.
    let raw = raw_catalogue();
    counts[1] = raw.len();
    for (name, bytes) in &raw {
        let base = server.base.clone();
        let bytes = bytes.clone();
        let status = tokio::task::spawn_blocking(move || send_raw(&base, &bytes)).await.unwrap();
        if !(status == 0 || (400..500).contains(&status)) {
            failures
                .push(format!("{backend}: {name}: status {status}, expected a 4xx or a closed connection"));
        }
    }

    // gRPC.
    let grpc = grpc_catalogue();
    counts[2] = grpc.len();
    let mut names: Vec<&str> = grpc.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), grpc.len(), "gRPC case names are unique");
    // A refusal is the caller's fault: never OK, UNKNOWN or INTERNAL.
    for case in &grpc {
        let code = match case.expect {
            GrpcExpect::Status(code) => code,
            GrpcExpect::Answer(..) => continue,
        };
        assert!(
            !matches!(code, tonic::Code::Ok | tonic::Code::Unknown | tonic::Code::Internal),
            "{}: {code:?}",
            case.name
        );
    }
    for case in grpc {
        let answer = match case.payload {
            Payload::Typed(req) => {
                let call = run.client.should_rate_limit(req);
                match tokio::time::timeout(Duration::from_secs(20), call).await {
                    Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 20 s")),
                    Ok(r) => r.map(|r| Some(r.into_inner())),
                }
            }
            Payload::Raw(bytes) => {
                let call = send_grpc_raw(run.channel.clone(), bytes);
                match tokio::time::timeout(Duration::from_secs(20), call).await {
                    Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 20 s")),
                    Ok(r) => r.map(|_| None),
                }
            }
            Payload::Nothing => {
                let call = send_grpc_nothing(run.channel.clone());
                match tokio::time::timeout(Duration::from_secs(20), call).await {
                    Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 20 s")),
                    Ok(r) => r.map(|_| None),
                }
            }
        };
        let wrong = match (&case.expect, answer) {
            (GrpcExpect::Status(code), Err(status)) if status.code() == *code => None,
            (GrpcExpect::Status(code), other) => Some(format!("expected {code:?}, got {other:?}")),
            (GrpcExpect::Answer(overall, each, keys), Ok(response)) => {
                legal_keys.extend(keys.iter().cloned());
                match response {
                    // Raw: the answer is not decoded here; peek at what it counted instead.
                    None => {
                        let pairs = [("remote_address", keys[0].rsplit('=').next().unwrap())];
                        let left = envoy_remaining(&mut run.client, &pairs).await;
                        (Some(left) != each[0].1)
                            .then(|| format!("raw request left {left}, expected {each:?}"))
                    }
                    Some(r) => {
                        let got: Vec<(Code, Option<u32>)> = r
                            .statuses
                            .iter()
                            .map(|s| (s.code(), s.current_limit.as_ref().map(|_| s.limit_remaining)))
                            .collect();
                        (r.overall_code() != *overall || got != *each).then(|| {
                            format!("expected {overall:?} {each:?}, got {:?} {got:?}", r.overall_code())
                        })
                    }
                }
            }
            (GrpcExpect::Answer(..), Err(status)) => Some(format!("expected an answer, got {status:?}")),
        };
        if let Some(w) = wrong {
            failures.push(format!("{backend}: gRPC {}: {w}", case.name));
        }
    }
    counts[3] = counts[0] + counts[1] + counts[2];
    eprintln!(
        "{backend}: {} HTTP cases, {} raw HTTP/1.1 cases, {} gRPC cases",
        counts[0], counts[1], counts[2]
    );
    assert!(counts[0] >= 50 && counts[2] >= 20, "{counts:?}");

    assert!(
        failures.is_empty(),
        "{} of {} hostile requests were not answered as expected:\n{}\n\nlogs:\n{}",
        failures.len(),
        counts[3],
        failures.join("\n"),
        server.logs()
    );

    // The victims' state is exactly as it was.
    let mut after = Vec::new();
    for (key, _) in HTTP_VICTIMS {
        after.push(http_remaining(server, key).await);
    }
    for (pairs, _) in ENVOY_VICTIMS {
        after.push(u64::from(envoy_remaining(&mut run.client, pairs).await));
    }
    assert_eq!(after, before, "{backend}: a hostile request touched a victim's state");

    // The management API still takes a well-formed policy (its body is read by the stricter
    // parser that refuses repeated members), and the server keeps answering; nothing panicked.
    let r = server
        .client
        .post(server.url("/v1/admin/policies"))
        .bearer_auth(&run.token)
        .json(&json!({"name": "hostile-ok", "apps": ["shop"], "description": "é ☃ {}",
            "rules": [{"algorithm": "gcra", "limit": 5, "period": "1m", "burst": 2}]}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_eq!(status, 201, "{}", r.text().await.unwrap());
    let (status, _) = server.get_text("/healthz").await;
    assert_eq!(status, 200);
    let (status, body) = server.check(json!({"key": "after-the-catalogue", "policy": "victim"})).await;
    assert_eq!((status, &body["remaining"]), (200, &json!(9)), "{body}");
    legal_keys.push("after-the-catalogue".to_owned());
    let logs = server.logs();
    assert!(!logs.contains("panicked"), "{backend}: a panic:\n{logs}");
    legal_keys
}

#[tokio::test]
async fn hostile_requests_on_memory() {
    let mut run = start(None).await;
    run_catalogue(&mut run, "memory").await;
}

#[tokio::test]
async fn hostile_requests_on_redis_touch_only_their_own_keys() {
    let redis = tollgate_testkit::RedisServer::start();
    let mut run = start(Some(&redis)).await;
    let legal = run_catalogue(&mut run, "redis").await;

    // Every Redis key is the hash of one legal key, and every legal key has exactly one: the
    // crafted keys never shared a Redis key with the victims or with each other (keys in
    // Tollgate's own namespaces, such as the Envoy victim's, are refused).
    let keys: BTreeSet<String> = redis.keys().into_iter().collect();
    let hashed = legal.iter().filter(|k| *k == "envoy#").count();
    let distinct: BTreeSet<&String> = legal.iter().filter(|k| *k != "envoy#").collect();
    let mut expected: BTreeSet<String> = BTreeSet::new();
    for key in distinct {
        assert!(expected.insert(format!("{}h", tagged(key))), "two legal keys map to one Redis key: {key:?}");
    }
    assert!(expected.len() >= 45, "{} legal keys", expected.len());
    let (long, exact): (BTreeSet<String>, BTreeSet<String>) =
        keys.into_iter().partition(|k| k.starts_with("tollgate:{envoy#"));
    let missing: Vec<&String> = expected.difference(&exact).collect();
    let extra: Vec<&String> = exact.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the Redis keys are not exactly those of the legal requests: missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(long.len(), hashed, "{long:?}");
    assert!(long.iter().all(|k| k.len() == "tollgate:{envoy#}:h".len() + 64), "{long:?}");
}
