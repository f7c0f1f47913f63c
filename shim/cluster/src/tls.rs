//! The extender over TLS, with client certificates: the only client it should have is
//! kube-scheduler (its extender config: `enableHTTPS: true` and a `tlsConfig` naming a client
//! certificate and the CA of the extender's). Any pod on the cluster network could otherwise
//! take its connections and request slots — kube-scheduler then treats the extender as failed —
//! and ask where other tenants' functions run. A client without a certificate the configured
//! CA signed is refused in the handshake, before any byte of HTTP.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

/// What is wrong with the TLS files; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or held no PEM object of the kind needed.
    #[error("{what} {path}: {why}")]
    File {
        /// Which file (`--tls-cert`, `--tls-key`, `--client-ca`).
        what: &'static str,
        /// Its path.
        path: String,
        /// Why.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(what: &'static str, path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no certificate in it"));
    }
    Ok(certs)
}

/// The acceptor for `cert` (the extender's chain) and `key`, requiring clients to present a
/// certificate `client_ca` signed.
///
/// # Errors
/// A file missing, unreadable or without what it should hold; a key that does not match.
pub fn acceptor(cert: &Path, key: &Path, client_ca: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates("--tls-cert", cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("--tls-key", key, e))?;
    let mut roots = RootCertStore::empty();
    for c in certificates("--client-ca", client_ca)? {
        roots
            .add(c)
            .map_err(|e| file_error("--client-ca", client_ca, e))?;
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
