//! Stamps the binary with the commit it was built from, for `tollgate --version`.
//!
//! `TOLLGATE_COMMIT` set in the environment wins (a packager building from a tarball knows the
//! commit); else `git rev-parse --short HEAD`; else "unknown". A build without git, or outside
//! a checkout, must still succeed, so every failure here falls back instead of panicking.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TOLLGATE_COMMIT");
    let commit = match std::env::var("TOLLGATE_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned()),
    };
    // Rebuild the stamp when HEAD moves: HEAD itself (a checkout), the branch it points at (a
    // commit), and packed-refs (where a branch's ref can live after `git gc`). In a worktree
    // these are in different directories, which --git-path resolves.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = PathBuf::from(path);
            let path = if path.is_absolute() {
                path
            } else {
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join(path)
            };
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
}
