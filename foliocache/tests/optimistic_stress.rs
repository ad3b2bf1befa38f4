//! Optimistic small reads (no reference taken) with real threads, against writers that punch,
//! rewrite, truncate and regrow two memory files sharing a small cache, so a page freed by one
//! file is soon reused by the other or at another index.
//!
//! Every change stamps the pages it touches with a new version (`common::versions`: the words
//! `(file, page, generation)` repeated, or zeros). A small read must return, byte for byte,
//! part of one version of its page that was current at some moment of the read, or be short
//! at end of file: never a stale version, another file's or another page's bytes, never a mix.
//! Half the reads go back to their handle's last page, so many start from the folio the
//! handle's last read copied from rather than from the index.
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per folio-order setting (default 2, halved),
//! under a deadline.

mod common;

use common::versions::{Content, PAGE, Versions, stamp};
use foliocache::{Cache, File, PAGE_SIZE, Policy, SmallReadPolicy};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGES: u64 = 96;

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
    let files: Arc<[File; 2]> = Arc::new([
        cache.create_memory_file(max_order).unwrap(),
        cache.create_memory_file(max_order).unwrap(),
    ]);
    let initial = Content::Stamp {
        generation: 0,
        zero: None,
    };
    let versions: Arc<[Versions; 2]> = Arc::new([
        Versions::new(1, PAGES, initial),
        Versions::new(2, PAGES, initial),
    ]);
    for (file, v) in files.iter().zip(versions.iter()) {
        for page in 0..PAGES {
            file.write_at(&stamp(v.file(), page, 0), page * PAGE_SIZE as u64)
                .unwrap();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, nonzero) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = Instant::now() + duration();
    let readers: Vec<_> = (1..=2u64)
        .map(|seed| {
            let (files, versions, stop, reads, nonzero) = (
                Arc::clone(&files),
                Arc::clone(&versions),
                Arc::clone(&stop),
                Arc::clone(&reads),
                Arc::clone(&nonzero),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut handles = [files[0].handle(), files[1].handle()];
                let mut buf = [0u8; 256];
                let mut last = [0u64; 2];
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.below(2) as usize;
                    // Half the reads go back to the handle's last page: they start from the
                    // folio its last read copied from (the handle's recent folio).
                    let page = if rng.below(2) == 0 {
                        last[k]
                    } else {
                        rng.below(PAGES)
                    };
                    last[k] = page;
                    let offset = rng.below(PAGE_SIZE as u64 - 1);
                    let len = 1 + rng.below(256.min(PAGE_SIZE as u64 - offset)) as usize;
                    let pos = page * PAGE_SIZE as u64 + offset;
                    let before = versions[k].before(page, page);
                    let n = handles[k].read_at(&mut buf[..len], pos).unwrap();
                    versions[k].check(pos, &buf[..n], &before);
                    reads.fetch_add(1, Ordering::Relaxed);
                    if buf[..n].iter().any(|&b| b != 0) {
                        nonzero.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut rng = Rng(7);
    let mut changes = 0u64;
    while Instant::now() < deadline && readers.iter().all(|r| !r.is_finished()) {
        let k = rng.below(2) as usize;
        let (file, v) = (&files[k], &versions[k]);
        let page = rng.below(PAGES);
        // Each change: the pages it touches and what they then hold.
        let (pages, content, outcome): (std::ops::Range<u64>, Content, _);
        match rng.below(10) {
            0 | 1 => {
                pages = page..page + 1;
                content = Content::Zero;
                let seqs = begin(v, pages.clone(), content);
                outcome = (seqs, file.punch_hole(page * PAGE as u64, PAGE as u64));
            }
            6 => {
                pages = page..PAGES;
                content = Content::Zero;
                let seqs = begin(v, pages.clone(), content);
                let result = file
                    .set_len(page * PAGE as u64)
                    .and_then(|()| file.set_len(PAGES * PAGE as u64));
                outcome = (seqs, result);
            }
            choice => {
                // One page, or a run (frees and reuses many folios at once).
                let run = if choice <= 5 {
                    1
                } else {
                    1 + rng.below(8).min(PAGES - page - 1)
                };
                pages = page..page + run;
                let generation = v.generation();
                content = Content::Stamp {
                    generation,
                    zero: None,
                };
                let seqs = begin(v, pages.clone(), content);
                let bytes: Vec<u8> = pages
                    .clone()
                    .flat_map(|p| stamp(v.file(), p, generation))
                    .collect();
                let result = file.write_at(&bytes, page * PAGE as u64).map(|_| ());
                outcome = (seqs, result);
            }
        }
        let (seqs, result) = outcome;
        match result {
            Ok(()) => {
                for (p, seq) in pages.zip(seqs) {
                    v.end(p, seq);
                }
            }
            // All or nothing: a change that could not get memory left the file as it was.
            Err(foliocache::Error::NoSpace { .. }) => {
                for (p, seq) in pages.zip(seqs) {
                    v.cancel(p, seq);
                }
            }
            Err(other) => {
                stop.store(true, Ordering::Relaxed);
                panic!("{other}");
            }
        }
        changes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        common::join_within(reader, Duration::from_secs(10), "a reader");
    }
    let retries: u64 = files
        .iter()
        .map(|f| f.mapping_stats().optimistic_retries)
        .sum();
    let recent: u64 = files.iter().map(|f| f.mapping_stats().recent_hits).sum();
    eprintln!(
        "order {max_order}: {changes} changes, {} small reads ({} with data, {recent} from the recent folio), {retries} optimistic retries",
        reads.load(Ordering::Relaxed),
        nonzero.load(Ordering::Relaxed)
    );
    assert!(nonzero.load(Ordering::Relaxed) > 0, "no read returned data");
    assert!(recent > 0, "no read started from its handle's recent folio");
    drop(files);
    foliocache::raw::drain_cpu_caches(&cache);
    assert_eq!(cache.stats().free_pages, 3 * PAGES, "every folio was freed");
}

fn begin(v: &Versions, pages: std::ops::Range<u64>, content: Content) -> Vec<u64> {
    pages.map(|p| v.begin(p, content)).collect()
}

#[test]
fn optimistic_reads_never_return_foreign_bytes() {
    for max_order in [0, 2] {
        run(max_order);
    }
}
