//! Mappings: speculative lookup, batches, insertion (single and range), removal with freeze,
//! truncation, misses, the folio lock, and bad input.

use foliocache::raw;
use foliocache::raw::RangeStop;
use foliocache::raw::RemoveError;
use foliocache::raw::{FolioBatch, flag};
use foliocache::{Cache, Error, FolioRef, PAGE_SIZE, Policy, RefcountPolicy};

fn caches() -> Vec<Cache> {
    [RefcountPolicy::FrozenBit, RefcountPolicy::Cas]
        .into_iter()
        .map(|refcount| {
            Cache::builder()
                .arena_pages(1024)
                .policy(Policy {
                    refcount,
                    ..Policy::default()
                })
                .build()
                .unwrap()
        })
        .collect()
}

#[test]
fn insert_lookup_and_references() {
    for cache in caches() {
        let file = raw::new_mapping(&cache);
        let folio = raw::alloc_folio(&cache, 2).unwrap();
        let (locked, shadow) = file.add_folio(folio, 8).unwrap();
        assert_eq!(shadow, None);
        let folio = locked.folio().clone();
        assert!(
            folio.test(flag::LOCKED),
            "inserted folios are locked for filling"
        );
        assert_eq!(folio.ref_count(), 3, "guard + this clone + page cache");
        locked.end_read(true);
        assert!(folio.is_uptodate() && !folio.test(flag::LOCKED));
        assert_eq!(folio.ref_count(), 2, "the guard's reference went with it");
        for index in 8..12 {
            let found = file.lookup(index).unwrap();
            assert_eq!(
                (found.id(), found.index(), found.mapping_id()),
                (folio.id(), 8, file.id())
            );
            assert_eq!(found.ref_count(), 3);
        }
        assert!(file.lookup(7).is_none() && file.lookup(12).is_none());
        assert_eq!(folio.ref_count(), 2, "lookups released their references");
        let stats = file.stats();
        assert_eq!(
            (stats.lookups, stats.insertions, stats.cached_pages),
            (6, 1, 4)
        );
        assert_eq!(stats.index_walks, 6);
    }
}

/// Inserts order-`orders[k]` folios back to back from page `start`, fills them (uptodate) and
/// returns references to them.
fn insert_run<'c>(
    cache: &'c Cache,
    file: &raw::Mapping,
    start: u64,
    orders: &[u8],
) -> Vec<FolioRef<'c>> {
    let folios: Vec<_> = orders
        .iter()
        .map(|&o| raw::alloc_folio(cache, o).unwrap())
        .collect();
    let added = file.add_folio_range(start, folios).unwrap();
    assert!(added.rest.is_empty());
    added
        .inserted
        .into_iter()
        .map(|locked| locked.end_read(true))
        .collect()
}

#[test]
fn get_batch_returns_contiguous_folios_in_one_walk() {
    for cache in caches() {
        let file = raw::new_mapping(&cache);
        let orders = [0u8, 0, 1, 2, 3, 1, 0, 0];
        let folios = insert_run(&cache, &file, 0, &orders);
        assert_eq!(folios.len(), orders.len());
        assert_eq!(
            file.stats().lock_acquisitions,
            1,
            "a whole run under one lock hold"
        );
        let walks = file.stats().index_walks;
        let mut batch = FolioBatch::new();
        file.get_batch(0, 31, &mut batch);
        let ids: Vec<_> = batch.folios().iter().map(FolioRef::id).collect();
        let want: Vec<_> = folios.iter().map(FolioRef::id).collect();
        assert_eq!(ids, want);
        assert_eq!(file.stats().index_walks - walks, 1);
        // Starting in the middle of a large folio returns it first.
        file.get_batch(5, 2, &mut batch);
        assert_eq!(batch.folios()[0].id(), folios[3].id());
        assert_eq!(batch.len(), 2);
        // A gap ends the batch.
        file.get_batch(100, 31, &mut batch);
        assert!(batch.is_empty());
        batch.clear();
        for f in &folios {
            assert_eq!(f.ref_count(), 2);
        }
    }
}

#[test]
fn a_batch_crossing_a_node_boundary_costs_one_more_walk() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let _folios = insert_run(cache, &file, 40, &[0; 80]);
    let mut batch = FolioBatch::new();
    let before = file.stats().index_walks;
    file.get_batch(50, 31, &mut batch);
    assert_eq!(batch.len(), 31);
    assert_eq!(
        file.stats().index_walks - before,
        2,
        "pages 50..81 span two leaves"
    );
}

#[test]
fn add_folio_range_stops_at_a_present_folio_and_leaves_the_rest_to_the_caller() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let _squatter = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 3)
        .unwrap();
    let folios: Vec<_> = (0..6)
        .map(|_| raw::alloc_folio(cache, 0).unwrap())
        .collect();
    let added = file.add_folio_range(0, folios).unwrap();
    assert_eq!(added.inserted.len(), 3);
    assert_eq!(added.stopped, Some(RangeStop::Present(3)));
    assert_eq!(added.rest.len(), 3, "the rest is handed back");
    assert!(added.rest.iter().all(|f| !f.is_uptodate()));
    // They can go in elsewhere.
    let again = file.add_folio_range(4, added.rest).unwrap();
    assert_eq!(again.inserted.len(), 3);
    assert!(again.rest.is_empty());
}

#[test]
fn add_folio_range_prepares_nothing_past_a_present_folio() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let _squatter = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 10)
        .unwrap();
    let locks = file.stats().lock_acquisitions;
    // The first position is taken: nothing goes in, and the writer lock is not even taken.
    let folios: Vec<_> = (0..4)
        .map(|_| raw::alloc_folio(cache, 0).unwrap())
        .collect();
    let added = file.add_folio_range(10, folios).unwrap();
    assert!(added.inserted.is_empty());
    assert_eq!(added.stopped, Some(RangeStop::Present(10)));
    assert_eq!(added.rest.len(), 4);
    assert_eq!(file.stats().lock_acquisitions, locks);
    // A large folio whose range holds the present page stops the run before it.
    let folios = vec![
        raw::alloc_folio(cache, 2).unwrap(),
        raw::alloc_folio(cache, 2).unwrap(),
        raw::alloc_folio(cache, 0).unwrap(),
    ];
    let added = file.add_folio_range(4, folios).unwrap();
    assert_eq!(added.inserted.len(), 1, "the folio at 4..8 went in");
    assert_eq!(added.stopped, Some(RangeStop::Present(10)));
    assert_eq!(added.rest.len(), 2);
    assert_eq!(file.stats().lock_acquisitions, locks + 1);
    // What was handed back is private and whole: it goes in elsewhere.
    let again = file.add_folio_range(16, added.rest).unwrap();
    assert_eq!(again.inserted.len(), 2);
    assert_eq!(again.stopped, None);
    assert!(file.lookup(20).is_some());
}

#[test]
fn removal_freezes_and_fails_while_someone_else_holds_a_reference() {
    for cache in caches() {
        let file = raw::new_mapping(&cache);
        let free_before = cache.stats().free_pages;
        let (locked, _) = file
            .add_folio(raw::alloc_folio(&cache, 0).unwrap(), 0)
            .unwrap();
        let folio = locked.unlock();
        let reader = file.lookup(0).unwrap();
        let folio = match file.remove_folio(folio, Some(42)) {
            Err(RemoveError::Busy(f)) => f,
            other => panic!("expected Busy, got {other:?}"),
        };
        assert!(file.lookup(0).is_some(), "a failed removal changes nothing");
        drop(reader);
        file.remove_folio(folio, Some(42)).unwrap();
        assert!(file.lookup(0).is_none());
        // The memory comes back after a grace period (optimistic readers may know the folio).
        raw::drain_cpu_caches(&cache);
        assert_eq!(
            file.index().load(0),
            Some(raw::Entry::Value {
                value: 42,
                order: 0
            }),
            "the shadow stays"
        );
        assert_eq!(cache.stats().free_pages, free_before, "the folio was freed");
        // A folio from another mapping is refused.
        let other = raw::new_mapping(&cache);
        let (locked, _) = other
            .add_folio(raw::alloc_folio(&cache, 0).unwrap(), 0)
            .unwrap();
        assert!(matches!(
            file.remove_folio(locked.unlock(), None),
            Err(RemoveError::NotInMapping(_))
        ));
    }
}

#[test]
fn truncation_keeps_referenced_folios_alive_until_released() {
    for cache in caches() {
        let file = raw::new_mapping(&cache);
        let free_before = cache.stats().free_pages;
        let folios = insert_run(&cache, &file, 0, &[1; 4]);
        let held = file.lookup(2).unwrap();
        drop(folios);
        // Pages 1..=6: folios at 2 and 4 are inside; those at 0 and 6 straddle and stay.
        assert_eq!(file.truncate(1..=6), 4);
        assert!(file.lookup(2).is_none() && file.lookup(5).is_none());
        assert!(file.lookup(1).is_some() && file.lookup(6).is_some());
        assert_eq!(
            held.mapping_id(),
            0,
            "a truncated folio belongs to no mapping"
        );
        assert_eq!(
            held.bytes().map(<[u8]>::len),
            Some(2 * PAGE_SIZE),
            "still readable"
        );
        // Freed memory comes back after a grace period (optimistic readers may know it).
        raw::drain_cpu_caches(&cache);
        assert_eq!(
            cache.stats().free_pages,
            free_before - 6,
            "the held folio is not freed yet"
        );
        drop(held);
        raw::drain_cpu_caches(&cache);
        assert_eq!(cache.stats().free_pages, free_before - 4);
        drop(file);
        raw::drain_cpu_caches(&cache);
        assert_eq!(
            cache.stats().free_pages,
            free_before,
            "dropping a mapping frees its folios"
        );
    }
}

#[test]
fn misses_follow_the_kernel_conventions() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let _folios = insert_run(cache, &file, 10, &[0; 10]);
    assert_eq!(file.next_miss(10, 100), 20);
    assert_eq!(
        file.next_miss(12, 5),
        17,
        "no gap within 5: one past the scanned range"
    );
    assert_eq!(file.next_miss(5, 100), 5);
    assert_eq!(file.prev_miss(19, 100), 9);
    assert_eq!(
        file.prev_miss(19, 4),
        15,
        "no gap within 4: one before the scanned range"
    );
    let _zero = insert_run(cache, &file, 0, &[0]);
    assert_eq!(file.prev_miss(0, 1), u64::MAX, "wraps below zero");
}

#[test]
fn bad_input_is_an_error() {
    let caches = caches();
    let cache = &caches[0];
    let file = raw::new_mapping(cache);
    let free = cache.stats().free_pages;
    assert!(matches!(
        file.add_folio(raw::alloc_folio(cache, 3).unwrap(), 4),
        Err(Error::Misaligned { index: 4, order: 3 })
    ));
    assert!(matches!(
        file.add_folio(raw::alloc_folio(cache, 3).unwrap(), u64::MAX - 3),
        Err(Error::Misaligned { .. })
    ));
    raw::drain_cpu_caches(cache);
    assert_eq!(
        cache.stats().free_pages,
        free,
        "refused folios are freed at once"
    );
    let _eight = file
        .add_folio(raw::alloc_folio(cache, 3).unwrap(), 8)
        .unwrap();
    assert!(matches!(
        file.add_folio(raw::alloc_folio(cache, 0).unwrap(), 9),
        Err(Error::Exists { index: 8 })
    ));
    let mut filled = raw::alloc_folio(cache, 0).unwrap();
    filled.mark_uptodate();
    assert!(matches!(
        file.add_zeroed_folio(filled, 40),
        Err(Error::FolioUptodate)
    ));
    file.add_zeroed_folio(raw::alloc_folio(cache, 0).unwrap(), 40)
        .unwrap();
    assert!(
        !file.lookup(40).unwrap().test(flag::LOCKED),
        "inserted unlocked"
    );
    assert!(matches!(
        file.index().load(40),
        Some(raw::Entry::Folio { zeros: true, .. })
    ));
    let foreign = raw::alloc_folio(&caches[1], 0).unwrap();
    assert!(matches!(
        file.add_folio(foreign, 0),
        Err(Error::ForeignFolio)
    ));
    // The last page index is usable; a run that would go past it is refused whole.
    let run: Vec<_> = (0..2)
        .map(|_| raw::alloc_folio(cache, 0).unwrap())
        .collect();
    assert!(matches!(
        file.add_folio_range(u64::MAX, run),
        Err(Error::IndexOverflow {
            index: u64::MAX,
            order: 0
        })
    ));
    assert!(
        file.lookup(u64::MAX).is_none(),
        "nothing of the run went in"
    );
    let _last = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), u64::MAX)
        .unwrap();
    assert!(file.lookup(u64::MAX).is_some());
}

#[test]
fn a_failed_insert_releases_the_lock_it_took() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let (squatter, _) = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 0)
        .unwrap();
    let folio = raw::alloc_folio(cache, 0).unwrap();
    let id = folio.id();
    assert!(matches!(
        file.add_folio(folio, 0),
        Err(Error::Exists { index: 0 })
    ));
    drop(squatter);
    // The refused folio was freed whole (unlocked, out of every mapping): the allocator hands
    // the same page out again, and it can be inserted and locked like any other.
    raw::drain_cpu_caches(cache);
    let again = raw::alloc_folio(cache, 0).unwrap();
    assert_eq!(again.id(), id);
    let (locked, _) = file.add_folio(again, 1).unwrap();
    assert!(locked.folio().test(flag::LOCKED));
    let folio = locked.unlock();
    assert!(raw::try_lock(&folio).is_some(), "the lock was released");
}

#[test]
fn removal_validates_the_shadow_and_ignores_truncated_folios() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let (locked, _) = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 0)
        .unwrap();
    let folio = locked.unlock();
    let folio = match file.remove_folio(folio, Some(u64::MAX)) {
        Err(RemoveError::ShadowTooLarge(f)) => f,
        other => panic!("{other:?}"),
    };
    assert!(file.lookup(0).is_some(), "nothing changed");
    let reader = file.lookup(0).unwrap();
    file.truncate(..);
    // Truncated: the count is 2 (caller + reader), but the removal must not freeze it.
    let folio = match file.remove_folio(folio, None) {
        Err(RemoveError::NotInMapping(f)) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(folio.ref_count(), 2);
    raw::drain_cpu_caches(cache);
    let free = cache.stats().free_pages;
    drop(reader);
    drop(folio);
    assert_eq!(
        cache.stats().pending_free_pages,
        1,
        "published: returned after a grace period"
    );
    raw::drain_cpu_caches(cache);
    assert_eq!(cache.stats().free_pages, free + 1, "the last put freed it");
}

#[test]
fn folio_lock_sleeps_until_unlocked() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let (mut locked, _) = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 0)
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = file.lookup(0).unwrap();
            f.wait_unlocked();
            assert!(
                done.load(std::sync::atomic::Ordering::SeqCst),
                "woke before the unlock"
            );
            assert!(f.is_uptodate(), "saw the unlock's uptodate bit");
            drop(raw::lock(&f));
        });
        s.spawn(|| {
            let f = file.lookup(0).unwrap();
            let guard = raw::lock(&f); // parks until the fill below ends
            assert!(f.is_uptodate());
            assert!(guard.folio().bytes().is_some_and(|b| b[0] == 7));
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        locked.bytes_mut().unwrap().fill(7);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let folio = locked.end_read(true);
        assert!(folio.is_uptodate());
    });
    assert!(!file.lookup(0).unwrap().test(flag::LOCKED));
}

#[test]
fn a_guard_cannot_write_an_uptodate_folio() {
    let cache = &caches()[0];
    let file = raw::new_mapping(cache);
    let (locked, _) = file
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 0)
        .unwrap();
    let folio = locked.end_read(true);
    let mut relocked = raw::lock(&folio);
    assert!(
        relocked.bytes_mut().is_none(),
        "uptodate folios are immutable"
    );
    drop(relocked);
    assert!(!folio.test(flag::LOCKED), "dropping the guard unlocks");
}
