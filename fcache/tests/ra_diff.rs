//! `fcache ra-diff`: foliocache's readahead against the kernel's.
//!
//! - The recorded set (`fcache/traces/recorded/*.json`, the kernel's page sets after every
//!   step of every trace, several runs each, recorded by `fcache/traces/record.sh`) replayed
//!   through foliocache alone: no kernel, no disk, runs anywhere.
//! - A live comparison with the running kernel on a file under the target directory, where
//!   the file system has a block device, O_DIRECT and mincore. Where it has not, the test fails
//!   unless `FOLIOCACHE_ALLOW_SKIP=1` (a skip must not pass silently in CI).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bar: steps with the kernel's (majority) page set, and mean Jaccard similarity.
const MIN_IDENTICAL_PCT: f64 = 95.0;
const MIN_MEAN_JACCARD: f64 = 0.98;

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

fn recordings() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(traces_dir().join("recorded"))
        .expect("fcache/traces/recorded exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    out.sort();
    out
}

/// Runs `fcache ra-diff ARGS --json`: the document, or stderr on failure.
fn ra_diff(args: &[&str]) -> Result<Value, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_fcache"))
        .arg("ra-diff")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err(stderr);
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap())
}

fn summary(doc: &Value) -> (f64, f64, u64) {
    let s = &doc["summary"];
    (
        s["identical_pct"].as_f64().unwrap(),
        s["mean_jaccard"].as_f64().unwrap(),
        s["steps"].as_u64().unwrap(),
    )
}

#[test]
fn foliocache_matches_the_recorded_kernel() {
    let recordings = recordings();
    let windows: Vec<u64> = recordings
        .iter()
        .map(|path| {
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            doc["settings"]["kernel"]["read_ahead_kb"].as_u64().unwrap()
        })
        .collect();
    assert!(
        windows.contains(&128) && windows.iter().any(|&kb| kb != 128),
        "recordings at 128 KiB and at a disk's own window: {windows:?}"
    );
    for path in &recordings {
        let traces = traces_dir();
        let doc = ra_diff(&[
            "--check",
            path.to_str().unwrap(),
            "--traces",
            traces.to_str().unwrap(),
        ])
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (identical, jaccard, steps) = summary(&doc);
        eprintln!(
            "{}: {steps} steps, {identical}% identical, mean Jaccard {jaccard} (kernel {})",
            path.display(),
            doc["settings"]["kernel"]
        );
        assert!(steps >= 1000, "{steps} steps: the whole set");
        assert!(
            identical >= MIN_IDENTICAL_PCT && jaccard >= MIN_MEAN_JACCARD,
            "{}: {identical}% of steps identical, mean Jaccard {jaccard}: {}",
            path.display(),
            doc["summary"]
        );
    }
}

#[test]
fn the_check_notices_a_different_window() {
    // The same recording against foliocache with a quarter of the window: the comparison must
    // fall well under the bar (the check can fail).
    let path = traces_dir().join("recorded/ra128.json");
    let doc = ra_diff(&["--check", path.to_str().unwrap(), "--ra-kb", "32"]).unwrap();
    let (identical, _, _) = summary(&doc);
    assert!(
        identical < 80.0,
        "{identical}% identical with a 32 KiB window"
    );
}

#[test]
fn the_check_refuses_a_recording_of_other_traces() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ra-diff-changed-traces");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("seq-4k-from-0.trace"),
        "file-size 16777216\nread 0 4096\n",
    )
    .unwrap();
    let path = traces_dir().join("recorded/ra128.json");
    let error = ra_diff(&[
        "--check",
        path.to_str().unwrap(),
        "--traces",
        dir.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(error.contains("changed since"), "{error}");
    let error =
        ra_diff(&["--check", dir.join("seq-4k-from-0.trace").to_str().unwrap()]).unwrap_err();
    assert!(error.contains("not JSON"), "{error}");
}

/// The project's rule for tests that cannot run here: fail, unless skips are allowed.
/// A test that cannot run here says why. Outside CI it passes with that line printed; in CI
/// (`CI` set, as `.ci/run` does) it fails unless `FOLIOCACHE_ALLOW_SKIP` is set (the
/// environment says the skip is expected). The same rule as foliocache's tests.
fn skip(reason: &str) {
    let in_ci = std::env::var_os("CI").is_some();
    let allowed = std::env::var_os("FOLIOCACHE_ALLOW_SKIP").is_some();
    assert!(
        !in_ci || allowed,
        "cannot run in CI: {reason} (set FOLIOCACHE_ALLOW_SKIP=1 if this is expected here)"
    );
    eprintln!("SKIPPED: {reason}");
}

#[test]
fn foliocache_matches_the_running_kernel() {
    // On the target directory's file system, with its device's own window; traces of each
    // family (sequential, interleaved, strided, end of file, advice, large folios).
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ra-diff-live");
    let traces = traces_dir();
    let result = ra_diff(&[
        dir.to_str().unwrap(),
        "--set",
        traces.to_str().unwrap(),
        "--only",
        "seq-4k-from-0,seq-64k-from-0,interleave-2x4k,stride-16k-read-4k,tail-partial,\
         dontneed-mid,willneed-mid,large-folio-history",
        "--runs",
        "3",
    ]);
    let doc = match result {
        Ok(doc) => doc,
        Err(error) if error.contains("unavailable:") => return skip(error.trim()),
        Err(error) => panic!("{error}"),
    };
    let (identical, jaccard, steps) = summary(&doc);
    eprintln!(
        "live: {steps} steps, {identical}% identical, mean Jaccard {jaccard}; kernel {}; \
         kernel self-agreement {}%",
        doc["settings"]["kernel"], doc["summary"]["kernel_self_identical_pct"]
    );
    assert!(
        identical >= MIN_IDENTICAL_PCT && jaccard >= MIN_MEAN_JACCARD,
        "{}",
        doc["summary"]
    );
    for trace in doc["traces"].as_array().unwrap() {
        // Each step carries both page sets and their difference.
        let step = &trace["steps"][0];
        for key in ["op", "kernel", "foliocache", "missing", "extra", "jaccard"] {
            assert!(!step[key].is_null(), "{key} in {step}");
        }
    }
}

#[test]
fn a_file_with_no_disk_under_it_is_refused_clearly() {
    // /proc has no block device: the comparison says it is unavailable, it does not panic.
    let error = ra_diff(&["/proc/self/status", "-"]).unwrap_err();
    assert!(error.contains("unavailable:"), "{error}");
    let error = ra_diff(&["/nonexistent/file"]).unwrap_err();
    assert!(error.contains("cannot open"), "{error}");
}
