//! Reliability under injected faults: readers of a real file (O_DIRECT, through each engine)
//! on a cache a quarter of its size, while faults fire all the time: device errors, transfers
//! cut short (aligned and not), panics while completing reads, allocation failures, and
//! evictions and drops. Readers retry errors; every byte they get is checked.
//!
//! It prints one line per engine: faults fired, errors the readers saw and retried, wrong bytes
//! (must be 0) and the run time; a hang fails the run (`common::run_stress`'s watchdog). The
//! README's reliability figures come from this test:
//! `FOLIOCACHE_STRESS_SECS=10 cargo test --release -p foliocache --test reliability -- --nocapture`.

mod common;

use common::{Worker, byte_at, per_engine, run_stress, test_file};
use foliocache::{Cache, Error, raw};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const SIZE: u64 = 4 * (1 << 20) + 4321;

#[test]
fn readers_survive_every_kind_of_fault() {
    common::quiet_injected_panics();
    let path = test_file("reliability", SIZE);
    let build = |kind| {
        Cache::builder()
            .capacity(1 << 20)
            .readahead_bytes(128 << 10)
            .io_engine(kind)
            .build()
            .unwrap()
    };
    for (kind, cache, file) in per_engine(build, &path) {
        let wrong = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut workers: Vec<Worker> = Vec::new();
        for (t, chunk) in [4096usize, 65_536, 100].into_iter().enumerate() {
            let (file, wrong, errors) = (file.clone(), Arc::clone(&wrong), Arc::clone(&errors));
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let mut handle = file.handle();
                let mut buf = vec![0u8; chunk];
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut pos = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if t == 2 {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        pos = seed % SIZE;
                    }
                    let (got, next) = match handle.read_at(&mut buf, pos) {
                        Ok(n) => (n, if n == 0 { 0 } else { pos + n as u64 }),
                        Err(Error::Io { offset, .. }) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            ((offset - pos) as usize, offset)
                        }
                        Err(other) => panic!("{other}"),
                    };
                    let bad = buf[..got]
                        .iter()
                        .enumerate()
                        .filter(|&(k, &b)| b != byte_at(pos + k as u64))
                        .count();
                    wrong.fetch_add(bad as u64, Ordering::Relaxed);
                    pos = next;
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let injector = raw::injector(&cache);
        let (evicting, dropping) = (cache.clone(), file.clone());
        workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match k % 6 {
                    0 => injector.io_errors(1),
                    1 => injector.short_transfers(1, 64 << 10),
                    2 => injector.short_transfers(1, 1000),
                    3 => injector.completion_panics(1),
                    4 => injector.fail_allocations(4),
                    _ => {
                        evicting.evict(32);
                        dropping.drop_cached((k * 40_961) % SIZE, 256 << 10);
                    }
                }
                k += 1;
                progress.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        }));
        let time = common::stress_duration();
        let progress = run_stress(time, workers);
        let fired = raw::injector(&cache).fired();
        let (wrong, errors) = (
            wrong.load(Ordering::Relaxed),
            errors.load(Ordering::Relaxed),
        );
        println!(
            "reliability {kind:?}: {:.1} s, {} reads, {fired} faults fired, {errors} I/O errors \
             seen and retried, {wrong} wrong bytes, 0 hangs",
            time.as_secs_f64(),
            progress[..3].iter().sum::<u64>()
        );
        assert_eq!(wrong, 0, "{kind:?}: wrong bytes reached a reader");
        assert!(fired > 0, "{kind:?}: no fault fired");
        assert!(
            progress[..3].iter().all(|&p| p > 10),
            "{kind:?}: {progress:?}"
        );
    }
}
