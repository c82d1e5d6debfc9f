//! A corpus of envoyproxy/ratelimit-style files (`tests/corpus/*.yaml`, written for Tollgate
//! from upstream's documented behaviour) with the node each request descriptor reaches
//! (`*.cases`: `key=value,... -> expectation` per line), the files upstream refuses (`*.error`:
//! each line a part of the message, which starts with the file's name and the mistake's line),
//! and the warnings a file gives (`*.warning`).
//!
//! Expectations: `none` (no descriptor matches), `no-limit-node` (a match without a limit),
//! `unlimited`, or the limits as `N/unit` (`blocked/unit` for a limit of 0; several for
//! `rate_limits`), then `shadow`, `quota`, `detailed`, and `shared=P,...` (per entry, the
//! wildcard its value is counted under, `-` for none) when they apply.

use std::path::Path;

use tollgate_envoy::config::{LimitKind, Match, find};
use tollgate_envoy::{Config, Domain};

fn describe(found: Option<Match<'_>>) -> String {
    let Some(Match { node, shared, .. }) = found else { return "none".into() };
    if node.limits.is_empty() {
        return "no-limit-node".into();
    }
    let mut words: Vec<String> = node
        .limits
        .iter()
        .map(|l| match (&l.kind, l.unit) {
            (LimitKind::Unlimited, _) => "unlimited".to_owned(),
            (LimitKind::Block, Some(unit)) => format!("blocked/{}", unit.name()),
            (LimitKind::Rule(_), Some(unit)) => format!("{}/{}", l.requests_per_unit, unit.name()),
            (_, None) => panic!("a limit without a unit: {l:?}"),
        })
        .collect();
    for (flag, word) in
        [(node.shadow_mode, "shadow"), (node.quota_mode, "quota"), (node.detailed_metric, "detailed")]
    {
        if flag {
            words.push(word.into());
        }
    }
    if shared.iter().any(Option::is_some) {
        let each: Vec<&str> = shared.iter().map(|s| s.unwrap_or("-")).collect();
        words.push(format!("shared={}", each.join(",")));
    }
    words.join(" ")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_corpus_is_read_as_upstream_reads_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let (mut checked, mut refused, mut warned) = (0, 0, 0);
    let mut failures = Vec::new();
    for yaml in files.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(yaml).unwrap();
        let name = yaml.file_name().unwrap().to_string_lossy().into_owned();
        let error = yaml.with_extension("error");
        if error.exists() {
            match Domain::from_yaml(&text, &name) {
                Ok(_) => failures.push(format!("{name}: accepted, expected an error")),
                Err(e) => {
                    let message = e.to_string();
                    let missing: Vec<String> =
                        lines(&error).into_iter().filter(|part| !message.contains(part.as_str())).collect();
                    let line = e.line.map_or("no line".into(), |l| format!("{name}:{l}: "));
                    if !message.starts_with(&line) || !missing.is_empty() {
                        failures
                            .push(format!("{name}: {message:?} lacks the file name and line or {missing:?}"));
                    }
                    refused += 1;
                }
            }
            continue;
        }
        let mut config = Config::default();
        if let Err(e) = config.add_file(&text, &name, false) {
            failures.push(format!("{name}: refused: {e}"));
            continue;
        }
        let warning = yaml.with_extension("warning");
        let expected = if warning.exists() { lines(&warning) } else { Vec::new() };
        if expected.len() != config.warnings.len()
            || expected.iter().any(|w| !config.warnings.iter().any(|got| got.contains(w.as_str())))
        {
            failures.push(format!("{name}: warnings {:?}, expected {expected:?}", config.warnings));
        }
        warned += expected.len();
        let domain = &config.domains[0];
        for line in lines(&yaml.with_extension("cases")) {
            let (request, expected) =
                line.split_once(" -> ").unwrap_or_else(|| panic!("{name}: bad case {line:?}"));
            let entries: Vec<(&str, &str)> =
                request.split(',').map(|pair| pair.split_once('=').unwrap()).collect();
            let got = describe(find(&domain.root, &entries));
            if got != expected.trim() {
                failures.push(format!("{name}: {request} -> {got}, expected {expected}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked >= 60 && refused >= 30 && warned >= 1,
        "{checked} cases, {refused} refusals, {warned} warnings"
    );
    eprintln!("{checked} cases, {refused} refusals, {warned} warnings");
}
