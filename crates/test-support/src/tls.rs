//! TLS for tests: a throwaway certificate authority ([`TestCa`]) that issues server
//! certificates for names or IP addresses, and a real HTTPS server ([`HttpsUpstream`], Python's
//! standard library: `http.server` and `ssl`) that echoes requests back as JSON or serves git's
//! smart HTTP, for tests of what crosses a TLS connection.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio::io::AsyncBufReadExt as _;

/// A certificate authority made for one test: its key lives only in memory.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA (its own key, self-signed, valid from long ago until long after the tests).
    pub fn new() -> TestCa {
        let key = KeyPair::generate().expect("generates the test CA's key");
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "Warren test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signs the test CA");
        TestCa { issuer }
    }

    /// The CA's certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's certificate, DER (for a rustls root store).
    pub fn ca_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// Writes the CA's certificate to `dir/ca.pem` and returns that path.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.ca_pem())
            .unwrap_or_else(|e| panic!("writes {}: {e}", path.display()));
        path
    }

    /// A server certificate signed by the CA for `hosts` (DNS names or IP addresses, each a
    /// subject alternative name; the first is also the common name), for server
    /// authentication. Writes `dir/<first host>.pem` and `dir/<first host>.key` (PKCS#8 PEM)
    /// and returns their paths.
    pub fn write_server(&self, dir: &Path, hosts: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key) = self.server_pem(hosts);
        let stem: String = hosts
            .first()
            .expect("a server certificate names at least one host")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let cert_path = dir.join(format!("{stem}.pem"));
        let key_path = dir.join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert)
            .unwrap_or_else(|e| panic!("writes {}: {e}", cert_path.display()));
        std::fs::write(&key_path, key)
            .unwrap_or_else(|e| panic!("writes {}: {e}", key_path.display()));
        (cert_path, key_path)
    }

    /// A server certificate for `hosts` and its key, both PEM (see [`TestCa::write_server`]).
    pub fn server_pem(&self, hosts: &[&str]) -> (String, String) {
        let names: Vec<String> = hosts.iter().map(|host| (*host).to_owned()).collect();
        let mut params = CertificateParams::new(names)
            .unwrap_or_else(|e| panic!("a certificate for {hosts:?}: {e}"));
        if let Some(first) = hosts.first() {
            params
                .distinguished_name
                .push(DnType::CommonName, (*first).to_owned());
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generates a server key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("signs a certificate for {hosts:?}: {e}"));
        (cert.pem(), key.serialize_pem())
    }
}

/// The HTTPS server's source, written to a temporary file for each server.
const SCRIPT: &str = include_str!("https_upstream.py");

/// How long the server may take to print its port.
const START_WAIT: Duration = Duration::from_secs(20);

/// A real HTTPS server on a loopback address (`https_upstream.py`), stopped when dropped (and
/// when the test process ends however it ends: the server exits when its stdin, a pipe this
/// process holds, closes).
///
/// Modes (`mode_args` of [`HttpsUpstream::start`]):
/// - `["echo", "--require-header", "NAME: VALUE"]`: every request is answered with JSON
///   `{"method", "path", "headers": {lowercased name: value}, "body"}`, 200 when the header came
///   with exactly VALUE, else 401 with `WWW-Authenticate: Bearer`; `/redirect?to=URL` answers
///   302 with `Location: URL` (401 when unauthorized); `/echo-header` answers with the header's
///   received value as a `text/plain` body and in an `X-Echo` header (200, or 401).
/// - `["git", "--root", DIR, "--user", USER, "--password", PASS]`: git's smart HTTP
///   (`git http-backend`) for the repositories in DIR, every request needing
///   `Authorization: Basic base64(USER:PASS)` (else 401 with `WWW-Authenticate: Basic`).
///
/// Each request is logged as `REQUEST <method> <path> <header>=present|absent` (never a value)
/// and each failed TLS handshake as `TLS-ERROR <why>`: see [`HttpsUpstream::log`].
pub struct HttpsUpstream {
    /// The port it listens on, on the address it was started with.
    pub port: u16,
    child: tokio::process::Child,
    /// Held open: the server exits when it closes.
    _stdin: Option<tokio::process::ChildStdin>,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for HttpsUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsUpstream")
            .field("port", &self.port)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

/// Debian's python3 when it is there (the server needs the standard library only), else the
/// first on the PATH.
fn python3() -> PathBuf {
    let debian = Path::new("/usr/bin/python3");
    if debian.is_file() {
        debian.to_owned()
    } else {
        PathBuf::from("python3")
    }
}

impl HttpsUpstream {
    /// Starts the server on `bind_ip` (a loopback address) with `cert` and `key` (PEM) and
    /// waits (at most 20 s) for the port it prints.
    pub async fn start(
        bind_ip: &str,
        cert: &Path,
        key: &Path,
        mode_args: &[&str],
    ) -> HttpsUpstream {
        let dir = tempfile::tempdir().expect("a directory for the HTTPS upstream's script");
        let script = dir.path().join("https_upstream.py");
        std::fs::write(&script, SCRIPT).expect("writes the HTTPS upstream's script");
        let what = format!("the HTTPS upstream on {bind_ip} ({mode_args:?})");
        let mut child = tokio::process::Command::new(python3())
            .arg("-u")
            .arg(&script)
            .arg("--bind")
            .arg(bind_ip)
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .arg("--exit-with-stdin")
            .args(mode_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starts {what} with python3: {e}"));
        let stdin = child.stdin.take();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("the server's stderr is piped");
        let kept = Arc::clone(&log);
        let tag = format!("https upstream {bind_ip}");
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{tag}: {line}");
                kept.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let stdout = child.stdout.take().expect("the server's stdout is piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_WAIT, lines.next_line()).await;
        let stderr_so_far = || log.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
        let line = match first {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => panic!(
                "{what} exited before printing `PORT <n>`; its stderr:\n{}",
                stderr_so_far()
            ),
            Ok(Err(e)) => panic!("reads the port line of {what}: {e}"),
            Err(_) => panic!(
                "{what} did not print `PORT <n>` within {START_WAIT:?}; its stderr:\n{}",
                stderr_so_far()
            ),
        };
        let port = line
            .strip_prefix("PORT ")
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what} printed {line:?}, not `PORT <n>`"));
        // The rest of stdout is read and dropped, so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpsUpstream {
            port,
            child,
            _stdin: stdin,
            log,
            _dir: dir,
        }
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// What the server logged on stderr so far, a line each.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `REQUEST <method> <path> <header>=present|absent` lines logged so far.
    pub fn requests(&self) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|line| line.starts_with("REQUEST "))
            .collect()
    }
}
