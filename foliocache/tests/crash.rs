//! A crash: a child process writes records through the cache and syncs every few, telling the
//! parent after each sync how many records are durable; the parent kills it with SIGKILL at a
//! random moment. Every record acknowledged as synced must be on storage, whole, and the file
//! at least that long. Several rounds, each with its own seed (printed).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECORD: usize = 1500;
const NAME: &str = "synced_records_survive_a_kill";

fn record(k: u64) -> Vec<u8> {
    (0..RECORD)
        .map(|i| (k.wrapping_mul(31) as u8) ^ (i as u8).wrapping_mul(7) ^ 0x5A)
        .collect()
}

/// The child: appends records (and now and then rewrites an earlier one, with the same bytes,
/// so synced pages get copied and written again), syncing every 7 records.
fn child(path: &str) {
    use foliocache::{Cache, OpenOptions};
    use std::io::Write;
    let cache = Cache::builder().capacity(2 << 20).build().unwrap();
    let file = cache
        .open_with(path, OpenOptions::new().write(true))
        .unwrap();
    let mut handle = file.handle();
    let mut out = std::io::stdout().lock();
    let mut k = 0u64;
    loop {
        handle.write_at(&record(k), k * RECORD as u64).unwrap();
        if k > 10 && k.is_multiple_of(5) {
            let earlier = (k * 7919) % k;
            handle
                .write_at(&record(earlier), earlier * RECORD as u64)
                .unwrap();
        }
        k += 1;
        if k.is_multiple_of(7) {
            let sync = if k.is_multiple_of(14) {
                handle.sync_data()
            } else {
                handle.sync_all()
            };
            sync.unwrap();
            writeln!(out, "synced {k}").unwrap();
            out.flush().unwrap();
        }
    }
}

#[test]
fn synced_records_survive_a_kill() {
    if let Some(role) = common::child_role() {
        if let Some(path) = role.strip_prefix("writer:") {
            child(path);
        }
        return;
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("crash-records");
    // Needs direct I/O where the file lives.
    let probe = common::test_file("crash-probe", 4096);
    if common::per_engine(
        |kind| {
            foliocache::Cache::builder()
                .capacity(1 << 20)
                .io_engine(kind)
                .build()
                .unwrap()
        },
        &probe,
    )
    .is_empty()
    {
        return;
    }
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64)
        | 1;
    for round in 0..4 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(20 + seed % 400);
        std::fs::write(&path, b"").unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("FOLIOCACHE_CHILD", format!("writer:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acked = 0u64;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("synced ") {
                    acked = n.trim().parse().unwrap();
                }
            }
            acked
        });
        let start = Instant::now();
        std::thread::sleep(delay);
        // SIGKILL: no destructor, no writeback on the way out.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let acked = reader.join().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        eprintln!(
            "round {round} (seed {seed}): killed after {:?} ({status}), {acked} records acknowledged, \
             {} bytes on storage",
            start.elapsed(),
            on_disk.len()
        );
        assert!(
            on_disk.len() as u64 >= acked * RECORD as u64,
            "round {round}: {} bytes on storage, {acked} records were synced",
            on_disk.len()
        );
        for k in 0..acked {
            let at = (k as usize) * RECORD;
            assert!(
                on_disk[at..at + RECORD] == record(k)[..],
                "round {round}: synced record {k} is not on storage"
            );
        }
    }
}
