//! docs/architecture.md's crate graph is the workspace's own, and it holds.
//!
//! - The graph drawn in the doc is generated from `cargo metadata` (`scripts/crate-graph`
//!   rewrites it), so it cannot drift: this test fails when the drawing and the workspace differ.
//! - Every dependency between Tollgate's crates is one the doc's crate table allows ("may depend
//!   on"), so an edge the doc forbids fails here before review; and each row allows only
//!   crates in rows above it, so the rule itself points one way and can allow no cycle.
//! - No cycle runs through the crates, counting dev-dependencies: a test-only edge back up the
//!   graph would build the crate below twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const DOC: &str = "docs/architecture.md";
const BEGIN: &str =
    "<!-- crate-graph: generated from `cargo metadata` by scripts/crate-graph; do not edit -->";
const END: &str = "<!-- end crate-graph -->";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Normal,
    Dev,
}

/// `(dependent, dependency) -> kind`, between workspace members; a normal edge wins over a dev one.
type Edges = BTreeMap<(String, String), Kind>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn workspace_edges() -> (BTreeSet<String>, Edges) {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> =
        packages.iter().map(|p| p["name"].as_str().expect("name").to_owned()).collect();
    let mut edges = Edges::new();
    for package in packages {
        let from = package["name"].as_str().expect("name");
        for dep in package["dependencies"].as_array().expect("dependencies") {
            let to = dep["name"].as_str().expect("name");
            if to == from || !members.contains(to) {
                continue;
            }
            let kind = if dep["kind"].as_str() == Some("dev") { Kind::Dev } else { Kind::Normal };
            let entry = edges.entry((from.to_owned(), to.to_owned())).or_insert(kind);
            *entry = (*entry).min(kind);
        }
    }
    (members, edges)
}

/// The doc's drawing of `edges`: a Mermaid graph, dependents above their dependencies.
fn drawing(members: &BTreeSet<String>, edges: &Edges) -> String {
    let mut out = String::from("```mermaid\ngraph TD\n");
    for member in members {
        if !edges.keys().any(|(a, b)| a == member || b == member) {
            out.push_str(&format!("  {member}\n"));
        }
    }
    for ((from, to), kind) in edges {
        let arrow = match kind {
            Kind::Normal => "-->",
            Kind::Dev => "-. dev .->",
        };
        out.push_str(&format!("  {from} {arrow} {to}\n"));
    }
    out.push_str("```\n");
    out
}

/// The crate table's rows, in order: crate and the crates it may depend on. A row is
/// `| \`crate\` | what it owns | \`a\`, \`b\` (or "nothing") |`.
fn rows(doc: &str) -> Vec<(String, BTreeSet<String>)> {
    let ticked =
        |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    doc.lines()
        .filter(|line| line.starts_with("| `tollgate"))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "", crate, job, may depend on, ""
            let name = ticked(cells.get(1)?).into_iter().next()?;
            Some((name, ticked(cells.get(3)?).into_iter().collect()))
        })
        .collect()
}

/// Crate -> the crates it may depend on.
fn allowed(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    rows(doc).into_iter().collect()
}

/// The rows allowing a crate not above them: `(crate, allowed)`. Empty when the rule points
/// one way, up the table (so it can allow no cycle).
fn upward_violations(doc: &str) -> Vec<(String, String)> {
    let mut above = BTreeSet::new();
    let mut wrong = Vec::new();
    for (name, may) in rows(doc) {
        wrong.extend(may.into_iter().filter(|m| !above.contains(m)).map(|m| (name.clone(), m)));
        above.insert(name);
    }
    wrong
}

fn cycle(edges: &Edges) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        edges: &'a Edges,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut found: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node);
        for (from, to) in edges.keys() {
            if from == node
                && let Some(found) = visit(to, edges, path, done)
            {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_docs_crate_graph_is_the_workspaces() {
    let (members, edges) = workspace_edges();
    let path = root().join(DOC);
    let doc = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("{DOC} has no generated crate graph between {BEGIN:?} and {END:?}");
    };
    let expected = format!("{BEGIN}\n{}{END}", drawing(&members, &edges));
    let current = &doc[begin..end + END.len()];
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(&path, doc.replacen(current, &expected, 1)).expect("write the doc");
        return;
    }
    assert_eq!(current, expected, "{DOC}'s crate graph is stale: run scripts/crate-graph");
}

#[test]
fn every_dependency_between_crates_is_one_the_doc_allows() {
    let (members, edges) = workspace_edges();
    let doc = std::fs::read_to_string(root().join(DOC)).expect("docs/architecture.md");
    let allowed = allowed(&doc);
    for member in &members {
        assert!(allowed.contains_key(member), "{DOC}'s crate table has no row for {member}");
    }
    let forbidden: Vec<String> = edges
        .iter()
        .filter(|(_, kind)| **kind == Kind::Normal)
        .filter(|((from, to), _)| !allowed.get(from).is_some_and(|ok| ok.contains(to)))
        .map(|((from, to), _)| format!("{from} -> {to}"))
        .collect();
    assert!(forbidden.is_empty(), "dependencies {DOC} does not allow: {forbidden:?}");
}

#[test]
fn the_docs_rule_points_one_way() {
    // A crate allowed to depend on one below it could close a cycle without a test failing.
    let doc = std::fs::read_to_string(root().join(DOC)).expect("docs/architecture.md");
    assert_eq!(upward_violations(&doc), [], "{DOC}'s crate table allows a crate listed below its row");
}

#[test]
fn no_cycle_runs_through_the_crates_even_through_dev_dependencies() {
    let (_, edges) = workspace_edges();
    assert_eq!(cycle(&edges), None, "a cycle among the crates");
}

#[test]
fn the_checks_catch_what_they_guard() {
    // The parsers and the cycle finder, on a made-up workspace: a forbidden edge, a cycle.
    let doc = "| `tollgate-b` | the bottom | nothing |\n| `tollgate-a` | the top | `tollgate-b` |\n";
    let allowed = allowed(doc);
    assert_eq!(allowed["tollgate-a"], BTreeSet::from(["tollgate-b".to_owned()]));
    assert!(allowed["tollgate-b"].is_empty());
    assert_eq!(upward_violations(doc), []);
    let circular = doc.replace("the bottom | nothing", "the bottom | `tollgate-a`");
    assert_eq!(upward_violations(&circular), [("tollgate-b".to_owned(), "tollgate-a".to_owned())]);
    let mut edges = Edges::new();
    edges.insert(("tollgate-a".into(), "tollgate-b".into()), Kind::Normal);
    assert_eq!(cycle(&edges), None);
    edges.insert(("tollgate-b".into(), "tollgate-a".into()), Kind::Dev);
    assert_eq!(cycle(&edges).map(|c| c.len()), Some(3));
}

/// Whether a dependency is OpenTelemetry's (its API, SDK, exporters or the tracing bridge).
fn is_opentelemetry(name: &str) -> bool {
    name.starts_with("opentelemetry") || name == "tracing-opentelemetry"
}

#[test]
fn only_the_binary_knows_opentelemetry() {
    // The libraries make plain `tracing` spans; the binary exports them (docs/architecture.md,
    // under the crate graph). Dev-dependencies are free: a test may run a collector.
    assert!(is_opentelemetry("opentelemetry_sdk") && is_opentelemetry("tracing-opentelemetry"));
    assert!(!is_opentelemetry("tracing") && !is_opentelemetry("tracing-subscriber"));
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let mut found = BTreeSet::new();
    for package in meta["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().expect("name");
        for dep in package["dependencies"].as_array().expect("dependencies") {
            let dependency = dep["name"].as_str().expect("name");
            if is_opentelemetry(dependency) && dep["kind"].as_str() != Some("dev") {
                found.insert((name.to_owned(), dependency.to_owned()));
            }
        }
    }
    let elsewhere: Vec<_> = found.iter().filter(|(crate_, _)| crate_ != "tollgate").collect();
    assert!(elsewhere.is_empty(), "OpenTelemetry outside the binary: {elsewhere:?}");
    assert!(found.iter().any(|(_, d)| d == "tracing-opentelemetry"), "the binary exports: {found:?}");
}
