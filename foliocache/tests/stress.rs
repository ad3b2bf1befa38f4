//! Stress: speculative lookups with real threads against writers that insert, remove (freeze),
//! truncate, free and reuse folios.
//!
//! Two files share one small cache, so a freed folio is soon reused by the other file or at
//! another index. Every page of a folio is stamped with `(mapping id, page index)` before the
//! folio is inserted; a reader that gets a folio back from `lookup` or `get_batch` must find
//! exactly the stamp of the page it asked for, at any moment, however the folio was recycled.
//! Each writer also keeps a `BTreeMap` model of its file, compared with the index at the end.
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds per refcount policy (default 2).

mod common;

use foliocache::raw;
use foliocache::raw::Entry;
use foliocache::raw::{FolioBatch, Mapping, NewFolio};
use foliocache::{Cache, FolioRef, PAGE_SIZE, Policy, RefcountPolicy};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PAGES_PER_FILE: u64 = 256;
const CACHE_PAGES: u64 = 320;

fn duration() -> Duration {
    common::stress_duration()
}

/// A small, fast, seedable generator (xorshift64*), so the test needs no extra dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Stamps every page of a private folio with `(mapping id, page index)`.
fn stamp(folio: &mut NewFolio<'_>, mapping: u64, first: u64) {
    let pages = folio.nr_pages();
    let bytes = folio.bytes_mut();
    for page in 0..pages {
        let at = page * PAGE_SIZE;
        bytes[at..at + 8].copy_from_slice(&mapping.to_le_bytes());
        bytes[at + 8..at + 16].copy_from_slice(&(first + page as u64).to_le_bytes());
    }
}

fn stamp_of(folio: &FolioRef<'_>, page: usize) -> (u64, u64) {
    let bytes = folio.bytes().expect("checked uptodate");
    let at = page * PAGE_SIZE;
    let word = |k: usize| u64::from_le_bytes(bytes[k..k + 8].try_into().unwrap());
    (word(at), word(at + 8))
}

fn check(folio: &FolioRef<'_>, mapping: &Mapping, index: u64) {
    // Wait for the fill to end, as a reader of the page cache does.
    folio.wait_unlocked();
    assert!(
        folio.is_uptodate(),
        "a folio in the cache ended its fill without success"
    );
    let first = folio.index();
    assert!(
        first <= index && index < first + folio.nr_pages() as u64,
        "folio does not cover {index}"
    );
    let owner = folio.mapping_id();
    assert!(
        owner == mapping.id() || owner == 0,
        "folio of mapping {owner} returned for {}",
        mapping.id()
    );
    let (m, i) = stamp_of(folio, (index - first) as usize);
    assert_eq!((m, i), (mapping.id(), index), "read another page's bytes");
}

fn writer(
    cache: &Cache,
    file: &Mapping,
    stop: &AtomicBool,
    seed: u64,
) -> (u64, BTreeMap<u64, (u32, u8)>) {
    let mut rng = Rng(seed);
    let mut model: BTreeMap<u64, (u32, u8)> = BTreeMap::new();
    let mut ops = 0u64;
    while !stop.load(Ordering::Relaxed) {
        ops += 1;
        let order = [0u8, 0, 0, 1, 2, 3][rng.below(6) as usize];
        let first = rng.below(PAGES_PER_FILE) & !((1u64 << order) - 1);
        let covered: Vec<u64> = model
            .range(..first + (1 << order))
            .filter(|(f, (_, o))| **f + (1u64 << o) > first)
            .map(|(f, _)| *f)
            .collect();
        match rng.below(10) {
            // Insert one folio, or a run of order-0 folios under one lock hold.
            0..=5 if covered.is_empty() => {
                let run = if rng.below(4) == 0 {
                    1 + rng.below(6)
                } else {
                    0
                };
                if run > 0 {
                    let mut folios: Vec<_> = (0..run)
                        .map_while(|_| raw::alloc_folio(cache, 0).ok())
                        .collect();
                    for (k, f) in folios.iter_mut().enumerate() {
                        stamp(f, file.id(), first + k as u64);
                    }
                    let added = file.add_folio_range(first, folios).unwrap();
                    for (k, locked) in added.inserted.into_iter().enumerate() {
                        let f = locked.end_read(true);
                        model.insert(first + k as u64, (f.id(), 0));
                    }
                } else if let Ok(mut f) = raw::alloc_folio(cache, order) {
                    stamp(&mut f, file.id(), first);
                    let (locked, _) = file.add_folio(f, first).unwrap();
                    let f = locked.end_read(true);
                    model.insert(first, (f.id(), order));
                }
            }
            // Remove with freeze (fails while a reader holds a reference).
            0..=7 => {
                let shadow = (rng.below(2) == 0).then_some(7);
                if let Some(&at) = covered.first()
                    && let Some(f) = file.lookup(at)
                    && file.remove_folio(f, shadow).is_ok()
                {
                    model.remove(&at);
                }
            }
            // Truncate a small range (no freeze: readers may keep the folios alive).
            _ => {
                let len = 1 + rng.below(16);
                let removed = file.truncate(first..first + len);
                let gone: Vec<u64> = model
                    .range(first..first + len)
                    .filter(|(f, (_, o))| **f + (1u64 << o) <= first + len)
                    .map(|(f, _)| *f)
                    .collect();
                let pages: u64 = gone.iter().map(|f| 1u64 << model[f].1).sum();
                assert_eq!(removed, pages);
                for f in gone {
                    model.remove(&f);
                }
            }
        }
    }
    (ops, model)
}

fn reader(files: &[Mapping; 2], stop: &AtomicBool, seed: u64) -> (u64, u64) {
    let mut rng = Rng(seed);
    let (mut lookups, mut hits) = (0u64, 0u64);
    let mut batch = FolioBatch::new();
    while !stop.load(Ordering::Relaxed) {
        let file = &files[rng.below(2) as usize];
        let index = rng.below(PAGES_PER_FILE);
        lookups += 1;
        if rng.below(4) == 0 {
            file.get_batch(index, 31, &mut batch);
            let mut want = index;
            for (k, folio) in batch.folios().iter().enumerate() {
                hits += 1;
                check(folio, file, want);
                if k > 0 {
                    assert_eq!(folio.index(), want, "a batch's folios must not overlap");
                }
                want = folio.index() + folio.nr_pages() as u64;
            }
            batch.clear();
        } else if let Some(folio) = file.lookup(index) {
            hits += 1;
            check(&folio, file, index);
        }
    }
    (lookups, hits)
}

fn run(policy: RefcountPolicy) {
    let cache = Cache::builder()
        .arena_pages(CACHE_PAGES as usize)
        .max_order(3)
        .policy(Policy {
            refcount: policy,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let files = [raw::new_mapping(&cache), raw::new_mapping(&cache)];
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (writes, reads) = std::thread::scope(|s| {
        let writers: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(k, file)| {
                let (cache, stop) = (&cache, &stop);
                s.spawn(move || writer(cache, file, stop, 0x9E37_79B9 + k as u64))
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|k| {
                let (files, stop) = (&files, &stop);
                s.spawn(move || reader(files, stop, 0xDEAD_BEEF + k))
            })
            .collect();
        std::thread::sleep(duration());
        stop.store(true, Ordering::Relaxed);
        let writes: Vec<_> = writers.into_iter().map(|h| h.join().unwrap()).collect();
        let reads: Vec<_> = readers.into_iter().map(|h| h.join().unwrap()).collect();
        (writes, reads)
    });
    // The index of each file is exactly its writer's model.
    for (file, (_, model)) in files.iter().zip(&writes) {
        let folios: BTreeMap<u64, (u32, u8)> = file
            .index()
            .entries()
            .into_iter()
            .filter_map(|(at, e)| match e {
                Entry::Folio { id, order, .. } => Some((at, (id, order))),
                Entry::Value { .. } => None,
            })
            .collect();
        assert_eq!(&folios, model);
        let pages: u64 = model.values().map(|(_, o)| 1u64 << o).sum();
        assert_eq!(file.stats().cached_pages, pages);
    }
    let write_ops: u64 = writes.iter().map(|(n, _)| n).sum();
    let (lookups, hits): (u64, u64) = reads.iter().fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
    eprintln!(
        "{policy:?}: {:.1}s, {write_ops} writer ops, {lookups} lookups, {hits} folios checked",
        start.elapsed().as_secs_f64()
    );
    assert!(hits > 0 && write_ops > 0, "the stress did no work");
    drop(files);
    foliocache::raw::drain_cpu_caches(&cache);
    let stats = cache.stats();
    assert_eq!(
        stats.free_pages, CACHE_PAGES,
        "{stats:?}: every folio was freed"
    );
    assert_eq!(
        cache.stats().free_pages,
        CACHE_PAGES,
        "every folio was freed"
    );
}

#[test]
fn stress_frozen_bit() {
    run(RefcountPolicy::FrozenBit);
}

#[test]
fn stress_cas() {
    run(RefcountPolicy::Cas);
}

/// `remove_folio` and `truncate` racing on the same file, with a reader holding references:
/// a removal must never freeze a folio whose cache reference is being dropped by a truncation
/// (the `put` would land on a frozen count and be lost: a leak, or a debug assertion).
#[test]
fn stress_remove_vs_truncate() {
    for policy in [RefcountPolicy::FrozenBit, RefcountPolicy::Cas] {
        let cache = Cache::builder()
            .arena_pages(64)
            .max_order(0)
            .policy(Policy {
                refcount: policy,
                ..Policy::default()
            })
            .build()
            .unwrap();
        let file = raw::new_mapping(&cache);
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + duration() / 2;
        let (removed, truncated) = std::thread::scope(|s| {
            let filler = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut f) = raw::alloc_folio(&cache, 0) {
                        stamp(&mut f, file.id(), 0);
                        if let Ok((locked, _)) = file.add_folio(f, 0) {
                            locked.end_read(true);
                        }
                    }
                }
            });
            let remover = s.spawn(|| {
                let mut removed = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(f) = file.lookup(0)
                        && file.remove_folio(f, None).is_ok()
                    {
                        removed += 1;
                    }
                }
                removed
            });
            let truncator = s.spawn(|| {
                let mut truncated = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    truncated += file.truncate(0..1);
                    // A reader holding the folio across the truncation.
                    if let Some(f) = file.lookup(0) {
                        check(&f, &file, 0);
                    }
                }
                truncated
            });
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
            filler.join().unwrap();
            (remover.join().unwrap(), truncator.join().unwrap())
        });
        eprintln!("{policy:?}: {removed} removals, {truncated} truncations");
        assert!(removed > 0 && truncated > 0, "both paths must have run");
        drop(file);
        foliocache::raw::drain_cpu_caches(&cache);
        assert_eq!(cache.stats().free_pages, 64, "{policy:?}: a folio leaked");
    }
}
