//! The gateway's VAPID key pair (RFC 8292): a P-256 key made at the first start and kept in
//! `<data>/push/vapid.key` (the directory 0700, the file 0600 from its first byte, in place only
//! once whole), reused at every later start, so the browsers' subscriptions, which are bound to
//! the public key, outlive a restart. And the `Authorization: vapid t=…, k=…` header of one push:
//! a JWT (ES256, signed by `jwt-simple`) whose `aud` is the push service's origin.
//!
//! A key file that exists but does not hold a key is an error naming it, never replaced: a new
//! key would silently orphan every subscription.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use web_push_native::jwt_simple::prelude::{
    Claims, Duration as JwtDuration, ECDSAP256KeyPairLike as _, ECDSAP256PublicKeyLike as _,
    ES256KeyPair,
};

use crate::subscription::{Endpoint, URL_SAFE_ANY_PADDING};

/// The key file under the data directory.
const KEY_DIR: &str = "push";
const KEY_FILE: &str = "vapid.key";
/// The length of a P-256 private key (a scalar).
const PRIVATE_KEY_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum VapidError {
    #[error("the VAPID key {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the VAPID key {0} does not hold a P-256 private key (base64url of 32 bytes)")]
    BadKey(PathBuf),
    #[error("cannot sign the VAPID token: {0}")]
    Sign(String),
}

/// The gateway's VAPID key pair.
pub struct Vapid {
    key_pair: ES256KeyPair,
    /// The public key as browsers take it (`applicationServerKey`): the uncompressed point,
    /// base64url without padding.
    public_key_b64url: String,
}

// Hand-written: the private key never reaches a log.
impl std::fmt::Debug for Vapid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vapid")
            .field("public_key", &self.public_key_b64url)
            .finish_non_exhaustive()
    }
}

impl Vapid {
    /// The key of `data_dir` (`push/vapid.key`), made and kept there when there is none.
    /// Blocking (a few small file operations).
    pub fn load_or_create(data_dir: &Path) -> Result<Vapid, VapidError> {
        let dir = data_dir.join(KEY_DIR);
        let path = dir.join(KEY_FILE);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| VapidError::Io { path, error }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        // A directory made earlier by hand (or by an older umask) is closed too.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
        match std::fs::read_to_string(&path) {
            Ok(text) => Vapid::from_text(&text).ok_or(VapidError::BadKey(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key_pair = ES256KeyPair::generate();
                let text = format!("{}\n", b64url(&key_pair.to_bytes()));
                write_private(&dir, &path, text.as_bytes()).map_err(io(&path))?;
                tracing::info!(path = %path.display(), "made the gateway's VAPID key");
                Ok(Vapid::from_key_pair(key_pair))
            }
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// A fresh key kept nowhere (tests, benchmarks).
    pub fn generate() -> Vapid {
        Vapid::from_key_pair(ES256KeyPair::generate())
    }

    fn from_text(text: &str) -> Option<Vapid> {
        let bytes = URL_SAFE_ANY_PADDING.decode(text.trim()).ok()?;
        // `from_bytes` panics on another length.
        if bytes.len() != PRIVATE_KEY_BYTES {
            return None;
        }
        ES256KeyPair::from_bytes(&bytes)
            .ok()
            .map(Vapid::from_key_pair)
    }

    fn from_key_pair(key_pair: ES256KeyPair) -> Vapid {
        let public_key_b64url = b64url(&key_pair.public_key().public_key().to_bytes_uncompressed());
        Vapid {
            key_pair,
            public_key_b64url,
        }
    }

    /// The public key as the browser's `applicationServerKey`: the uncompressed P-256 point
    /// (65 bytes), base64url without padding.
    pub fn public_key_b64url(&self) -> &str {
        &self.public_key_b64url
    }

    /// The `Authorization` header of a push to `endpoint`: `vapid t=<JWT>, k=<public key>`, the
    /// JWT's `aud` the endpoint's origin, `sub` the `contact`, `exp` `valid_for` from now.
    pub fn authorization(
        &self,
        endpoint: &Endpoint,
        contact: &str,
        valid_for: Duration,
    ) -> Result<String, VapidError> {
        let claims = Claims::create(JwtDuration::from_secs(valid_for.as_secs()))
            .with_audience(endpoint.origin())
            .with_subject(contact);
        let token = self
            .key_pair
            .sign(claims)
            .map_err(|e| VapidError::Sign(e.to_string()))?;
        Ok(format!("vapid t={token}, k={}", self.public_key_b64url))
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Writes `bytes` to `path` readable by this user alone, in place only once whole and synced:
/// a temporary file made 0600, renamed over `path`, and the directory synced.
fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{KEY_FILE}.{}.tmp", std::process::id()));
    // One gateway per data directory (its lock): a temporary file by this name is a leftover.
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::AllowedEndpoints;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("exists")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn the_key_is_made_once_private_and_the_same_after_a_restart() {
        let data = tempfile::tempdir().expect("temp dir");
        let first = Vapid::load_or_create(data.path()).expect("made");
        let key_file = data.path().join("push").join("vapid.key");
        assert_eq!(mode(&key_file), 0o600, "the key file is the user's alone");
        assert_eq!(mode(&data.path().join("push")), 0o700);
        let again = Vapid::load_or_create(data.path()).expect("loaded");
        assert_eq!(first.public_key_b64url(), again.public_key_b64url());
        let point = URL_SAFE_ANY_PADDING
            .decode(first.public_key_b64url())
            .expect("base64url");
        assert_eq!(point.len(), 65, "an uncompressed point");
        assert_eq!(point[0], 0x04);
        let names: Vec<_> = std::fs::read_dir(data.path().join("push"))
            .expect("lists")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["vapid.key"], "no temporary file is left");
    }

    #[test]
    fn a_key_file_that_holds_no_key_is_an_error_and_stays() {
        for text in [
            "",
            "not base64!",
            "AAAA",
            &b64url(&[7u8; 31]),
            &b64url(&[0u8; 32]),
        ] {
            let data = tempfile::tempdir().expect("temp dir");
            let dir = data.path().join("push");
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("vapid.key"), text).expect("write");
            let error = Vapid::load_or_create(data.path()).expect_err(text);
            assert!(
                error.to_string().contains("vapid.key"),
                "{text:?}: the error names the file: {error}"
            );
            assert_eq!(
                std::fs::read_to_string(dir.join("vapid.key")).expect("kept"),
                text
            );
        }
    }

    #[test]
    fn the_authorization_is_a_jwt_for_the_endpoints_origin_signed_by_the_key() {
        use web_push_native::jwt_simple::prelude::{
            ECDSAP256PublicKeyLike as _, ES256PublicKey, NoCustomClaims, VerificationOptions,
        };
        let vapid = Vapid::generate();
        let allowed = AllowedEndpoints::new(&["http://127.0.0.1:8443/".to_owned()]).expect("ok");
        let endpoint = allowed
            .check("http://127.0.0.1:8443/push/abc")
            .expect("allowed");
        let header = vapid
            .authorization(
                &endpoint,
                "mailto:ops@example.com",
                Duration::from_secs(3600),
            )
            .expect("signs");
        let (token, key) = header
            .strip_prefix("vapid t=")
            .and_then(|rest| rest.split_once(", k="))
            .expect("vapid t=…, k=…");
        assert_eq!(key, vapid.public_key_b64url());
        let public = ES256PublicKey::from_bytes(&URL_SAFE_ANY_PADDING.decode(key).expect("b64"))
            .expect("a P-256 point");
        let claims = public
            .verify_token::<NoCustomClaims>(token, Some(VerificationOptions::default()))
            .expect("the signature verifies");
        let audiences = claims.audiences.expect("aud").into_string().expect("one");
        assert_eq!(
            audiences, "http://127.0.0.1:8443",
            "the origin, port included"
        );
        assert_eq!(claims.subject.as_deref(), Some("mailto:ops@example.com"));
        let expires = claims.expires_at.expect("exp").as_secs();
        let issued = claims.issued_at.expect("iat").as_secs();
        assert_eq!(expires - issued, 3600);
    }
}
