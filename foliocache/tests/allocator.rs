//! The arena's buddy allocator: random alloc/free never hands out overlapping memory, freeing
//! everything coalesces back to the largest blocks, and bad configuration is an error.

mod common;

use foliocache::raw::{self, NewFolio};
use foliocache::{Cache, Error, PAGE_SIZE};
use proptest::prelude::*;

fn cache(pages: u64, max_order: u8) -> Cache {
    Cache::builder()
        .arena_pages(pages as usize)
        .max_order(max_order)
        .build()
        .expect("valid configuration")
}

/// The largest-block shape of an arena of `pages` pages: free blocks per order.
fn full_shape(pages: u64, max_order: u8) -> Vec<usize> {
    let mut shape = vec![0; max_order as usize + 1];
    let mut pfn = 0u64;
    while pfn < pages {
        let mut order = max_order;
        while !pfn.is_multiple_of(1 << order) || pfn + (1 << order) > pages {
            order -= 1;
        }
        shape[order as usize] += 1;
        pfn += 1 << order;
    }
    shape
}

fn address(folio: &mut NewFolio<'_>) -> usize {
    folio.bytes_mut().as_ptr() as usize
}

fn check_disjoint(live: &mut [NewFolio<'_>]) {
    let mut ranges: Vec<(usize, usize)> = live
        .iter_mut()
        .map(|f| (address(f), address(f) + f.len()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping folios {pair:?}");
    }
    for f in live {
        assert_eq!(
            address(f) % f.len(),
            0,
            "folio of order {} not naturally aligned",
            f.order()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_alloc_free_never_overlaps_and_fully_coalesces(
        pages in 1u64..700,
        max_order in 0u8..=9,
        ops in prop::collection::vec((any::<bool>(), 0u8..=9, any::<prop::sample::Index>()), 1..300),
    ) {
        let cache = cache(pages, max_order);
        let mut live: Vec<NewFolio<'_>> = Vec::new();
        let mut used = 0u64;
        for (alloc, order, pick) in ops {
            if alloc || live.is_empty() {
                let order = order.min(max_order);
                match raw::alloc_folio(&cache, order) {
                    Ok(folio) => {
                        prop_assert_eq!(folio.order(), order);
                        used += 1 << order;
                        live.push(folio);
                    }
                    Err(Error::NoMemory { order: o }) => {
                        prop_assert_eq!(o, order);
                        // A failure is only allowed when no free block of that order exists.
                        raw::drain_cpu_caches(&cache);
                        let blocks = raw::free_blocks_by_order(&cache);
                        prop_assert!(blocks[order as usize..].iter().all(|&n| n == 0),
                            "order {} failed with free blocks {:?}", order, blocks);
                    }
                    Err(other) => prop_assert!(false, "unexpected {other}"),
                }
            } else {
                let folio = live.swap_remove(pick.index(live.len()));
                used -= folio.nr_pages() as u64;
                drop(folio);
            }
            prop_assert_eq!(cache.stats().free_pages, pages - used);
        }
        check_disjoint(&mut live);
        drop(live);
        raw::drain_cpu_caches(&cache);
        prop_assert_eq!(cache.stats().free_pages, pages);
        prop_assert_eq!(raw::free_blocks_by_order(&cache), full_shape(pages, max_order));
    }
}

#[test]
fn every_page_can_be_allocated_even_from_thread_caches() {
    let pages = 256;
    let cache = cache(pages, 9);
    // Fill and free order-0 pages on two threads, leaving pages in both threads' caches.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let folios: Vec<_> = (0..40)
                    .map(|_| raw::alloc_folio(&cache, 0).unwrap())
                    .collect();
                drop(folios);
            });
        }
    });
    // A large folio must still be found: allocation drains the caches before failing.
    let all = raw::alloc_folio(&cache, 8).expect("256 pages are free");
    assert_eq!(all.nr_pages(), 256);
    assert!(matches!(
        raw::alloc_folio(&cache, 0),
        Err(Error::NoMemory { order: 0 })
    ));
}

#[test]
fn two_threads_allocate_and_free_concurrently_without_overlap() {
    let cache = cache(4096, 9);
    std::thread::scope(|s| {
        for t in 0..2u8 {
            let cache = &cache;
            s.spawn(move || {
                for round in 0..200 {
                    let mut folios: Vec<_> = (0..64)
                        .map(|i| {
                            raw::alloc_folio(cache, ((i + round + usize::from(t)) % 3) as u8)
                                .unwrap()
                        })
                        .collect();
                    // Stamp every folio's bytes with this thread's id, then check them: an
                    // overlap with the other thread's folio would show up as a foreign stamp.
                    for f in &mut folios {
                        f.bytes_mut().fill(t);
                    }
                    for f in &mut folios {
                        assert!(f.bytes_mut().iter().all(|&b| b == t));
                    }
                    check_disjoint(&mut folios);
                }
            });
        }
    });
    raw::drain_cpu_caches(&cache);
    assert_eq!(cache.stats().free_pages, 4096);
    assert_eq!(raw::free_blocks_by_order(&cache), full_shape(4096, 9));
}

#[test]
fn order_0_traffic_stays_in_per_thread_caches() {
    let cache = cache(4096, 9);
    let rounds = 2000u64;
    let before = cache.stats().zone_lock_acquisitions;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..rounds {
                    let folios: Vec<_> = (0..8)
                        .map(|_| raw::alloc_folio(&cache, 0).unwrap())
                        .collect();
                    drop(folios);
                }
            });
        }
    });
    let locks = cache.stats().zone_lock_acquisitions - before;
    let operations = 2 * rounds * 8 * 2; // allocations and frees, both threads
    // Each thread refills its cache once and then recycles the same pages: the shared free
    // lists are touched a handful of times, not once per operation.
    assert!(
        locks <= 8,
        "{locks} zone lock acquisitions for {operations} order-0 operations"
    );
}

#[test]
fn bad_configuration_is_an_error_not_a_panic() {
    for capacity in [0, 1, 4095, 4097, 3 * 4096 + 5] {
        let err = Cache::builder().capacity(capacity).build().unwrap_err();
        assert!(
            matches!(err, Error::InvalidCapacity(c) if c == capacity),
            "{err}"
        );
        assert!(err.to_string().contains("multiple of the page size"));
    }
    let err = Cache::builder().capacity(!4095).build().unwrap_err();
    assert!(matches!(err, Error::InvalidCapacity(_)), "{err}");
    let err = Cache::builder().max_order(10).build().unwrap_err();
    assert!(
        matches!(err, Error::OrderTooLarge { order: 10, max: 9 }),
        "{err}"
    );
    let cache = cache(16, 2);
    assert!(matches!(
        raw::alloc_folio(&cache, 3),
        Err(Error::OrderTooLarge { order: 3, max: 2 })
    ));
}

#[test]
fn a_capacity_too_large_for_this_machine_is_an_error_not_an_abort() {
    // Run in a child limited to 8 GiB of address space, so that whatever this machine's memory
    // and overcommit policy, the memory for a 16 TiB cache cannot be had (and nothing is
    // touched if it could): the build must come back with an error, not abort or be killed.
    const NAME: &str = "a_capacity_too_large_for_this_machine_is_an_error_not_an_abort";
    if common::child_role().as_deref() == Some("limited") {
        let limit = libc::rlimit {
            rlim_cur: 8 << 30,
            rlim_max: 8 << 30,
        };
        // SAFETY: setrlimit with a valid pointer to an initialised struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
        let capacity = (u64::from(u32::MAX) - 1) * PAGE_SIZE as u64;
        match Cache::builder().capacity(capacity).build() {
            Err(Error::MetadataAlloc { bytes }) => assert!(bytes > 1 << 30),
            Err(Error::Mmap { .. }) => {}
            other => panic!("expected an allocation error, got {other:?}"),
        }
        return;
    }
    let status = common::run_child(NAME, "limited");
    assert!(status.success(), "the limited child failed: {status}");
}

#[test]
fn a_capacity_that_is_not_a_power_of_two_is_usable_to_the_last_page() {
    let pages = 3 * 512 + 7;
    let cache = cache(pages, 9);
    let mut folios = Vec::new();
    for order in (0..=9).rev() {
        while let Ok(f) = raw::alloc_folio(&cache, order) {
            folios.push(f);
        }
    }
    assert_eq!(
        folios.iter().map(|f| f.nr_pages() as u64).sum::<u64>(),
        pages
    );
    check_disjoint(&mut folios);
}

#[test]
fn huge_pages_and_prefault_build() {
    let cache = Cache::builder()
        .capacity(8 << 20)
        .huge_pages(true)
        .prefault(true)
        .build()
        .unwrap();
    let mut f = raw::alloc_folio(&cache, 9).unwrap();
    assert_eq!(
        address(&mut f) % (2 << 20),
        0,
        "order-9 folios are 2 MiB aligned"
    );
}

/// A budget pays for everything the cache's memory takes: with huge pages (the default) a
/// 1 GiB cache's folio table lives in huge pages of its own, and their rounding up comes out of
/// the arena, so the accounted bytes still fit the budget.
#[test]
fn a_folio_table_in_huge_pages_is_paid_for_by_the_budget() {
    let budget = 1u64 << 30;
    let huge = Cache::builder().capacity(budget).build().unwrap().stats();
    let small = Cache::builder()
        .capacity(budget)
        .huge_pages(false)
        .build()
        .unwrap()
        .stats();
    for stats in [&huge, &small] {
        assert!(stats.accounted_bytes() <= budget, "{stats:?}");
    }
    assert_eq!(small.folio_table_bytes, small.total_pages * 32);
    assert_eq!(huge.folio_table_bytes % (2 << 20), 0, "{huge:?}");
    assert!(huge.folio_table_bytes > huge.total_pages * 32);
    // The rounding (under 2 MiB) costs a few dozen pages of a quarter million.
    assert!(huge.total_pages < small.total_pages, "{huge:?}");
    assert!(small.total_pages - huge.total_pages < 512, "{huge:?}");
}
