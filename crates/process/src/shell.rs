//! The one default-shell lookup: `bash` when it is on `PATH`, else `sh`. Looked up once per
//! process; callers that run a shell without flags of their own ask [`default_shell`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The shell to use when a request names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shell {
    /// `"bash"` or `"sh"`, found through `PATH` at spawn time.
    pub program: &'static str,
    /// True for bash, which takes `--noprofile`, `--norc` and `-l`.
    pub is_bash: bool,
}

/// `bash` when it is installed, else `sh`.
pub fn default_shell() -> Shell {
    static SHELL: OnceLock<Shell> = OnceLock::new();
    *SHELL.get_or_init(|| {
        if find_in_path("bash").is_some() {
            Shell {
                program: "bash",
                is_bash: true,
            }
        } else {
            Shell {
                program: "sh",
                is_bash: false,
            }
        }
    })
}

/// The first executable file named `program` in `PATH`.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// True when `program` names an executable file: a path, or a name found in `PATH`.
pub fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        Path::new(program).is_file()
    } else {
        find_in_path(program).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_shell_is_bash_where_bash_is_installed() {
        let shell = default_shell();
        assert_eq!(shell.is_bash, find_in_path("bash").is_some());
        assert!(program_exists(shell.program));
        assert!(program_exists("/bin/sh"));
        assert!(!program_exists("/no/such/shell"));
        assert!(!program_exists("no-such-shell-anywhere"));
    }
}
