//! The write path against a byte model (fsx-style): random writes (small and unaligned,
//! page-sized, large), sequential streams (with write-behind), reads, truncation down and up, hole punching, syncs, drops, evictions
//! under a tiny budget, and closing and reopening, on a real file through each I/O engine.
//! Every read must match the model; after every sync and at the end, the file read without the
//! cache (`std::fs`) must equal the model, size included. Range syncs go to storage or, half of
//! them, into the kernel's page cache (`SyncRange::KERNEL`).
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per engine (default 2). The seed is printed: a
//! failure names it, and `FOLIOCACHE_SEED=N` replays it.

mod common;

use foliocache::{Cache, EngineKind, Error, File, Handle, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const MAX_SIZE: u64 = 3 << 20;

fn open(cache: &Cache, path: &Path) -> (File, Handle) {
    let file = cache
        .open_with(path, OpenOptions::new().write(true))
        .unwrap();
    let handle = file.handle();
    (file, handle)
}

fn check_read(handle: &mut Handle, model: &[u8], pos: u64, len: usize, what: &str) {
    let mut buf = vec![0xA5u8; len];
    let n = handle.read_at(&mut buf, pos).unwrap();
    let want = model.len().saturating_sub(pos as usize).min(len);
    assert_eq!(
        n,
        want,
        "{what}: read {len} at {pos} of a {}-byte file",
        model.len()
    );
    if let Some(k) = (0..n).find(|&k| buf[k] != model[pos as usize + k]) {
        panic!(
            "{what}: byte {} is {:#x}, the model has {:#x}",
            pos + k as u64,
            buf[k],
            model[pos as usize + k]
        );
    }
}

fn check_storage(path: &Path, model: &[u8], what: &str) {
    let on_disk = std::fs::read(path).unwrap();
    assert_eq!(on_disk.len(), model.len(), "{what}: size on storage");
    if let Some(k) = (0..model.len()).find(|&k| on_disk[k] != model[k]) {
        panic!(
            "{what}: byte {k} on storage is {:#x}, the model has {:#x}",
            on_disk[k], model[k]
        );
    }
}

fn run(kind: EngineKind, path: &Path, seed: u64) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, b"").unwrap();
    // A tiny budget (256 pages): eviction and dirty throttling happen all the time.
    let cache = Cache::builder()
        .capacity(1 << 20)
        .io_engine(kind)
        .readahead_bytes(64 << 10)
        .write_behind_bytes(2 << 20)
        .build()
        .unwrap();
    let (mut file, mut handle) = open(&cache, path);
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(seed);
    let deadline = Instant::now() + common::stress_duration();
    let mut ops = 0u64;
    let mut syncs = 0u64;
    let mut spot = 0u64;
    let mut recent_hits = 0u64;
    let trace = std::env::var_os("FOLIOCACHE_TRACE").is_some();
    while Instant::now() < deadline {
        ops += 1;
        let what = format!("{kind:?} seed {seed} op {ops}");
        if trace {
            eprintln!(
                "{what}: size {} dirty {:?}",
                model.len(),
                file.mapping_stats().dirty_pages
            );
        }
        match rng.below(21) {
            // Writes: small unaligned, page aligned, or large.
            0..=7 => {
                let len = match rng.below(4) {
                    0 => 1 + rng.below(100),
                    1 => 4096 * (1 + rng.below(3)),
                    2 => 1 + rng.below(3 * 4096),
                    _ => 1 + rng.below(600 << 10),
                };
                let pos = rng.below(MAX_SIZE - len);
                let pos = if rng.below(3) == 0 { pos & !4095 } else { pos };
                let stamp = rng.next() as u8 | 1;
                let data: Vec<u8> = (0..len).map(|k| stamp.wrapping_add(k as u8)).collect();
                if trace {
                    eprintln!("  write {pos}..{}", pos + len);
                }
                assert_eq!(handle.write_at(&data, pos).unwrap(), len as usize, "{what}");
                let end = (pos + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[pos as usize..end].copy_from_slice(&data);
                assert_eq!(file.size(), model.len() as u64, "{what}: size after write");
            }
            8 | 9 => {
                let pos = rng.below(model.len() as u64 + 10_000);
                let len = 1 + rng.below(200_000) as usize;
                check_read(&mut handle, &model, pos, len, &what);
            }
            10 | 11 => {
                // Small reads near one spot, which moves now and then: most start from the
                // folio the handle's last read copied from, which the operations between
                // them may have replaced, dropped or truncated.
                if rng.below(8) == 0 {
                    spot = rng.below(model.len() as u64 + 4096);
                }
                for _ in 0..4 {
                    let pos = spot + rng.below(8192);
                    let len = 1 + rng.below(2048) as usize;
                    check_read(&mut handle, &model, pos, len, &what);
                }
            }
            12 => {
                let len = rng.below(MAX_SIZE);
                if trace {
                    eprintln!("  set_len {len}");
                }
                file.set_len(len).unwrap();
                model.resize(len as usize, 0);
                assert_eq!(file.size(), len, "{what}: size after set_len");
            }
            13 => {
                if model.is_empty() {
                    continue;
                }
                let pos = rng.below(model.len() as u64);
                let len = 1 + rng.below(100_000.min(model.len() as u64 - pos));
                if trace {
                    eprintln!("  punch {pos}..{}", pos + len);
                }
                match file.punch_hole(pos, len) {
                    Ok(()) => model[pos as usize..(pos + len) as usize].fill(0),
                    // A file system without hole punching: nothing changed.
                    Err(Error::Io { .. }) => {}
                    Err(other) => panic!("{what}: {other}"),
                }
            }
            14 | 15 => {
                handle.sync_all().unwrap();
                syncs += 1;
                check_storage(path, &model, &format!("{what}: after sync"));
            }
            16 => {
                let pos = rng.below(model.len() as u64 + 1);
                file.drop_cached(pos, rng.below(1 << 20));
            }
            17 => {
                cache.evict(rng.below(512));
            }
            18 => {
                // Close and reopen: the last holder writes the file back.
                recent_hits += file.mapping_stats().recent_hits;
                drop(handle);
                drop(file);
                check_storage(path, &model, &format!("{what}: after close"));
                (file, handle) = open(&cache, path);
            }
            20 => {
                // A sequential stream (write-behind hands what is behind it to the flusher).
                let mut pos = rng.below(MAX_SIZE / 2);
                let end = (pos + (1 << 20) + rng.below(3 << 20)).min(MAX_SIZE);
                let stamp = rng.next() as u8 | 1;
                if trace {
                    eprintln!("  stream {pos}..{end}");
                }
                while pos < end {
                    let len = (1 + rng.below(128 << 10)).min(end - pos);
                    let data: Vec<u8> = (0..len).map(|k| stamp.wrapping_add(k as u8)).collect();
                    assert_eq!(handle.write_at(&data, pos).unwrap(), len as usize, "{what}");
                    let stop = (pos + len) as usize;
                    if model.len() < stop {
                        model.resize(stop, 0);
                    }
                    model[pos as usize..stop].copy_from_slice(&data);
                    pos += len;
                }
                assert_eq!(file.size(), model.len() as u64, "{what}: size after stream");
            }
            _ => {
                if model.len() > 4096 {
                    let pos = rng.below(model.len() as u64 - 4096);
                    // To storage, or into the kernel's page cache (which the O_DIRECT
                    // writes and reads after it must stay coherent with).
                    let flags = if rng.below(2) == 0 {
                        foliocache::SyncRange::ALL
                    } else {
                        foliocache::SyncRange::ALL | foliocache::SyncRange::KERNEL
                    };
                    handle.sync_range(pos, 4096, flags).unwrap();
                }
            }
        }
    }
    handle.sync_all().unwrap();
    check_storage(path, &model, &format!("{kind:?} seed {seed}: at the end"));
    let mut whole = file.handle();
    check_read(&mut whole, &model, 0, model.len() + 1, "the final read");
    let stats = cache.stats();
    recent_hits += file.mapping_stats().recent_hits;
    eprintln!(
        "{kind:?} seed {seed}: {ops} operations, {syncs} syncs, {} pages written back, {} evicted, {recent_hits} small reads from the recent folio",
        stats.dirty.written_pages,
        cache.reclaim_stats().evicted_pages
    );
    assert!(stats.dirty.written_pages > 0);
    assert!(
        recent_hits > 0,
        "no small read started from its recent folio"
    );
}

#[test]
fn random_operations_match_a_byte_model_on_storage() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("write-model");
    let seed = std::env::var("FOLIOCACHE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("seed {seed} (FOLIOCACHE_SEED={seed} replays it)");
    // The engines, where this machine has them (the probe also checks O_DIRECT works here).
    common::test_file("write-model-probe", 4096);
    let probe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("write-model-probe");
    for (kind, _, _) in common::per_engine(
        |kind| {
            Cache::builder()
                .capacity(1 << 20)
                .io_engine(kind)
                .build()
                .unwrap()
        },
        &probe,
    ) {
        run(kind, &path, seed);
    }
}

/// `SyncRange::KERNEL`: the range's bytes are in the kernel's page cache when the call returns
/// (a read without the cache sees them before any fsync), the cache's copy is clean, and the
/// rest of the file's dirty data is left alone.
#[test]
fn a_kernel_sync_hands_the_range_to_the_kernels_page_cache() {
    common::test_file("write-model-kernel", 4 << 20);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("write-model-kernel");
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let (file, mut handle) = open(&cache, &path);
    let before = std::fs::read(&path).unwrap();
    let new = vec![0x5Au8; 3 * 4096];
    handle.write_at(&new, 4096).unwrap();
    handle.write_at(&new, 1 << 20).unwrap();
    assert_eq!(cache.stats().dirty.dirty_pages, 6);
    handle
        .sync_range(
            4096,
            3 * 4096,
            foliocache::SyncRange::ALL | foliocache::SyncRange::KERNEL,
        )
        .unwrap();
    // The first range is the kernel's now; the second is still the cache's alone.
    let seen = std::fs::read(&path).unwrap();
    assert_eq!(&seen[4096..4 * 4096], &new[..], "the synced range");
    assert_eq!(
        &seen[1 << 20..(1 << 20) + 3 * 4096],
        &before[1 << 20..(1 << 20) + 3 * 4096],
        "a range not synced"
    );
    assert_eq!(
        cache.stats().dirty.dirty_pages,
        3,
        "the synced range is clean"
    );
    handle.sync_all().unwrap();
    assert_eq!(cache.stats().dirty.dirty_pages, 0);
    drop(handle);
    drop(file);
    let seen = std::fs::read(&path).unwrap();
    assert_eq!(&seen[1 << 20..(1 << 20) + 3 * 4096], &new[..]);
}
