//! Programs made of several processes, with the library in both write modes: nothing a
//! process reads may be older than what another process wrote before it, and the library
//! never takes a program's locks away. Each test also checks the counters, so a library that
//! passed every file through would fail: files were cached and hit, leases were taken and
//! broken, and files were passed through for the reason the test creates.

mod common;

use common::{
    CacheMode, With, Writes, command, compile_c, have, run, stats, work_dir, write_pattern,
};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

/// Longer runs under `FOLIOCACHE_STRESS_SECS` (rounds scale with it).
fn stress_factor() -> usize {
    std::env::var("FOLIOCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(1, |secs| secs.clamp(1, 3600))
}

fn library(writes: Writes, stats: &Path) -> With<'_> {
    With::Library {
        cache: CacheMode::Private,
        writes,
        stats,
    }
}

fn library_on(cache: CacheMode, writes: Writes, stats: &Path) -> With<'_> {
    With::Library {
        cache,
        writes,
        stats,
    }
}

// ---------------------------------------------------------------------------------------------
// Locks

#[test]
fn a_programs_locks_survive_mmap_reopen_fork_spawn_truncate_and_exec() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("mp-locks");
    let exe = compile_c(&dir, "locks", include_str!("c/locks.c"));
    let cases = [
        "mmap", "reopen", "fork", "spawn", "truncate", "exec", "execl",
    ];
    for writes in Writes::BOTH {
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        for case in cases {
            write_pattern(&dir.join("f"), 100_000, 7);
            let out = run(
                &dir,
                library(writes, &stats_path),
                exe.to_str().unwrap(),
                &["f", case],
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                text.trim(),
                format!("{case} kept"),
                "{writes:?}: the program's lock was dropped"
            );
        }
        let s = stats(&stats_path);
        assert!(s.hits > 0, "{writes:?}: the cache served nothing: {s:?}");
        assert!(s.leases_taken > 0, "{writes:?}: no lease was taken: {s:?}");
        // The mapping case makes the file pass through; so does the fork case for the
        // writable descriptor the child inherited.
        assert!(s.passed("shared-mapping") > 0, "{writes:?}: {s:?}");
        assert!(s.passed("inherited") > 0, "{writes:?}: {s:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// A reader beside a writer

/// A reader that keeps its file open and re-reads its first page on each line of input,
/// printing the first 16 bytes in hex.
const REREADER_PY: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for line in sys.stdin:
    print(os.pread(fd, 4096, 0)[:16].hex(), flush=True)
"#;

/// Writes byte N over the first page, syncs, closes.
const WRITER_PY: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, bytes([int(sys.argv[2])]) * 4096, 0)
os.fsync(fd)
os.close(fd)
"#;

struct Rereader {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Rereader {
    fn start(dir: &Path, with: With<'_>) -> Self {
        let mut child = command(dir, with, "python3", &["reread.py", "f"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the reader");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// The first 16 bytes of the page, read now.
    fn read(&mut self) -> String {
        self.stdin.write_all(b"r\n").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    fn finish(mut self) {
        drop(self.stdin);
        assert!(self.child.wait().unwrap().success(), "the reader failed");
    }
}

#[test]
fn a_reader_sees_another_processs_write_as_soon_as_it_returned() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("mp-reread");
    std::fs::write(dir.join("reread.py"), REREADER_PY).unwrap();
    std::fs::write(dir.join("write.py"), WRITER_PY).unwrap();
    let rounds = 10 * stress_factor();
    for (cache, writes) in common::modes() {
        std::fs::write(dir.join("f"), vec![0u8; 64 << 10]).unwrap();
        let mode = format!("{}-{}", cache.as_str(), writes.as_str());
        let stats_path = dir.join(format!("stats-{mode}.jsonl"));
        let writer_stats = dir.join(format!("writer-{mode}.jsonl"));
        let library = |writes, stats| library_on(cache, writes, stats);
        let mut reader = Rereader::start(&dir, library(writes, &stats_path));
        assert_eq!(reader.read(), "00".repeat(16));
        assert_eq!(reader.read(), "00".repeat(16));
        for round in 1..=rounds {
            let byte = round % 250 + 1;
            // Every other writer runs with the library too.
            let with = if round % 2 == 0 {
                library(writes, &writer_stats)
            } else {
                With::Kernel
            };
            run(&dir, with, "python3", &["write.py", "f", &byte.to_string()]);
            let expected = format!("{byte:02x}").repeat(16);
            for k in 0..2 {
                assert_eq!(
                    reader.read(),
                    expected,
                    "{mode}, round {round}, read {k}: the reader saw old bytes after the \
                     writer's write returned"
                );
            }
        }
        reader.finish();
        let s = stats(&stats_path);
        assert!(s.hits > 0, "{mode}: {s:?}");
        if cache == CacheMode::Private {
            assert!(s.leases_taken > 0, "{mode}: {s:?}");
            assert!(s.leases_broken > 0, "{mode}: {s:?}");
        } else {
            // The reader's reads came from the shared cache, its writers' writes through it.
            assert!(s.shared_used_pages > 0, "{mode}: {s:?}");
            assert!(stats(&writer_stats).writes > 0, "{mode}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads the whole file twice (the second pass from the cache), prints `ready`, then on each
/// line of input reads it again and prints its length and a checksum.
const READ_MOSTLY_PY: &str = r#"
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
def whole():
    parts, at = [], 0
    while True:
        b = os.pread(fd, 65536, at)
        if not b: return b''.join(parts)
        parts.append(b); at += len(b)
for _ in range(2): whole()
print('ready', flush=True)
for line in sys.stdin:
    data = whole()
    print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"#;

#[test]
fn readers_are_served_from_their_caches_until_a_writer_opens_the_file() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("mp-readmostly");
    std::fs::write(dir.join("readers.py"), READ_MOSTLY_PY).unwrap();
    let size = 4 << 20;
    for writes in Writes::BOTH {
        write_pattern(&dir.join("f"), size, 3);
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        let mut readers: Vec<_> = (0..3)
            .map(|_| {
                let mut child = command(
                    &dir,
                    library(writes, &stats_path),
                    "python3",
                    &["readers.py", "f"],
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
                let stdin = child.stdin.take().unwrap();
                let mut stdout = BufReader::new(child.stdout.take().unwrap());
                let mut line = String::new();
                stdout.read_line(&mut line).unwrap();
                assert_eq!(line.trim(), "ready");
                (child, stdin, stdout)
            })
            .collect();
        // A writer without the library rewrites the file.
        let new = common::pattern(size, 99);
        {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("f"))
                .unwrap();
            file.write_all(&new).unwrap();
            file.sync_all().unwrap();
        }
        let expected = format!("{} {}", size, sha256_hex(&new));
        for (child, mut stdin, mut stdout) in readers.drain(..) {
            stdin.write_all(b"check\n").unwrap();
            stdin.flush().unwrap();
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            assert_eq!(
                line.trim(),
                expected,
                "{writes:?}: a reader saw the old file"
            );
            drop(stdin);
            assert!(child.wait_with_output().unwrap().status.success());
        }
        let s = stats(&stats_path);
        assert_eq!(s.processes, 3, "{s:?}");
        assert!(
            s.bytes_from_cache >= 3 * size as u64,
            "{writes:?}: the second passes were not served from the caches: {s:?}"
        );
        assert!(s.leases_taken >= 3, "{writes:?}: {s:?}");
        assert!(s.leases_broken >= 3, "{writes:?}: {s:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn sha256_hex(data: &[u8]) -> String {
    let mut child = std::process::Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// One file, one cached file

/// fsx-style churn: a file opened and closed thousands of times, read, written and truncated
/// in between, checked against a byte model at every read and at the end.
const CHURN_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define MAX (256 * 1024)
static unsigned char model[MAX], buf[MAX];
static unsigned long long rng = 88172645463325252ULL;
static unsigned long long next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
int main(int argc, char **argv) {
    const char *path = argv[1];
    long iterations = atol(argv[2]);
    rng ^= (unsigned long long)atol(argv[3]) * 2654435761ULL;
    long size = 0, reads = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("create"); return 1; }
    close(fd);
    for (long it = 0; it < iterations; it++) {
        int writable = next() % 4 != 0;
        fd = open(path, writable ? O_RDWR : O_RDONLY);
        if (fd < 0) { perror("open"); return 1; }
        int ops = 1 + next() % 4;
        for (int k = 0; k < ops; k++) {
            int op = next() % 10;
            if (!writable || op < 6) {
                long at = size ? next() % size : 0, len = 1 + next() % 65536;
                ssize_t n = pread(fd, buf, len, at);
                long want = at + len <= size ? len : size - at;
                if (n != want || memcmp(buf, model + at, n) != 0) {
                    printf("BAD read at %ld len %ld: got %zd, want %ld (iteration %ld)\n", at, len, n, want, it);
                    return 1;
                }
                reads++;
            } else if (op < 9) {
                long at = next() % (MAX - 65536), len = 1 + next() % 65536;
                for (long i = 0; i < len; i++) buf[i] = (unsigned char)next();
                if (pwrite(fd, buf, len, at) != len) { perror("pwrite"); return 1; }
                if (at > size) memset(model + size, 0, at - size);
                memcpy(model + at, buf, len);
                if (at + len > size) size = at + len;
            } else {
                long to = next() % MAX;
                if (ftruncate(fd, to) != 0) { perror("ftruncate"); return 1; }
                if (to > size) memset(model + size, 0, to - size);
                size = to;
            }
        }
        if (next() % 50 == 0 && writable) fsync(fd);
        close(fd);
    }
    fd = open(path, O_RDONLY);
    ssize_t n = pread(fd, buf, MAX, 0);
    if (n != size || memcmp(buf, model, size) != 0) { printf("BAD at the end\n"); return 1; }
    printf("ok %ld reads\n", reads);
    return 0;
}
"#;

#[test]
fn a_file_reopened_thousands_of_times_stays_one_cached_file() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("mp-churn");
    let exe = compile_c(&dir, "churn", CHURN_C);
    let iterations = (3000 * stress_factor()).to_string();
    for writes in Writes::BOTH {
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        let out = run(
            &dir,
            library(writes, &stats_path),
            exe.to_str().unwrap(),
            &["f", &iterations, "5"],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("ok "), "{writes:?}: {text}");
        let s = stats(&stats_path);
        assert_eq!(
            s.files, 1,
            "{writes:?}: one file became several cached files: {s:?}"
        );
        assert!(s.hits > 0, "{writes:?}: {s:?}");
        assert!(s.leases_taken > 0, "{writes:?}: {s:?}");
        // Storage has what the model has (the program compared its last read already; this
        // is the file as the kernel has it after the process is gone).
        let on_storage = std::fs::read(dir.join("f")).unwrap();
        let again = run(
            &dir,
            With::Kernel,
            exe.to_str().unwrap(),
            &["g", &iterations, "5"],
        );
        assert!(String::from_utf8_lossy(&again.stdout).starts_with("ok "));
        assert!(
            on_storage == std::fs::read(dir.join("g")).unwrap(),
            "{writes:?}: storage differs from a run without the library"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// SQLite in WAL mode

const WAL_WRITER_PY: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=120, isolation_level=None)
db.execute('PRAGMA journal_mode=WAL')
me, n = int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    db.execute('BEGIN IMMEDIATE')
    db.execute('INSERT INTO t(who, v, pad) VALUES (?, ?, ?)', (me, i, 'x' * (i % 500)))
    db.execute('UPDATE total SET rows = rows + 1, sum = sum + ?', (i,))
    db.execute('COMMIT')
print('ok')
"#;

/// Reads the rows and the running totals in one transaction until `stop` exists: they must
/// agree, and the row count never goes down.
const WAL_READER_PY: &str = r#"
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=120, isolation_level=None)
last, checks, bad = 0, 0, []
while not os.path.exists(sys.argv[2]) or checks < 5:
    db.execute('BEGIN')
    (rows, total) = db.execute('SELECT count(*), coalesce(sum(v), 0) FROM t').fetchone()
    (r2, s2) = db.execute('SELECT rows, sum FROM total').fetchone()
    db.execute('COMMIT')
    if (rows, total) != (r2, s2): bad.append(('totals', rows, total, r2, s2))
    if rows < last: bad.append(('went back', last, rows))
    last, checks = rows, checks + 1
print('ok' if not bad else 'BAD %r' % bad[:5])
"#;

#[test]
fn sqlite_in_wal_mode_with_two_writers_and_a_reader_stays_consistent() {
    if !have("python3") || !have("sqlite3") {
        return;
    }
    let dir = work_dir("mp-wal");
    std::fs::write(dir.join("writer.py"), WAL_WRITER_PY).unwrap();
    std::fs::write(dir.join("reader.py"), WAL_READER_PY).unwrap();
    let rows = 400 * stress_factor();
    for (cache, writes) in common::modes() {
        let mode = format!("{}-{}", cache.as_str(), writes.as_str());
        for name in ["db.sqlite", "db.sqlite-wal", "db.sqlite-shm", "stop"] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        run(
            &dir,
            With::Kernel,
            "sqlite3",
            &[
                "db.sqlite",
                "PRAGMA journal_mode=WAL; CREATE TABLE t(who INTEGER, v INTEGER, pad TEXT); \
             CREATE TABLE total(rows INTEGER, sum INTEGER); INSERT INTO total VALUES (0, 0);",
            ],
        );
        let stats_path = dir.join(format!("stats-{mode}.jsonl"));
        let with = library_on(cache, writes, &stats_path);
        let spawn = |args: &[&str]| {
            command(&dir, with, "python3", args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        // The reader first, alone for a moment (its files are cached under leases), then the
        // writers one after the other.
        let reader = spawn(&["reader.py", "db.sqlite", "stop"]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let first = spawn(&["writer.py", "db.sqlite", "1", &rows.to_string()]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let second = spawn(&["writer.py", "db.sqlite", "2", &rows.to_string()]);
        for (name, child) in [("first writer", first), ("second writer", second)] {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
                "{writes:?}: the {name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(dir.join("stop"), b"").unwrap();
        let out = reader.wait_with_output().unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
            "{writes:?}: the reader saw: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A program without the library sees the shared cache's writes once written back.
        common::sync_shared();
        let out = run(
            &dir,
            With::Kernel,
            "sqlite3",
            &[
                "db.sqlite",
                "PRAGMA integrity_check; SELECT count(*), count(DISTINCT who) FROM t; \
             SELECT rows FROM total;",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("ok\n{}|2\n{}\n", 2 * rows, 2 * rows),
            "{mode}"
        );
        let s = stats(&stats_path);
        assert_eq!(s.processes, 3, "{s:?}");
        if cache == CacheMode::Private {
            assert!(s.leases_taken > 0, "{mode}: {s:?}");
            assert!(s.leases_broken > 0, "{mode}: {s:?}");
        } else {
            assert!(s.hits > 0 && s.writes > 0, "{mode}: {s:?}");
        }
        assert!(
            s.passed("shared-mapping") > 0,
            "{mode}: the -shm file: {s:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Data-loader workers on the shared cache

/// Four worker processes (forked by `multiprocessing`) each read every dataset file in
/// shuffled records of 4 KiB to 1 MiB, put each file back together and print its SHA-256.
const LOADER_PY: &str = r#"
import hashlib, multiprocessing as mp, os, random, sys
files = sys.argv[1:]
def work(seed):
    rnd = random.Random(seed)
    sums = []
    for path in files:
        size = os.path.getsize(path)
        cuts, at = [], 0
        while at < size:
            n = min(size - at, rnd.randint(4096, 1 << 20))
            cuts.append((at, n)); at += n
        rnd.shuffle(cuts)
        fd = os.open(path, os.O_RDONLY)
        parts = {at: os.pread(fd, n, at) for at, n in cuts}
        os.close(fd)
        whole = b''.join(parts[at] for at in sorted(parts))
        sums.append(hashlib.sha256(whole).hexdigest() if len(whole) == size else 'short')
    return sums
if __name__ == '__main__':
    mp.set_start_method('fork')
    with mp.Pool(4) as pool:
        for sums in pool.map(work, range(4)):
            print(' '.join(sums))
"#;

#[test]
fn data_loader_workers_share_one_copy_and_start_warm() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("mp-loader");
    std::fs::write(dir.join("loader.py"), LOADER_PY).unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("part{i}.bin")).collect();
    let mut sums = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // Odd sizes: records end short of pages and of the file.
        let data = common::pattern((6 << 20) + 4096 * i + 123, 50 + i as u64);
        sums.push(sha256_hex(&data));
        std::fs::write(dir.join(name), data).unwrap();
    }
    let expected = sums.join(" ");
    let dataset_pages: u64 = names
        .iter()
        .map(|n| std::fs::metadata(dir.join(n)).unwrap().len().div_ceil(4096))
        .sum();
    // A cache of its own, so its pages are only this dataset's.
    let cache_name = format!("loader{}", std::process::id());
    let mut args = vec!["loader.py"];
    args.extend(names.iter().map(String::as_str));
    // (The workers end with `os._exit`, as `multiprocessing`'s do: they write no counters;
    // the shared cache's status says what it holds and what it read.)
    let dataset = |status: &serde_json::Value| -> (u64, u64) {
        let mut pages_and_reads = (0, 0);
        for file in status["files"].as_array().expect("files in the status") {
            let path = file["path"].as_str().unwrap_or("");
            if names.iter().any(|n| path.ends_with(n.as_str())) {
                pages_and_reads.0 += file["cached_pages"].as_u64().unwrap_or(0);
                pages_and_reads.1 += file["device_read_bytes"].as_u64().unwrap_or(0);
            }
        }
        pages_and_reads
    };
    let mut device = Vec::new();
    for pass in ["cold", "warm"] {
        let stats_path = dir.join(format!("stats-{pass}.jsonl"));
        let out = command(
            &dir,
            library_on(CacheMode::Shared, Writes::Through, &stats_path),
            "python3",
            &args,
        )
        .env("FOLIOCACHE_SHARED", &cache_name)
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{pass}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{pass}: {text}");
        for line in lines {
            assert_eq!(line, expected, "{pass}: a worker read other bytes");
        }
        let status: serde_json::Value = serde_json::from_str(
            &foliocache::cache_command(&cache_name, foliocache::CacheCommand::Status)
                .expect("the loader's shared cache"),
        )
        .expect("a JSON status");
        let (pages, read) = dataset(&status);
        // Each page once in memory, however many workers read it.
        assert!(
            pages >= dataset_pages * 9 / 10 && pages <= dataset_pages,
            "{pass}: {pages} pages cached for a dataset of {dataset_pages}"
        );
        // And the whole cache holds no more than that (besides staging folios and index
        // nodes): four workers did not make four copies.
        let used = status["total_pages"].as_u64().unwrap_or(0)
            - status["free_pages"].as_u64().unwrap_or(0);
        assert!(
            used <= dataset_pages + dataset_pages / 10 + 512,
            "{pass}: the cache uses {used} pages for a dataset of {dataset_pages}"
        );
        device.push(read);
    }
    // The second run found the first run's pages: the files were read from the device in
    // the first run only.
    assert!(device[0] > 0, "the cold pass read nothing from the device?");
    assert_eq!(
        device[1], device[0],
        "the warm pass read from the device: the cache did not keep the first run's pages"
    );
    let _ = foliocache::cache_command(
        &cache_name,
        foliocache::CacheCommand::Destroy { force: true },
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// No lease to be had

/// Reads the file twice and prints its checksum.
const READ_TWICE_PY: &str = r#"
import hashlib, sys
for _ in range(2):
    data = open(sys.argv[1], 'rb').read()
print(len(data), hashlib.sha256(data).hexdigest())
"#;

#[test]
fn another_users_file_without_cap_lease_passes_through() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !have("python3") {
        return;
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the file is this user's own, nothing to test here");
        return;
    }
    let dir = work_dir("mp-nolease");
    std::fs::write(dir.join("read.py"), READ_TWICE_PY).unwrap();
    let data = common::pattern(1 << 20, 11);
    std::fs::write(dir.join("f"), &data).unwrap();
    // Counters from a user who may write only here.
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stats_path = out_dir.join("stats.jsonl");
    for writes in Writes::BOTH {
        let out = command(
            &dir,
            library(writes, &stats_path),
            "python3",
            &["read.py", "f"],
        )
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{writes:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{} {}", data.len(), sha256_hex(&data))
        );
    }
    let s = stats(&stats_path);
    assert_eq!(s.processes, 2, "{s:?}");
    assert_eq!(s.leases_taken, 0, "{s:?}");
    assert_eq!(
        s.hits, 0,
        "another user's file was served without a lease: {s:?}"
    );
    assert!(s.passed("no-lease") >= 2, "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// A description sent to another process

/// Starts a receiver, then opens the file and reads it (from the cache), sends the writable
/// descriptor over a Unix socket (`SCM_RIGHTS`), waits until the receiver wrote through it,
/// and reads again.
const SEND_FD_PY: &str = r#"
import os, socket, subprocess, sys
a, b = socket.socketpair()
receiver = subprocess.Popen([sys.executable, '-c', '''
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
msg, fds, flags, addr = socket.recv_fds(s, 1, 1)
os.pwrite(fds[0], b"N" * 16, 0)
s.send(b"k")
''', str(b.fileno())], pass_fds=[b.fileno()])
fd = os.open(sys.argv[1], os.O_RDWR)
before = os.pread(fd, 16, 0)
os.pread(fd, 16, 0)
socket.send_fds(a, [b"x"], [fd])
a.recv(1)
after = os.pread(fd, 16, 0)
receiver.wait()
print(before.hex(), after.hex())
"#;

#[test]
fn a_writable_descriptor_sent_to_another_process_makes_its_file_pass_through() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("mp-sendfd");
    std::fs::write(dir.join("send.py"), SEND_FD_PY).unwrap();
    for writes in Writes::BOTH {
        std::fs::write(dir.join("f"), vec![b'o'; 8192]).unwrap();
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        let out = run(
            &dir,
            library(writes, &stats_path),
            "python3",
            &["send.py", "f"],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{} {}", "6f".repeat(16), "4e".repeat(16)),
            "{writes:?}: the sender read old bytes after the receiver's write"
        );
        let s = stats(&stats_path);
        assert!(s.hits > 0, "{writes:?}: {s:?}");
        assert!(s.leases_taken > 0, "{writes:?}: {s:?}");
        assert!(s.passed("inherited") > 0, "{writes:?}: {s:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// A program that blocks every signal

/// Blocks every signal in every thread and reads them from a `signalfd` on a thread of its own
/// (as servers do); on each line of input re-reads the first page and prints 16 bytes in hex;
/// at the end of input prints how many signals its signalfd received.
const SIGNALFD_READER_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/signalfd.h>
#include <unistd.h>
static int sfd;
static volatile int received;
static void *drain(void *arg) {
    struct signalfd_siginfo info;
    while (read(sfd, &info, sizeof info) == sizeof info) received++;
    return arg;
}
int main(int argc, char **argv) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, 0);
    sfd = signalfd(-1, &all, 0);
    pthread_t thread;
    pthread_create(&thread, 0, drain, 0);
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    char line[64];
    unsigned char page[4096];
    while (fgets(line, sizeof line, stdin)) {
        if (pread(fd, page, sizeof page, 0) != sizeof page) { perror("pread"); return 1; }
        for (int i = 0; i < 16; i++) printf("%02x", page[i]);
        printf("\n");
        fflush(stdout);
    }
    printf("signals %d\n", received);
    return 0;
}
"#;

#[test]
fn a_break_is_heard_by_a_program_that_blocks_every_signal() {
    if !have("gcc") || !have("python3") {
        return;
    }
    let dir = work_dir("mp-signalfd");
    let exe = compile_c(&dir, "reader", SIGNALFD_READER_C);
    std::fs::write(dir.join("write.py"), WRITER_PY).unwrap();
    for writes in Writes::BOTH {
        std::fs::write(dir.join("f"), vec![0u8; 64 << 10]).unwrap();
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        let mut child = command(
            &dir,
            library(writes, &stats_path),
            exe.to_str().unwrap(),
            &["f"],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut read = || {
            stdin.write_all(b"r\n").unwrap();
            stdin.flush().unwrap();
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            line.trim().to_owned()
        };
        assert_eq!(read(), "00".repeat(16));
        assert_eq!(read(), "00".repeat(16));
        // Unheard, the writer's open would wait for the kernel's lease-break-time (45 s by
        // default): a watchdog on the writer, not a timing.
        let writer = command(&dir, With::Kernel, "python3", &["write.py", "f", "7"])
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let status = wait_at_most(writer, std::time::Duration::from_secs(20));
        assert!(
            status.is_some_and(|s| s.success()),
            "{writes:?}: the writer's open was not let through ({:?}): the break went unheard",
            started.elapsed()
        );
        assert_eq!(
            read(),
            "07".repeat(16),
            "{writes:?}: old bytes after the write"
        );
        drop(stdin);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(
            rest.trim(),
            "signals 0",
            "{writes:?}: the program got the lease signal"
        );
        let s = stats(&stats_path);
        assert!(s.hits > 0 && s.leases_broken > 0, "{writes:?}: {s:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for `child` at most `limit`; kills it past that.
fn wait_at_most(mut child: Child, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
