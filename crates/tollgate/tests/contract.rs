//! The OpenAPI document is the contract: schemathesis (`--checks all`, stateful phase included)
//! against a real `serve` with a policy database, a seeded consumer limit and a token of each
//! role (admin, editor, viewer), each run with no failure and no warning that can be mended.
//! Its settings, and the few
//! places where it is told that a refusal JSON Schema cannot state is expected, are in
//! `tests/contract/schemathesis.toml`.
//!
//! schemathesis is installed with pip into a virtualenv under the target directory when missing.
//! Under `CI=true` a failure to install or run it fails the test; elsewhere it is skipped with a
//! message.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Tollgate, bootstrap_token};
use serde_json::json;

/// Pinned so that a seed means the same cases on every machine.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// With this seed and example count the run takes well under a minute.
const SEED: &str = "4";
const MAX_EXAMPLES: &str = "10";

/// The budget of inline state is a server setting (400 `state-too-large` above it), not a
/// per-field bound the document can state: raised to its maximum so that every rule the
/// document allows fits.
const CONFIG: &str = r#"
[server]
max_request_state = 1073741824

[policies.from_file]
rules = [{ algorithm = "fixed_window", limit = 5, period = "1h" }]
"#;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The schemathesis executable, installing it when missing; `Err` says why it cannot be had.
fn schemathesis() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("schemathesis-venv");
    let exe = venv.join("bin").join("schemathesis");
    let pinned = venv.join(SCHEMATHESIS);
    if exe.exists() && pinned.exists() {
        return Ok(exe);
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?} failed:\n{}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", SCHEMATHESIS]))?;
    std::fs::write(&pinned, "").map_err(|e| e.to_string())?;
    Ok(exe)
}

/// A consumer limit for the operations on one (a made-up id only ever meets a 404), made
/// afresh for each run since a run may delete it: its id.
async fn seed(server: &Tollgate, admin: &str) -> String {
    let limits = json!({"per_second": 1, "per_minute": -1, "per_hour": -1, "per_day": -1, "per_week": -1, "per_month": -1});
    let created = reqwest::Client::new()
        .post(server.url("/v1/admin/consumers/seeded/limits"))
        .bearer_auth(admin)
        .json(&limits)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    created.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
}

/// One schemathesis run against `server` with `token`, `extra` arguments narrowing the
/// operations; asserts no failure and no warning.
fn run(exe: &Path, dir: &Path, server: &Tollgate, token: &str, seeded: &str, extra: &[&str]) -> String {
    let settings = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract/schemathesis.toml");
    let out = Command::new(exe)
        .arg("--config-file")
        .arg(&settings)
        .arg("run")
        .arg(server.url("/openapi.json"))
        .args(["--checks", "all", "--seed", SEED, "--max-examples", MAX_EXAMPLES, "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(extra)
        // The consumer limit the settings point updates and deletes at.
        .env("TOLLGATE_SEEDED_LIMIT", seeded)
        // schemathesis keeps a cache in its working directory.
        .current_dir(dir)
        .output()
        .expect("schemathesis runs");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "schemathesis found failures with {extra:?} ({}):\n{report}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Warnings that can be mended (schema stricter than the API, operations never reached) are
    // failures too. One cannot be: a consumer limit's `to` must be after its `from`, which JSON
    // Schema cannot state, so random times are mostly refused there ("validation mismatch").
    let warnings = unmendable_warnings_only(&report);
    assert!(warnings.is_ok(), "schemathesis warned with {extra:?}: {}\n{report}", warnings.unwrap_err());
    report
}

/// Whether the report's warnings are all the consumer limits' validation mismatch; else the
/// first other warning.
fn unmendable_warnings_only(report: &str) -> Result<(), String> {
    let Some(section) = report.split("WARNINGS ===").nth(1) else { return Ok(()) };
    let section = section.split("SUMMARY ===").next().unwrap_or(section);
    let mut title = "";
    for line in section.lines() {
        if line.trim().is_empty() || line.starts_with("💡") || line.starts_with('=') {
            continue;
        }
        if let Some(operation) = line.strip_prefix("  - ") {
            if !(title.starts_with("Schema validation mismatch")
                && operation.contains(" /v1/admin/consumers/"))
            {
                return Err(format!("{title} / {operation}"));
            }
        } else {
            title = line;
            if !title.starts_with("Schema validation mismatch") {
                return Err(title.to_owned());
            }
        }
    }
    Ok(())
}

/// Every role's token against the operations it may call: the admin's all of them, the
/// editor's all but tokens (an admin's), the viewer's the reads. (Each role's refusals are
/// tested in api.rs.)
#[tokio::test]
async fn the_served_openapi_document_holds_under_schemathesis() {
    let exe = match schemathesis() {
        Ok(exe) => exe,
        Err(why) if !in_ci() => {
            eprintln!("skipped: schemathesis is not available: {why}");
            return;
        }
        Err(why) => panic!("schemathesis is not available: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("contract.db").display());
    let admin = bootstrap_token(&database, "root", "admin", None);
    let editor = bootstrap_token(&database, "editor", "editor", None);
    let viewer = bootstrap_token(&database, "viewer", "viewer", None);
    let server = Tollgate::start(CONFIG, &["--database", &database]).await;
    let report = run(&exe, dir.path(), &server, &admin, &seed(&server, &admin).await, &[]);
    // A run that tested nothing would pass too: every operation of the document is tested.
    let document: serde_json::Value =
        reqwest::get(server.url("/openapi.json")).await.unwrap().json().await.unwrap();
    let operations: usize =
        document["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
    assert!(operations >= 25, "{operations} operations");
    assert!(report.contains(&format!("Tested: {operations}")), "{operations} operations:\n{report}");
    assert!(report.contains("✅ Stateful"), "{report}");
    let seeded = seed(&server, &admin).await;
    run(&exe, dir.path(), &server, &editor, &seeded, &["--exclude-path-regex", "^/v1/admin/tokens"]);
    run(
        &exe,
        dir.path(),
        &server,
        &viewer,
        &seeded,
        &[
            "--include-method",
            "GET",
            "--exclude-path-regex",
            "^/v1/admin/tokens",
            // The stateful phase follows links from writes, which a viewer cannot make.
            "--phases",
            "examples,coverage,fuzzing",
        ],
    );
}
