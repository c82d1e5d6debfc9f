//! Loading a runtime directory as upstream's loader reads `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
//! config`: every file, subfolders included, dot-files skipped (a Kubernetes ConfigMap's
//! `..data` copies among them), one domain per file, and `MERGE_DOMAIN_CONFIG`'s merge.

use std::path::Path;

use tollgate_envoy::config::find;
use tollgate_envoy::load;

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn limit(yaml_domain: &str, key: &str, n: u32) -> String {
    format!(
        "domain: {yaml_domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
    )
}

fn names(config: &tollgate_envoy::Config) -> Vec<&str> {
    config.domains.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn every_file_of_the_tree_is_read_and_dot_files_are_not() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &limit("a", "k", 1));
    write(dir.path(), "team/b.yml", &limit("b", "k", 2));
    write(dir.path(), "team/deeper/c", &limit("c", "k", 3));
    write(dir.path(), ".hidden.yaml", &limit("a", "k", 9));
    write(dir.path(), ".git/d.yaml", "not: [yaml");
    let config = load(dir.path(), false).unwrap();
    assert_eq!(names(&config), ["a", "b", "c"]);

    // A file that is no configuration stops the load, naming it (upstream reads every file).
    write(dir.path(), "team/README", "Limits for the team.\n");
    let e = load(dir.path(), false).unwrap_err().to_string();
    assert!(e.contains("team/README"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_config_map_mount_is_read_once() {
    // kubelet's layout: files are symlinks through `..data` to a timestamped directory.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "..2026_01_01_00_00_00.1/edge.yaml", &limit("edge", "k", 4));
    std::os::unix::fs::symlink("..2026_01_01_00_00_00.1", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", dir.path().join("edge.yaml")).unwrap();
    let config = load(dir.path(), false).unwrap();
    assert_eq!(names(&config), ["edge"]);
}

#[test]
fn one_domain_in_two_files_is_refused_unless_merged() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "one.yaml", &limit("shared", "k1", 10));
    write(dir.path(), "two.yaml", &limit("shared", "k2", 20));
    let e = load(dir.path(), false).unwrap_err().to_string();
    assert!(e.contains("two.yaml:1: duplicate domain 'shared' in config file"), "{e}");

    let config = load(dir.path(), true).unwrap();
    assert_eq!(names(&config), ["shared"]);
    let root = &config.domains[0].root;
    for (key, n) in [("k1", 10), ("k2", 20)] {
        let m = find(root, &[(key, "v")]).unwrap();
        assert_eq!(m.node.limits[0].requests_per_unit, n);
    }

    // Merged, a descriptor defined by both files is a duplicate.
    write(dir.path(), "three.yaml", &limit("shared", "k1", 30));
    let e = load(dir.path(), true).unwrap_err().to_string();
    assert!(e.contains("three.yaml:3: duplicate descriptor composite key 'shared.k1'"), "{e}");
}

#[test]
fn a_single_file_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "edge.yaml", "domain: edge\nunit: second\ndescriptors:\n  - key: k\n");
    let config = load(&dir.path().join("edge.yaml"), false).unwrap();
    assert_eq!(names(&config), ["edge"]);
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(config.warnings[0].contains("edge.yaml: unit:"), "{:?}", config.warnings);
    let e = load(&dir.path().join("missing.yaml"), false).unwrap_err().to_string();
    assert!(e.contains("missing.yaml: cannot read"), "{e}");
}
