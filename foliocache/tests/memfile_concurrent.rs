//! Concurrent readers while a writer punches holes, rewrites, truncates and extends a memory
//! file. Every byte of page `p` is either `pattern(p)` or zero, at every moment: a reader must
//! never see anything else (torn garbage, another page's bytes, a reused folio's bytes).
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per configuration (default 2, split in four).

mod common;

use foliocache::{Cache, File, PAGE_SIZE, Policy, ReadPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGES: u64 = 1024; // 4 MiB

fn pattern(page: u64) -> u8 {
    (page % 251) as u8 + 1
}

fn page_bytes(first_page: u64, pages: u64) -> Vec<u8> {
    (first_page..first_page + pages)
        .flat_map(|p| std::iter::repeat_n(pattern(p), PAGE_SIZE))
        .collect()
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn check(buf: &[u8], pos: u64) {
    for (k, &b) in buf.iter().enumerate() {
        let page = (pos + k as u64) / PAGE_SIZE as u64;
        assert!(
            b == 0 || b == pattern(page),
            "byte {} of page {page}: {b}",
            pos + k as u64
        );
    }
}

fn run(max_order: u8, read: ReadPolicy, time: Duration) {
    let cache = Cache::builder()
        .arena_pages((4 * PAGES) as usize)
        .policy(Policy {
            read,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let file: File = cache.create_memory_file(max_order).unwrap();
    file.write_at(&page_bytes(0, PAGES), 0).unwrap();
    let stop = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    /// Stops the readers when dropped, even if the writer panics (else the scope would wait
    /// for them forever).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop_readers = StopOnDrop(&stop);
        for seed in 1..=2u64 {
            let (file, stop, checked) = (&file, &stop, &checked);
            s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut handle = file.handle();
                let mut buf = vec![0u8; 300_000];
                while !stop.load(Ordering::Relaxed) {
                    let pos = rng.below(PAGES * PAGE_SIZE as u64);
                    let len = 1 + rng.below(300_000) as usize;
                    if rng.below(4) == 0 {
                        let run = handle.read_folios(pos, len).unwrap();
                        check(&run.to_vec(), pos);
                    } else {
                        let n = handle.read_at(&mut buf[..len], pos).unwrap();
                        check(&buf[..n], pos);
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let mut rng = Rng(42);
        let deadline = Instant::now() + time;
        let mut changes = 0u64;
        while Instant::now() < deadline {
            let page = rng.below(PAGES);
            let pages = 1 + rng.below(64).min(PAGES - page - 1);
            match rng.below(5) {
                0 | 1 => {
                    // Punch an arbitrary byte range (partial pages at both ends).
                    let pos = page * PAGE_SIZE as u64 + rng.below(PAGE_SIZE as u64);
                    file.punch_hole(pos, rng.below(pages * PAGE_SIZE as u64) + 1)
                        .unwrap();
                }
                2 | 3 => {
                    file.write_at(&page_bytes(page, pages), page * PAGE_SIZE as u64)
                        .unwrap();
                }
                _ => {
                    // Shrink, then grow back: the tail reads as zeros, then is rewritten.
                    let keep = rng.below(PAGES * PAGE_SIZE as u64);
                    file.set_len(keep).unwrap();
                    file.set_len(PAGES * PAGE_SIZE as u64).unwrap();
                }
            }
            changes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        eprintln!(
            "order {max_order}, {read:?}: {changes} changes, {} reads checked",
            checked.load(Ordering::Relaxed)
        );
        assert!(changes > 0);
    });
    assert!(
        checked.load(Ordering::Relaxed) > 0,
        "the readers did no work"
    );
    drop(file);
    foliocache::raw::drain_cpu_caches(&cache);
    assert_eq!(cache.stats().free_pages, 4 * PAGES, "every folio was freed");
}

fn slice() -> Duration {
    common::stress_duration() / 4
}

#[test]
fn readers_never_see_garbage_while_holes_are_punched() {
    for max_order in [0, 9] {
        for read in [ReadPolicy::Batched, ReadPolicy::PerFolio] {
            run(max_order, read, slice());
        }
    }
}
