//! Entry paths as the archive holds them: relative, `/`-separated, with no `..`, no root and no
//! empty names. The one place that decides whether a path in an archive is acceptable, and
//! where an absolute symlink target of a workspace leads ([`beneath_root`]): execd's live walk,
//! the gateway's walk of a stored snapshot, `pack` and `unpack` all follow this one rule.

use std::collections::HashMap;
use std::ffi::OsStr;
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

/// One step of a path beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    Parent,
    Name(&'a OsStr),
}

/// The steps below `root` of the absolute `path`, `None` when it leads elsewhere: the rule for
/// an absolute symlink target in a workspace. `root` is the workspace as whoever follows the
/// link sees it (canonical; `/workspace` inside a sandbox), so `ln -s /workspace/a.txt l` made
/// in the sandbox leads to `a.txt`, and `/etc/passwd` leads out. `.` and `..` are applied
/// lexically only while the path is at the root or one of its ancestors (real directories,
/// since the root is canonical, so that is what the kernel does there); below the root they
/// are left to the walk, which knows what is a link.
pub fn beneath_root<'a>(root: &Path, path: &'a Path) -> Option<Vec<Step<'a>>> {
    let root_names: Vec<&OsStr> = root
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return None;
    }
    // How many of the root's names the path has spelled so far: it is at an ancestor.
    let mut depth = 0usize;
    while let Some(component) = components.next() {
        match component {
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => depth = depth.saturating_sub(1),
            Component::Normal(name) if depth == root_names.len() => {
                let mut steps = vec![Step::Name(name)];
                steps.extend(components.filter_map(|c| match c {
                    Component::ParentDir => Some(Step::Parent),
                    Component::Normal(name) => Some(Step::Name(name)),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
                }));
                return Some(steps);
            }
            Component::Normal(name) if name == root_names[depth] => depth += 1,
            Component::Normal(_) => return None,
        }
    }
    (depth == root_names.len()).then(Vec::new)
}

/// A symlink's target as the same place spelled from the link's directory: a relative target
/// as it is; an absolute one beneath `root` ([`beneath_root`]) as `..` up to the root, then its
/// steps; `None` for an absolute target elsewhere (or an empty one).
pub(crate) fn from_link_dir(root: &Path, link_path: &str, target: &Path) -> Option<PathBuf> {
    if target.as_os_str().is_empty() {
        return None;
    }
    if !target.is_absolute() {
        return Some(target.to_owned());
    }
    let steps = beneath_root(root, target)?;
    let mut relative = PathBuf::from(".");
    for _ in parents(link_path) {
        relative.push("..");
    }
    for step in steps {
        match step {
            Step::Parent => relative.push(".."),
            Step::Name(name) => relative.push(name),
        }
    }
    Some(relative)
}

/// Whether a stored tree keeps the symlink at `link_path` (normalized) to `target`: `pack`'s
/// rule, which a listing of a checkpoint follows too. It must lead beneath `root` (the
/// workspace as the sandbox sees it; `None`: unknown, so no absolute target is kept), read
/// lexically from the link's directory.
pub fn link_kept(root: Option<&Path>, link_path: &str, target: &Path) -> bool {
    let from_dir = match root {
        Some(root) => from_link_dir(root, link_path, target),
        None => {
            (!target.is_absolute() && !target.as_os_str().is_empty()).then(|| target.to_owned())
        }
    };
    from_dir.is_some_and(|from_dir| link_stays_inside(link_path, &from_dir))
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

    fn show(steps: Option<Vec<Step<'_>>>) -> Option<String> {
        steps.map(|steps| {
            steps
                .iter()
                .map(|step| match step {
                    Step::Parent => "..".to_owned(),
                    Step::Name(name) => name.to_string_lossy().into_owned(),
                })
                .collect::<Vec<_>>()
                .join("/")
        })
    }

    #[test]
    fn absolute_paths_lead_below_the_root_only_when_they_spell_it() {
        let table = [
            ("/workspace", "/workspace/a.txt", Some("a.txt")),
            ("/workspace", "/workspace", Some("")),
            ("/srv/root", "/srv/root", Some("")),
            ("/srv/root", "/srv/root/a/b", Some("a/b")),
            ("/srv/root", "/srv/root/a/../b", Some("a/../b")),
            ("/srv/root", "/srv/root/./a/./b/", Some("a/b")),
            ("/srv/root", "//srv//root/a", Some("a")),
            ("/srv/root", "/srv/root/../root/x", Some("x")),
            ("/srv/root", "/../srv/root/x", Some("x")),
            ("/srv/root", "/srv/root/..", None),
            ("/srv/root", "/srv", None),
            ("/srv/root", "/", None),
            ("/srv/root", "/etc/passwd", None),
            ("/srv/root", "/srv/rootless/x", None),
            ("/srv/root", "/srv/other/../root/x", None),
            ("/srv/root", "relative/x", None),
            ("/", "/", Some("")),
            ("/", "/etc/passwd", Some("etc/passwd")),
            ("/", "/../etc", Some("etc")),
            ("/", "/var/../run", Some("var/../run")),
        ];
        for (root, path, expected) in table {
            assert_eq!(
                show(beneath_root(Path::new(root), Path::new(path))).as_deref(),
                expected,
                "{path} under {root}"
            );
        }
    }

    #[test]
    fn a_links_target_is_spelled_from_its_directory() {
        let root = Path::new("/workspace");
        let table = [
            ("l", "a.txt", Some("a.txt")),
            ("d/l", "../a.txt", Some("../a.txt")),
            ("l", "/workspace/a.txt", Some("./a.txt")),
            ("d/e/l", "/workspace/a.txt", Some("./../../a.txt")),
            ("d/l", "/workspace", Some("./..")),
            ("d/l", "/workspace/x/../../y", Some("./../x/../../y")),
            ("l", "/etc/passwd", None),
            ("l", "", None),
        ];
        for (link, target, expected) in table {
            let got = from_link_dir(root, link, Path::new(target));
            assert_eq!(
                got.as_deref().map(Path::to_string_lossy).as_deref(),
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
