//! Real programs on the preload library: each runs without it and with it in both write modes
//! (`FOLIOCACHE_WRITES=through` and `back`) on the same data, and the outputs must be
//! identical. `FOLIOCACHE_STATS` proves the cache was really used, and that the writes went
//! where the mode sends them (a test cannot pass with the library silently inactive).
//!
//! The programs come from Debian packages (`.ci/run` installs them). A missing one fails its
//! test, unless `FOLIOCACHE_ALLOW_SKIP=1` (then the test says it skipped).

mod common;

use common::{CacheMode, With, Writes, have, preload_lib, run, stats, work_dir, write_pattern};
use std::path::Path;
use std::process::Command;

#[test]
fn sha256sum_and_cat_match_without_the_library() {
    if !have("sha256sum") || !have("cat") {
        return;
    }
    let dir = work_dir("coreutils");
    let sizes = [0usize, 1, 100, 4096, 8192, 5 * (1 << 20) + 321];
    let names: Vec<String> = sizes.iter().map(|size| format!("f{size}")).collect();
    for (size, name) in sizes.iter().zip(&names) {
        write_pattern(&dir.join(name), *size, *size as u64 + 7);
    }
    let args: Vec<&str> = names.iter().map(String::as_str).collect();
    for (cache, writes) in common::modes() {
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        for program in ["sha256sum", "cat"] {
            let plain = run(&dir, With::Kernel, program, &args);
            let cached = run(&dir, with, program, &args);
            assert!(
                plain.stdout == cached.stdout,
                "{program} ({writes:?}): output differs with the library"
            );
            assert!(!plain.stdout.is_empty() || program == "cat");
        }
        let stats = stats(&stats_path);
        assert_eq!(stats.processes, 2, "{stats:?}");
        assert!(stats.files >= 10, "{stats:?}");
        assert!(stats.hits > 0, "the cache served no read: {stats:?}");
        // cat and sha256sum each read every byte through the cache.
        let total: u64 = sizes.iter().map(|s| *s as u64).sum();
        assert_eq!(stats.bytes_from_cache, 2 * total, "{stats:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: buffered reads with seeks, os.pread, dup'd fds sharing an offset, writes read back,
/// threads reading one fd at once, and a child program inheriting an fd mid-file.
const PYTHON: &str = r#"
import os, sys, hashlib, threading, subprocess
p = sys.argv[1]
out = []
with open(p, 'rb') as f:
    out.append(hashlib.sha256(f.read()).hexdigest())
    f.seek(12345); out.append(f.read(100).hex())
    f.seek(-777, 2); out.append(f.read().hex()); out.append(str(f.tell()))
fd = os.open(p, os.O_RDONLY)
size = os.fstat(fd).st_size
for off in (0, 4095, 4096, 1000000, size - 10, size + 5):
    out.append(os.pread(fd, 300, off).hex())
os.lseek(fd, 100, 0); out.append(os.read(fd, 50).hex())
fd2 = os.dup(fd); out.append(os.read(fd2, 50).hex()); out.append(str(os.lseek(fd, 0, 1)))
os.close(fd2)
# Threads reading at once through one fd.
expect = open(p, 'rb').read()
bad = []
def reader(seed):
    x = seed
    for _ in range(2000):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        off = x % size; n = 1 + (x >> 40) % 9000
        if os.pread(fd, n, off) != expect[off:off + n]: bad.append(off)
ts = [threading.Thread(target=reader, args=(s,)) for s in (1, 2, 3, 4)]
[t.start() for t in ts]; [t.join() for t in ts]
out.append('threads ok' if not bad else 'threads BAD %r' % bad[:3])
# A child program continues where this process left off.
os.lseek(fd, 1000, 0); os.read(fd, 100)
r = subprocess.run(['sh', '-c', 'head -c 50 <&3 | od -An -tx1 | tr -d " \\n"'], pass_fds=[fd], stdout=subprocess.PIPE)
out.append('child ' + r.stdout.decode()); out.append(str(os.lseek(fd, 0, 1)))
os.close(fd)
# Writes read back: in place, past the end, truncation.
w = p + '.w'
with open(w, 'wb') as f: f.write(bytes(range(256)) * 40)
with open(w, 'r+b') as f:
    f.read(100); f.seek(5000); f.write(b'hello'); f.seek(4998); out.append(f.read(10).hex())
    f.seek(0, 2); f.write(b'tail'); f.seek(-6, 2); out.append(f.read().hex())
    f.truncate(3000); f.seek(0); out.append(hashlib.sha256(f.read()).hexdigest())
fd = os.open(w, os.O_RDWR)
os.pread(fd, 4096, 0); os.pwrite(fd, b'XYZ', 10); out.append(os.pread(fd, 16, 5).hex())
out.append(str(os.fstat(fd).st_size)); os.close(fd)
os.unlink(w)
print('\n'.join(out))
"#;

#[test]
fn python_seeks_pread_threads_and_writes_match() {
    if !have("python3") || !have("sh") {
        return;
    }
    let dir = work_dir("python");
    write_pattern(&dir.join("data"), 3 * (1 << 20) + 4321, 99);
    std::fs::write(dir.join("script.py"), PYTHON).unwrap();
    let plain = run(&dir, With::Kernel, "python3", &["script.py", "data"]);
    for (cache, writes) in common::modes() {
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        let cached = run(&dir, with, "python3", &["script.py", "data"]);
        let text = String::from_utf8_lossy(&cached.stdout);
        assert!(text.contains("threads ok"), "{text}");
        assert_eq!(
            String::from_utf8_lossy(&plain.stdout),
            text,
            "python's output differs with the library ({writes:?})"
        );
        let stats = stats(&stats_path);
        assert!(stats.hits > 0, "the cache served no read: {stats:?}");
        stats.assert_writes_went(cache, writes);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const SQL_FILL: &str = "
PRAGMA cache_size = 200;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
  INSERT INTO t(k, v) SELECT (x * 7919) % 100003, printf('%08d-%s', x, substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 26)) FROM c;
CREATE INDEX tk ON t(k);
UPDATE t SET v = v || '!' WHERE id % 97 = 0;
DELETE FROM t WHERE id % 1000 = 1;
SELECT count(*), sum(k), min(v), max(v) FROM t;
SELECT id, k, v FROM t WHERE k BETWEEN 500 AND 530 ORDER BY k;
PRAGMA integrity_check;
";

const SQL_QUERY: &str = "
PRAGMA cache_size = 50;
SELECT count(*), sum(length(v)) FROM t WHERE k > 5000;
SELECT k, count(*) FROM t GROUP BY k % 17 ORDER BY 1 LIMIT 5;
SELECT v FROM t WHERE id IN (5, 500, 50000, 99999);
PRAGMA integrity_check;
";

#[test]
fn sqlite_fills_indexes_queries_and_checks_the_same() {
    if !have("sqlite3") {
        return;
    }
    let dir = work_dir("sqlite");
    let plain_dir = dir.join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let mut plain_out = Vec::new();
    for sql in [SQL_FILL, SQL_QUERY] {
        plain_out.push(run(&plain_dir, With::Kernel, "sqlite3", &["db.sqlite", sql]).stdout);
    }
    for (cache, writes) in common::modes() {
        let cached_dir = dir.join(format!("{}-{}", cache.as_str(), writes.as_str()));
        std::fs::create_dir_all(&cached_dir).unwrap();
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        for (sql, plain) in [SQL_FILL, SQL_QUERY].into_iter().zip(&plain_out) {
            let cached = run(&cached_dir, with, "sqlite3", &["db.sqlite", sql]);
            let text = String::from_utf8_lossy(&cached.stdout);
            assert!(text.trim_end().ends_with("ok"), "integrity_check: {text}");
            assert_eq!(
                String::from_utf8_lossy(plain),
                text,
                "sqlite's output differs with the library ({writes:?})"
            );
        }
        // The databases themselves are the same bytes.
        let a = std::fs::read(plain_dir.join("db.sqlite")).unwrap();
        let b = std::fs::read(cached_dir.join("db.sqlite")).unwrap();
        assert!(a == b, "the database files differ ({writes:?})");
        let stats = stats(&stats_path);
        assert!(stats.hits > 0, "the cache served no read: {stats:?}");
        stats.assert_writes_went(cache, writes);
        if writes == Writes::Back {
            assert!(stats.syncs > 0, "sqlite's fsyncs: {stats:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fio_writes_then_verifies_crc32c() {
    if !have("fio") {
        return;
    }
    let dir = work_dir("fio");
    let dir_arg = format!("--directory={}", dir.display());
    let common = [
        "--name=verify",
        "--thread", // jobs as threads: the counters land in one process
        "--ioengine=psync",
        "--size=24m",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--randrepeat=1",
        dir_arg.as_str(),
    ];
    for (cache, writes) in common::modes() {
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        for rw in ["--rw=write", "--rw=randwrite"] {
            let mut args = common.to_vec();
            args.extend([rw, "--bs=4k", "--do_verify=1"]);
            let out = run(&dir, with, "fio", &args);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("err= 0"), "{text}");
            // Verify again in other processes, reads only: with the library, and without it
            // (what is on storage).
            let mut args = common.to_vec();
            args.extend([rw, "--bs=4k", "--verify_only=1"]);
            for again in [with, With::Kernel] {
                let out = run(&dir, again, "fio", &args);
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("err= 0"), "{again:?}: {text}");
            }
        }
        let stats = stats(&stats_path);
        assert!(stats.reads > 0, "{stats:?}");
        assert!(stats.hits > 0, "the cache served no read hit: {stats:?}");
        stats.assert_writes_went(cache, writes);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a db_bench run did, without its timings: each benchmark's name, operation count and
/// `(N of M found)`.
fn db_bench_outcome(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|line| line.split_whitespace().any(|word| word == "ops/sec"))
        .map(|line| {
            let name = line.split_whitespace().next().unwrap_or("");
            let operations = line
                .split(';')
                .next()
                .and_then(|head| head.split_whitespace().rev().nth(1))
                .unwrap_or("");
            let found = line.find('(').map_or("", |at| &line[at..]);
            format!("{name} {operations} operations {found}")
        })
        .collect()
}

#[test]
fn rocksdb_writes_compacts_reads_and_scans_the_same() {
    if !have("db_bench") || !have("ldb") {
        return;
    }
    let dir = work_dir("rocksdb");
    // Small memtables and files: many flushes, SST files written, fsynced, compacted, deleted
    // and read back while the benchmark runs.
    let bench = [
        "--db=db",
        "--benchmarks=fillrandom,overwrite,readrandom,readseq",
        "--num=20000",
        "--reads=20000",
        "--value_size=200",
        "--compression_type=none",
        "--seed=1",
        "--threads=1",
        "--write_buffer_size=262144",
        "--target_file_size_base=524288",
        "--max_bytes_for_level_base=1048576",
        "--use_direct_reads=false",
        "--histogram=0",
    ];
    let scan = ["--db=db", "scan", "--hex"];
    let plain_dir = dir.join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let plain = db_bench_outcome(&run(&plain_dir, With::Kernel, "db_bench", &bench).stdout);
    assert_eq!(plain.len(), 4, "{plain:?}");
    assert!(plain[2].ends_with("of 20000 found)"), "{plain:?}");
    let plain_scan = run(&plain_dir, With::Kernel, "ldb", &scan).stdout;
    assert!(plain_scan.len() > 1 << 20, "the scan printed too little");
    for (cache, writes) in common::modes() {
        let cached_dir = dir.join(format!("{}-{}", cache.as_str(), writes.as_str()));
        std::fs::create_dir_all(&cached_dir).unwrap();
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        let cached = db_bench_outcome(&run(&cached_dir, with, "db_bench", &bench).stdout);
        assert_eq!(
            plain, cached,
            "db_bench differs with the library ({writes:?})"
        );
        // The database it left is the same key-value content, read through the library and
        // from storage without it, and RocksDB finds it consistent.
        for again in [with, With::Kernel] {
            let cached_scan = run(&cached_dir, again, "ldb", &scan).stdout;
            assert!(
                cached_scan == plain_scan,
                "ldb scan differs ({writes:?}, read {again:?})"
            );
            let check = run(&cached_dir, again, "ldb", &["--db=db", "checkconsistency"]);
            assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "OK");
        }
        let stats = stats(&stats_path);
        assert!(stats.hits > 0, "the cache served no read: {stats:?}");
        stats.assert_writes_went(cache, writes);
        if writes == Writes::Back {
            assert!(stats.syncs > 0, "RocksDB's fsyncs: {stats:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_setting_prints_one_line_and_runs_uncached() {
    if !have("sha256sum") {
        return;
    }
    let dir = work_dir("bad-setting");
    write_pattern(&dir.join("data"), 100_000, 5);
    let stats_path = dir.join("stats.jsonl");
    let plain = run(&dir, With::Kernel, "sha256sum", &["data"]);
    for (key, value) in [
        ("FOLIOCACHE_CAPACITY_MB", "lots"),
        ("FOLIOCACHE_RA_KB", "-3"),
        ("FOLIOCACHE_WRITES", "bogus"),
    ] {
        let out = Command::new("sha256sum")
            .arg("data")
            .current_dir(&dir)
            .env("LD_PRELOAD", preload_lib())
            .env("FOLIOCACHE_PATHS", &dir)
            .env("FOLIOCACHE_STATS", &stats_path)
            .env(key, value)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, plain.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(key) && stderr.contains("uncached"),
            "{stderr}"
        );
    }
    assert!(!stats_path.exists(), "an uncached run wrote counters");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_without_direct_io_pass_through_a_private_cache() {
    if !have("sha256sum") {
        return;
    }
    // tmpfs keeps every file in the kernel's cache: the library leaves it alone.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("SKIPPED: no /dev/shm");
        return;
    }
    let dir = shm.join(format!("foliocache-preload-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_pattern(&dir.join("data"), 200_000, 11);
    let stats_dir = work_dir("tmpfs");
    let plain = run(&dir, With::Kernel, "sha256sum", &["data"]);
    for (cache, writes) in common::modes() {
        let stats_path = stats_dir.join(format!("{}-{}.jsonl", cache.as_str(), writes.as_str()));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        let cached = run(&dir, with, "sha256sum", &["data"]);
        assert_eq!(plain.stdout, cached.stdout);
        assert!(
            cached.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&cached.stderr)
        );
        // A private cache needs direct I/O; a shared cache's owner reads tmpfs buffered.
        let expected = match cache {
            CacheMode::Private => 0,
            CacheMode::Shared => 1,
        };
        assert_eq!(stats(&stats_path).files, expected, "{cache:?} {writes:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
