//! Writes racing everything else, on a real file: a writer rewrites pages (each change a new
//! version, `common::versions`) and now and then truncates and regrows the file, while
//! readers check that every page they read is one whole version current during the read, a
//! syncer writes back (whole-file and ranges), the flusher writes in the background (the dirty
//! thresholds are tiny), and another thread evicts and drops. Writeback races truncation,
//! eviction and redirtying all the time. At the end, storage must hold exactly the model.
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per engine (default 2), under the stress
//! watchdog.

mod common;

use common::versions::{Content, PAGE, Versions, expected, stamp};
use common::{Worker, run_stress};
use foliocache::{Cache, OpenOptions, SyncRange};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const PAGES: u64 = 256; // 1 MiB
const FILE_ID: u64 = 3;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[test]
fn readers_writers_writeback_truncation_and_eviction() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("write-concurrent");
    let initial: Vec<u8> = (0..PAGES).flat_map(|p| stamp(FILE_ID, p, 0)).collect();
    let probe = common::test_file("write-concurrent-probe", 4096);
    let build = |kind| {
        Cache::builder()
            .capacity(1 << 20)
            .io_engine(kind)
            .dirty_background_ratio(0.02)
            .dirty_ratio(0.08)
            .writeback_interval(std::time::Duration::from_millis(5))
            .build()
            .unwrap()
    };
    for (kind, _, _) in common::per_engine(build, &probe) {
        std::fs::write(&path, &initial).unwrap();
        let cache = build(kind);
        let file = cache
            .open_with(&path, OpenOptions::new().write(true))
            .unwrap();
        let versions = Arc::new(Versions::new(
            FILE_ID,
            PAGES,
            Content::Stamp {
                generation: 0,
                zero: None,
            },
        ));
        let mut workers: Vec<Worker> = Vec::new();
        // The writer.
        {
            let (file, versions) = (file.clone(), Arc::clone(&versions));
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
                let mut handle = file.handle();
                while !stop.load(Ordering::Relaxed) {
                    if rng.below(40) == 0 {
                        // Truncate to a page boundary and grow back: the tail reads as zeros.
                        let keep = rng.below(PAGES);
                        let seqs: Vec<(u64, u64)> = (keep..PAGES)
                            .map(|p| (p, versions.begin(p, Content::Zero)))
                            .collect();
                        file.set_len(keep * PAGE as u64).unwrap();
                        file.set_len(PAGES * PAGE as u64).unwrap();
                        for (p, seq) in seqs {
                            versions.end(p, seq);
                        }
                    } else {
                        let first = rng.below(PAGES);
                        let run = 1 + rng.below(8).min(PAGES - first - 1);
                        let generation = versions.generation();
                        let content = Content::Stamp {
                            generation,
                            zero: None,
                        };
                        let seqs: Vec<(u64, u64)> = (first..first + run)
                            .map(|p| (p, versions.begin(p, content)))
                            .collect();
                        let bytes: Vec<u8> = (first..first + run)
                            .flat_map(|p| stamp(FILE_ID, p, generation))
                            .collect();
                        handle.write_at(&bytes, first * PAGE as u64).unwrap();
                        for (p, seq) in seqs {
                            versions.end(p, seq);
                        }
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // Two readers: the first reads at most 16 KiB at a time (hits copied without a
        // reference, `HIT_READ_MAX`), the second up to 256 KiB (the referenced batch path).
        for seed in 1..=2u64 {
            let (file, versions) = (file.clone(), Arc::clone(&versions));
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
                let mut handle = file.handle();
                let mut buf = vec![0u8; 64 * PAGE];
                while !stop.load(Ordering::Relaxed) {
                    let pos = rng.below(PAGES * PAGE as u64);
                    let most = match seed {
                        1 => foliocache::HIT_READ_MAX,
                        _ => buf.len(),
                    };
                    let len = 1 + rng.below(most as u64) as usize;
                    let last = (pos + len as u64 - 1) / PAGE as u64;
                    let before = versions.before(pos / PAGE as u64, last);
                    let n = handle.read_at(&mut buf[..len], pos).unwrap();
                    versions.check(pos, &buf[..n], &before);
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // The syncer.
        {
            let file = file.clone();
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let mut rng = Rng(77);
                let mut handle = file.handle();
                while !stop.load(Ordering::Relaxed) {
                    match rng.below(3) {
                        0 => handle.sync_all().unwrap(),
                        1 => handle.sync_data().unwrap(),
                        _ => {
                            let pos = rng.below(PAGES) * PAGE as u64;
                            handle
                                .sync_range(pos, 16 * PAGE as u64, SyncRange::ALL)
                                .unwrap();
                        }
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // Evictions and drops.
        {
            let (cache, file) = (cache.clone(), file.clone());
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    cache.evict(32);
                    file.drop_cached((k % PAGES) * PAGE as u64, 32 * PAGE as u64);
                    k += 7;
                    progress.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
            }));
        }
        let progress = run_stress(common::stress_duration(), workers);
        file.sync_all().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len() as u64, PAGES * PAGE as u64, "{kind:?}");
        for p in 0..PAGES {
            let want = expected(FILE_ID, p, versions.content(p));
            let at = p as usize * PAGE;
            assert!(
                on_disk[at..at + PAGE] == want[..],
                "{kind:?}: page {p} on storage is not the last version ({:?})",
                versions.content(p)
            );
        }
        let stats = cache.stats();
        eprintln!(
            "{kind:?}: progress {progress:?}, {} pages written back, {} evicted",
            stats.dirty.written_pages,
            cache.reclaim_stats().evicted_pages
        );
        assert!(progress.iter().all(|&p| p > 0));
    }
}
