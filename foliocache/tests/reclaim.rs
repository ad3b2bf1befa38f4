//! Reclaim: eviction order against a model of the rules, shadow entries, the memory budget, and
//! readers, a scanner and eviction together on a tiny budget.

mod common;

use common::{MemBackend, byte_at, pattern};
use foliocache::ReclaimPolicy;
use foliocache::raw::Entry;
use foliocache::{Advice, Cache, File, Handle, Policy};
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const PAGE: u64 = 4096;

fn cache(policy: ReclaimPolicy, arena_pages: usize) -> Cache {
    Cache::builder()
        .arena_pages(arena_pages)
        .policy(Policy {
            reclaim: policy,
            ..Policy::default()
        })
        .build()
        .unwrap()
}

/// A file of `pages` pages in 4 KiB folios, and a handle that reads only what it is asked
/// (no readahead), so every page's life is the script's doing.
fn open(cache: &Cache, pages: u64) -> (File, Handle) {
    let backend = Arc::new(MemBackend::new(pattern(pages * PAGE)));
    let file = cache.open_backend(backend, Some(0)).unwrap();
    let mut handle = file.handle();
    handle.advise(Advice::Random).unwrap();
    (file, handle)
}

fn read_page(handle: &mut Handle, page: u64) {
    let mut buf = vec![0u8; PAGE as usize];
    assert_eq!(
        handle.read_at(&mut buf, page * PAGE).unwrap(),
        PAGE as usize
    );
    assert!(
        buf.iter()
            .enumerate()
            .all(|(k, &b)| b == byte_at(page * PAGE + k as u64)),
        "page {page}: wrong bytes"
    );
}

/// Reads all of `file` in order, in 64 KiB reads, checking every byte, and waits for its I/O.
fn read_whole(file: &File, what: &str) {
    let mut handle = file.handle();
    let mut buf = vec![0u8; 64 << 10];
    let mut pos = 0;
    while pos < file.size() {
        let n = handle.read_at(&mut buf, pos).unwrap();
        assert!(n > 0);
        assert!(
            buf[..n]
                .iter()
                .enumerate()
                .all(|(k, &b)| b == byte_at(pos + k as u64)),
            "{what}: wrong bytes at {pos}"
        );
        pos += n as u64;
    }
    file.wait_for_io();
}

fn cached(file: &File, page: u64) -> bool {
    foliocache::raw::mapping(file).lookup(page).is_some()
}

// ---------------------------------------------------------------------------------------------
// The model: the rules of `foliocache::reclaim` written out plainly, one page per folio.

#[derive(Debug, Clone, Copy, Default)]
struct Bits {
    referenced: bool,
    promote: bool,
    active: bool,
    workingset: bool,
}

#[derive(Debug, Default)]
struct Counts {
    evicted: u64,
    activations: u64,
    deactivations: u64,
    refaults: u64,
    workingset_activations: u64,
    workingset_restores: u64,
}

#[derive(Debug)]
struct Model {
    policy: ReclaimPolicy,
    /// Front = head (newest).
    inactive: VecDeque<u64>,
    active: VecDeque<u64>,
    bits: HashMap<u64, Bits>,
    shadows: HashMap<u64, (u64, bool)>,
    age: u64,
    /// The page the previous read ended in.
    last_page: Option<u64>,
    counts: Counts,
}

const BATCH: usize = 32;

impl Model {
    fn new(policy: ReclaimPolicy) -> Self {
        Self {
            policy,
            inactive: VecDeque::new(),
            active: VecDeque::new(),
            bits: HashMap::new(),
            shadows: HashMap::new(),
            age: 0,
            last_page: None,
            counts: Counts::default(),
        }
    }

    fn push_head(&mut self, page: u64, active: bool) {
        self.bits.entry(page).or_default().active = active;
        if active {
            self.active.push_front(page);
        } else {
            self.inactive.push_front(page);
        }
    }

    fn read(&mut self, page: u64) {
        if !self.bits.contains_key(&page) {
            let mut active = false;
            let mut bits = Bits::default();
            if let Some((evicted_at, workingset)) = self.shadows.remove(&page) {
                self.counts.refaults += 1;
                if self.policy == ReclaimPolicy::Workingset
                    && self.age - evicted_at <= self.active.len() as u64
                {
                    active = true;
                    self.counts.workingset_activations += 1;
                    self.age += 1;
                    if workingset {
                        bits.workingset = true;
                        self.counts.workingset_restores += 1;
                    }
                }
            }
            self.bits.insert(page, bits);
            self.push_head(page, active);
        }
        // A read continuing in the page the previous one ended in is not a new access.
        if self.last_page != Some(page) {
            let bits = self.bits.get_mut(&page).unwrap();
            if !bits.referenced {
                bits.referenced = true;
            } else if !bits.active && !bits.promote {
                bits.promote = true;
            }
        }
        self.last_page = Some(page);
    }

    fn balance(&mut self) {
        if self.inactive.len() >= self.active.len() {
            return;
        }
        let mut moved = Vec::new();
        while moved.len() < BATCH {
            let Some(page) = self.active.pop_back() else {
                break;
            };
            self.bits.get_mut(&page).unwrap().workingset = true;
            self.counts.deactivations += 1;
            moved.push(page);
        }
        for page in moved {
            self.push_head(page, false);
        }
    }

    fn evict(&mut self, want: u64) {
        let mut freed = 0;
        let mut budget = 2 * (self.inactive.len() + self.active.len()) as u64 + BATCH as u64;
        while freed < want && budget > 0 {
            if self.policy != ReclaimPolicy::Clock {
                self.balance();
            }
            let mut batch = Vec::new();
            while batch.len() < BATCH {
                match self.inactive.pop_back() {
                    Some(page) => batch.push(page),
                    None => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            budget = budget.saturating_sub(batch.len() as u64);
            let mut putback = Vec::new();
            for page in batch {
                let bits = self.bits.get_mut(&page).unwrap();
                if self.policy == ReclaimPolicy::Clock {
                    if bits.referenced || bits.promote {
                        bits.referenced = false;
                        bits.promote = false;
                        putback.push((page, false));
                        continue;
                    }
                } else if bits.promote {
                    bits.referenced = false;
                    bits.promote = false;
                    self.counts.activations += 1;
                    self.age += 1;
                    putback.push((page, true));
                    continue;
                }
                let workingset = bits.workingset;
                self.bits.remove(&page);
                if self.policy == ReclaimPolicy::Workingset {
                    self.shadows.insert(page, (self.age, workingset));
                }
                self.age += 1;
                self.counts.evicted += 1;
                freed += 1;
            }
            for (page, active) in putback {
                self.push_head(page, active);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Read(u64),
    Evict(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..48).prop_map(Op::Read),
        1 => (1u64..12).prop_map(Op::Evict),
    ]
}

fn policy() -> impl Strategy<Value = ReclaimPolicy> {
    prop_oneof![
        Just(ReclaimPolicy::Workingset),
        Just(ReclaimPolicy::TwoLists),
        Just(ReclaimPolicy::Clock),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// After every step of a random script of reads and evictions, the cache holds exactly the
    /// pages the model holds, and the counters agree.
    #[test]
    fn eviction_order_follows_the_model(
        policy in policy(),
        script in proptest::collection::vec(op(), 1..160),
    ) {
        let cache = cache(policy, 256);
        let (file, mut handle) = open(&cache, 48);
        let mut model = Model::new(policy);
        for (step, op) in script.iter().enumerate() {
            match *op {
                Op::Read(page) => {
                    read_page(&mut handle, page);
                    model.read(page);
                }
                Op::Evict(want) => {
                    cache.evict(want);
                    model.evict(want);
                }
            }
            for page in 0..48 {
                prop_assert_eq!(
                    cached(&file, page),
                    model.bits.contains_key(&page),
                    "{:?}: page {} after step {} ({:?})", policy, page, step, op
                );
            }
        }
        let stats = cache.reclaim_stats();
        prop_assert_eq!(stats.evicted_folios, model.counts.evicted);
        prop_assert_eq!(stats.activations, model.counts.activations);
        prop_assert_eq!(stats.deactivations, model.counts.deactivations);
        prop_assert_eq!(stats.refaults, model.counts.refaults);
        prop_assert_eq!(stats.workingset_activations, model.counts.workingset_activations);
        prop_assert_eq!(stats.workingset_restores, model.counts.workingset_restores);
        prop_assert_eq!(stats.inactive_pages, model.inactive.len() as u64);
        prop_assert_eq!(stats.active_pages, model.active.len() as u64);
        prop_assert_eq!(stats.nonresident_age, model.age);
    }
}

#[test]
fn pages_read_twice_outlive_a_scan_but_not_under_a_clock() {
    for policy in [
        ReclaimPolicy::Workingset,
        ReclaimPolicy::TwoLists,
        ReclaimPolicy::Clock,
    ] {
        let cache = cache(policy, 256);
        let (file, mut handle) = open(&cache, 200);
        // A hot set of 8 pages, read twice (the second read promotes them).
        for _ in 0..2 {
            for page in 0..8 {
                read_page(&mut handle, page);
            }
        }
        // A scan reads 64 pages once each, and 8 pages are evicted after every 8 read (the
        // inactive list never runs dry, so the active list is never drained).
        for page in 96..160 {
            read_page(&mut handle, page);
            if page % 8 == 7 {
                cache.evict(8);
            }
        }
        let hot_cached = (0..8).filter(|&p| cached(&file, p)).count();
        match policy {
            ReclaimPolicy::Clock => assert_eq!(hot_cached, 0, "{policy:?}"),
            _ => assert_eq!(hot_cached, 8, "{policy:?} {:?}", cache.reclaim_stats()),
        }
    }
}

#[test]
fn shadows_are_left_by_eviction_consumed_by_refault_and_dropped_with_their_range() {
    let cache = cache(ReclaimPolicy::Workingset, 256);
    let (file, mut handle) = open(&cache, 32);
    for page in 0..4 {
        read_page(&mut handle, page);
    }
    assert_eq!(cache.evict(4), 4);
    for page in 0..4 {
        assert!(
            matches!(
                foliocache::raw::mapping(&file).index().load(page),
                Some(Entry::Value { .. })
            ),
            "page {page} left a shadow"
        );
    }
    assert_eq!(cache.reclaim_stats().shadow_entries, 4);
    // A refault consumes the shadow: the slot holds the folio again.
    read_page(&mut handle, 1);
    assert!(matches!(
        foliocache::raw::mapping(&file).index().load(1),
        Some(Entry::Folio { .. })
    ));
    let stats = cache.reclaim_stats();
    assert_eq!((stats.refaults, stats.shadow_entries), (1, 3));
    // Dropping a range (DontNeed) takes its shadows with it: a later read is no refault.
    file.drop_cached(0, 4 * PAGE);
    for page in 0..4 {
        assert_eq!(
            foliocache::raw::mapping(&file).index().load(page),
            None,
            "page {page}"
        );
    }
    assert_eq!(cache.reclaim_stats().shadow_entries, 0);
    read_page(&mut handle, 2);
    assert_eq!(cache.reclaim_stats().refaults, 1);
    // Without workingset detection, eviction leaves nothing behind.
    let cache = self::cache(ReclaimPolicy::TwoLists, 256);
    let (file, mut handle) = open(&cache, 32);
    read_page(&mut handle, 0);
    assert_eq!(cache.evict(1), 1);
    assert_eq!(foliocache::raw::mapping(&file).index().load(0), None);
}

#[test]
fn a_refault_within_the_active_list_is_activated_and_one_beyond_it_is_not() {
    let cache = cache(ReclaimPolicy::Workingset, 256);
    let (file, mut handle) = open(&cache, 200);
    // Pages 0..4 read twice (promoted), 10 and 11 once.
    for _ in 0..2 {
        for page in 0..4 {
            read_page(&mut handle, page);
        }
    }
    read_page(&mut handle, 10);
    read_page(&mut handle, 11);
    // One scan batch takes all six: 0..4 are activated (age 4), 10 and 11 evicted at ages 4
    // and 5 (the age is 6 after).
    cache.evict(1);
    let stats = cache.reclaim_stats();
    assert_eq!((stats.active_pages, stats.inactive_pages), (4, 0));
    assert_eq!((stats.activations, stats.evicted_folios), (4, 2));
    assert_eq!(stats.nonresident_age, 6);
    assert!(!cached(&file, 10) && !cached(&file, 11));
    // Page 10 refaults at distance 2, within the 4 active pages: straight to the active list.
    read_page(&mut handle, 10);
    let stats = cache.reclaim_stats();
    assert_eq!((stats.refaults, stats.workingset_activations), (1, 1));
    assert_eq!(stats.active_pages, 5);
    // 40 pages read once and evicted push the age far past page 11's eviction.
    for page in 100..140 {
        read_page(&mut handle, page);
    }
    assert_eq!(cache.evict(40), 40);
    assert!((0..4).chain([10]).all(|page| cached(&file, page)));
    read_page(&mut handle, 11);
    let stats = cache.reclaim_stats();
    assert_eq!((stats.refaults, stats.workingset_activations), (2, 1));
    assert_eq!(stats.inactive_pages, 1, "page 11 went to the inactive list");
}

#[test]
fn the_budget_holds_folios_and_metadata_together() {
    let budget = 4u64 << 20;
    let cache = Cache::builder().capacity(budget).build().unwrap();
    let files: Vec<(File, Arc<MemBackend>)> = (0..3)
        .map(|_| {
            let backend = Arc::new(MemBackend::new(pattern(6 << 20)));
            (cache.open_backend(backend.clone(), None).unwrap(), backend)
        })
        .collect();
    for round in 0..2 {
        for (file, _) in &files {
            read_whole(file, &format!("round {round}"));
            let stats = cache.stats();
            assert!(
                stats.accounted_bytes() <= budget,
                "{} > {budget}: {stats:?}",
                stats.accounted_bytes()
            );
            assert!(
                stats.index_node_bytes <= stats.index_reserve_pages * PAGE,
                "index nodes not paid for: {stats:?}"
            );
        }
    }
    assert!(cache.reclaim_stats().evicted_pages > 0);
    // Sparse shadows cost nodes, and the nodes still fit the reserve.
    let stats = cache.stats();
    assert!(stats.index_node_bytes > 0);
    assert!(stats.index_node_bytes <= stats.index_reserve_pages * PAGE);
}

/// On a large arena backed by huge pages (the default) the index reserve is taken in whole
/// 2 MiB blocks: single pages, each discarded, would split a huge page apiece. The reserve still
/// pays for the nodes, the budget still holds, and a block is not given back and taken again
/// while it covers the nodes.
#[test]
fn the_index_reserve_moves_in_whole_huge_pages_on_a_huge_page_arena() {
    const HUGE: u64 = 512;
    let budget = 96u64 << 20;
    let read_all = |cache: &Cache| {
        let backend = Arc::new(MemBackend::new(pattern(40 << 20)));
        let file = cache.open_backend(backend, None).unwrap();
        for _round in 0..2 {
            file.drop_cached(0, 0);
            let mut handle = file.handle();
            let mut buf = vec![0u8; 256 << 10];
            let mut pos = 0;
            while pos < file.size() {
                pos += handle.read_at(&mut buf, pos).unwrap() as u64;
            }
            file.wait_for_io();
        }
        let stats = cache.stats();
        assert!(stats.index_node_bytes > 0);
        assert!(
            stats.index_node_bytes <= stats.index_reserve_pages * PAGE,
            "index nodes not paid for: {stats:?}"
        );
        assert!(stats.accounted_bytes() <= budget, "{stats:?}");
        (file, stats)
    };
    let cache = Cache::builder().capacity(budget).build().unwrap();
    let (file, stats) = read_all(&cache);
    // The nodes need far less than a block: the test is about granularity.
    assert!(stats.index_node_bytes < (1 << 20), "{stats:?}");
    assert_eq!(
        stats.index_reserve_pages, HUGE,
        "one whole block: {stats:?}"
    );
    // Dropping the file's pages shrinks the nodes, and the block stays: no give-and-take.
    file.drop_cached(0, 0);
    let mut buf = [0u8; 4096];
    file.handle().read_at(&mut buf, 0).unwrap();
    assert_eq!(cache.stats().index_reserve_pages, HUGE);

    // Small pages: the reserve follows the nodes page by page.
    let small = Cache::builder()
        .capacity(budget)
        .huge_pages(false)
        .build()
        .unwrap();
    let (_file, stats) = read_all(&small);
    assert!(
        stats.index_reserve_pages > 0 && stats.index_reserve_pages < HUGE,
        "{stats:?}"
    );
}

/// Readers of two files (random and sequential), a scanner of a third, and explicit evictions,
/// all on a budget a fraction of the data: every read returns the right bytes, every thread
/// keeps making progress, and every thread ends when stopped (`common::run_stress`).
#[test]
fn readers_a_scanner_and_eviction_on_a_tiny_budget() {
    let cache = Cache::builder().capacity(256 << 10).build().unwrap();
    let files: Vec<File> = (0..3)
        .map(|k| {
            let backend = Arc::new(MemBackend::new(pattern((1 + k) << 20)));
            cache.open_backend(backend, None).unwrap()
        })
        .collect();
    let mut workers: Vec<common::Worker> = Vec::new();
    // Random 4 KiB..64 KiB reads of file 0 and file 1.
    for (t, file) in files[..2].iter().enumerate() {
        let file = file.clone();
        workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
            let mut handle = file.handle();
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
            let mut buf = vec![0u8; 64 << 10];
            while !stop.load(Ordering::Relaxed) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let pos = seed % file.size();
                let len = 1 + (seed >> 40) as usize % buf.len();
                let n = handle.read_at(&mut buf[..len], pos).unwrap();
                assert!(n > 0, "no progress at {pos}");
                assert!(
                    buf[..n]
                        .iter()
                        .enumerate()
                        .all(|(k, &b)| b == byte_at(pos + k as u64)),
                    "wrong bytes at {pos}"
                );
                progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // A sequential scanner of file 2, again and again.
    let file = files[2].clone();
    workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
        let mut buf = vec![0u8; 8 << 10];
        while !stop.load(Ordering::Relaxed) {
            let mut handle = file.handle();
            let mut pos = 0;
            while pos < file.size() && !stop.load(Ordering::Relaxed) {
                let n = handle.read_at(&mut buf, pos).unwrap();
                assert!(n > 0);
                assert!(
                    buf[..n]
                        .iter()
                        .enumerate()
                        .all(|(k, &b)| b == byte_at(pos + k as u64)),
                    "scan: wrong bytes at {pos}"
                );
                pos += n as u64;
                progress.fetch_add(1, Ordering::Relaxed);
            }
        }
    }));
    // Explicit evictions and drops.
    let (evicting, dropping) = (cache.clone(), files.clone());
    workers.push(Box::new(move |stop: &AtomicBool, progress: &AtomicU64| {
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            evicting.evict(16);
            dropping[(k % 3) as usize].drop_cached((k % 64) * 16 * PAGE, 16 * PAGE);
            k += 1;
            progress.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(200));
        }
    }));
    let progress = common::run_stress(common::stress_duration(), workers);
    assert!(progress.iter().all(|&p| p > 0), "{progress:?}");
    let stats = cache.stats();
    assert!(
        stats.accounted_bytes() <= 256 << 10,
        "over budget: {stats:?}"
    );
    assert!(cache.reclaim_stats().evicted_pages > 0);
}

/// A window of large folios on a full arena whose free pages lie apart takes those pages (in
/// 4 KiB folios) before it evicts anything. Evicting until a block of the window's order
/// forms would drop cached pages while free ones sat unused: with placement by offset on, that
/// cost `fcache bench reclaim`'s hot+scan under the clock policy 3 points of hit ratio.
#[test]
fn a_large_folio_takes_free_pages_apart_before_it_evicts() {
    let cache = cache(ReclaimPolicy::Workingset, 1024);
    // The arena filled with one file's 4 KiB folios, read in order, up to its last free page
    // (an eviction would leave a free run behind).
    let (small, mut handle) = open(&cache, 1024);
    let mut page = 0;
    while cache.stats().free_pages > 0 {
        read_page(&mut handle, page);
        page += 1;
    }
    assert_eq!(cache.reclaim_stats().evicted_pages, 0);
    let resident: Vec<u64> = (0..page).filter(|&p| cached(&small, p)).collect();
    assert!(resident.len() > 512, "{} pages resident", resident.len());
    // Every fourth resident page dropped: free pages, scattered.
    for &page in resident.iter().step_by(4) {
        small.drop_cached(page * PAGE, PAGE);
    }
    foliocache::raw::drain_cpu_caches(&cache);
    let free = cache.stats().free_pages;
    let blocks = foliocache::raw::free_blocks_by_order(&cache);
    // The window below asks for order-2 folios and larger: no free block can give one.
    assert!(
        blocks.iter().skip(2).all(|&n| n == 0),
        "free blocks by order: {blocks:?}"
    );
    let evicted = cache.reclaim_stats().evicted_pages;
    // A file of large folios, read in order: its windows find no block of their order.
    let pages = free / 2;
    let backend = Arc::new(MemBackend::new(pattern(pages * PAGE)));
    let large = cache.open_backend(backend, None).unwrap();
    read_whole(&large, "the file of large folios");
    let ra = large.readahead_stats();
    assert_eq!(
        cache.reclaim_stats().evicted_pages,
        evicted,
        "pages evicted while {free} were free (a {pages}-page file read): {ra:?}"
    );
    // Its windows did ask for large folios, and finished in 4 KiB ones.
    assert!(ra.order_fallbacks > 0, "{ra:?}");
}

/// A readahead window that finds the arena dry evicts what it still needs in one pass, not a
/// batch of 64 pages at a time. Each pass's memory comes back after a grace period, and ending
/// one is a process-wide barrier in asymmetric mode (`membarrier`): a stream that evicted 64
/// pages at a time paid one per 256 KiB it read (docs/BENCHMARKS.md, "Eviction and the grace
/// period's barrier").
#[test]
fn a_window_on_a_dry_arena_evicts_what_it_needs_at_once() {
    let cache = Cache::builder()
        .arena_pages(8192)
        .readahead_bytes(1 << 20)
        .build()
        .unwrap();
    // The arena filled with one file's pages, read one at a time.
    let (_first, mut handle) = open(&cache, 8192);
    let mut page = 0;
    while cache.stats().free_pages > 0 {
        read_page(&mut handle, page);
        page += 1;
    }
    let before = cache.reclaim_stats();
    // A second file read in order: its windows grow to 256 pages, each found the arena dry.
    let backend = Arc::new(MemBackend::new(pattern(4096 * PAGE)));
    let second = cache.open_backend(backend, Some(0)).unwrap();
    read_whole(&second, "the second file");
    let after = cache.reclaim_stats();
    let evicted = after.evicted_pages - before.evicted_pages;
    let passes = after.passes - before.passes;
    assert!(
        evicted >= 3072,
        "{evicted} pages evicted for a 4096-page file"
    );
    assert!(
        passes * 128 <= evicted,
        "{passes} eviction passes for {evicted} pages"
    );
}
