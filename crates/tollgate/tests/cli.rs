//! The command line: configuration reloads (good and broken files), `check-config`, the
//! environment variables, `--help`, and shutdown on SIGTERM.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Tollgate, eventually};
use serde_json::{Value, json};

fn policy(name: &str, limit: u64) -> String {
    format!(
        "[policies.{name}]\nrules = [{{ name = \"hourly\", algorithm = \"fixed_window\", limit = {limit}, period = \"1h\" }}]\n"
    )
}

async fn info(server: &Tollgate) -> Value {
    server.client.get(server.url("/v1/info")).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn a_changed_file_is_applied_and_a_broken_one_refused() {
    let server = Tollgate::start(&policy("p", 1), &[]).await;
    let body = json!({"key": "k", "policy": "p"});
    assert_eq!(server.check(body.clone()).await.0, 200);
    assert_eq!(server.check(body.clone()).await.0, 429);

    // Raise the limit and add a policy.
    server.rewrite_config(&format!("{}{}", policy("p", 5), policy("q", 1)));
    let applied = eventually(Duration::from_secs(5), || async {
        server.check(json!({"key": "k", "policy": "p", "cost": 0})).await.1["limit"] == 5
    })
    .await;
    assert!(applied, "the new limit applies:\n{}", server.logs());
    // A new limit is a new rule with its own count, so the key starts afresh.
    assert_eq!(server.check(body.clone()).await.0, 200);
    assert_eq!(info(&server).await["policies"], json!(["p", "q"]));

    // A broken file: the mistake is on line 4; the last good configuration stays.
    let broken = "[policies.p]\nrules = [\n  { algorithm = \"fixed_window\", limit = 2, period = \"1h\" },\n  { algorithm = \"gcra\", limit = 1, period = \"1s\", burst = 0 },\n]\n";
    server.rewrite_config(broken);
    let logged = eventually(Duration::from_secs(5), || async {
        server.logs().contains("configuration reload refused")
    })
    .await;
    assert!(logged, "{}", server.logs());
    assert!(server.logs().contains("tollgate.toml:4"), "the log names the line:\n{}", server.logs());
    assert_eq!(info(&server).await["policies"], json!(["p", "q"]));
    assert_eq!(server.check(json!({"key": "k", "policy": "p", "cost": 0})).await.1["limit"], 5);

    // Fixed again.
    server.rewrite_config(&policy("p", 9));
    let fixed =
        eventually(Duration::from_secs(5), || async { info(&server).await["policies"] == json!(["p"]) })
            .await;
    assert!(fixed, "{}", server.logs());
}

/// `check-config` on Envoy YAML is upstream's `ratelimit_config_check`: the file checked as
/// `serve --envoy-config` reads it, its domains listed, or the file and the reason.
#[test]
fn check_config_checks_envoy_yaml_too() {
    let check = |args: &[&std::ffi::OsStr]| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("check-config").args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let edge = dir.path().join("edge.yaml");
    std::fs::write(&edge, "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: SECOND, requests_per_unit: 10}\n  - key: health\n    rate_limit: {unlimited: true}\n").unwrap();
    let (ok, stdout, _) = check(&[edge.as_os_str()]);
    assert!(ok && stdout.contains("edge.yaml: ok, 1 domain: edge"), "{stdout}");

    // A directory: every file, subfolders too.
    std::fs::create_dir_all(dir.path().join("team")).unwrap();
    std::fs::write(dir.path().join("team/internal.yml"), "domain: internal\n").unwrap();
    let (ok, stdout, _) = check(&[dir.path().as_os_str()]);
    assert!(ok && stdout.contains("ok, 2 domains: edge, internal"), "{stdout}");

    // Refused as upstream refuses it, naming the file and the line.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unlimited: true}\n",
    )
    .unwrap();
    let (ok, _, stderr) = check(&[bad.as_os_str()]);
    assert!(
        !ok && stderr.contains("bad.yaml:4: should not specify rate limit unit when unlimited"),
        "{stderr}"
    );
    std::fs::write(&bad, "domain: bad\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: -3\n").unwrap();
    let (ok, _, stderr) = check(&[bad.as_os_str()]);
    assert!(!ok && stderr.contains("bad.yaml:6: error loading config file"), "{stderr}");
    let (ok, _, stderr) = check(&[dir.path().as_os_str()]);
    assert!(!ok && stderr.contains("bad.yaml"), "the directory's bad file: {stderr}");

    // Two files of one domain: refused, or merged with upstream's MERGE_DOMAIN_CONFIG.
    std::fs::remove_file(&bad).unwrap();
    std::fs::write(
        dir.path().join("edge-more.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .unwrap();
    let (ok, _, stderr) = check(&[dir.path().as_os_str()]);
    assert!(!ok && stderr.contains("duplicate domain 'edge'"), "{stderr}");
    let (ok, stdout, _) = check(&[dir.path().as_os_str(), "--envoy-merge-domains".as_ref()]);
    assert!(ok && stdout.contains("ok, 2 domains: edge, internal"), "{stdout}");

    // An upstream key where it means nothing: accepted, with a warning.
    let odd = dir.path().join("odd.yaml");
    std::fs::write(&odd, "domain: odd\nshadow_mode: true\n").unwrap();
    let (ok, stdout, stderr) = check(&[odd.as_os_str()]);
    assert!(ok && stdout.contains("ok, 1 domain: odd"), "{stdout}");
    assert!(stderr.contains("warning: ") && stderr.contains("shadow_mode"), "{stderr}");
}

#[test]
fn check_config_accepts_the_example_and_names_the_line_of_a_mistake() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tollgate.example.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["check-config", example]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok, 5 policies: default, login, smooth, trial, uploads"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.toml");
    std::fs::write(&one, policy("only", 1)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("check-config").arg(&one).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok, 1 policy: only"), "{stdout}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nlisten = \"127.0.0.1:1\"\n\n[policies.x]\nrules = [{ algorithm = \"fixed_window\", limit = 1, period = \"1 fortnight\" }]\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.toml:5"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn help_documents_every_option_and_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--config",
        "TOLLGATE_CONFIG",
        "--listen",
        "TOLLGATE_LISTEN",
        "--redis",
        "TOLLGATE_REDIS_URL",
        "--redis-engine",
        "TOLLGATE_REDIS_ENGINE",
        "--json-logs",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("serve") && help.contains("check-config"), "{help}");
}

#[tokio::test]
async fn environment_variables_configure_serve_and_sigterm_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("env.toml");
    std::fs::write(&config, policy("from_env", 2)).unwrap();
    let port = tollgate_testkit::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .env("TOLLGATE_CONFIG", &config)
        .env("TOLLGATE_LISTEN", format!("127.0.0.1:{port}"))
        .env("TOLLGATE_JSON_LOGS", "true")
        .env("TOLLGATE_GRPC_LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_DATABASE_URL", format!("sqlite://{}", dir.path().join("env.db").display()))
        .env_remove("TOLLGATE_REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/info");
    let deadline = Instant::now() + Duration::from_secs(15);
    let info: Value = loop {
        if let Ok(r) = client.get(&url).send().await {
            break r.json().await.unwrap();
        }
        assert!(Instant::now() < deadline, "no answer on TOLLGATE_LISTEN");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(info["policies"], json!(["from_env"]));

    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut logs = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut logs).unwrap();
        (status, logs)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "exit {:?}:\n{}", status.0, status.1);
    // JSON logs: every line is a JSON object.
    let first = status.1.lines().next().unwrap();
    let line: Value = serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert_eq!(line["fields"]["message"], "tollgate is listening");
}

#[tokio::test]
async fn a_bad_redis_url_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            "http://example.com",
            "--database",
            "sqlite::memory:",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Redis URL"));
}

#[test]
fn a_bad_bench_target_names_every_kind_of_target() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "--target", "ftp://example.com", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for scheme in ["http://", "grpc://", "redis://", "redis+cluster://", "redis+sentinel://"] {
        assert!(stderr.contains(scheme), "{scheme} missing from: {stderr}");
    }
}

#[tokio::test]
async fn the_module_engine_needs_the_module_and_info_names_the_engine() {
    let plain = tollgate_testkit::RedisServer::start();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database", "sqlite::memory:", "--redis"])
        .arg(plain.url())
        .args(["--redis-engine", "module"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("module is not loaded"), "{stderr}");

    let loaded = tollgate_testkit::RedisServer::with_module(&[]);
    let url = loaded.url();
    let server = Tollgate::start("", &["--redis", &url, "--redis-engine", "module"]).await;
    let body = json!({"key": "k", "limits": [{"algorithm": "fixed_window", "limit": 1, "period": "1m"}]});
    assert_eq!(server.check(body.clone()).await.0, 200);
    assert_eq!(server.check(body).await.0, 429);
    assert_eq!(info(&server).await["engine"], "module");
    let stats: String = loaded.command(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_tollgate.decide:calls=2"), "{stats}");
}

#[tokio::test]
async fn logs_written_to_a_file_carry_no_colour_codes() {
    // The harness sends standard error to a file: not a terminal.
    let server = Tollgate::start(&policy("p", 1), &[]).await;
    let logs = server.logs();
    assert!(logs.contains("tollgate is listening"), "{logs}");
    assert!(!logs.contains('\x1b'), "escape codes in a log file: {logs:?}");
}

#[test]
fn the_management_commands_say_when_a_token_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["policy", "list", "--server", "127.0.0.1:9"])
        .env_remove("TOLLGATE_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a token is needed: --token TOKEN or TOLLGATE_TOKEN"), "{stderr}");
}

#[test]
fn algorithm_names_are_snake_case_with_kebab_case_accepted() {
    let help = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["bench", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("sliding_window_log") && !help.contains("sliding-window-log"), "{help}");
    // Both spellings get past the parser to the target (port 9: nothing listens there).
    for spelling in ["sliding_window_log", "sliding-window-log"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["bench", "--target", "redis://127.0.0.1:9", "--duration", "1s", "--algorithm", spelling])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("invalid value"), "{spelling}: {stderr}");
        assert!(stderr.contains("Redis does not answer"), "{spelling}: {stderr}");
    }
    // Without --algorithm, a grpc target gets the fixed window its protocol asks for.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "--target", "grpc://127.0.0.1:9", "--duration", "1s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("--algorithm"), "{stderr}");
}
