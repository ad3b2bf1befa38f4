//! Reliability under injected faults, on real files through each engine:
//! * readers of a file on a cache a quarter of its size, while faults fire all the time:
//!   device errors, transfers cut short (aligned and not), panics while completing reads,
//!   allocation failures, and evictions and drops. Readers retry errors; every byte they get
//!   is checked;
//! * writers of a file on a 1 MiB cache (throttled, evicting, flushing all the time), while
//!   writes fail with EIO and ENOSPC, are cut short, panic while completing, and allocations
//!   fail. Each writer reads back what it wrote; after a last sync that succeeds (the default
//!   policy keeps failed data dirty and retries it), storage must equal the model.
//!
//! Each prints one line per engine: faults fired, errors seen and retried, wrong or lost bytes
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

/// Bytes of the write-fault test's file; two writers own one half each.
const WRITE_SIZE: usize = 2 << 20;

#[test]
fn writers_lose_nothing_under_write_faults() {
    use foliocache::OpenOptions;
    use std::sync::Mutex;
    common::quiet_injected_panics();
    let path = test_file("reliability-writes", WRITE_SIZE as u64);
    let build = |kind| {
        // A small cache (1 MiB: dirty limit about 50 pages) with a busy flusher: throttling,
        // eviction and background writeback all the time.
        Cache::builder()
            .capacity(1 << 20)
            .io_engine(kind)
            .dirty_expire(Duration::from_millis(20))
            .writeback_interval(Duration::from_millis(10))
            .build()
            .unwrap()
    };
    for (kind, cache, _reader) in per_engine(build, &path) {
        let file = cache
            .open_with(&path, OpenOptions::new().write(true))
            .unwrap();
        let initial = std::fs::read(&path).unwrap();
        let halves: Vec<Arc<Mutex<Vec<u8>>>> = (0..2)
            .map(|t| {
                let half = WRITE_SIZE / 2;
                Arc::new(Mutex::new(initial[t * half..(t + 1) * half].to_vec()))
            })
            .collect();
        let reported = Arc::new(AtomicU64::new(0));
        let wrong = Arc::new(AtomicU64::new(0));
        let mut workers: Vec<Worker> = Vec::new();
        for (t, model) in halves.iter().enumerate() {
            let (file, model) = (file.clone(), Arc::clone(model));
            let (reported, wrong) = (Arc::clone(&reported), Arc::clone(&wrong));
            workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
                let half = WRITE_SIZE / 2;
                let base = (t * half) as u64;
                let mut handle = file.handle();
                let mut seed = 0xD1B5_4A32_D192_ED03u64 ^ t as u64;
                let mut stamp = 0u8;
                let mut next = || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                while !stop.load(Ordering::Relaxed) {
                    let len = 1 + (next() % 20_000) as usize;
                    let at = (next() % (half - len) as u64) as usize;
                    stamp = stamp.wrapping_add(1);
                    let data: Vec<u8> = (0..len).map(|k| stamp ^ (k as u8)).collect();
                    let mut model = model.lock().unwrap();
                    let done = match handle.write_at(&data, base + at as u64) {
                        Ok(n) => n,
                        // A page that had to be read first failed: the bytes before it went in.
                        Err(Error::Io { offset, .. }) => {
                            reported.fetch_add(1, Ordering::Relaxed);
                            (offset - base - at as u64) as usize
                        }
                        Err(other) => panic!("{other}"),
                    };
                    model[at..at + done].copy_from_slice(&data[..done]);
                    // Read back what this writer alone writes.
                    let mut back = vec![0u8; len];
                    if let Ok(n) = handle.read_at(&mut back, base + at as u64) {
                        let bad = (0..n).filter(|&k| back[k] != model[at + k]).count();
                        wrong.fetch_add(bad as u64, Ordering::Relaxed);
                    }
                    drop(model);
                    if next() % 16 == 0 {
                        match handle.sync_all() {
                            Ok(()) => {}
                            Err(Error::Writeback { .. }) => {
                                reported.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(other) => panic!("{other}"),
                        }
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let injector = raw::injector(&cache);
        let evicting = cache.clone();
        workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match k % 6 {
                    0 => injector.io_errors(1),
                    1 => injector.nospace_errors(1),
                    2 => injector.short_transfers(1, 5000),
                    3 => injector.completion_panics(1),
                    4 => injector.fail_allocations(2),
                    _ => {
                        evicting.evict(32);
                    }
                }
                k += 1;
                progress.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        }));
        let time = common::stress_duration();
        let progress = run_stress(time, workers);
        // Faults still armed fire on the next requests; the data stays dirty meanwhile (the
        // default policy), so syncing until one succeeds must put everything on storage.
        let mut handle = file.handle();
        let mut attempts = 0;
        while let Err(error) = handle.sync_all() {
            assert!(matches!(error, Error::Writeback { .. }), "{error}");
            reported.fetch_add(1, Ordering::Relaxed);
            attempts += 1;
            assert!(attempts < 20, "{kind:?}: sync keeps failing: {error}");
        }
        let on_disk = std::fs::read(&path).unwrap();
        let model: Vec<u8> = halves
            .iter()
            .flat_map(|half| half.lock().unwrap().clone())
            .collect();
        assert_eq!(on_disk.len(), WRITE_SIZE);
        let lost = (0..WRITE_SIZE).filter(|&k| on_disk[k] != model[k]).count();
        let fired = raw::injector(&cache).fired();
        let (wrong, reported) = (
            wrong.load(Ordering::Relaxed),
            reported.load(Ordering::Relaxed),
        );
        println!(
            "reliability writes {kind:?}: {:.1} s, {} writes, {fired} faults fired, {reported} \
             errors reported and retried, {wrong} wrong bytes read back, {lost} bytes lost or \
             wrong on storage, 0 hangs",
            time.as_secs_f64(),
            progress[..2].iter().sum::<u64>(),
        );
        assert_eq!(wrong, 0, "{kind:?}: a writer read back other bytes");
        assert_eq!(lost, 0, "{kind:?}: storage differs from the model");
        assert!(fired > 0, "{kind:?}: no fault fired");
    }
}
