//! loom models of the speculative lookup against removal, truncation and reuse, on the real
//! cache: arena, allocator, folio table, index and mapping, with loom's atomics underneath.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom_lookup`
#![cfg(loom)]

use foliocache::raw;
use foliocache::{Cache, Policy, RefcountPolicy};
use loom::sync::Arc;
use loom::thread;

const BOTH: [RefcountPolicy; 2] = [RefcountPolicy::FrozenBit, RefcountPolicy::Cas];

fn small_cache(refcount: RefcountPolicy) -> Cache {
    Cache::builder()
        .arena_pages(4)
        .max_order(0)
        .policy(Policy {
            refcount,
            ..Policy::default()
        })
        .build()
        .unwrap()
}

/// A reader looks up page 0 of file A while a writer removes that folio (freeze at the expected
/// count) and immediately reuses its memory for page 0 of file B. The reader gets either
/// nothing or A's folio, and if it holds A's folio, the removal must have failed.
#[test]
fn lookup_vs_removal_and_reuse() {
    for policy in BOTH {
        loom::model(move || {
            let cache = small_cache(policy);
            let a = Arc::new(raw::new_mapping(&cache));
            let b = Arc::new(raw::new_mapping(&cache));
            {
                let folio = foliocache::raw::alloc_folio(&cache, 0).unwrap();
                a.add_folio(folio, 0).unwrap().0.end_read(true);
            }
            let reader = {
                let a = a.clone();
                thread::spawn(move || {
                    if let Some(folio) = a.lookup(0) {
                        assert_eq!(
                            folio.mapping_id(),
                            a.id(),
                            "{policy:?}: a reused folio was returned"
                        );
                        assert_eq!(folio.index(), 0);
                        assert!(folio.is_uptodate());
                    }
                })
            };
            if let Some(folio) = a.lookup(0)
                && a.remove_folio(folio, None).is_ok()
            {
                // The freed page is the first the allocator hands out again.
                let reused = foliocache::raw::alloc_folio(&cache, 0).unwrap();
                b.add_folio(reused, 0).unwrap().0.end_read(true);
            }
            reader.join().unwrap();
        });
    }
}

/// A reader looks up page 0 while a writer truncates it (no freeze) and reuses free memory for
/// file B. The reader may get the truncated folio (its reference keeps it alive) but never B's.
#[test]
fn lookup_vs_truncation_and_reuse() {
    for policy in BOTH {
        loom::model(move || {
            let cache = small_cache(policy);
            let a = Arc::new(raw::new_mapping(&cache));
            let b = Arc::new(raw::new_mapping(&cache));
            let id;
            {
                let folio = foliocache::raw::alloc_folio(&cache, 0).unwrap();
                id = folio.id();
                a.add_folio(folio, 0).unwrap().0.end_read(true);
            }
            let reader = {
                let (a, b) = (a.clone(), b.clone());
                thread::spawn(move || {
                    if let Some(folio) = a.lookup(0) {
                        assert_eq!(folio.id(), id);
                        assert_ne!(
                            folio.mapping_id(),
                            b.id(),
                            "{policy:?}: B's folio returned for A"
                        );
                        assert_eq!(folio.index(), 0);
                    }
                })
            };
            assert_eq!(a.truncate(0..1), 1);
            let reused = foliocache::raw::alloc_folio(&cache, 0).unwrap();
            b.add_folio(reused, 0).unwrap().0.end_read(true);
            reader.join().unwrap();
        });
    }
}

/// A removal racing a truncation of the same folio. The truncation unhooks the folio under the
/// writer lock and drops the cache's reference after releasing it; a removal that froze the
/// count in between (count 2 = caller + the not-yet-dropped cache reference) would make that
/// `put` land on a frozen count and be lost when the removal gives up and unfreezes: a leak.
/// The removal must check, under the lock, that the folio is still in the index before it
/// freezes. Every page must be free at the end.
#[test]
fn removal_vs_truncation_loses_no_reference() {
    for policy in BOTH {
        loom::model(move || {
            let cache = small_cache(policy);
            let a = Arc::new(raw::new_mapping(&cache));
            {
                let folio = foliocache::raw::alloc_folio(&cache, 0).unwrap();
                a.add_folio(folio, 0).unwrap().0.end_read(true);
            }
            let held = a.lookup(0).unwrap();
            let truncator = {
                let a = a.clone();
                thread::spawn(move || {
                    a.truncate(0..1);
                })
            };
            let _ = a.remove_folio(held, None);
            truncator.join().unwrap();
            assert!(a.lookup(0).is_none());
            drop(a);
            // A freed folio may still wait for the grace period of a reader that was pinned
            // when it was freed; none is left now.
            foliocache::raw::drain_cpu_caches(&cache);
            assert_eq!(cache.stats().free_pages, 4, "{policy:?}: a folio leaked");
        });
    }
}
