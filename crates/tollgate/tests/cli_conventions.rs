//! The command line's conventions: shell completions that the shell accepts and that complete,
//! man pages, and `--version` naming the commit the binary was built from.

use std::process::{Command, Output};

fn tollgate(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().unwrap();
    assert!(out.status.success(), "tollgate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn stdout(args: &[&str]) -> String {
    String::from_utf8(tollgate(args).stdout).unwrap()
}

/// Runs `script` in a non-interactive bash; its stdout.
fn bash(script: &str) -> String {
    let out = Command::new("bash").args(["--norc", "--noprofile", "-c", script]).output().unwrap();
    assert!(out.status.success(), "bash failed on {script}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completion_is_a_script_bash_sources_and_it_completes() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("tollgate.bash");
    std::fs::write(&script, stdout(&["completions", "bash"])).unwrap();
    let status = Command::new("bash").arg("-n").arg(&script).status().unwrap();
    assert!(status.success(), "bash -n refuses the completion script");

    // Sourced, it registers a completion for `tollgate` that knows subcommands and flags.
    let complete = |words: &[&str]| {
        let words = words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" ");
        bash(&format!(
            "source '{}'; complete -p tollgate >/dev/null || exit 9; COMP_WORDS=({words}); \
             COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
             COMP_POINT=${{#COMP_LINE}}; \
             _tollgate tollgate \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
    };
    let subcommands = complete(&["tollgate", "c"]);
    for expected in ["check-config", "completions", "consumer"] {
        assert!(subcommands.lines().any(|l| l == expected), "{expected} missing: {subcommands}");
    }
    let flags = complete(&["tollgate", "serve", "--re"]);
    assert_eq!(flags.lines().collect::<Vec<_>>(), ["--redis", "--redis-engine"], "{flags}");
    let shells = complete(&["tollgate", "completions", ""]);
    for expected in ["bash", "zsh", "fish"] {
        assert!(shells.lines().any(|l| l == expected), "{expected} missing: {shells}");
    }
}

/// Zsh and fish are not installed by scripts/test, so their scripts are checked by what they
/// must declare; where the shell is present, it parses the script too.
#[test]
fn zsh_and_fish_completions_declare_tollgate() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, declares) in [("zsh", "#compdef tollgate"), ("fish", "complete -c tollgate")] {
        let text = stdout(&["completions", shell]);
        assert!(text.contains(declares), "{shell}: {text}");
        assert!(text.contains("check-config") && text.contains("redis-engine"), "{shell}: {text}");
        let file = dir.path().join(format!("tollgate.{shell}"));
        std::fs::write(&file, &text).unwrap();
        if let Ok(status) = Command::new(shell).arg("-n").arg(&file).status() {
            assert!(status.success(), "{shell} -n refuses the completion script");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["completions", "cmd.exe"]).output().unwrap();
    assert!(!out.status.success(), "an unknown shell is refused");
}

#[test]
fn man_prints_the_page_and_writes_one_per_command() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH tollgate 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS") && page.contains("tollgate\\-serve(1)"), "{page}");
    assert!(page.contains(env!("CARGO_PKG_VERSION")), "the page carries the version: {page}");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    tollgate(&["man", "--out", out.to_str().unwrap()]);
    for name in
        ["tollgate", "tollgate-serve", "tollgate-check-config", "tollgate-token-create", "tollgate-man"]
    {
        let text = std::fs::read_to_string(out.join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"));
        assert!(text.contains(&format!(".TH {name} 1")), "{name}.1: {text}");
    }
    let serve = std::fs::read_to_string(out.join("tollgate-serve.1")).unwrap();
    assert!(serve.contains("\\-\\-redis"), "serve's page lists its options: {serve}");
}

/// The commit HEAD is at, as build.rs reads it; None outside a git checkout or without git.
fn head_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn version_names_the_commit() {
    let version = stdout(&["--version"]);
    assert!(version.starts_with(&format!("tollgate {}", env!("CARGO_PKG_VERSION"))), "{version}");
    let expected = match std::env::var("TOLLGATE_COMMIT") {
        Ok(set) if !set.trim().is_empty() => set.trim().to_owned(),
        _ => head_commit().unwrap_or_else(|| "unknown".to_owned()),
    };
    assert!(version.contains(&format!("(commit {expected})")), "{version}, expected {expected}");
}
