//! Stress: readers of one backed file (sequential and random), eviction under a small cache and
//! `DontNeed` drops, all at once, with real threads. The oracle is the file's byte pattern: no
//! reader may ever see a wrong byte. Runs `FOLIOCACHE_STRESS_SECS` (default 2) per backend
//! mode; a watchdog fails the run if it stops making progress.

mod common;

use common::{MemBackend, byte_at, pattern};
use foliocache::{Advice, Cache, InsertPolicy, Policy};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn stress_time() -> Duration {
    common::stress_duration() / 2
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
    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    let time = stress_time();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (file, stop, progress) = (&file, &stop, &progress);
            s.spawn(move || {
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
            });
        }
        {
            let (file, stop, cache) = (&file, &stop, &cache);
            s.spawn(move || {
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
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
        }
        let start = Instant::now();
        let mut last = (0, Instant::now());
        while start.elapsed() < time {
            std::thread::sleep(Duration::from_millis(50));
            let now = progress.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(20) {
                eprintln!(
                    "no progress for 20 s: deadlock? {:?}",
                    file.readahead_stats()
                );
                std::process::exit(1);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(progress.load(Ordering::Relaxed) > 100);
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
