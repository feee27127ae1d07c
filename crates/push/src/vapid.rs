//! The gateway's VAPID key pair (RFC 8292): a P-256 key made at the first start and kept in
//! `<data>/push/vapid.key` (the directory 0700, the file 0600 from its first byte, in place only
//! once whole), reused at every later start, so the browsers' subscriptions, which are bound to
//! the public key, outlive a restart. And the `Authorization: vapid t=…, k=…` header of one push:
//! a JWT (ES256: ECDSA P-256 with SHA-256 by `p256`, the signature as `r‖s`, RFC 7518 §3.4)
//! whose `aud` is the push service's origin.
//!
//! A key file that exists but does not hold a key is an error naming it, never replaced: a new
//! key would silently orphan every subscription.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};

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
    key: SigningKey,
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
                let key = new_key();
                let text = format!("{}\n", b64url(&key.to_bytes()));
                write_private(&dir, &path, text.as_bytes()).map_err(io(&path))?;
                tracing::info!(path = %path.display(), "made the gateway's VAPID key");
                Ok(Vapid::from_key(key))
            }
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// A fresh key kept nowhere (tests, benchmarks).
    pub fn generate() -> Vapid {
        Vapid::from_key(new_key())
    }

    fn from_text(text: &str) -> Option<Vapid> {
        let bytes = URL_SAFE_ANY_PADDING.decode(text.trim()).ok()?;
        if bytes.len() != PRIVATE_KEY_BYTES {
            return None;
        }
        // Refuses zero and scalars past the curve's order.
        SigningKey::from_slice(&bytes).ok().map(Vapid::from_key)
    }

    fn from_key(key: SigningKey) -> Vapid {
        let point = key.verifying_key().to_encoded_point(false);
        Vapid {
            public_key_b64url: b64url(point.as_bytes()),
            key,
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
        let now = chrono::Utc::now().timestamp();
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256"});
        let claims = serde_json::json!({
            "aud": endpoint.origin(),
            "sub": contact,
            "iat": now,
            "exp": now + i64::try_from(valid_for.as_secs()).map_err(|e| VapidError::Sign(e.to_string()))?,
        });
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature: Signature = self.key.sign(signing_input.as_bytes());
        let token = format!("{signing_input}.{}", b64url(&signature.to_bytes()));
        Ok(format!("vapid t={token}, k={}", self.public_key_b64url))
    }
}

/// The claims of a VAPID token (`t=` of the header) that `public_key_b64url` (`k=`) signed,
/// with ES256 in its header; `None` when anything does not hold. For a receiver of pushes (the
/// benchmark's); the gateway only signs.
pub fn verify_token(public_key_b64url: &str, token: &str) -> Option<serde_json::Value> {
    use p256::ecdsa::VerifyingKey;
    use p256::ecdsa::signature::Verifier as _;
    let decode = |text: &str| URL_SAFE_ANY_PADDING.decode(text).ok();
    let public = VerifyingKey::from_sec1_bytes(&decode(public_key_b64url)?).ok()?;
    let (signed, signature) = token.rsplit_once('.')?;
    let (header, claims) = signed.split_once('.')?;
    let header: serde_json::Value = serde_json::from_slice(&decode(header)?).ok()?;
    let signature = Signature::from_slice(&decode(signature)?).ok()?;
    (header["alg"] == "ES256" && public.verify(signed.as_bytes(), &signature).is_ok())
        .then(|| serde_json::from_slice(&decode(claims)?).ok())
        .flatten()
}

/// A fresh P-256 private key from the operating system's random source.
fn new_key() -> SigningKey {
    loop {
        let mut bytes = [0u8; PRIVATE_KEY_BYTES];
        rand::fill(&mut bytes);
        // Out of range (zero, or past the order) about once in 2^32 tries.
        if let Ok(key) = SigningKey::from_slice(&bytes) {
            return key;
        }
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
        use p256::ecdsa::VerifyingKey;
        use p256::ecdsa::signature::Verifier as _;
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
        let public = VerifyingKey::from_sec1_bytes(&URL_SAFE_ANY_PADDING.decode(key).expect("b64"))
            .expect("a P-256 point");
        let (signed, signature) = token.rsplit_once('.').expect("three parts");
        let signature =
            Signature::from_slice(&URL_SAFE_ANY_PADDING.decode(signature).expect("b64"))
                .expect("r‖s, 64 bytes");
        public
            .verify(signed.as_bytes(), &signature)
            .expect("the signature verifies");
        let part = |i: usize| -> serde_json::Value {
            let text = signed.split('.').nth(i).expect("a part");
            serde_json::from_slice(&URL_SAFE_ANY_PADDING.decode(text).expect("b64")).expect("JSON")
        };
        assert_eq!(part(0)["alg"], "ES256");
        let claims = part(1);
        assert_eq!(
            claims["aud"], "http://127.0.0.1:8443",
            "the origin, port included"
        );
        assert_eq!(claims["sub"], "mailto:ops@example.com");
        let (exp, iat) = (
            claims["exp"].as_i64().expect("exp"),
            claims["iat"].as_i64().expect("iat"),
        );
        assert_eq!(exp - iat, 3600);
    }
}
