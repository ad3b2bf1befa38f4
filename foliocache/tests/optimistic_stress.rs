//! Optimistic small reads (no reference taken) with real threads, against writers that punch,
//! rewrite, truncate and regrow two memory files sharing a small cache, so a page freed by one
//! file is soon reused by the other or at another index.
//!
//! Every page of file `f` at index `p` holds the 16-byte stamp `(f, p)` repeated. A small read
//! must return, byte for byte, either that stamp or zeros (a hole, a punched or truncated and
//! regrown range), or be short at end of file: never another file's or another page's bytes,
//! never a mix within the stamp's words.
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per folio-order setting (default 2, halved).

mod common;

use foliocache::{Cache, File, PAGE_SIZE, Policy, SmallReadPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGES: u64 = 96;

fn stamp(file: u64, page: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(PAGE_SIZE);
    while bytes.len() < PAGE_SIZE {
        bytes.extend_from_slice(&file.to_le_bytes());
        bytes.extend_from_slice(&page.to_le_bytes());
    }
    bytes
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

fn duration() -> Duration {
    common::stress_duration() / 2
}

fn run(max_order: u8) {
    let cache = Cache::builder()
        .arena_pages((3 * PAGES) as usize)
        .policy(Policy {
            small_read: SmallReadPolicy::Optimistic,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let files: [File; 2] = [
        cache.create_memory_file(max_order).unwrap(),
        cache.create_memory_file(max_order).unwrap(),
    ];
    let ids = [1u64, 2];
    for (file, id) in files.iter().zip(ids) {
        for page in 0..PAGES {
            file.write_at(&stamp(id, page), page * PAGE_SIZE as u64)
                .unwrap();
        }
    }
    let stop = AtomicBool::new(false);
    let (reads, nonzero) = (AtomicU64::new(0), AtomicU64::new(0));
    let deadline = Instant::now() + duration();
    std::thread::scope(|s| {
        for seed in 1..=2u64 {
            let (files, stop, reads, nonzero) = (&files, &stop, &reads, &nonzero);
            s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut handles = [files[0].handle(), files[1].handle()];
                let mut buf = [0u8; 256];
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.below(2) as usize;
                    let page = rng.below(PAGES);
                    let offset = rng.below(PAGE_SIZE as u64 - 1);
                    let len = 1 + rng.below(256.min(PAGE_SIZE as u64 - offset)) as usize;
                    let pos = page * PAGE_SIZE as u64 + offset;
                    let n = handles[k].read_at(&mut buf[..len], pos).unwrap();
                    let got = &buf[..n];
                    if got.iter().all(|&b| b == 0) {
                        reads.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let want = stamp(ids[k], page);
                    assert_eq!(
                        got,
                        &want[offset as usize..offset as usize + n],
                        "file {} page {page} offset {offset}: bytes of another page or file",
                        ids[k]
                    );
                    reads.fetch_add(1, Ordering::Relaxed);
                    nonzero.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let mut rng = Rng(7);
        let mut changes = 0u64;
        while Instant::now() < deadline {
            let k = rng.below(2) as usize;
            let (file, id) = (&files[k], ids[k]);
            let page = rng.below(PAGES);
            let outcome = match rng.below(10) {
                0 | 1 => file.punch_hole(page * PAGE_SIZE as u64, PAGE_SIZE as u64),
                2..=5 => file
                    .write_at(&stamp(id, page), page * PAGE_SIZE as u64)
                    .map(|_| ()),
                6 => file
                    .set_len(page * PAGE_SIZE as u64)
                    .and_then(|()| file.set_len(PAGES * PAGE_SIZE as u64)),
                _ => {
                    // Rewrite a run of pages: frees and reuses many folios at once.
                    let run = 1 + rng.below(8).min(PAGES - page - 1);
                    let bytes: Vec<u8> = (page..page + run).flat_map(|p| stamp(id, p)).collect();
                    file.write_at(&bytes, page * PAGE_SIZE as u64).map(|_| ())
                }
            };
            match outcome {
                Ok(()) | Err(foliocache::Error::NoSpace { .. }) => {}
                Err(other) => {
                    stop.store(true, Ordering::Relaxed);
                    panic!("{other}");
                }
            }
            changes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let retries: u64 = files
            .iter()
            .map(|f| f.mapping_stats().optimistic_retries)
            .sum();
        eprintln!(
            "order {max_order}: {changes} changes, {} small reads ({} with data), {retries} optimistic retries",
            reads.load(Ordering::Relaxed),
            nonzero.load(Ordering::Relaxed)
        );
    });
    assert!(nonzero.load(Ordering::Relaxed) > 0, "no read returned data");
    drop(files);
    foliocache::raw::drain_cpu_caches(&cache);
    assert_eq!(cache.stats().free_pages, 3 * PAGES, "every folio was freed");
}

#[test]
fn optimistic_reads_never_return_foreign_bytes() {
    for max_order in [0, 2] {
        run(max_order);
    }
}
