//! The confined file system every face of execd uses (Warren's `/v1/files*`, OpenSandbox's
//! files, E2B's filesystem service, bash sessions' working directories): [`resolve`] walks a
//! client's path beneath `--root` (no `..`, symlink or swap leads out; FIFOs never opened),
//! [`confined`] the file work on what it found (listing, streaming, temp files, moves), and
//! here the path errors that are the client's to fix ([`PathError`], no HTTP: each face picks
//! its statuses in `crate::error`).

pub(crate) mod confined;
#[doc(hidden)]
pub mod resolve;

use std::io;

use resolve::Refusal;

pub mod error;
pub use error::PathError;

/// A path as the client wrote it, made usable: NUL refused, `~` and `$VAR` expanded.
pub fn checked_path(raw: &str) -> Result<String, PathError> {
    if raw.contains('\0') {
        return Err(PathError::InvalidPath(format!(
            "path {raw:?} contains a NUL byte"
        )));
    }
    expand_path(raw).map_err(PathError::InvalidPath)
}

/// The errors the OS gives for a path that are the client's to fix, by errno; `None` for the
/// rest.
pub fn path_error(path: &str, err: &io::Error) -> Option<PathError> {
    let errno = rustix::io::Errno::from_io_error(err)?;
    Some(match errno {
        rustix::io::Errno::NAMETOOLONG => PathError::NameTooLong(format!(
            "{path}: a name in it is longer than the filesystem allows"
        )),
        rustix::io::Errno::NOTDIR => {
            PathError::NotADirectory(format!("{path}: a component of it is not a directory"))
        }
        rustix::io::Errno::ACCESS | rustix::io::Errno::PERM => {
            PathError::PermissionDenied(format!("{path}: permission denied"))
        }
        _ => return None,
    })
}

/// Expands a leading `~` (the daemon user's home) and `$NAME` / `${NAME}`; an undefined
/// variable is an error.
pub fn expand_path(raw: &str) -> Result<String, String> {
    let mut text = raw.to_owned();
    if text == "~" || text.starts_with("~/") {
        let home = std::env::var("HOME").map_err(|_| "cannot expand ~: HOME is not set")?;
        text = format!("{home}{}", &text[1..]);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let name: String = if chars.peek() == Some(&'{') {
            chars.next();
            let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
            if name.is_empty() {
                return Err(format!("bad variable reference in {raw}"));
            }
            name
        } else {
            let mut name = String::new();
            while let Some(c) = chars
                .peek()
                .copied()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                name.push(c);
                chars.next();
            }
            if name.is_empty() {
                out.push('$');
                continue;
            }
            name
        };
        let value =
            std::env::var(&name).map_err(|_| format!("undefined variable {name} in {raw}"))?;
        out.push_str(&value);
    }
    Ok(out)
}

/// An escape refused by the resolver, by the kernel (`EXDEV` from `RESOLVE_BENEATH`) or by
/// cap-std.
pub fn is_escape(err: &io::Error) -> bool {
    matches!(resolve::refusal(err), Some(Refusal::Escape))
        || err.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error())
        || (err.kind() == io::ErrorKind::PermissionDenied
            && err.to_string().contains("outside of the filesystem"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_home_and_variables() {
        let home = std::env::var("HOME").unwrap_or_default();
        assert_eq!(expand_path("~/x").ok(), Some(format!("{home}/x")));
        assert_eq!(expand_path("${HOME}/y").ok(), Some(format!("{home}/y")));
        assert_eq!(expand_path("/a$/b").ok(), Some("/a$/b".to_owned()));
        assert!(expand_path("/$WARREN_SURELY_UNDEFINED_VAR/x").is_err());
    }
}
