//! The engines scale-out runs on, started for real on loopback: a PostgreSQL cluster (Debian's
//! `postgresql` binaries, `initdb` into a temporary directory, run as an unprivileged user when
//! the tests run as root) and an S3 endpoint (`moto[server]` from the pinned Python
//! environment).
//!
//! Each server runs under a small `sh` watchdog whose stdin is a pipe held by the test process:
//! when the test process ends, however it ends (kill -9 included), the pipe closes and the
//! watchdog stops the server by its pid. No server outlives the tests that started it.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to accept connections.
const START_WAIT: Duration = Duration::from_secs(60);

/// Debian's PostgreSQL binaries (`/usr/lib/postgresql/<major>/bin`), the newest installed.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("postgres").is_file() && bin.join("initdb").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// A port nothing listens on right now (bound, read and released; the small race with other
/// programs picking it is accepted in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binds an ephemeral port")
}

/// The uid and gid servers run as: `nobody` when the tests run as root (PostgreSQL refuses
/// root), else the tests' own.
fn server_user() -> Option<(u32, u32)> {
    rustix::process::getuid()
        .is_root()
        .then_some((65534, 65534))
}

fn chown_for_server(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chowns for the server user");
    }
}

/// Which server a [`Watched`] runs: its name (in failures), its log's file name, the signal
/// that stops it and whether it runs as the server user.
struct Kind {
    name: &'static str,
    log: &'static str,
    stop_signal: &'static str,
    unprivileged: bool,
}

/// SIGINT is PostgreSQL's fast shutdown: clients are disconnected at once.
const POSTGRES: Kind = Kind {
    name: "PostgreSQL",
    log: "postgres.log",
    stop_signal: "INT",
    unprivileged: true,
};

const MOTO: Kind = Kind {
    name: "moto",
    log: "moto.log",
    stop_signal: "TERM",
    unprivileged: false,
};

/// A server process under its watchdog.
struct Watched {
    child: Child,
    /// Closing it (drop, or the test process ending) makes the watchdog stop the server.
    stdin: Option<ChildStdin>,
}

impl Watched {
    /// Runs `program args`, the `kind` server, under a watchdog `sh` (as the server user when
    /// it runs unprivileged), its output to its log in `dir`. The watchdog sends its stop signal
    /// when told to stop or when its stdin closes; in the second case (the test process is
    /// gone) it also removes `dir`.
    fn spawn(kind: &Kind, program: &Path, args: &[String], dir: &Path) -> Watched {
        let (stop_signal, unprivileged) = (kind.stop_signal, kind.unprivileged);
        let log = dir.join(kind.log);
        let log_file = std::fs::File::create(&log).expect("creates the server log");
        if unprivileged {
            chown_for_server(&log);
        }
        let script = format!(
            r#"dir=$1; shift
            "$@" & pid=$!
            if read -r _; then
              kill -{stop_signal} $pid 2>/dev/null; wait $pid
            else
              kill -{stop_signal} $pid 2>/dev/null; wait $pid; rm -rf "$dir"
            fi"#
        );
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .arg("watchdog")
            .arg(dir)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log_file.try_clone().expect("log handle"))
            .stderr(log_file)
            .current_dir(dir)
            // Its own group: a test that signals its own group never reaches the server.
            .process_group(0);
        if let Some((uid, gid)) = server_user().filter(|_| unprivileged) {
            command.uid(uid).gid(gid);
        }
        let mut child = command.spawn().expect("starts the server's watchdog");
        let stdin = child.stdin.take();
        Watched { child, stdin }
    }

    /// [`Watched::spawn`] of the `kind` server in `dir` (its log there), then waits until it
    /// accepts connections on 127.0.0.1:`port`.
    fn listening(kind: &Kind, program: &Path, args: &[String], dir: &Path, port: u16) -> Watched {
        let server = Watched::spawn(kind, program, args, dir);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for_port(addr, kind.name, &dir.join(kind.log));
        server
    }

    /// Stops the server and waits (bounded) for the watchdog to end.
    fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let deadline = Instant::now() + START_WAIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let pgid = rustix::process::Pid::from_raw(self.child.id() as i32);
                    if let Some(pgid) = pgid {
                        let _ = rustix::process::kill_process_group(
                            pgid,
                            rustix::process::Signal::KILL,
                        );
                    }
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_for_port(addr: SocketAddr, what: &str, log: &Path) {
    let deadline = Instant::now() + START_WAIT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} does not accept connections on {addr}:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A PostgreSQL cluster of its own: a temporary data directory, a loopback port, the `warren`
/// superuser with trust authentication. [`Postgres::stop`] and [`Postgres::start_again`] stop
/// and restart it on the same directory and port (the fault tests' "PostgreSQL restarted").
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    server: Option<Watched>,
}

static N_DATABASES: AtomicU64 = AtomicU64::new(0);

impl Postgres {
    /// Initializes and starts a cluster. Panics when PostgreSQL is not installed (`scripts/test.sh`
    /// installs Debian's `postgresql`).
    pub fn start() -> Postgres {
        let bin = postgres_bin_dir()
            .expect("PostgreSQL is installed (apt-get install postgresql; scripts/test.sh does)");
        let dir = tempfile::Builder::new()
            .prefix("warren-pg-")
            .tempdir()
            .expect("creates the cluster's directory");
        chown_for_server(dir.path());
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "warren", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .env("LC_ALL", "C.UTF-8")
            .current_dir(dir.path());
        if let Some((uid, gid)) = server_user() {
            initdb.uid(uid).gid(gid);
        }
        let output = initdb.output().expect("runs initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut postgres = Postgres {
            dir,
            bin,
            port: free_port(),
            server: None,
        };
        postgres.start_again();
        postgres
    }

    /// The cluster shared by every test of this process (each test takes a
    /// [`Postgres::fresh_database`] of its own). Stopped when the process ends.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(Postgres::start)
    }

    /// Starts the server (again) on the same directory and port.
    pub fn start_again(&mut self) {
        assert!(self.server.is_none(), "the server is already running");
        let socket_dir = self.dir.path().to_path_buf();
        let args = vec![
            "-D".to_owned(),
            self.dir.path().join("data").display().to_string(),
            "-k".to_owned(),
            socket_dir.display().to_string(),
            "-p".to_owned(),
            self.port.to_string(),
            "-c".to_owned(),
            "listen_addresses=127.0.0.1".to_owned(),
            "-c".to_owned(),
            "fsync=off".to_owned(),
            "-c".to_owned(),
            "max_connections=300".to_owned(),
        ];
        let program = self.bin.join("postgres");
        let server = Watched::listening(&POSTGRES, &program, &args, self.dir.path(), self.port);
        self.server = Some(server);
        // The port opens before the cluster accepts queries; pg_isready says when it does.
        let deadline = Instant::now() + START_WAIT;
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "PostgreSQL never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: every connection is cut) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://warren@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://warren@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates an empty database with a unique name and returns its URL.
    pub fn fresh_database(&self) -> String {
        let name = format!(
            "t_{}_{}",
            std::process::id(),
            N_DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// Runs `sql` with `psql` in `database`; panics with psql's message when it fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let output = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "warren",
            ])
            .args(["-d", database, "-c", sql])
            .output()
            .expect("runs psql");
        assert!(
            output.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An S3 endpoint: `moto[server]` from the pinned Python environment on a loopback port.
/// Buckets are made with [`S3::create_bucket`] (object storage clients cannot make them).
pub struct S3 {
    dir: tempfile::TempDir,
    port: u16,
    server: Option<Watched>,
}

impl S3 {
    pub fn start() -> S3 {
        let dir = tempfile::Builder::new()
            .prefix("warren-s3-")
            .tempdir()
            .expect("creates the endpoint's directory");
        let mut s3 = S3 {
            dir,
            port: free_port(),
            server: None,
        };
        s3.start_again();
        s3
    }

    /// Starts moto (again) on the same port; its objects do not survive a stop.
    pub fn start_again(&mut self) {
        assert!(self.server.is_none(), "the endpoint is already running");
        let args = vec![
            "-m".to_owned(),
            "moto.server".to_owned(),
            "-H".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            self.port.to_string(),
        ];
        let program = crate::python();
        let server = Watched::listening(&MOTO, &program, &args, self.dir.path(), self.port);
        self.server = Some(server);
    }

    /// Stops the endpoint (the fault tests' "S3 unavailable").
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
    }

    /// `http://127.0.0.1:<port>`, for `AWS_ENDPOINT_URL`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment an S3 client needs for this endpoint (moto takes any credentials).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", "warren-test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "warren-test-secret".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
    }

    /// Creates `bucket` (an unsigned `PUT /<bucket>`, which moto accepts).
    pub fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connects to moto");
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("sends the request");
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut stream, &mut answer).expect("reads the answer");
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "moto did not create {bucket}: {answer}"
        );
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_starts_answers_stops_and_starts_again() {
        if postgres_bin_dir().is_none() {
            panic!("PostgreSQL is not installed (scripts/test.sh installs it)");
        }
        let mut postgres = Postgres::start();
        let url = postgres.fresh_database();
        let database = url.rsplit('/').next().expect("a database name");
        assert_eq!(postgres.psql(database, "SELECT 1 + 1").trim(), "2");
        postgres.stop();
        assert!(
            TcpStream::connect(("127.0.0.1", postgres.port())).is_err(),
            "stopped"
        );
        postgres.start_again();
        assert_eq!(postgres.psql(database, "SELECT 2 + 2").trim(), "4");
    }
}
