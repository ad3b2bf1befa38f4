//! A sequential reader's prefetch (`FOLIOCACHE_SEQ_PREFETCH`, chosen once per process): the
//! default follows the CPU's vendor, `on` and `off` override it, and a bad value is one line on
//! stderr and the default. Reads in order return the right bytes both ways, each way in a child
//! process: from a memory file and from a file on disk (cold, then warm through the hit path),
//! in 4 KiB and in large folios, in records that end inside a folio and at its end.

mod common;

use common::pattern;
use foliocache::{Cache, Error, File, SEQ_PREFETCH_VAR, sequential_prefetch};
use std::io::Write;
use std::path::PathBuf;

const NAME: &str = "sequential_reads_are_right_with_the_prefetch_on_and_off";

/// What `/proc/cpuinfo` says of the CPU's vendor.
fn cpu_is_intel() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
    info.lines()
        .find(|l| l.starts_with("vendor_id"))
        .is_some_and(|l| l.trim_end().ends_with("GenuineIntel"))
}

/// Reads `file` from its start in `record`-byte reads, each starting where the last ended.
fn read_in_order(file: &File, record: usize) -> Vec<u8> {
    let mut handle = file.handle();
    let mut out = Vec::new();
    let mut buf = vec![0u8; record];
    loop {
        let n = handle.read_at(&mut buf, out.len() as u64).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn check(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first wrong byte at {at}");
    }
}

/// The reads of a child: every file kind, folio size and record size, checked byte for byte.
fn reads_in_order() {
    let size = 3 * (2 << 20) + 5000;
    let want = pattern(size);
    let cache = Cache::builder().capacity(64 << 20).build().unwrap();
    for order in [0, foliocache::MAX_ORDER] {
        let file = cache.create_memory_file(order).unwrap();
        file.write_at(&want, 0).unwrap();
        for record in [4096, 3000, 8192] {
            let got = read_in_order(&file, record);
            check(
                &format!("memory file, order {order}, {record} B"),
                &got,
                &want,
            );
        }
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("seq-prefetch-{}", std::process::id()));
    let mut out = std::fs::File::create(&path).unwrap();
    out.write_all(&want).unwrap();
    out.sync_all().unwrap();
    drop(out);
    let file = match cache.open(&path) {
        Ok(file) => file,
        Err(Error::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
            std::fs::remove_file(&path).unwrap();
            common::skip("the target directory's file system has no direct I/O");
            return;
        }
        Err(error) => panic!("{error}"),
    };
    for record in [8192, 5000, 4096] {
        file.drop_cached(0, 0);
        let cold = read_in_order(&file, record);
        check(&format!("disk file, cold, {record} B"), &cold, &want);
        let warm = read_in_order(&file, record);
        check(&format!("disk file, warm, {record} B"), &warm, &want);
    }
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn sequential_reads_are_right_with_the_prefetch_on_and_off() {
    if let Some(role) = common::child_role() {
        assert_eq!(sequential_prefetch(), role == "on", "the child's setting");
        reads_in_order();
        return;
    }
    if std::env::var_os(SEQ_PREFETCH_VAR).is_none() {
        assert_eq!(
            sequential_prefetch(),
            cpu_is_intel(),
            "the default is by vendor"
        );
    }
    for value in ["on", "off"] {
        let status = common::run_child_with(NAME, value, &[(SEQ_PREFETCH_VAR, value)]);
        assert!(
            status.success(),
            "the run with {SEQ_PREFETCH_VAR}={value} failed: {status}"
        );
    }
}

#[test]
fn a_bad_value_says_so_and_takes_the_default() {
    const SELF: &str = "a_bad_value_says_so_and_takes_the_default";
    if common::child_role().is_some() {
        println!("prefetch: {}", sequential_prefetch());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", SELF, "--nocapture", "--test-threads=1"])
        .env("FOLIOCACHE_CHILD", "bad")
        .env(SEQ_PREFETCH_VAR, "sometimes")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains(&format!("prefetch: {}", cpu_is_intel())),
        "the default for this CPU: {stdout}"
    );
    assert!(
        stderr.contains(&format!("{SEQ_PREFETCH_VAR}=\"sometimes\" is neither")),
        "one line on stderr: {stderr}"
    );
}
