//! The OS user of a request: envd takes it from `Authorization: Basic base64("user:")`. Warren
//! runs a command as that user only where it may: the daemon's own user always; another user
//! only when the daemon is root (its uid and primary gid from `/etc/passwd`). Anything else is
//! refused with `permission_denied`, never silently run as someone else.
//!
//! Names come from `/etc/passwd` and `/etc/group`, read on each lookup (they are small and
//! this keeps no cache to go stale).

use axum::http::{HeaderMap, header};
use base64::Engine as _;

use super::connect::{Code, ConnectError};

/// Who a request runs as: `None` is the daemon's own user.
pub fn request_user(headers: &HeaderMap) -> Result<Option<(u32, u32)>, ConnectError> {
    let Some(name) = basic_user(headers)? else {
        return Ok(None);
    };
    let own_uid = rustix::process::getuid().as_raw();
    let Some((uid, gid)) = lookup_user(&name) else {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            format!(
                "user {name:?} does not exist here; execd runs as {}",
                user_name(own_uid).unwrap_or_else(|| own_uid.to_string())
            ),
        ));
    };
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

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_entries(&passwd)
        .find(|(n, _, _)| *n == name)
        .map(|(_, uid, gid)| (uid, gid))
}

/// The name of user `uid`, if `/etc/passwd` has one.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_entries(&passwd)
        .find(|(_, u, _)| *u == uid)
        .map(|(n, _, _)| n.to_owned())
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

/// `(name, uid, gid)` of each well-formed `/etc/passwd` line.
fn passwd_entries(text: &str) -> impl Iterator<Item = (&str, u32, u32)> {
    text.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some((name, uid, gid))
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
    fn passwd_lines_give_name_uid_and_gid() {
        let text = "root:x:0:0:root:/root:/bin/bash\n# comment\nuser:x:1000:1001::/home/user:/bin/sh\nbroken\n";
        let entries: Vec<_> = passwd_entries(text).collect();
        assert_eq!(entries, [("root", 0, 0), ("user", 1000, 1001)]);
    }
}
