//! Stress: readers of one backed file (sequential and random), eviction under a small cache and
//! `DontNeed` drops, all at once, with real threads, on the in-memory test backend and on a
//! real file read with O_DIRECT through io_uring and the thread pool. The oracle is the file's
//! byte pattern: no reader may ever see a wrong byte. Runs `FOLIOCACHE_STRESS_SECS` (default
//! 2) per mode; a watchdog fails the run if any thread stops making progress for half the run,
//! and threads that do not end after the stop fail it too (`common::run_stress`).

mod common;

use common::{MemBackend, Worker, byte_at, pattern, run_stress};
use foliocache::{Advice, Cache, File, InsertPolicy, Policy};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

fn stress_time() -> Duration {
    common::stress_duration() / 2
}

/// Three readers (sequential 4 KiB, sequential 8 KiB + 17, random 100 bytes) checking every
/// byte against `byte_at`, and a thread dropping ranges (`DontNeed`) and evicting, on `file`
/// in `cache`, for `time`.
fn workers(cache: &Cache, file: &File, size: u64) -> Vec<Worker> {
    let mut out: Vec<Worker> = Vec::new();
    for t in 0..3u64 {
        let file = file.clone();
        out.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
            let mut handle = file.handle();
            let mut buf = vec![0u8; [4096, 8192 + 17, 100][t as usize]];
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ t;
            let mut pos = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if t == 2 {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    pos = (state >> 20) % size;
                }
                let n = handle.read_at(&mut buf, pos).unwrap();
                for (k, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(
                        b,
                        byte_at(pos + k as u64),
                        "reader {t} at {}",
                        pos + k as u64
                    );
                }
                pos = if n == 0 { 0 } else { pos + n as u64 };
                progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (cache, file) = (cache.clone(), file.clone());
    out.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
        let mut handle = file.handle();
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            k += 1;
            let offset = (k * 77_777) % size;
            handle
                .advise(Advice::DontNeed {
                    offset,
                    len: 200_000,
                })
                .unwrap();
            cache.evict(16);
            progress.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(200));
        }
    }));
    out
}

fn run(delay: Option<Duration>, insert: InsertPolicy) {
    let size = 4 * (1 << 20) + 1234;
    let mut backend = MemBackend::new(pattern(size));
    backend.delay = delay;
    let cache = Cache::builder()
        .capacity(1 << 20)
        .readahead_bytes(64 << 10)
        .policy(Policy {
            insert,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let file = cache.open_backend(Arc::new(backend), None).unwrap();
    let progress = run_stress(stress_time(), workers(&cache, &file, size));
    assert!(progress[..3].iter().all(|&p| p > 100), "{progress:?}");
    assert!(cache.reclaim_stats().evicted_pages > 0);
}

#[test]
fn readers_eviction_and_drops_inline_completion() {
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        run(None, insert);
    }
}

#[test]
fn readers_eviction_and_drops_threaded_completion() {
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        run(Some(Duration::from_micros(50)), insert);
    }
}

#[test]
fn readers_eviction_and_drops_on_real_files_with_o_direct() {
    // The same stress on a file on disk, read with O_DIRECT through each engine (io_uring
    // first): real completions, real short reads at the end of the file.
    let size = 4 * (1 << 20) + 1234;
    let path = common::test_file("disk-stress-real", size);
    let build = |kind| {
        Cache::builder()
            .capacity(1 << 20)
            .readahead_bytes(64 << 10)
            .io_engine(kind)
            .build()
            .unwrap()
    };
    for (kind, cache, file) in common::per_engine(build, &path) {
        let progress = run_stress(stress_time(), workers(&cache, &file, size));
        assert!(
            progress[..3].iter().all(|&p| p > 100),
            "{kind:?}: {progress:?}"
        );
        assert!(cache.reclaim_stats().evicted_pages > 0, "{kind:?}");
        assert_eq!(file.io_stats().errors, 0, "{kind:?}");
    }
}
