//! HTTPS for a server (`--tls-cert FILE --tls-key FILE`): the rustls configuration [`serve_tls`]
//! accepts connections with, read from PEM files.
//!
//! - The certificate file holds the server's certificate first, then any intermediates (the
//!   usual `fullchain.pem`); the key file one private key (PKCS#8, PKCS#1 or SEC1 PEM).
//! - ALPN offers `http/1.1` only: the serve loop speaks HTTP/1.1 (hyper's `http1`), WebSocket
//!   upgrades included.
//! - A file that cannot be read, holds no certificate or key, or a key that does not match the
//!   certificate is a start-up error naming the file ([`TlsError`]).
//!
//! [`serve_tls`]: crate::serve::serve_tls

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why the certificate and key do not make a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {}: {why}", path.display())]
    Cert { path: PathBuf, why: String },
    #[error("--tls-key {}: {why}", path.display())]
    Key { path: PathBuf, why: String },
    #[error("--tls-cert {} and --tls-key {}: {why}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
}

/// The server configuration of the certificate chain in `cert` and the private key in `key`
/// (both PEM), with ALPN `http/1.1`.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_error = |why: String| TlsError::Cert {
        path: cert.to_owned(),
        why,
    };
    let key_error = |why: String| TlsError::Key {
        path: key.to_owned(),
        why,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_error(pem_error(&e)))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_error(pem_error(&e)))?;
    if chain.is_empty() {
        return Err(cert_error(
            "no certificate in it (expected PEM `-----BEGIN CERTIFICATE-----`)".to_owned(),
        ));
    }
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| key_error(pem_error(&e)))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cert_error(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(|e| TlsError::Pair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            why: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A PEM read error as words (a missing file says so plainly).
fn pem_error(error: &rustls_pki_types::pem::Error) -> String {
    match error {
        rustls_pki_types::pem::Error::Io(io) => format!("cannot read it: {io}"),
        rustls_pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".to_owned(),
        other => format!("not a valid PEM file: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("nope.pem");
        let key = dir.path().join("key.pem");
        let error = server_config(&missing, &key).expect_err("no such file");
        let text = error.to_string();
        assert!(
            text.contains("--tls-cert")
                && text.contains("nope.pem")
                && text.contains("cannot read"),
            "{text}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").expect("writes");
        let text = server_config(&empty, &key).expect_err("empty").to_string();
        assert!(text.contains("empty.pem"), "{text}");
    }
}
