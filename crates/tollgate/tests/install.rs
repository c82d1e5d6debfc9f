//! The README's install command, run as written (issue 23): it must build, and the binary land
//! where the README says. Cargo's own `CARGO_INSTALL_ROOT` puts it in a temporary directory
//! instead of the machine's `~/.cargo/bin`, and `CARGO_TARGET_DIR` keeps its release build apart
//! from the tests' (where `cargo build --release` would leave it: `<target>/release/tollgate`).
//!
//! This is a release build of the binary: minutes on a cold machine, run beside the other tests.

use std::path::Path;
use std::process::Command;

/// The command of the fenced block after `<!-- install -->` in README.md, its comment dropped.
fn install_command() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let block = readme.split("<!-- install -->\n```sh\n").nth(1).expect("README.md marks its install block");
    let line = block.lines().next().unwrap();
    line.split('#').next().unwrap().trim().to_owned()
}

#[test]
fn the_readme_install_command_installs_the_binary() {
    let command = install_command();
    assert!(command.starts_with("cargo install "), "{command}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let install_root = tempfile::tempdir().unwrap();
    let target = root.join("target/readme-install");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let words: Vec<&str> = command.split_whitespace().collect();
    let status = Command::new(cargo)
        .args(&words[1..])
        .current_dir(&root)
        .env("CARGO_INSTALL_ROOT", install_root.path())
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap();
    assert!(status.success(), "`{command}` failed: {status}");

    let installed = install_root.path().join("bin/tollgate");
    let version = Command::new(&installed).arg("--version").output().unwrap();
    assert!(version.status.success());
    let version = String::from_utf8(version.stdout).unwrap();
    assert!(version.starts_with("tollgate "), "{version}");
    assert!(target.join("release/tollgate").is_file(), "the release build leaves target/release/tollgate");
}
