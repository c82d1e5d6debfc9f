//! The operators' kit in deploy/, each piece checked: every metric the Grafana dashboard and the
//! alerting rules query is one a real server exports (after traffic that makes each appear);
//! the rules pass `promtool check rules` and their unit tests; the systemd unit passes
//! `systemd-analyze verify` and starts `serve` with flags it has; the two-instance example is
//! a valid configuration whose two instances, run on one Redis, share one limit.
//!
//! promtool (Debian's prometheus package) and systemd-analyze (systemd) are installed by
//! scripts/test; without them these checks are skipped, except under CI=true, where they fail.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Tollgate, eventually, inside_window};
use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

/// `CI` set (and not `false` or `0`): a missing tool fails the test instead of skipping it.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Whether `name` is installed; under CI, its absence is a failure.
fn have(name: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !in_ci(),
            "{name} is missing (CI=true): apt-get install --no-install-recommends {package}, or run \
             scripts/test, which does"
        );
        eprintln!("SKIPPED: {name} is missing (apt-get install {package}; with CI=true this fails)");
    }
    found
}

// --- PromQL and the Prometheus text format -------------------------------------------------

/// A metric selector of a PromQL expression: the metric's name, the labels its matchers name,
/// and the values its equality matchers (`label="value"`, no Grafana variable) ask for.
#[derive(Debug, PartialEq)]
struct Selector {
    metric: String,
    labels: Vec<String>,
    values: Vec<(String, String)>,
}

/// PromQL's functions and aggregations the kit uses (an identifier before `(` must be one).
const FUNCTIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "rate",
    "irate",
    "increase",
    "changes",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "abs",
    "absent",
    "vector",
    "scalar",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];
/// Modifiers followed by a list of label names, not of selectors.
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The index after the string literal that starts at `i`.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        if chars[j] == '\\' && quote != '`' {
            j += 2;
            continue;
        }
        if chars[j] == quote {
            return j + 1;
        }
        j += 1;
    }
    panic!("unterminated string in {}", chars.iter().collect::<String>())
}

/// The index after the first `close` from `i`.
fn skip_past(chars: &[char], i: usize, close: char) -> usize {
    let at = chars[i..].iter().position(|&c| c == close);
    i + at.unwrap_or_else(|| panic!("no {close} in {}", chars.iter().collect::<String>())) + 1
}

/// The label names of the matchers `{...}` at `i` (with the value of each `=` one), and the
/// index after them.
fn matcher_labels(chars: &[char], mut i: usize, labels: &mut Vec<(String, Option<String>)>) -> usize {
    i += 1;
    loop {
        while chars[i].is_whitespace() || chars[i] == ',' {
            i += 1;
        }
        if chars[i] == '}' {
            return i + 1;
        }
        let start = i;
        while is_word(chars[i]) {
            i += 1;
        }
        let name: String = chars[start..i].iter().collect();
        let op_start = i;
        while chars[i].is_whitespace() || matches!(chars[i], '=' | '!' | '~') {
            i += 1;
        }
        let op: String = chars[op_start..i].iter().filter(|c| !c.is_whitespace()).collect();
        let value_start = i;
        i = skip_string(chars, i);
        let value: String = chars[value_start + 1..i - 1].iter().collect();
        labels.push((name, (op == "=" && !value.contains('$')).then_some(value)));
    }
}

/// Every metric selector of `expr`.
fn selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            // A range or subquery: a duration or a Grafana variable.
            '[' => i = skip_past(&chars, i, ']'),
            // A Grafana variable ($policy, ${datasource}).
            '$' if chars.get(i + 1) == Some(&'{') => i = skip_past(&chars, i, '}'),
            '$' => {
                i += 1;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
            }
            // A number or a duration (0.99, 1e3, 5m).
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let before_paren = chars.get(next) == Some(&'(');
                if GROUPING.contains(&word.as_str()) {
                    if before_paren {
                        i = skip_past(&chars, next, ')');
                    }
                } else if FUNCTIONS.contains(&word.as_str()) {
                    // A call, or an aggregation whose `by (...)` comes first.
                } else if before_paren {
                    panic!("unknown function {word} in {expr}");
                } else if !KEYWORDS.contains(&word.to_lowercase().as_str()) {
                    let mut matchers = Vec::new();
                    if chars.get(next) == Some(&'{') {
                        i = matcher_labels(&chars, next, &mut matchers);
                    }
                    let values = matchers.iter().filter_map(|(l, v)| Some((l.clone(), v.clone()?))).collect();
                    let labels = matchers.into_iter().map(|(l, _)| l).collect();
                    out.push(Selector { metric: word, labels, values });
                }
            }
            '{' => panic!("a selector without a metric name in {expr}"),
            _ => i += 1,
        }
    }
    out
}

#[test]
fn selectors_are_found_in_promql() {
    let found = selectors(
        r#"histogram_quantile(0.99, sum by (le, backend) (rate(a_bucket{x="1", y=~"a|b\"}", z="$v"}[$__rate_interval])))
           / on (z) group_left b offset 5m > 3 * sum(c:d{instance=~"$instance"}[1h] offset 1e3) or vector(0)"#,
    );
    let want = |metric: &str, labels: &[&str], values: &[(&str, &str)]| Selector {
        metric: metric.into(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        values: values.iter().map(|(l, v)| ((*l).to_owned(), (*v).to_owned())).collect(),
    };
    assert_eq!(
        found,
        [
            want("a_bucket", &["x", "y", "z"], &[("x", "1")]),
            want("b", &[], &[]),
            want("c:d", &["instance"], &[])
        ]
    );
}

/// The series of a Prometheus text exposition, each with the labels its samples carry and
/// their values (a histogram's series are its `_bucket`, `_sum` and `_count`, as PromQL names
/// them).
fn exported(text: &str) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut series: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let end = line.find(['{', ' ']).unwrap_or_else(|| panic!("not a sample: {line}"));
        let labels = series.entry(line[..end].to_owned()).or_default();
        if line[end..].starts_with('{') {
            let chars: Vec<char> = line[end..].chars().collect();
            let mut pairs = Vec::new();
            matcher_labels(&chars, 0, &mut pairs);
            for (name, value) in pairs {
                labels.entry(name).or_default().extend(value);
            }
        }
    }
    series
}

/// Every PromQL expression of the dashboard: its panels' and annotations' `expr`, and its
/// variables' queries (`label_values(selector, label)` stands for its selector).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(expr)) => out.push(expr.clone()),
                        ("query", Value::Object(q)) => {
                            if let Some(Value::String(query)) = q.get("query") {
                                let inner = query
                                    .strip_prefix("label_values(")
                                    .and_then(|q| q.rsplit_once(','))
                                    .map(|(selector, _)| selector.to_owned());
                                out.push(inner.unwrap_or_else(|| query.clone()));
                            }
                        }
                        _ => walk(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/tollgate.json")).expect("the dashboard is JSON")
}

fn alerting_rules() -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&read("prometheus/alerts.yml")).expect("the rules are YAML")
}

/// (alert name, expression) of every rule.
fn alerts() -> Vec<(String, String)> {
    let rules = alerting_rules();
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alerting rule").to_owned();
            out.push((name, rule["expr"].as_str().expect("expr").to_owned()));
        }
    }
    out
}

#[test]
fn the_dashboard_is_well_formed_and_covers_what_operators_ask() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "{title}: duplicate id");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is wider than the grid");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().filter(|t| !t.is_empty());
        for target in targets.unwrap_or_else(|| panic!("{title} has no query")) {
            assert!(target["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{title}");
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    // Every variable a query uses is defined (or one of Grafana's own).
    let defined: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for query in dashboard_queries(&dashboard) {
        for (at, _) in query.match_indices('$') {
            let name: String = query[at + 1..].chars().take_while(|&c| is_word(c)).collect();
            assert!(
                defined.contains(name.as_str())
                    || ["__rate_interval", "__range", "__interval"].contains(&name.as_str()),
                "${name} is not defined: {query}"
            );
        }
    }
    // What issue 22 asks the dashboard to show.
    let all: Vec<Selector> = dashboard_queries(&dashboard).iter().flat_map(|q| selectors(q)).collect();
    for metric in [
        "tollgate_decisions_total",
        "tollgate_degraded_decisions_total",
        "tollgate_breaker_open",
        "tollgate_backend_duration_seconds_bucket",
        "tollgate_redis_deny_cache_hits_total",
        "tollgate_redis_operations_total",
        "tollgate_redis_calls_total",
    ] {
        assert!(all.iter().any(|s| s.metric == metric), "the dashboard does not show {metric}");
    }
    assert!(
        dashboard_queries(&dashboard).iter().any(|q| q.contains("topk(") && q.contains("by (policy)")),
        "the hottest policies"
    );
}

fn redis_config(redis: &RedisServer) -> String {
    format!(
        r#"
[backend]
kind = "redis"
url = "{}"
prefix = "kit"
timeout = "2s"
on_failure = "local"
failure_threshold = 1
probe_interval = "100ms"

[policies.p]
rules = [{{ name = "hourly", algorithm = "fixed_window", limit = 3, period = "1h" }}]

[policies.smooth]
rules = [{{ name = "pace", algorithm = "gcra", limit = 5, period = "1s", burst = 1 }}]
on_limit = "delay"
max_wait = "1s"

[policies.trial]
mode = "shadow"
rules = [{{ name = "daily", algorithm = "fixed_window", limit = 1, period = "1d" }}]
"#,
        redis.url()
    )
}

/// Metrics appear in /metrics once recorded, so the server is driven through what records
/// each: admitted, refused (Redis, then the deny cache), delayed and shadow-refused requests,
/// a refused configuration, then Redis killed (errors, the breaker, degraded answers). Then
/// every selector of the dashboard and the alerts must name an exported series and labels it
/// has.
#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_query_is_exported() {
    let mut redis = RedisServer::start();
    let config = redis_config(&redis);
    let server = Tollgate::start(&config, &[]).await;
    inside_window(3600, 30).await;

    let mut statuses = Vec::new();
    for _ in 0..6 {
        let (status, body) = server.check(json!({"key": "a", "policy": "p"})).await;
        assert_eq!(body["degraded"], false, "{body}");
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    for _ in 0..3 {
        assert_eq!(server.check(json!({"key": "s", "policy": "smooth"})).await.0, 200);
    }
    for _ in 0..2 {
        assert_eq!(server.check(json!({"key": "t", "policy": "trial"})).await.0, 200);
    }
    // The first refusal came from Redis; the two after it from the deny cache.
    assert_eq!(server.metric("tollgate_redis_deny_cache_hits_total").await, 2.0);
    let (operations, calls) = (
        server.metric("tollgate_redis_operations_total").await,
        server.metric("tollgate_redis_calls_total").await,
    );
    assert!(calls >= 1.0 && operations >= calls, "{operations} operations in {calls} calls");
    // The second and third come within the first's 200 ms, unless this machine is slower than
    // that between two requests: at least one was held.
    let delayed = server.metric("tollgate_delayed_total{policy=\"smooth\",result=\"admitted\"}").await;
    assert!(delayed >= 1.0, "{delayed}");
    let ok = "tollgate_config_last_reload_successful{config=\"file\"}";
    assert_eq!(server.metric(ok).await, 1.0);

    server.rewrite_config(&format!("{config}\n[policies.broken]\nrules = [{{ algorithm = \"nope\" }}]\n"));
    let refused = eventually(Duration::from_secs(10), || async { server.metric(ok).await == 0.0 }).await;
    assert!(refused, "the gauge says the reload was refused:\n{}", server.logs());
    let counted = "tollgate_config_reloads_total{config=\"file\",result=\"refused\"}";
    assert_eq!(server.metric(counted).await, 1.0);

    redis.kill();
    let degraded = eventually(Duration::from_secs(10), || async {
        server.check(json!({"key": "b", "policy": "p"})).await.1["degraded"] == true
    })
    .await;
    assert!(degraded, "{}", server.logs());
    let open =
        eventually(Duration::from_secs(10), || async { server.metric("tollgate_breaker_open").await == 1.0 })
            .await;
    assert!(open, "the breaker opened:\n{}", server.logs());

    let (status, text) = server.get_text("/metrics").await;
    assert_eq!(status, 200);
    let series = exported(&text);
    let mut queries: Vec<(String, String)> =
        dashboard_queries(&dashboard()).into_iter().map(|q| ("the dashboard".to_owned(), q)).collect();
    queries.extend(alerts().into_iter().map(|(name, expr)| (format!("alert {name}"), expr)));
    let mut wrong = Vec::new();
    for (from, query) in &queries {
        for selector in selectors(query) {
            let Some(labels) = series.get(&selector.metric) else {
                wrong.push(format!("{from}: {} is not exported", selector.metric));
                continue;
            };
            // Prometheus adds `instance` and `job` when it scrapes.
            for label in selector.labels.iter().filter(|l| !["instance", "job"].contains(&l.as_str())) {
                if !labels.contains_key(label) {
                    wrong.push(format!("{from}: {} has no label {label} ({labels:?})", selector.metric));
                }
            }
            for (label, value) in &selector.values {
                if labels.get(label).is_some_and(|values| !values.contains(value)) {
                    wrong
                        .push(format!("{from}: {} has no {label}=\"{value}\" ({labels:?})", selector.metric));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}\n\nexported:\n{text}", wrong.join("\n"));
    assert!(queries.len() > 20, "{queries:?}");
}

#[test]
fn the_alerting_rules_pass_promtool_and_each_is_unit_tested() {
    let names: BTreeSet<String> = alerts().into_iter().map(|(name, _)| name).collect();
    for wanted in [
        "TollgateRedisUnreachable",
        "TollgateBreakerOpen",
        "TollgateDegradedAnswers",
        "TollgateDenialRateSpike",
        "TollgateConfigReloadFailed",
    ] {
        assert!(names.contains(wanted), "no {wanted}: {names:?}");
    }
    // Each alert has a test in which it fires.
    let tests: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read("prometheus/alerts.test.yml")).unwrap();
    let mut fired = BTreeSet::new();
    for test in tests["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            if case["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()) {
                fired.insert(case["alertname"].as_str().unwrap().to_owned());
            }
        }
    }
    assert_eq!(fired, names, "alerts without a test that fires them");

    if !have("promtool", "prometheus") {
        return;
    }
    let promtool = |args: &[&str]| {
        let out = Command::new("promtool").args(args).current_dir(deploy("prometheus")).output().unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "promtool {args:?}:\n{text}");
        text
    };
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", names.len())), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The long flags `tollgate <path> --help` lists, and whether it has subcommands.
fn help_of(path: &[&str]) -> (BTreeSet<String>, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(path).arg("--help").output().unwrap();
    assert!(out.status.success(), "tollgate {path:?} --help: {}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8(out.stdout).unwrap();
    let flags = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.split(['=', '<']).next().unwrap().to_owned())
        .collect();
    (flags, help.contains("\nCommands:\n"))
}

/// Checks that a `tollgate ...` command line names a subcommand, and flags it has.
fn check_command_line(line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first().copied(), Some("tollgate"), "{line}");
    let mut path = vec![words[1]];
    while help_of(&path).1 {
        path.push(words[path.len() + 1]);
    }
    let (flags, _) = help_of(&path);
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        let flag = flag.split('=').next().unwrap();
        assert!(flags.contains(flag), "`tollgate {}` has no {flag}: {line}", path.join(" "));
    }
}

/// The `tollgate ...` commands of a Markdown file: lines of its code blocks (continued lines
/// joined, environment assignments dropped) and inline code spans.
fn commands_in_markdown(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            pending.push_str(line.trim_end_matches('\\'));
            pending.push(' ');
            if !line.ends_with('\\') {
                let words = std::mem::take(&mut pending);
                let command: Vec<&str> =
                    words.split_whitespace().skip_while(|w| w.contains('=') && !w.starts_with('-')).collect();
                if command.first() == Some(&"tollgate") {
                    out.push(command.join(" "));
                }
            }
        } else {
            for (n, span) in line.split('`').enumerate() {
                if n % 2 == 1 && span.starts_with("tollgate ") {
                    out.push(span.to_owned());
                }
            }
        }
    }
    out
}

/// `[Service]` (and other sections') settings: key and value, in order, comments left out.
fn unit_settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (key, value) = l.split_once('=').unwrap_or_else(|| panic!("not a setting: {l}"));
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

#[test]
fn the_systemd_unit_is_hardened_and_runs_serve_with_flags_it_has() {
    let unit = read("systemd/tollgate.service");
    let settings = unit_settings(&unit);
    let values = |key: &str| -> Vec<&str> {
        settings.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    };
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("LockPersonality", "yes"),
        ("SystemCallFilter", "@system-service"),
        ("SystemCallArchitectures", "native"),
    ] {
        assert!(values(key).contains(&value), "{key}={value} is missing: {:?}", values(key));
    }
    let exec = values("ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(words[..2], ["/usr/local/bin/tollgate", "serve"], "{exec:?}");
    check_command_line(&format!("tollgate {}", words[1..].join(" ")));
    // With ProtectSystem=strict only the state directory is writable, and the configuration
    // directory is where the unit's --config is.
    let arg = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1]).unwrap();
    assert_eq!(values("StateDirectory"), ["tollgate"]);
    assert!(arg("--database").starts_with("sqlite:///var/lib/tollgate/"), "{exec:?}");
    assert_eq!(values("ConfigurationDirectory"), ["tollgate"]);
    assert!(arg("--config").starts_with("/etc/tollgate/"), "{exec:?}");

    if !have("systemd-analyze", "systemd") {
        return;
    }
    // verify wants the binary to exist, and the man page the unit documents.
    let dir = tempfile::tempdir().unwrap();
    let unit_path = dir.path().join("tollgate.service");
    std::fs::write(&unit_path, unit.replace("/usr/local/bin/tollgate", env!("CARGO_BIN_EXE_tollgate")))
        .unwrap();
    let man = dir.path().join("man");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["man", "--out"])
        .arg(man.join("man1"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let out =
        Command::new("systemd-analyze").arg("verify").arg(&unit_path).env("MANPATH", &man).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It warns of unknown keys and bad values on stderr with success: both count.
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify:\n{stderr}");
}

#[test]
fn the_two_instance_example_checks_and_its_commands_exist() {
    let toml = deploy("two-instances/tollgate.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("check-config").arg(&toml).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("ok, 3 policies: api, login, signup"), "{stdout}");

    let commands = commands_in_markdown(&read("two-instances/README.md"));
    assert!(commands.iter().any(|c| c.starts_with("tollgate serve --config")), "{commands:?}");
    assert!(commands.iter().any(|c| c.starts_with("tollgate token create")), "{commands:?}");
    for command in &commands {
        check_command_line(command);
    }
    // The load balancer sends to the port the instances listen on.
    let nginx = read("two-instances/nginx.conf");
    let serve = commands.iter().find(|c| c.starts_with("tollgate serve")).unwrap();
    let port = serve.split("--listen ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap();
    let port = port.rsplit(':').next().unwrap();
    let upstreams: Vec<&str> =
        nginx.lines().filter_map(|l| l.trim().strip_prefix("server ")).filter(|l| l.contains(':')).collect();
    assert_eq!(upstreams.len(), 2, "{upstreams:?}");
    for upstream in upstreams {
        assert!(upstream.split_whitespace().next().unwrap().ends_with(&format!(":{port}")), "{upstream}");
    }
}

/// The example's configuration, run twice on one Redis: requests alternating between the two
/// instances are held to one limit (with the memory backend each would admit the limit).
#[tokio::test]
async fn two_instances_of_the_example_share_one_limit() {
    let example = read("two-instances/tollgate.toml");
    let redis = RedisServer::start();
    let config = example.replace("redis://10.0.0.5:6379", &redis.url());
    assert_ne!(config, example, "the example's Redis URL moved; update this test");
    let (a, b) = (Tollgate::start(&config, &[]).await, Tollgate::start(&config, &[]).await);
    inside_window(3600, 30).await;
    let mut admitted = [0, 0];
    for i in 0..16 {
        let server = [&a, &b][i % 2];
        let (status, body) = server.check(json!({"key": "203.0.113.7", "policy": "signup"})).await;
        assert!(status == 200 || status == 429, "{status} {body}");
        assert_eq!(body["degraded"], false, "{body}");
        if status == 200 {
            admitted[i % 2] += 1;
        }
    }
    assert_eq!(admitted, [5, 5], "10 an hour in all, whichever instance answers");
}
