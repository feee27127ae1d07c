//! Entry paths as the archive holds them: relative, `/`-separated, with no `..`, no root and no
//! empty names. The one place that decides whether a path in an archive is acceptable.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use crate::SnapshotError;

/// The normal components of `path`, joined by `/`; `""` for the root itself (`.` or `./`).
/// Refuses absolute paths, `..` and names that are not UTF-8.
pub(crate) fn normalize(path: &Path) -> Result<String, SnapshotError> {
    let unsafe_path = |reason| SnapshotError::Unsafe {
        path: path.to_string_lossy().into_owned(),
        reason,
    };
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(
                name.to_str()
                    .ok_or_else(|| unsafe_path("name is not UTF-8"))?,
            ),
            Component::CurDir => {}
            Component::ParentDir => return Err(unsafe_path("path contains ..")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(unsafe_path("absolute path"));
            }
        }
    }
    Ok(parts.join("/"))
}

/// True when a symlink at `link_path` (normalized) pointing at `target` stays beneath the root,
/// resolved lexically from the link's directory. Links through other links are resolved by
/// whoever follows them (execd's file routes resolve beneath the root with openat2).
pub(crate) fn link_stays_inside(link_path: &str, target: &Path) -> bool {
    let mut depth = link_path.split('/').count() as i64 - 1;
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// The first of an archive's symlinks (path, target) that leads outside the root when links are
/// followed the way the kernel follows them, `None` when all stay inside. Each link passing
/// [`link_stays_inside`] on its own is not enough: `d/l -> ..` is inside, and so is `x -> d/l/..`
/// read lexically, yet `x` really leads to the root's parent. Links met on the way are followed
/// (at most [`MAX_LINK_HOPS`] per link, after which the kernel refuses too).
pub(crate) fn escaping_link(links: &[(String, PathBuf)]) -> Option<&str> {
    let by_path: HashMap<&str, &Path> = links
        .iter()
        .map(|(path, target)| (path.as_str(), target.as_path()))
        .collect();
    links.iter().find_map(|(path, target)| {
        let mut dir: Vec<String> = path.split('/').map(str::to_owned).collect();
        dir.pop();
        let mut hops = 0;
        resolve(&by_path, dir, target, &mut hops)
            .is_none()
            .then_some(path.as_str())
    })
}

/// Most links one resolution in [`escaping_link`] follows (Linux's own limit).
const MAX_LINK_HOPS: usize = 40;

/// Where `target` leads from the real directory `dir` (root-relative names), following the
/// archive's links; `None` when it climbs out of the root.
fn resolve(
    links: &HashMap<&str, &Path>,
    mut dir: Vec<String>,
    target: &Path,
    hops: &mut usize,
) -> Option<Vec<String>> {
    for component in target.components() {
        match component {
            Component::Normal(name) => {
                dir.push(name.to_string_lossy().into_owned());
                let Some(next) = links.get(dir.join("/").as_str()) else {
                    continue;
                };
                *hops += 1;
                if *hops > MAX_LINK_HOPS {
                    // A loop: the kernel answers ELOOP rather than going anywhere.
                    return Some(dir);
                }
                dir.pop();
                dir = resolve(links, dir, next, hops)?;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                dir.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(dir)
}

/// The proper prefixes of a normalized path: `a/b/c` gives `a`, `a/b`.
pub(crate) fn parents(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_or_are_refused() {
        let cases = [
            ("a/b", Some("a/b")),
            ("./a//b/", Some("a/b")),
            (".", Some("")),
            ("../x", None),
            ("a/../../x", None),
            ("a/../b", None),
            ("/etc/x", None),
        ];
        for (input, expected) in cases {
            let got = normalize(Path::new(input)).ok();
            assert_eq!(got.as_deref(), expected, "{input}");
        }
    }

    #[test]
    fn links_are_checked_lexically_from_their_directory() {
        let cases = [
            ("l", ".", true),
            ("l", "a/b", true),
            ("l", "..", false),
            ("d/l", "..", true),
            ("d/l", "../..", false),
            ("l", "a/../../x", false),
            ("d/l", "x/../../y", true),
            ("l", "/", false),
            ("l", "/etc/passwd", false),
        ];
        for (link, target, expected) in cases {
            assert_eq!(
                link_stays_inside(link, Path::new(target)),
                expected,
                "{link} -> {target}"
            );
        }
    }

    #[test]
    fn parents_are_the_proper_prefixes() {
        assert_eq!(parents("a/b/c").collect::<Vec<_>>(), ["a", "a/b"]);
        assert!(parents("a").next().is_none());
    }
}
