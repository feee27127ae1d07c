//! The OS user of a request: envd takes it from `Authorization: Basic base64("user:")`. Warren
//! runs a command as that user only where it may: the daemon's own user always; another user
//! only when the daemon is root (its uid and primary gid from `/etc/passwd`). Anything else is
//! refused with `permission_denied`, never silently run as someone else.
//!
//! A request's user also has a home: where envd takes relative paths from (`cd ~ && pwd -P`
//! as that user) and the `HOME` of the processes it starts. The daemon's own user's home is
//! execd's `--home` when given (the agent's home), else its `$HOME`, else `/etc/passwd`'s;
//! another user's is `/etc/passwd`'s.
//!
//! Names come from `/etc/passwd` and `/etc/group`, read on each lookup (they are small and
//! this keeps no cache to go stale).

use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, header};
use base64::Engine as _;

use super::connect::{Code, ConnectError};

/// Who a request runs as: `None` is the daemon's own user.
pub fn request_user(headers: &HeaderMap) -> Result<Option<(u32, u32)>, ConnectError> {
    let Some(name) = basic_user(headers)? else {
        return Ok(None);
    };
    let own_uid = rustix::process::getuid().as_raw();
    let KnownUser { uid, gid, .. } = known_user(&name)?;
    if uid == own_uid {
        return Ok(None);
    }
    if own_uid != 0 {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            format!(
                "cannot run as user {name:?}: execd runs as {} and is not root; omit the user",
                user_name(own_uid).unwrap_or_else(|| own_uid.to_string())
            ),
        ));
    }
    Ok(Some((uid, gid)))
}

/// The user name of `Authorization: Basic base64("name:")`; `None` without the header.
pub fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let invalid = || {
        ConnectError::new(
            Code::Unauthenticated,
            "Authorization must be Basic base64(\"user:\")",
        )
    };
    let text = value.to_str().map_err(|_| invalid())?;
    let Some(encoded) = text.strip_prefix("Basic ") else {
        return Err(invalid());
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| invalid())?;
    let decoded = String::from_utf8(decoded).map_err(|_| invalid())?;
    let name = decoded
        .split_once(':')
        .map_or(decoded.as_str(), |(name, _)| name);
    Ok((!name.is_empty()).then(|| name.to_owned()))
}

/// The home of the daemon's own user: `configured` (execd's `--home`), else `$HOME`, else its
/// `/etc/passwd` entry's.
pub fn own_home(configured: Option<&Path>) -> Option<PathBuf> {
    configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("HOME").map(PathBuf::from))
        .filter(|home| home.is_absolute())
        .or_else(|| {
            let own_uid = rustix::process::getuid().as_raw();
            let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
            passwd_entries(&passwd)
                .find(|entry| entry.uid == own_uid)
                .and_then(|entry| entry.home())
        })
}

/// The home of the user `name` (`None`: the daemon's own user, whose home is `own_home`), not
/// resolved: what `HOME` is for that user's processes. A user that does not exist is refused
/// as [`request_user`] refuses it.
pub fn home_of(
    name: Option<&str>,
    own_home: Option<&Path>,
) -> Result<Option<PathBuf>, ConnectError> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(own_home.map(Path::to_path_buf));
    };
    let user = known_user(name)?;
    if user.uid == rustix::process::getuid().as_raw() {
        return Ok(own_home.map(Path::to_path_buf));
    }
    Ok(user.home)
}

/// What a request needs of a known user.
struct KnownUser {
    uid: u32,
    gid: u32,
    home: Option<PathBuf>,
}

/// The user `name` from `/etc/passwd`, or the `permission_denied` error that says it is
/// missing.
fn known_user(name: &str) -> Result<KnownUser, ConnectError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd_entries(&passwd)
        .find(|entry| entry.name == name)
        .map(|entry| KnownUser {
            uid: entry.uid,
            gid: entry.gid,
            home: entry.home(),
        })
        .ok_or_else(|| {
            let own_uid = rustix::process::getuid().as_raw();
            ConnectError::new(
                Code::PermissionDenied,
                format!(
                    "user {name:?} does not exist here; execd runs as {}",
                    user_name(own_uid).unwrap_or_else(|| own_uid.to_string())
                ),
            )
        })
}

/// The name of user `uid`, if `/etc/passwd` has one.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_entries(&passwd)
        .find(|entry| entry.uid == uid)
        .map(|entry| entry.name.to_owned())
}

/// The name of group `gid`, if `/etc/group` has one.
pub fn group_name(gid: u32) -> Option<String> {
    let group = std::fs::read_to_string("/etc/group").ok()?;
    group.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        (fields.next()?.parse::<u32>().ok()? == gid).then(|| name.to_owned())
    })
}

/// One well-formed `/etc/passwd` line.
#[derive(Debug, PartialEq, Eq)]
struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    /// The home field as written (empty on some system users).
    home: &'a str,
}

impl PasswdEntry<'_> {
    /// The home, when the line names an absolute one.
    fn home(&self) -> Option<PathBuf> {
        Path::new(self.home)
            .is_absolute()
            .then(|| PathBuf::from(self.home))
    }
}

/// Each well-formed `/etc/passwd` line (`name:password:uid:gid:gecos:home:shell`).
fn passwd_entries(text: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    text.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        let _gecos = fields.next();
        let home = fields.next().unwrap_or_default();
        Some(PasswdEntry {
            name,
            uid,
            gid,
            home,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_user_comes_from_basic_auth_with_an_empty_password() {
        let table = [
            (Some("Basic dXNlcjo="), Ok(Some("user"))),
            (Some("Basic cm9vdDo="), Ok(Some("root"))),
            (Some("Basic Og=="), Ok(None)),
            (None, Ok(None)),
            (Some("Bearer x"), Err(())),
            (Some("Basic !!!"), Err(())),
        ];
        for (header, expected) in table {
            let mut headers = HeaderMap::new();
            if let Some(value) = header {
                headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            }
            let got = basic_user(&headers).map_err(|_| ());
            assert_eq!(
                got.as_ref().map(|n| n.as_deref()),
                expected.as_ref().map(|n| n.as_deref()),
                "{header:?}"
            );
        }
    }

    #[test]
    fn passwd_lines_give_name_uid_gid_and_home() {
        let text = "root:x:0:0:root:/root:/bin/bash\n# comment\nuser:x:1000:1001::/home/user:/bin/sh\nbroken\nshort:x:7:7\n";
        let entries: Vec<_> = passwd_entries(text)
            .map(|e| (e.name, e.uid, e.gid, e.home()))
            .collect();
        assert_eq!(
            entries,
            [
                ("root", 0, 0, Some(PathBuf::from("/root"))),
                ("user", 1000, 1001, Some(PathBuf::from("/home/user"))),
                ("short", 7, 7, None),
            ]
        );
    }
}
