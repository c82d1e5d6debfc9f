//! TLS, and mutual TLS, on the gRPC listener (upstream's `GRPC_SERVER_USE_TLS`,
//! `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and `GRPC_CLIENT_TLS_CACERT`): rustls over
//! ring, TLS 1.2 and 1.3, ALPN `h2` (gRPC clients such as Envoy and gRPC C-core insist on it).
//! The handshake runs in [`crate::listen`]'s connection tasks, bounded by the header timeout.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio_rustls::TlsAcceptor;

/// A TLS acceptor serving the certificate chain of `cert` with the private key of `key` (PEM
/// files); with `client_ca`, clients must present a certificate that the CAs of that PEM file
/// issued (mTLS), as upstream requires one when `GRPC_CLIENT_TLS_CACERT` is set.
///
/// With `client_san` too, the client's certificate must also be valid for that DNS name
/// (upstream's `GRPC_CLIENT_TLS_SAN`).
pub(crate) fn acceptor(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    client_san: Option<&str>,
) -> anyhow::Result<TlsAcceptor> {
    let chain = certificates(cert, "--grpc-tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--grpc-tls-key {}: no PEM private key could be read", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca, "--grpc-tls-client-ca")? {
                roots.add(c).with_context(|| {
                    format!("--grpc-tls-client-ca {}: a certificate is not a CA's", ca.display())
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .with_context(|| format!("--grpc-tls-client-ca {}", ca.display()))?;
            match client_san {
                None => builder.with_client_cert_verifier(verifier),
                Some(san) => {
                    let name = ServerName::try_from(san.to_owned())
                        .map_err(|_| anyhow::anyhow!("--grpc-tls-client-san {san:?} is not a DNS name"))?;
                    builder.with_client_cert_verifier(Arc::new(NamedClient { inner: verifier, name }))
                }
            }
        }
    };
    let mut config = builder.with_single_cert(chain, key).with_context(|| {
        format!("--grpc-tls-cert {} and --grpc-tls-key do not make a pair", cert.display())
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Every certificate of the PEM file `path` (at least one).
fn certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let found: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{flag} {}: cannot be read", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{flag} {}: not PEM certificates", path.display()))?;
    anyhow::ensure!(!found.is_empty(), "{flag} {}: no PEM certificate in it", path.display());
    Ok(found)
}

/// A client verifier that also wants the client's certificate valid for `name`, as upstream's
/// `GRPC_CLIENT_TLS_SAN` (Go's `x509.VerifyOptions.DNSName`).
#[derive(Debug)]
struct NamedClient {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
