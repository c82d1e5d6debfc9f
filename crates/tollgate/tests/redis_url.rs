//! `--redis` URLs beyond the plain one: a username and password, TLS (`rediss://`), and a Redis
//! Cluster (`redis+cluster://`).

mod common;

use std::path::Path;
use std::process::Command;

use common::Tollgate;
use serde_json::json;
use tollgate_testkit::{RedisCluster, RedisServer, free_port};

const CONFIG: &str = r#"
[backend]
on_failure = "closed"

[policies.p]
rules = [{ algorithm = "fixed_window", limit = 2, period = "1h" }]
"#;

/// Whether checks are answered from Redis, within 5 s (the first connection, a TLS handshake on
/// a busy machine, may take longer than one call's timeout).
async fn answers_from_redis(server: &Tollgate) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let (status, body) = server.check(json!({"key": "k", "policy": "p"})).await;
        if status == 200 && body["degraded"] == false {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn username_and_password_in_the_url() {
    let redis = RedisServer::start_with(&["--user", "tg", "on", ">s3cret", "~*", "&*", "+@all"]);
    let _: () = redis.command(&["ACL", "SETUSER", "default", "off"]);
    let port = redis.port();

    let good = format!("redis://tg:s3cret@127.0.0.1:{port}");
    let server = Tollgate::start(CONFIG, &["--redis", &good]).await;
    assert!(answers_from_redis(&server).await, "{}", server.logs());

    let bad = format!("redis://tg:wrong@127.0.0.1:{port}");
    let server = Tollgate::start(CONFIG, &["--redis", &bad]).await;
    let r = server.post("/v1/check", &json!({"key": "k", "policy": "p"})).await;
    assert_eq!(r.status(), 503, "a wrong password is a backend failure, answered by the failure policy");
}

#[tokio::test]
async fn a_redis_cluster_url() {
    let cluster = RedisCluster::start();
    let server = Tollgate::start(CONFIG, &["--redis", &cluster.url()]).await;
    assert!(answers_from_redis(&server).await, "{}", server.logs());
    // The first check above spent one of the key's two; the next is the last, then 429.
    let (status, _) = server.check(json!({"key": "k", "policy": "p"})).await;
    assert_eq!(status, 200);
    let (status, body) = server.check(json!({"key": "k", "policy": "p"})).await;
    assert_eq!(status, 429, "{body}");
    // The state is in the cluster, on the master that serves the key's slot.
    let keys: usize = cluster.masters().iter().map(|&m| cluster.nodes()[m].keys().len()).sum();
    assert_eq!(keys, 1);
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
    assert!(status.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&status.stderr));
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}

#[tokio::test]
async fn tls_with_rediss() {
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let tls_port = free_port().to_string();
    let path = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &path("server.pem"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.pem"),
        "--tls-auth-clients",
        "no",
    ]);

    let url = format!("rediss://127.0.0.1:{tls_port}");
    // The test CA is trusted through the standard variable that rustls-native-certs reads.
    let server =
        Tollgate::start_with_env(CONFIG, &["--redis", &url], &[("SSL_CERT_FILE", &path("ca.pem"))]).await;
    assert!(answers_from_redis(&server).await, "{}", server.logs());
    assert_eq!(redis.keys().len(), 1, "the count is in the TLS server");

    // Without trusting the CA, the certificate is refused: no decision comes from that server.
    let server = Tollgate::start(CONFIG, &["--redis", &url]).await;
    let r = server.post("/v1/check", &json!({"key": "k", "policy": "p"})).await;
    assert_eq!(r.status(), 503);
}
