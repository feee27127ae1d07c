//! Embeds the web console: writes `$OUT_DIR/console_files.rs`, a table of `(url path,
//! include_bytes!(file))` for every file below `console/` except its `test/` folder, dot files
//! and `node_modules/` (none of which a browser loads). `src/console.rs` includes the table.
//!
//! A table of `include_bytes!` rather than an embedding crate: cargo reruns this script when
//! anything below `console/` changes, files added or removed included (a derive macro only
//! sees edits to the files it already embedded), and a missing folder is an empty console, not
//! a build error. No dependency.

use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let console_dir = manifest_dir.join("console");
    let mut files = Vec::new();
    if console_dir.is_dir() {
        // A directory is scanned whole: an added, changed or removed file reruns this script.
        println!("cargo::rerun-if-changed=console");
        collect(&console_dir, "", &mut files);
    } else {
        // Watch the crate itself, so the folder's creation is noticed.
        println!("cargo::rerun-if-changed=.");
    }
    files.sort();
    let mut table = String::from("&[\n");
    for (url_path, file) in &files {
        table.push_str(&format!("    ({url_path:?}, include_bytes!({file:?})),\n"));
    }
    table.push_str("]\n");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("console_files.rs"), table).expect("writes console_files.rs");
}

/// Every file below `dir` as `(its path below console/ with `/` separators, its absolute
/// path)`, leaving out what the console's browser never loads.
fn collect(dir: &Path, prefix: &str, files: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reads {}: {e}", dir.display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("reads {}: {e}", dir.display())));
    for entry in entries {
        let name = entry.file_name();
        let name = name
            .to_str()
            .unwrap_or_else(|| panic!("{:?} in {} is not UTF-8", name, dir.display()));
        let url_path = format!("{prefix}{name}");
        if name.starts_with('.') || name == "node_modules" || url_path == "test" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            collect(&path, &format!("{url_path}/"), files);
        } else {
            let path = path.to_str().expect("a UTF-8 name below a UTF-8 directory");
            files.push((url_path, path.to_owned()));
        }
    }
}
