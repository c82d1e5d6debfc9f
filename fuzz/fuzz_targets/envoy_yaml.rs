//! envoyproxy/ratelimit's YAML configuration (`tollgate serve --envoy-config`): text to a
//! validated [`Domain`]. Never panics; every limit of a valid domain is a valid rule set, and
//! looking up a descriptor path that the tree defines finds it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::RuleSet;
use tollgate_envoy::Domain;
use tollgate_envoy::config::{LimitKind, Node, find};

/// Checks every node's limits, and that a path of exact values (no wildcard) the tree defines
/// is found: at each level an exact `key_value` is looked up first.
fn walk(root: &Node, node: &Node, path: &mut Vec<(String, String)>, exact: bool, depth: usize) {
    let rules: Vec<_> = node
        .limits
        .iter()
        .filter_map(|l| match &l.kind {
            LimitKind::Rule(rule) => Some(rule.clone()),
            _ => None,
        })
        .collect();
    if !rules.is_empty() {
        RuleSet::new(rules).expect("a node's limits form a rule set");
    }
    if depth > 8 {
        return;
    }
    for (key, value, child) in node.children() {
        let exact = exact && value.is_some_and(|v| !v.contains('*')) && !key.contains('*');
        path.push((key.to_owned(), value.unwrap_or_default().to_owned()));
        if exact {
            let found = find(root, path).map(|m| std::ptr::eq(m.node, child));
            assert_eq!(found, Some(true), "{path:?} is defined but not found");
        }
        walk(root, child, path, exact, depth + 1);
        path.pop();
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Domain::from_yaml(text, "fuzz.yaml") {
        Ok(domain) => {
            assert!(!domain.name.is_empty());
            walk(&domain.root, &domain.root, &mut Vec::new(), true, 0);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
