//! The layers of docs/ARCHITECTURE.md hold: every `crate::` path in `src/` points to a module
//! below its own in the diagram there (a lower row, or further right in the same row), and
//! every module of `src/` has a place in it. The diagram is read from the page itself, so the
//! claim and this check cannot drift apart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The modules of the diagram, top first (a module's position is its height).
fn diagram() -> Vec<String> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&page).expect("docs/ARCHITECTURE.md");
    let block = text
        .split("```")
        .nth(1)
        .expect("the layer diagram, the page's first code block");
    let mut order = Vec::new();
    for line in block.lines() {
        // Notes in parentheses name things, not modules.
        let mut depth = 0;
        let bare: String = line
            .chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0 && *c != ')'
            })
            .collect();
        for word in bare.split_whitespace() {
            let name = word
                .strip_suffix(".rs")
                .or_else(|| word.strip_suffix('/'))
                .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            if let Some(name) = name {
                order.push(name.to_owned());
            }
        }
    }
    order
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source file without its comments (`//` to the end of the line).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_import_points_down_the_architecture_diagram() {
    let order = diagram();
    assert!(order.len() > 20, "the diagram was not read: {order:?}");
    let height: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(k, name)| (name.as_str(), order.len() - k))
        .collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let Some(&mine) = height.get(module.as_str()) else {
            wrong.push(format!(
                "{}: module `{module}` has no place in the diagram",
                relative.display()
            ));
            continue;
        };
        let text = code(&std::fs::read_to_string(file).unwrap());
        for (at, _) in text.match_indices("crate::") {
            let target: String = text[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if target == module || target.is_empty() {
                continue;
            }
            match height.get(target.as_str()) {
                Some(&theirs) if theirs < mine => {}
                Some(_) => wrong.push(format!(
                    "{}: uses `crate::{target}`, which is not below `{module}`",
                    relative.display()
                )),
                None => wrong.push(format!(
                    "{}: uses `crate::{target}`, which has no place in the diagram",
                    relative.display()
                )),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against docs/ARCHITECTURE.md's layers:\n{}",
        wrong.join("\n")
    );
}
