//! `fcache replay` end to end: the windows it reports are those of docs/KERNEL.md's "Worked
//! traces" (the first rows).

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn replay_shows_the_readahead_windows_of_a_sequential_trace() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-test.dat");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fcache"))
        .args(["replay", "--json", "--max-order", "0"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let trace: String = (0..5).map(|i| format!("{} 4096\n", i * 4096)).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(trace.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("direct I/O") {
        // The same rule as the other tests: a skip passes outside CI, fails in it unless
        // FOLIOCACHE_ALLOW_SKIP says it is expected.
        assert!(
            std::env::var_os("CI").is_none() || std::env::var_os("FOLIOCACHE_ALLOW_SKIP").is_some(),
            "cannot run in CI: {stderr}"
        );
        eprintln!("SKIPPED: {stderr}");
        return;
    }
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    let window = |k: usize| {
        let ra = &lines[k]["ra"];
        (ra["start"].as_u64().unwrap(), ra["size"].as_u64().unwrap())
    };
    assert_eq!(window(0), (0, 4));
    assert_eq!(window(1), (4, 8));
    assert_eq!(window(4), (12, 16));
    let cached = &lines[4]["cached"][0];
    assert_eq!(cached["first_page"], 0);
    assert_eq!(cached["pages"], 28);
    assert_eq!(cached["marks"][0], 12);
    assert_eq!(cached["state"], "uptodate");
}

#[test]
fn replay_explains_a_bad_trace() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-bad.dat");
    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fcache"))
        .args(["replay"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"0 10\nnot a line\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("direct I/O") {
        return;
    }
    assert!(!output.status.success());
    assert!(stderr.contains("trace line 2"), "{stderr}");
}
