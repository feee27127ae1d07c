//! The gateway's certificate authority for credentialed hosts (network.md "Credentials"): a CA
//! kept in the data directory (its key mode 0600, never in a sandbox; its certificate in every
//! sandbox's trust store), a certificate per host issued on first use and kept in memory, and
//! the trust the proxy checks upstreams against (the system's roots plus
//! `--egress-upstream-ca`).

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::PublicKeyData;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::Digest;

/// The CA's key in its directory (mode 0600).
pub const CA_KEY: &str = "ca.key";
/// The CA's certificate in its directory.
pub const CA_CERT: &str = "ca.pem";
/// How long a host's certificate is valid, and after how long it is issued again.
const LEAF_VALID: Duration = Duration::from_secs(30 * 24 * 3600);
const LEAF_REISSUED_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
/// What both sides of an injecting connection speak.
const HTTP11: &[u8] = b"http/1.1";

/// Why the authority or the upstream trust cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("the egress CA in {dir}: {why}")]
    Ca { dir: PathBuf, why: String },
    #[error("--egress-upstream-ca {path}: {why}")]
    UpstreamCa { path: PathBuf, why: String },
    #[error("a certificate for {host}: {why}")]
    Leaf { host: String, why: String },
}

/// The CA and the certificates it issued, by host.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, (Instant, Arc<ServerConfig>)>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// The CA's subject: the same for a given key, so a reloaded CA issues what the kept
/// certificate verifies.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let digest = sha2::Sha256::digest(key.der_bytes());
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Warren");
    name.push(
        DnType::CommonName,
        format!("Warren egress CA {}", hex::encode(&digest[..4])),
    );
    let mut params = CertificateParams::default();
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

impl Authority {
    /// Loads the CA kept in `dir`, or makes one there (the key readable by this user only).
    pub fn open(dir: &Path) -> Result<Authority, AuthorityError> {
        let error = |why: String| AuthorityError::Ca {
            dir: dir.to_owned(),
            why,
        };
        std::fs::create_dir_all(dir).map_err(|e| error(e.to_string()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| error(e.to_string()))?;
        let key_path = dir.join(CA_KEY);
        let cert_path = dir.join(CA_CERT);
        let (key, cert_pem) = match std::fs::read_to_string(&key_path) {
            Ok(key_pem) => {
                let key = KeyPair::from_pem(&key_pem)
                    .map_err(|e| error(format!("{CA_KEY} does not parse: {e}")))?;
                let cert_pem = std::fs::read_to_string(&cert_path)
                    .map_err(|e| error(format!("{CA_CERT}: {e}")))?;
                (key, cert_pem)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = KeyPair::generate().map_err(|e| error(e.to_string()))?;
                let mut params = ca_params(&key);
                params.not_before = now() - Duration::from_secs(24 * 3600);
                params.not_after = now() + Duration::from_secs(10 * 365 * 24 * 3600);
                let cert = params.self_signed(&key).map_err(|e| error(e.to_string()))?;
                write_new(&cert_path, cert.pem().as_bytes(), 0o644)
                    .map_err(|e| error(e.to_string()))?;
                // The key last: a directory with a key always has its certificate.
                write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)
                    .map_err(|e| error(e.to_string()))?;
                (key, cert.pem())
            }
            Err(e) => return Err(error(e.to_string())),
        };
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| error(format!("{CA_CERT} does not parse: {e}")))?;
        let params = ca_params(&key);
        Ok(Authority {
            issuer: Issuer::new(params, key),
            cert_pem,
            cert_der,
            leaves: Mutex::default(),
        })
    }

    /// The CA's certificate, PEM (what sandboxes trust).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// What the proxy answers a sandbox's TLS with for `host`: a certificate for it signed by
    /// the CA, issued on first use and kept (with its session cache) for later connections.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, AuthorityError> {
        if let Some((issued, config)) = self
            .leaves
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(host)
            && issued.elapsed() < LEAF_REISSUED_AFTER
        {
            return Ok(config.clone());
        }
        let config = Arc::new(self.issue(host)?);
        self.leaves
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(host.to_owned(), (Instant::now(), config.clone()));
        Ok(config)
    }

    /// The server configuration that presents a new certificate for `host`.
    fn issue(&self, host: &str) -> Result<ServerConfig, AuthorityError> {
        let (cert, key) = self.leaf(host)?;
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| AuthorityError::Leaf {
                host: host.to_owned(),
                why: e.to_string(),
            })?;
        config.alpn_protocols = vec![HTTP11.to_vec()];
        Ok(config)
    }

    /// A new certificate for `host` signed by the CA, and its key.
    fn leaf(
        &self,
        host: &str,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), AuthorityError> {
        let error = |why: String| AuthorityError::Leaf {
            host: host.to_owned(),
            why,
        };
        let key = KeyPair::generate().map_err(|e| error(e.to_string()))?;
        let mut params =
            CertificateParams::new(vec![host.to_owned()]).map_err(|e| error(e.to_string()))?;
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_owned());
        params.not_before = now() - Duration::from_secs(3600);
        params.not_after = now() + LEAF_VALID;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| error(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((cert.der().clone(), key))
    }
}

/// Creates `path` with `mode` and `data` (through a temporary file renamed into place).
fn write_new(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

/// What the proxy checks an upstream's certificate against: the system's roots plus each
/// `--egress-upstream-ca` file (PEM, one or more certificates).
pub fn upstream_trust(extra: &[PathBuf]) -> Result<Arc<ClientConfig>, AuthorityError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "a system root certificate could not be read");
    }
    let (_, ignored) = roots.add_parsable_certificates(native.certs);
    if ignored > 0 {
        tracing::debug!(ignored, "system root certificates rustls cannot use");
    }
    for path in extra {
        let error = |why: String| AuthorityError::UpstreamCa {
            path: path.clone(),
            why,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| error(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error(e.to_string()))?;
        if certs.is_empty() {
            return Err(error("no certificate in it".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| error(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        tracing::warn!(
            "the egress proxy trusts no upstream certificate: no system roots were found (install ca-certificates) and no --egress-upstream-ca was given"
        );
    }
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![HTTP11.to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn the_ca_is_kept_with_its_key_private_and_a_reloaded_ca_issues_what_it_verifies() {
        let dir = tempfile::tempdir().expect("the test CA works");
        let ca_dir = dir.path().join("egress-ca");
        let first = Authority::open(&ca_dir).expect("the test CA works");
        let mode = |name: &str| {
            std::fs::metadata(ca_dir.join(name))
                .expect("the test CA works")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(CA_KEY), 0o600);
        assert_eq!(mode(""), 0o700);
        let second = Authority::open(&ca_dir).expect("the test CA works");
        assert_eq!(first.cert_pem(), second.cert_pem(), "the kept CA is reused");

        // A certificate the reloaded CA issues verifies against the kept CA certificate.
        let mut roots = RootCertStore::empty();
        roots
            .add(first.cert_der().clone())
            .expect("the test CA works");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("the test CA works");
        let (leaf, _) = second.leaf("api.example.test").expect("the test CA works");
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &rustls_pki_types::ServerName::try_from("api.example.test")
                    .expect("the test CA works"),
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .expect("the test CA works");
        let wrong_name = verifier.verify_server_cert(
            &leaf,
            &[],
            &rustls_pki_types::ServerName::try_from("other.example.test")
                .expect("the test CA works"),
            &[],
            rustls_pki_types::UnixTime::now(),
        );
        assert!(wrong_name.is_err());

        // One certificate per host, kept.
        let a = second
            .server_config("api.example.test")
            .expect("the test CA works");
        let b = second
            .server_config("api.example.test")
            .expect("the test CA works");
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn a_bad_upstream_ca_file_is_named_with_why() {
        let dir = tempfile::tempdir().expect("the test CA works");
        let missing = dir.path().join("missing.pem");
        let error = upstream_trust(std::slice::from_ref(&missing)).expect_err("refused");
        assert!(error.to_string().contains("missing.pem"), "{error}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("the test CA works");
        let error = upstream_trust(&[empty]).expect_err("refused").to_string();
        assert!(error.contains("no certificate in it"), "{error}");
    }
}
