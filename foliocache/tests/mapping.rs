//! Mappings: speculative lookup, batches, insertion (single and range), removal with freeze,
//! truncation, misses, the folio lock, and bad input.

use foliocache::index::RangeStop;
use foliocache::mapping::RemoveError;
use foliocache::{Cache, Error, FolioBatch, PAGE_SIZE, Policy, RefcountPolicy, flag};

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
        let file = cache.new_mapping();
        let folio = cache.alloc_folio(2).unwrap();
        assert_eq!(file.add_folio(&folio, 8).unwrap(), None);
        assert!(
            folio.test(flag::LOCKED),
            "inserted folios are locked for filling"
        );
        assert_eq!(folio.ref_count(), 2, "caller + page cache");
        folio.end_read(true);
        assert!(folio.is_uptodate() && !folio.test(flag::LOCKED));
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

#[test]
fn get_batch_returns_contiguous_folios_in_one_walk() {
    for cache in caches() {
        let file = cache.new_mapping();
        let orders = [0u8, 0, 1, 2, 3, 1, 0, 0];
        let folios: Vec<_> = orders
            .iter()
            .map(|&o| cache.alloc_folio(o).unwrap())
            .collect();
        let added = file.add_folio_range(0, &folios).unwrap();
        assert_eq!(added.inserted, orders.len());
        assert_eq!(
            file.stats().lock_acquisitions,
            1,
            "a whole run under one lock hold"
        );
        let walks = file.stats().index_walks;
        let mut batch = FolioBatch::new();
        file.get_batch(0, 31, &mut batch);
        let ids: Vec<_> = batch
            .folios()
            .iter()
            .map(foliocache::FolioRef::id)
            .collect();
        let want: Vec<_> = folios.iter().map(foliocache::FolioRef::id).collect();
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
    let file = cache.new_mapping();
    let folios: Vec<_> = (0..80).map(|_| cache.alloc_folio(0).unwrap()).collect();
    file.add_folio_range(40, &folios).unwrap();
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
    let file = cache.new_mapping();
    let squatter = cache.alloc_folio(0).unwrap();
    file.add_folio(&squatter, 3).unwrap();
    let folios: Vec<_> = (0..6).map(|_| cache.alloc_folio(0).unwrap()).collect();
    let added = file.add_folio_range(0, &folios).unwrap();
    assert_eq!(added.inserted, 3);
    assert_eq!(added.stopped, Some(RangeStop::Present(3)));
    for f in &folios[3..] {
        assert_eq!(
            (f.mapping_id(), f.ref_count(), f.flags()),
            (0, 1, 0),
            "untouched"
        );
    }
    // They can go in elsewhere.
    let added = file.add_folio_range(4, &folios[3..]).unwrap();
    assert_eq!(added.inserted, 3);
}

#[test]
fn removal_freezes_and_fails_while_someone_else_holds_a_reference() {
    for cache in caches() {
        let file = cache.new_mapping();
        let free_before = cache.stats().free_pages;
        let folio = cache.alloc_folio(0).unwrap();
        file.add_folio(&folio, 0).unwrap();
        folio.unlock();
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
        cache.drain_cpu_caches();
        assert_eq!(
            file.index().load(0),
            Some(foliocache::index::Entry::Value {
                value: 42,
                order: 0
            }),
            "the shadow stays"
        );
        assert_eq!(cache.stats().free_pages, free_before, "the folio was freed");
        // A folio from another mapping is refused.
        let other = cache.new_mapping();
        let f = cache.alloc_folio(0).unwrap();
        other.add_folio(&f, 0).unwrap();
        assert!(matches!(
            file.remove_folio(f, None),
            Err(RemoveError::NotInMapping(_))
        ));
    }
}

#[test]
fn truncation_keeps_referenced_folios_alive_until_released() {
    for cache in caches() {
        let file = cache.new_mapping();
        let free_before = cache.stats().free_pages;
        let folios: Vec<_> = (0..4).map(|_| cache.alloc_folio(1).unwrap()).collect();
        file.add_folio_range(0, &folios).unwrap();
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
        // SAFETY: (test) the folio is pinned by `held`; nobody writes it.
        let _ = unsafe { held.as_ptr().read_volatile() };
        // Freed memory comes back after a grace period (optimistic readers may know it).
        cache.drain_cpu_caches();
        assert_eq!(
            cache.stats().free_pages,
            free_before - 6,
            "the held folio is not freed yet"
        );
        drop(held);
        cache.drain_cpu_caches();
        assert_eq!(cache.stats().free_pages, free_before - 4);
        drop(file);
        cache.drain_cpu_caches();
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
    let file = cache.new_mapping();
    let folios: Vec<_> = (0..10).map(|_| cache.alloc_folio(0).unwrap()).collect();
    file.add_folio_range(10, &folios).unwrap();
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
    let zero = cache.alloc_folio(0).unwrap();
    file.add_folio(&zero, 0).unwrap();
    assert_eq!(file.prev_miss(0, 1), u64::MAX, "wraps below zero");
}

#[test]
fn bad_input_is_an_error() {
    let caches = caches();
    let cache = &caches[0];
    let file = cache.new_mapping();
    let folio = cache.alloc_folio(3).unwrap();
    assert!(matches!(
        file.add_folio(&folio, 4),
        Err(Error::Misaligned { index: 4, order: 3 })
    ));
    assert_eq!(
        (folio.mapping_id(), folio.ref_count(), folio.flags()),
        (0, 1, 0)
    );
    assert!(matches!(
        file.add_folio(&folio, u64::MAX - 3),
        Err(Error::Misaligned { .. })
    ));
    file.add_folio(&folio, 8).unwrap();
    assert!(matches!(
        file.add_folio(&folio, 16),
        Err(Error::FolioInUse { .. })
    ));
    let other = cache.alloc_folio(0).unwrap();
    assert!(matches!(
        file.add_folio(&other, 9),
        Err(Error::Exists { index: 8 })
    ));
    let filled = cache.alloc_folio(0).unwrap();
    filled.lock();
    filled.end_read(true);
    assert!(matches!(
        file.add_zeroed_folio(&filled, 40),
        Err(Error::FolioUptodate)
    ));
    assert_eq!(filled.mapping_id(), 0, "nothing changed");
    let zeroed = cache.alloc_folio(0).unwrap();
    file.add_zeroed_folio(&zeroed, 40).unwrap();
    assert!(!zeroed.test(flag::LOCKED), "inserted unlocked");
    assert!(matches!(
        file.index().load(40),
        Some(foliocache::index::Entry::Folio { zeros: true, .. })
    ));
    let foreign = caches[1].alloc_folio(0).unwrap();
    assert!(matches!(
        file.add_folio(&foreign, 0),
        Err(Error::ForeignFolio)
    ));
    // The last page index is usable; a run that would go past it is refused whole.
    let run: Vec<_> = (0..2).map(|_| cache.alloc_folio(0).unwrap()).collect();
    assert!(matches!(
        file.add_folio_range(u64::MAX, &run),
        Err(Error::IndexOverflow {
            index: u64::MAX,
            order: 0
        })
    ));
    assert!(
        run.iter()
            .all(|f| f.mapping_id() == 0 && f.ref_count() == 1)
    );
    file.add_folio(&other, u64::MAX).unwrap();
    assert!(file.lookup(u64::MAX).is_some());
}

#[test]
fn two_holders_racing_to_insert_one_folio_cannot_both_win() {
    for cache in caches() {
        let (x, y) = (cache.new_mapping(), cache.new_mapping());
        for round in 0..500u64 {
            let folio = cache.alloc_folio(0).unwrap();
            let other = folio.clone();
            let barrier = std::sync::Barrier::new(2);
            let (a, b) = std::thread::scope(|s| {
                let t = s.spawn(|| {
                    barrier.wait();
                    y.add_folio(&other, round)
                });
                barrier.wait();
                (x.add_folio(&folio, round), t.join().unwrap())
            });
            match (&a, &b) {
                (Ok(_), Err(Error::FolioInUse { .. } | Error::FolioLocked))
                | (Err(Error::FolioInUse { .. } | Error::FolioLocked), Ok(_)) => {}
                other => panic!("round {round}: {other:?}"),
            }
            let winner = if a.is_ok() { &x } else { &y };
            assert_eq!(folio.mapping_id(), winner.id());
            assert_eq!(folio.ref_count(), 3, "two holders + the cache");
            folio.unlock();
        }
        assert_eq!(x.stats().cached_pages + y.stats().cached_pages, 500);
    }
}

#[test]
fn a_locked_folio_cannot_be_inserted_and_a_failed_insert_unlocks_properly() {
    let cache = &caches()[0];
    let file = cache.new_mapping();
    let folio = cache.alloc_folio(0).unwrap();
    assert!(folio.try_lock());
    assert!(matches!(file.add_folio(&folio, 0), Err(Error::FolioLocked)));
    assert_eq!((folio.mapping_id(), folio.ref_count()), (0, 1));
    folio.unlock();
    // A failed insert (Exists) releases the folio lock it took, waking any waiter.
    let squatter = cache.alloc_folio(0).unwrap();
    file.add_folio(&squatter, 0).unwrap();
    assert!(matches!(
        file.add_folio(&folio, 0),
        Err(Error::Exists { index: 0 })
    ));
    assert_eq!(folio.flags(), 0);
    assert!(folio.try_lock(), "the lock was released");
    folio.unlock();
}

#[test]
fn removal_validates_the_shadow_and_ignores_truncated_folios() {
    let cache = &caches()[0];
    let file = cache.new_mapping();
    let folio = cache.alloc_folio(0).unwrap();
    file.add_folio(&folio, 0).unwrap();
    folio.unlock();
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
    cache.drain_cpu_caches();
    let free = cache.stats().free_pages;
    drop(reader);
    drop(folio);
    assert_eq!(
        cache.stats().pending_free_pages,
        1,
        "published: returned after a grace period"
    );
    cache.drain_cpu_caches();
    assert_eq!(cache.stats().free_pages, free + 1, "the last put freed it");
}

#[test]
fn a_folio_that_was_cached_cannot_go_in_again() {
    let cache = &caches()[0];
    let (a, b) = (cache.new_mapping(), cache.new_mapping());
    let folio = cache.alloc_folio(0).unwrap();
    a.add_folio(&folio, 3).unwrap();
    folio.end_read(true);
    a.truncate(..);
    assert_eq!(folio.mapping_id(), 0);
    assert!(matches!(b.add_folio(&folio, 7), Err(Error::FolioWasCached)));
    assert_eq!(folio.index(), 3, "its identity was not touched");
    assert!(b.lookup(7).is_none());
}

#[test]
fn public_flag_setters_cannot_touch_lock_or_uptodate() {
    let cache = &caches()[0];
    let file = cache.new_mapping();
    let folio = cache.alloc_folio(0).unwrap();
    file.add_folio(&folio, 0).unwrap(); // locked
    folio.set(flag::REFERENCED | flag::UPTODATE);
    assert!(
        folio.test(flag::REFERENCED) && !folio.is_uptodate(),
        "UPTODATE comes from end_read"
    );
    folio.end_read(true);
    assert!(folio.clear(u32::MAX), "REFERENCED was set");
    assert!(folio.is_uptodate(), "an uptodate folio stays uptodate");
    assert!(
        folio.try_lock(),
        "clear did not take the lock away or leave it"
    );
    assert!(!folio.clear(u32::MAX));
    assert!(folio.test(flag::LOCKED), "nor did it drop a held lock");
    folio.unlock();
}

#[test]
fn folio_lock_sleeps_until_unlocked() {
    let cache = &caches()[0];
    let file = cache.new_mapping();
    let folio = cache.alloc_folio(0).unwrap();
    file.add_folio(&folio, 0).unwrap(); // locked
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
            f.lock();
            f.unlock();
        });
        s.spawn(|| {
            let f = file.lookup(0).unwrap();
            f.lock(); // parks until the fill below ends
            assert!(f.is_uptodate());
            f.unlock();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: (test) the folio is locked by us and not uptodate: we are its filler.
        unsafe { folio.as_ptr().write_bytes(7, PAGE_SIZE) };
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        folio.end_read(true);
    });
    assert!(!folio.test(flag::LOCKED));
}
