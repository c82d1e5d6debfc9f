//! TLS and mutual TLS on the gRPC listener (`--grpc-tls-cert`, `--grpc-tls-key`,
//! `--grpc-tls-client-ca`: upstream's GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT,
//! GRPC_SERVER_TLS_KEY and GRPC_CLIENT_TLS_CACERT), with certificates made here by rcgen and a
//! tonic client over rustls.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Tollgate;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const YAML: &str =
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// A CA, a server certificate for `localhost` it issued, a client certificate it issued, and a
/// client certificate from another CA, as PEM files in `dir`.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let leaf = |names: &[&str], issuer: &CertifiedIssuer<'_, KeyPair>, file: &str| {
            let params =
                CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, issuer).unwrap();
            write(&format!("{file}.pem"), cert.pem());
            write(&format!("{file}.key"), key.serialize_pem());
        };
        let trusted = ca("Tollgate test CA");
        write("ca.pem", trusted.pem());
        leaf(&["localhost"], &trusted, "server");
        leaf(&["envoy.client"], &trusted, "client");
        let rogue = ca("Someone else's CA");
        leaf(&["envoy.client"], &rogue, "rogue");
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap()
    }

    /// A client trusting the CA, presenting the certificate `file` (`server`'s CA) if any.
    fn client_tls(&self, identity: Option<&str>) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.text("ca.pem")))
            .domain_name("localhost");
        match identity {
            Some(file) => tls.identity(Identity::from_pem(
                self.text(&format!("{file}.pem")),
                self.text(&format!("{file}.key")),
            )),
            None => tls,
        }
    }
}

/// Starts tollgate with TLS on a free gRPC port, and `extra` arguments; answers its port.
async fn start(pki: &Pki, config: &str, extra: &[&str]) -> (Tollgate, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let port = tollgate_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let mut args = vec![
        "--grpc-listen",
        &listen,
        "--envoy-config",
        yaml.to_str().unwrap(),
        "--grpc-tls-cert",
        cert.to_str().unwrap(),
        "--grpc-tls-key",
        key.to_str().unwrap(),
    ];
    args.extend(extra);
    let server = Tollgate::start(config, &args).await;
    (server, port, dir)
}

/// One ShouldRateLimit call over `tls` (plaintext when `None`): its overall code, or why the
/// connection or the call failed.
async fn call(port: u16, tls: Option<ClientTlsConfig>) -> Result<Code, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "k".into(), value: "v".into() }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request)
        .await
        .map_err(|s| format!("call: {s:?}"))?;
    Ok(answer.into_inner().overall_code())
}

#[tokio::test]
async fn tls_serves_the_service_and_refuses_plaintext() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new();
    let (server, port, _dir) = start(&pki, "", &[]).await;
    assert_eq!(call(port, Some(pki.client_tls(None))).await, Ok(Code::Ok), "{}", server.logs());
    // A client may present a certificate the server does not ask for.
    assert_eq!(call(port, Some(pki.client_tls(Some("client")))).await, Ok(Code::Ok));
    let plain = call(port, None).await;
    assert!(plain.is_err(), "a plaintext client was answered: {plain:?}");
    // A client that does not trust the server's CA gives up.
    let stranger = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.text("rogue.pem")))
        .domain_name("localhost");
    assert!(call(port, Some(stranger)).await.is_err());
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_of_the_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let (server, port, _dir) = start(&pki, "", &["--grpc-tls-client-ca", ca.to_str().unwrap()]).await;
    assert_eq!(call(port, Some(pki.client_tls(Some("client")))).await, Ok(Code::Ok), "{}", server.logs());
    let without = call(port, Some(pki.client_tls(None))).await;
    assert!(without.is_err(), "a client without a certificate was answered: {without:?}");
    let rogue = call(port, Some(pki.client_tls(Some("rogue")))).await;
    assert!(rogue.is_err(), "a client certificate of another CA was accepted: {rogue:?}");
    assert!(call(port, None).await.is_err());
}

#[tokio::test]
async fn the_client_san_narrows_the_accepted_certificates() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let ca = ca.to_str().unwrap();
    let (server, port, _dir) =
        start(&pki, "", &["--grpc-tls-client-ca", ca, "--grpc-tls-client-san", "envoy.client"]).await;
    assert_eq!(call(port, Some(pki.client_tls(Some("client")))).await, Ok(Code::Ok), "{}", server.logs());
    let (_other, port, _d) =
        start(&pki, "", &["--grpc-tls-client-ca", ca, "--grpc-tls-client-san", "someone.else"]).await;
    let refused = call(port, Some(pki.client_tls(Some("client")))).await;
    assert!(refused.is_err(), "a certificate for another name was accepted: {refused:?}");
}

/// Whether the server closes `socket` within `within` (its reads end or fail).
async fn closed_within(socket: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A TLS alert, then the close.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_stalled_handshake_holds_no_one_else_and_is_closed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new();
    let (server, port, _dir) = start(&pki, "[server]\nheader_timeout = \"1s\"\n", &[]).await;
    // One client says nothing; another starts a ClientHello and stops.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut halfway = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    halfway.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]).await.unwrap();
    // Others are served meanwhile.
    let started = Instant::now();
    assert_eq!(call(port, Some(pki.client_tls(None))).await, Ok(Code::Ok), "{}", server.logs());
    assert!(started.elapsed() < Duration::from_millis(900), "served after {:?}", started.elapsed());
    // The stalled handshakes are closed at the header timeout.
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await, "the silent connection stayed open");
    assert!(closed_within(&mut halfway, Duration::from_secs(5)).await, "the half handshake stayed open");
    assert!(started.elapsed() >= Duration::from_millis(500), "closed before the header timeout");
}

#[test]
fn bad_tls_files_are_refused_naming_the_setting() {
    let pki = Pki::new();
    let missing = pki.path("missing.pem");
    let not_pem = pki.path("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let run = |args: &[&Path]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--database",
            "sqlite::memory:",
        ]);
        for (flag, path) in ["--grpc-tls-cert", "--grpc-tls-key", "--grpc-tls-client-ca"].iter().zip(args) {
            cmd.arg(flag).arg(path);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let e = run(&[&missing, &key]);
    assert!(e.contains("--grpc-tls-cert"), "{e}");
    let e = run(&[&not_pem, &key]);
    assert!(e.contains("--grpc-tls-cert") && e.contains("no PEM certificate"), "{e}");
    let e = run(&[&cert, &not_pem]);
    assert!(e.contains("--grpc-tls-key"), "{e}");
    let e = run(&[&cert, &pki.path("client.key")]);
    assert!(e.contains("do not make a pair"), "{e}");
    let e = run(&[&cert, &key, &not_pem]);
    assert!(e.contains("--grpc-tls-client-ca"), "{e}");
    // A key without its certificate.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--grpc-tls-key"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grpc-tls-cert"));
}
