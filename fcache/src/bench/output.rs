//! Where a run's results go: each suite's JSON file, and at the end the summary (printed, and
//! written as `summary.json` and `summary.md`) and `index.html`, one page of it all.

use super::args::BenchArgs;
use super::html;
use super::report::Report;
use super::summary::{self, Row};
use std::path::{Path, PathBuf};

/// Where a suite's JSON goes: `--json PATH` for one suite, `PATH` with the suite's name added
/// before the extension for several, else `<suite>.json` in the output directory.
pub(crate) fn json_path(args: &BenchArgs, suites: usize, suite: &str) -> PathBuf {
    match (&args.json, suites) {
        (Some(path), 1) => path.clone(),
        (Some(path), _) => with_suffix(path, suite),
        (None, _) => args.out.join(format!("{suite}.json")),
    }
}

fn with_suffix(path: &Path, suite: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "results".into(), |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "json".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-{suite}.{ext}"))
}

/// Rows in seed order (000, 001, ...), then the other suites' by name; a suite's own order is
/// kept.
fn seed_order(rows: &mut [Row]) {
    rows.sort_by_key(|r| (!r.seed.chars().all(|c| c.is_ascii_digit()), r.seed.clone()));
}

/// Prints the summary of the suites that ran and writes `summary.json`, `summary.md` and
/// `index.html` into `out`.
pub(crate) fn finish(out: &Path, reports: &[Report], mut rows: Vec<Row>) -> Result<(), String> {
    seed_order(&mut rows);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let summary_path = out.join("summary.json");
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "command": command,
        "machine": reports.first().map(|r| &r.machine),
        "rows": rows,
    }))
    .map_err(|e| e.to_string())?;
    std::fs::write(&summary_path, text)
        .map_err(|e| format!("cannot write {}: {e}", summary_path.display()))?;
    let md_path = out.join("summary.md");
    std::fs::write(
        &md_path,
        format!(
            "# fcache bench: summary\n\n`{command}`\n\n{}",
            summary::markdown(&rows)
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
    let html_path = out.join("index.html");
    std::fs::write(&html_path, html::page(reports, &rows, &command))
        .map_err(|e| format!("cannot write {}: {e}", html_path.display()))?;
    if let Some(first) = reports.first() {
        println!(
            "\nSummary: `{command}`\n{}; mitigations: {}",
            first.machine.line(),
            first.machine.mitigations()
        );
    }
    print!("{}", summary::render(&rows, summary::Style::for_stdout()));
    println!(
        "Full tables: --verbose, or the .md beside each JSON; all in one page: {}",
        html_path.display()
    );
    Ok(())
}
