//! A corpus of envoyproxy/ratelimit-style files (`tests/corpus/*.yaml`) with the decisions
//! upstream documents for them (`*.cases`: `key=value,... -> expectation` per line), and files
//! that must be refused (`*.error`: a part of the message).
//!
//! Expectations: `none` (no descriptor matches), `no-limit-node` (a match without a limit),
//! `unlimited`, or the limits as `N/unit` (several for `rate_limits`), optionally followed by
//! `shadow` and `detailed`.

use std::path::Path;

use tollgate_envoy::Domain;
use tollgate_envoy::config::{Node, Unit, find};

fn unit(u: Unit) -> &'static str {
    match u {
        Unit::Second => "second",
        Unit::Minute => "minute",
        Unit::Hour => "hour",
        Unit::Day => "day",
        Unit::Week => "week",
        Unit::Month => "month",
        Unit::Year => "year",
    }
}

fn describe(node: Option<&Node>) -> String {
    let Some(node) = node else { return "none".into() };
    if node.limits.is_empty() {
        return "no-limit-node".into();
    }
    if node.limits.iter().all(|l| l.rule.is_none()) {
        return "unlimited".into();
    }
    let mut words: Vec<String> =
        node.limits.iter().map(|l| format!("{}/{}", l.requests_per_unit, unit(l.unit))).collect();
    if node.shadow_mode {
        words.push("shadow".into());
    }
    if node.detailed_metric {
        words.push("detailed".into());
    }
    words.join(" ")
}

#[test]
fn the_corpus_decides_as_documented() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let (mut checked, mut refused) = (0, 0);
    let mut failures = Vec::new();
    for yaml in files.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(yaml).unwrap();
        let name = yaml.file_name().unwrap().to_string_lossy().into_owned();
        let error = yaml.with_extension("error");
        if error.exists() {
            let expected = std::fs::read_to_string(&error).unwrap().trim().to_owned();
            match Domain::from_yaml(&text, &name) {
                Ok(_) => failures.push(format!("{name}: accepted, expected an error with {expected:?}")),
                Err(e) if e.to_string().contains(&expected) => refused += 1,
                Err(e) => failures.push(format!("{name}: {e}, expected {expected:?}")),
            }
            continue;
        }
        let domain = Domain::from_yaml(&text, &name).unwrap_or_else(|e| panic!("{e}"));
        let cases = std::fs::read_to_string(yaml.with_extension("cases")).unwrap();
        for line in cases.lines().filter(|l| !l.trim().is_empty()) {
            let (request, expected) =
                line.split_once(" -> ").unwrap_or_else(|| panic!("{name}: bad case {line:?}"));
            let entries: Vec<(String, String)> = request
                .split(',')
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap();
                    (k.to_owned(), v.to_owned())
                })
                .collect();
            let got = describe(find(&domain.root, &entries));
            if got != expected.trim() {
                failures.push(format!("{name}: {request} -> {got}, expected {expected}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 20 && refused >= 4, "{checked} cases, {refused} refusals");
}
