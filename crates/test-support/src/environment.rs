//! The repository the tests run in, and the pinned Python and npm environments the
//! interoperability tests drive third-party SDKs with.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How long `scripts/python-env.sh` may take: minutes on a cold cache (`scripts/test.sh` runs it before
/// the tests, so there it only prints the path).
const PYTHON_ENV_WAIT: Duration = Duration::from_secs(15 * 60);
const NODE_INSTALL_WAIT: Duration = Duration::from_secs(10 * 60);

/// The workspace root, two levels above this crate.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("this crate lies two levels below the workspace root")
        .to_path_buf()
}

/// The python of the pinned environment (OpenSandbox, ACP and MCP SDKs) that
/// `scripts/python-env.sh` creates once and names; run once per test process.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(run_python_env).clone()
}

/// A directory with the pinned npm packages of `tests/node` installed (the MCP and E2B SDKs)
/// and its `.mjs` scripts copied in, so `node <dir>/<script>.mjs` finds the packages. Installed
/// once for every test binary (under a lock; the stamp holds the package files it was installed
/// from, so a change to either reinstalls); run once per test process.
pub fn node_packages() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(install_node_packages).clone()
}

fn install_node_packages() -> PathBuf {
    let source = repo_root().join("tests/node");
    let dir = repo_root().join("target/warren-node");
    std::fs::create_dir_all(&dir).expect("creates the node directory");
    let install = r#"
        set -euo pipefail
        exec 9>"$1/.lock"
        flock 9
        cat "$2/package.json" "$2/package-lock.json" > "$1/.wanted"
        if ! cmp -s "$1/.wanted" "$1/.installed"; then
          cp "$2/package.json" "$2/package-lock.json" "$1/"
          (cd "$1" && npm ci --no-audit --no-fund --silent >&2)
          mv "$1/.wanted" "$1/.installed"
        fi
        for script in "$2"/*.mjs; do
          cp "$script" "$1/$(basename "$script").tmp"
          mv "$1/$(basename "$script").tmp" "$1/$(basename "$script")"
        done
    "#;
    let mut command = Command::new("bash");
    command
        .args(["-c", install, "install"])
        .arg(&dir)
        .arg(&source);
    succeeding_within(command, NODE_INSTALL_WAIT, "npm ci of tests/node");
    dir
}

fn run_python_env() -> PathBuf {
    let script = repo_root().join("scripts/python-env.sh");
    let mut command = Command::new("bash");
    command.arg(&script);
    let output = succeeding_within(command, PYTHON_ENV_WAIT, "scripts/python-env.sh");
    let path = String::from_utf8(output.stdout).expect("the python path is UTF-8");
    PathBuf::from(path.trim())
}

/// Checks an OpenAPI document (its JSON text) with the pinned `openapi-spec-validator`, the
/// check client generators make before they accept a document (unique operation ids, valid
/// schemas and references). Panics with the validator's words when it refuses.
pub fn validate_openapi(name: &str, document_json: &str) {
    let mut command = Command::new(python());
    command.args(["-m", "openapi_spec_validator", "-"]);
    let output = output_within(
        command,
        document_json.as_bytes().to_vec(),
        Duration::from_secs(120),
        "openapi-spec-validator",
    );
    assert!(
        output.status.success(),
        "openapi-spec-validator refuses {name}'s document ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `command` with no input like [`output_within`]; panics with its stderr, naming `what`,
/// unless it succeeds.
fn succeeding_within(command: Command, limit: Duration, what: &str) -> std::process::Output {
    let output = output_within(command, Vec::new(), limit, what);
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `command` with `input` on its stdin (then closed) and its output captured, and waits
/// at most `limit` for it; past that it is killed and the test fails naming `what`.
fn output_within(
    mut command: Command,
    input: Vec<u8>,
    limit: Duration,
    what: &str,
) -> std::process::Output {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = crate::process::spawn_owned(&mut command)
        .unwrap_or_else(|err| panic!("starts {what}: {err}"));
    let pid = child.id();
    let stdin = child.stdin.take();
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // A child that exits without reading its input is no error here: its status says.
        if let Some(mut stdin) = stdin {
            let _ = std::io::Write::write_all(&mut stdin, &input);
        }
        let output = child.wait_with_output();
        warren_process::reaper::release(pid);
        let _ = done.send(output);
    });
    match output.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|err| panic!("waits for {what}: {err}")),
        Err(_) => {
            // Stopped by its pid: it is this process's own child and not yet reaped.
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            panic!("{what} did not finish within {limit:?}");
        }
    }
}
