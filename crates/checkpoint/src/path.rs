//! Paths as a manifest holds them: relative, `/`-separated, canonical. A manifest read from
//! storage may have been tampered with, so a path is refused rather than normalized: no root,
//! no `.` or `..`, no empty name, no NUL, no name longer than the kernel allows. Whether a
//! parent is a directory (and not a link) is the manifest's check, which sees every entry.

/// The longest path and name the kernel creates.
const MAX_PATH: usize = 4095;
const MAX_NAME: usize = 255;

/// Why `path` cannot be a manifest's path, `None` when it can.
pub(crate) fn refusal(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("empty path");
    }
    if path.len() > MAX_PATH {
        return Some("path too long");
    }
    if path.starts_with('/') {
        return Some("absolute path");
    }
    if path.contains('\0') {
        return Some("NUL in the path");
    }
    for name in path.split('/') {
        match name {
            "" => return Some("empty name in the path"),
            "." | ".." => return Some("'.' or '..' in the path"),
            _ if name.len() > MAX_NAME => return Some("name too long"),
            _ => {}
        }
    }
    None
}

/// The directory holding `path`, `None` for a name at the root.
pub(crate) fn parent(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(parent, _)| parent)
}

/// `dir/name`, or `name` at the root (`dir` empty).
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_relative_paths_are_accepted() {
        let long_name = "n".repeat(256);
        let table: &[(&str, Option<&str>)] = &[
            ("a", None),
            ("a/b/c.txt", None),
            (".hidden/x", None),
            ("a..b", None),
            ("", Some("empty path")),
            ("/etc/passwd", Some("absolute path")),
            ("../x", Some("'.' or '..' in the path")),
            ("a/../../x", Some("'.' or '..' in the path")),
            ("a/./b", Some("'.' or '..' in the path")),
            ("a//b", Some("empty name in the path")),
            ("a/", Some("empty name in the path")),
            ("a\0b", Some("NUL in the path")),
            (&long_name, Some("name too long")),
        ];
        for (path, expected) in table {
            assert_eq!(refusal(path), *expected, "{path:?}");
        }
    }

    #[test]
    fn parents_and_joins() {
        assert_eq!(parent("a/b/c"), Some("a/b"));
        assert_eq!(parent("a"), None);
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a/b", "c"), "a/b/c");
    }
}
