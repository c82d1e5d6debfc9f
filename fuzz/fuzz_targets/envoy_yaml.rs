//! envoyproxy/ratelimit's YAML configuration (`tollgate serve --envoy-config`): text to a
//! validated [`Domain`]. Never panics; every limit of a valid domain is a valid rule set, and
//! looking up a descriptor path that the tree defines finds it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::RuleSet;
use tollgate_envoy::Domain;
use tollgate_envoy::config::{Node, find};

fn walk(root: &Node, node: &Node, path: &mut Vec<(String, String)>, depth: usize) {
    let rules: Vec<_> = node.limits.iter().filter_map(|l| l.rule.clone()).collect();
    if !rules.is_empty() {
        RuleSet::new(rules).expect("a node's limits form a rule set");
    }
    if depth > 8 {
        return;
    }
    for ((key, value), child) in &node.exact {
        path.push((key.clone(), value.clone()));
        assert!(find(root, path).is_some(), "{path:?} is defined but not found");
        walk(root, child, path, depth + 1);
        path.pop();
    }
    for (key, prefix, child) in &node.prefix {
        path.push((key.clone(), prefix.clone()));
        walk(root, child, path, depth + 1);
        path.pop();
    }
    for (key, child) in &node.any {
        path.push((key.clone(), String::new()));
        walk(root, child, path, depth + 1);
        path.pop();
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Domain::from_yaml(text, "fuzz.yaml") {
        Ok(domain) => {
            assert!(!domain.name.is_empty());
            walk(&domain.root, &domain.root, &mut Vec::new(), 0);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
