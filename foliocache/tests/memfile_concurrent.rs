//! Concurrent readers while a writer punches holes, rewrites, truncates and extends a memory
//! file. Every change stamps the pages it touches with a new version (`common::versions`): a
//! reader must find, on every page it read, one whole version that was current at some moment
//! of its read. Stale pages, torn pages, another page's bytes or a reused folio's bytes fail.
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per configuration (default 2, split in four),
//! under a deadline (a hang fails the test).

mod common;

use common::versions::{Content, PAGE, Versions, stamp};
use foliocache::{Cache, File, Policy, ReadPolicy};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGES: u64 = 1024; // 4 MiB
const FILE_ID: u64 = 7;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Writes a new generation of pages `first..first + pages`.
fn rewrite(file: &File, versions: &Versions, first: u64, pages: u64) {
    let generation = versions.generation();
    let content = Content::Stamp {
        generation,
        zero: None,
    };
    let seqs: Vec<u64> = (first..first + pages)
        .map(|p| versions.begin(p, content))
        .collect();
    let bytes: Vec<u8> = (first..first + pages)
        .flat_map(|p| stamp(FILE_ID, p, generation))
        .collect();
    file.write_at(&bytes, first * PAGE as u64).unwrap();
    for (p, seq) in (first..first + pages).zip(seqs) {
        versions.end(p, seq);
    }
}

/// What zeroing `from..to` of `page` leaves, if the model can say (a page with a zeroed
/// range already is not given a second one: the caller widens to the whole page).
fn zeroed(content: Content, from: usize, to: usize) -> Option<Content> {
    match content {
        _ if from == 0 && to == PAGE => Some(Content::Zero),
        Content::Zero => Some(Content::Zero),
        Content::Stamp {
            generation,
            zero: None,
        } => Some(Content::Stamp {
            generation,
            zero: Some((from, to)),
        }),
        Content::Stamp { zero: Some(_), .. } => None,
    }
}

/// Punches `pos..end` (bytes; widened to whole pages where a partial page's new content
/// could not be modelled).
fn punch(file: &File, versions: &Versions, mut pos: u64, mut end: u64) {
    let page_of = |b: u64| b / PAGE as u64;
    let first = page_of(pos);
    let last = page_of(end - 1);
    let piece = |p: u64, pos: u64, end: u64| {
        let from = if p == page_of(pos) {
            (pos % PAGE as u64) as usize
        } else {
            0
        };
        let to = if p == page_of(end - 1) {
            ((end - 1) % PAGE as u64) as usize + 1
        } else {
            PAGE
        };
        (from, to)
    };
    let (from, to) = piece(first, pos, end);
    if zeroed(versions.content(first), from, to).is_none() {
        pos = first * PAGE as u64;
    }
    let (from, to) = piece(last, pos, end);
    if zeroed(versions.content(last), from, to).is_none() {
        end = (last + 1) * PAGE as u64;
    }
    let changes: Vec<(u64, u64)> = (first..=last)
        .map(|p| {
            let (from, to) = piece(p, pos, end);
            let content = zeroed(versions.content(p), from, to).expect("widened above");
            (p, versions.begin(p, content))
        })
        .collect();
    file.punch_hole(pos, end - pos).unwrap();
    for (p, seq) in changes {
        versions.end(p, seq);
    }
}

/// Truncates to `keep` bytes (rounded down to a page where the page holding it could not be
/// modelled), then grows back to the full size: the tail reads as zeros.
fn shrink_and_grow(file: &File, versions: &Versions, mut keep: u64) {
    let page = keep / PAGE as u64;
    let offset = (keep % PAGE as u64) as usize;
    if offset != 0 && zeroed(versions.content(page), offset, PAGE).is_none() {
        keep -= offset as u64;
    }
    let first = keep / PAGE as u64;
    let changes: Vec<(u64, u64)> = (first..PAGES)
        .map(|p| {
            let from = if p == first {
                (keep % PAGE as u64) as usize
            } else {
                0
            };
            let content = zeroed(versions.content(p), from, PAGE).expect("rounded above");
            (p, versions.begin(p, content))
        })
        .collect();
    file.set_len(keep).unwrap();
    file.set_len(PAGES * PAGE as u64).unwrap();
    for (p, seq) in changes {
        versions.end(p, seq);
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
    let versions = Arc::new(Versions::new(
        FILE_ID,
        PAGES,
        Content::Stamp {
            generation: 0,
            zero: None,
        },
    ));
    let initial: Vec<u8> = (0..PAGES).flat_map(|p| stamp(FILE_ID, p, 0)).collect();
    file.write_at(&initial, 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (1..=2u64)
        .map(|seed| {
            let (file, stop, checked, versions) = (
                file.clone(),
                Arc::clone(&stop),
                Arc::clone(&checked),
                Arc::clone(&versions),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut handle = file.handle();
                let mut buf = vec![0u8; 300_000];
                while !stop.load(Ordering::Relaxed) {
                    let pos = rng.below(PAGES * PAGE as u64);
                    let len = 1 + rng.below(300_000) as usize;
                    let last = (pos + len as u64 - 1) / PAGE as u64;
                    let before = versions.before(pos / PAGE as u64, last);
                    if rng.below(4) == 0 {
                        let run = handle.read_folios(pos, len).unwrap();
                        versions.check(pos, &run.to_vec(), &before);
                    } else {
                        let n = handle.read_at(&mut buf[..len], pos).unwrap();
                        versions.check(pos, &buf[..n], &before);
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut rng = Rng(42);
    let deadline = Instant::now() + time;
    let mut changes = 0u64;
    while Instant::now() < deadline && readers.iter().all(|r| !r.is_finished()) {
        let page = rng.below(PAGES);
        let pages = 1 + rng.below(64).min(PAGES - page - 1);
        match rng.below(5) {
            0 | 1 => {
                // Punch an arbitrary byte range (partial pages at both ends).
                let pos = page * PAGE as u64 + rng.below(PAGE as u64);
                let len = rng.below(pages * PAGE as u64) + 1;
                punch(&file, &versions, pos, (pos + len).min(PAGES * PAGE as u64));
            }
            2 | 3 => rewrite(&file, &versions, page, pages),
            _ => shrink_and_grow(&file, &versions, rng.below(PAGES * PAGE as u64)),
        }
        changes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        // A reader's panic (a wrong byte) fails the test here.
        common::join_within(reader, Duration::from_secs(10), "a reader");
    }
    eprintln!(
        "order {max_order}, {read:?}: {changes} changes, {} reads checked",
        checked.load(Ordering::Relaxed)
    );
    assert!(changes > 0);
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
