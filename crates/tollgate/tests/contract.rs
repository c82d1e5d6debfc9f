//! The OpenAPI document is the contract: schemathesis (`--checks all`, stateful phase included)
//! against a real `serve` with a policy database and an admin token. Its settings, and the few
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
    let server = Tollgate::start(CONFIG, &["--database", &database]).await;

    let settings = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract/schemathesis.toml");
    let out = Command::new(&exe)
        .arg("--config-file")
        .arg(&settings)
        .arg("run")
        .arg(server.url("/openapi.json"))
        .args(["--checks", "all", "--seed", SEED, "--max-examples", MAX_EXAMPLES, "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {admin}")])
        // schemathesis keeps a cache in its working directory.
        .current_dir(dir.path())
        .output()
        .expect("schemathesis runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found failures ({}):\n{report}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // A run that tested nothing would pass too.
    assert!(report.contains("Tested: 25"), "{report}");
    assert!(report.contains("✅ Stateful"), "{report}");
}
