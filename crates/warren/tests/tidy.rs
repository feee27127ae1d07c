//! Tidiness checks over the source tree, in the spirit of rust-analyzer's `tidy.rs`: every
//! source file opens with a `//!` paragraph saying what it does, every crate has a heading in
//! ARCHITECTURE.md, and only `warren-process` spawns processes. These are facts the code map
//! and the house style promise; a test keeps them true.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = warren_test_support::files_under(dir)
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    files
}

/// `(crate directory name, its src files)` for every crate of the workspace.
fn crates() -> Vec<(String, Vec<PathBuf>)> {
    let mut crates: Vec<(String, Vec<PathBuf>)> = std::fs::read_dir(workspace().join("crates"))
        .expect("crates/")
        .flatten()
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, rust_files(&entry.path().join("src")))
        })
        .collect();
    crates.sort();
    crates
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_source_file_starts_with_a_doc_paragraph() {
    let missing: Vec<String> = crates()
        .into_iter()
        .flat_map(|(_, files)| files)
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            !text.starts_with("//! ")
        })
        .map(|file| relative(&file))
        .collect();
    assert!(
        missing.is_empty(),
        "files without a `//!` paragraph: {missing:#?}"
    );
}

#[test]
fn every_crate_has_a_heading_in_the_architecture_document() {
    let architecture =
        std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let missing: Vec<String> = crates()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !architecture.contains(&format!("### crates/{name}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "crates missing from ARCHITECTURE.md: {missing:?}"
    );
    for heading in architecture
        .lines()
        .filter_map(|l| l.strip_prefix("### crates/"))
    {
        assert!(
            workspace()
                .join("crates")
                .join(heading)
                .join("Cargo.toml")
                .is_file(),
            "ARCHITECTURE.md describes crates/{heading}, which does not exist"
        );
    }
}

/// Test fixtures that stand in for third-party programs and start processes the way those do.
const SPAWNING_FIXTURES: &[&str] = &["crates/brain/src/bin/warren-test-agent.rs"];

#[test]
fn only_the_process_crate_spawns_processes() {
    let forbidden = [
        "Command::new(",
        "process::Command",
        "libc::fork",
        "posix_spawn",
    ];
    let mut offenders = Vec::new();
    for (name, files) in crates() {
        // The spawner itself, and the dev-only helpers tests use to start real programs.
        if name == "process" || name == "test-support" {
            continue;
        }
        for file in files {
            let shown = relative(&file);
            if SPAWNING_FIXTURES.contains(&shown.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let spawns = forbidden.iter().any(|needle| {
                    code.match_indices(needle).any(|(at, _)| {
                        // `std::process::CommandExt` or `CommandSpec` are not spawns.
                        !code[at + needle.len()..]
                            .starts_with(|c: char| c.is_alphanumeric() || c == '_')
                    })
                }) || code.contains(" Command::new(")
                    || code.contains("(Command::new(");
                if spawns {
                    offenders.push(format!("{shown}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "processes are spawned outside warren-process (use warren_process::spawn): {offenders:#?}"
    );
}

/// Every face that runs commands (PTY sessions, exec sessions, OpenSandbox commands and bash
/// sessions, E2B processes, agent workers) ends them and drains their output by one policy,
/// `warren_process::stop`: none keeps a grace or drain time of its own.
#[test]
fn the_faces_that_run_commands_share_one_kill_and_drain_policy() {
    let mut offenders = Vec::new();
    for (name, files) in crates() {
        if !["execd", "exec", "brain"].contains(&name.as_str()) {
            continue;
        }
        for file in files {
            let shown = relative(&file);
            if shown.contains("/tests/") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("").trim();
                let own_time = code.contains("const ")
                    && code.contains(": Duration")
                    && (code.contains("GRACE") || code.contains("DRAIN"));
                let own_kill = name == "execd" && code.contains("kill_tree(");
                if own_time || own_kill {
                    offenders.push(format!("{shown}:{}: {code}", n + 1));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "use warren_process::stop (end_tree, hang_up, drain_after_exit, Drain): {offenders:#?}"
    );
}

#[test]
fn no_file_cites_a_spec_outside_the_repository() {
    let mut offenders = Vec::new();
    let mut files: Vec<PathBuf> = crates().into_iter().flat_map(|(_, files)| files).collect();
    for dir in ["docs", "crates"] {
        files.extend(
            rust_files(&workspace().join(dir))
                .into_iter()
                .filter(|f| f.components().any(|c| c.as_os_str() == "tests")),
        );
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(workspace().join("docs"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    docs.push(workspace().join("README.md"));
    docs.push(workspace().join("ARCHITECTURE.md"));
    files.extend(docs);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            // Spelled in two pieces so this file does not match itself.
            if line.contains(concat!("shared", "/spec")) || line.contains(concat!("../", "shared"))
            {
                offenders.push(format!("{}:{}: {}", relative(&file), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "references to specs outside the repository: {offenders:#?}"
    );
}

#[test]
fn what_the_gateway_stands_on_knows_neither_the_gateway_nor_axum() {
    // The session engine, the hands and what they keep name no route and no HTTP type; the
    // model proxy serves its own routes, so axum is its to name.
    let engines = [
        ("engine", true),
        ("store", true),
        ("hands", true),
        ("egress", true),
        ("push", true),
        ("model-proxy", false),
    ];
    let mut offenders = Vec::new();
    for (name, no_axum) in engines {
        let manifest = workspace().join("crates").join(name).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).expect("a crate's manifest");
        let dependencies = text.split("[dev-dependencies]").next().unwrap_or("");
        if dependencies.contains("warren-gateway") {
            offenders.push(format!("{name} depends on warren-gateway"));
        }
        if no_axum && dependencies.lines().any(|line| line.starts_with("axum")) {
            offenders.push(format!("{name} depends on axum"));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The most files one import cycle may hold in a crate (the engine's handle and the three
/// subsystems it starts name each other).
const MAX_IMPORT_CYCLE: usize = 4;

#[test]
fn no_import_cycle_spans_more_than_a_handful_of_files() {
    let mut offenders = Vec::new();
    for (name, files) in crates() {
        let src = workspace().join("crates").join(&name).join("src");
        let graph = module_graph(&src, &files);
        for cycle in strongly_connected(&graph) {
            if cycle.len() > MAX_IMPORT_CYCLE {
                offenders.push(format!("crates/{name}: {}", cycle.join(", ")));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "import cycles of more than {MAX_IMPORT_CYCLE} files:\n{}",
        offenders.join("\n")
    );
}

/// Each module of a crate (`a::b` for `src/a/b.rs` or `src/a/b/mod.rs`; the crate root left
/// out) and the modules its code outside tests names through `crate::`.
fn module_graph(
    src: &Path,
    files: &[PathBuf],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let module_of = |file: &PathBuf| {
        let relative = file.strip_prefix(src).ok()?.with_extension("");
        let name = relative.to_string_lossy().replace('/', "::");
        let name = name.strip_suffix("::mod").unwrap_or(&name).to_owned();
        (!matches!(name.as_str(), "lib" | "main") && !name.starts_with("bin::")).then_some(name)
    };
    let modules: std::collections::BTreeSet<String> = files.iter().filter_map(module_of).collect();
    let mut graph = std::collections::BTreeMap::new();
    for file in files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut names = std::collections::BTreeSet::new();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for (at, _) in line.match_indices("crate::") {
                let path: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let parts: Vec<&str> = path.split("::").collect();
                let named = [parts[..parts.len().min(2)].join("::"), parts[0].to_owned()]
                    .into_iter()
                    .find(|candidate| modules.contains(candidate));
                if let Some(named) = named
                    && named != module
                    && !module.starts_with(&format!("{named}::"))
                {
                    names.insert(named);
                }
            }
        }
        graph.insert(module, names);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn strongly_connected(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        index: std::collections::HashMap<&'a str, usize>,
        low: std::collections::HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, module: &'a str) {
            let n = self.index.len();
            self.index.insert(module, n);
            self.low.insert(module, n);
            self.stack.push(module);
            for next in self.graph.get(module).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[module].min(self.low[next]);
                    self.low.insert(module, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[module].min(self.index[next]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top.to_owned());
                    if top == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: Default::default(),
        low: Default::default(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.found
}
