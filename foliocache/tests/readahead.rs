//! Readahead decisions, traced through real reads on a test backend (docs/KERNEL.md, "Worked
//! traces"), and the read path's behaviour on files read from a backend.

mod common;

use common::{MemBackend, byte_at, pattern};
use foliocache::raw::flag;
use foliocache::{Advice, Cache, Error, File, InsertPolicy, Policy};
use std::sync::Arc;

const PAGE: u64 = 4096;

fn cache_with(policy: Policy, capacity: u64) -> Cache {
    Cache::builder()
        .capacity(capacity)
        .policy(policy)
        .build()
        .unwrap()
}

fn open(cache: &Cache, pages: u64, max_order: u8) -> (File, Arc<MemBackend>) {
    let backend = Arc::new(MemBackend::new(pattern(pages * PAGE)));
    let file = cache
        .open_backend(backend.clone(), Some(max_order))
        .unwrap();
    (file, backend)
}

/// One row of a trace: the page whose read triggered a window, the window, the folio order
/// readahead used, and where its mark is (None: no mark).
#[derive(Debug, PartialEq, Eq)]
struct Row {
    at: u64,
    window: (u64, u64),
    order: u8,
    mark: Option<u64>,
}

/// Reads the file sequentially in 4 KiB reads from 0 and records every new window.
fn trace(file: &File, pages: u64) -> Vec<Row> {
    let mut handle = file.handle();
    let mut rows = Vec::new();
    let mut seen = (u64::MAX, 0);
    let mut buf = vec![0u8; PAGE as usize];
    for page in 0..pages {
        assert_eq!(
            handle.read_at(&mut buf, page * PAGE).unwrap(),
            PAGE as usize
        );
        assert!(
            buf.iter()
                .enumerate()
                .all(|(k, &b)| b == byte_at(page * PAGE + k as u64))
        );
        let ra = handle.ra_state();
        if (ra.start, ra.size) != seen {
            seen = (ra.start, ra.size);
            let window = (ra.start, ra.start + ra.size);
            let mapping = foliocache::raw::mapping(file);
            let mark = (window.0..window.1).find(|&i| {
                mapping
                    .lookup(i)
                    .is_some_and(|f| f.index() == i && f.test(flag::READAHEAD))
            });
            rows.push(Row {
                at: page,
                window,
                order: ra.order,
                mark,
            });
        }
    }
    rows
}

fn row(at: u64, window: (u64, u64), order: u8, mark: u64) -> Row {
    Row {
        at,
        window,
        order,
        mark: Some(mark),
    }
}

#[test]
fn trace_without_large_folios_matches_the_spec() {
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        let cache = cache_with(
            Policy {
                insert,
                ..Policy::default()
            },
            16 << 20,
        );
        let (file, _) = open(&cache, 1024, 0);
        let rows = trace(&file, 92);
        // "Worked traces", first table: ra->order oscillates 0 → 2 → 0 (recorded after the
        // fill: 0).
        let expected = [
            row(0, (0, 4), 0, 1),
            row(1, (4, 12), 0, 4),
            row(4, (12, 28), 0, 12),
            row(12, (28, 60), 0, 28),
            row(28, (60, 92), 0, 60),
            row(60, (92, 124), 0, 92),
        ];
        assert_eq!(rows, expected, "{insert:?}");
        // Every folio is a single page.
        for i in 0..124 {
            assert_eq!(
                foliocache::raw::mapping(&file).lookup(i).unwrap().order(),
                0
            );
        }
    }
}

#[test]
fn trace_with_large_folios_matches_the_spec() {
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        let cache = cache_with(
            Policy {
                insert,
                ..Policy::default()
            },
            16 << 20,
        );
        let (file, _) = open(&cache, 1024, 9);
        let rows = trace(&file, 97);
        // "Worked traces", second table.
        let expected = [
            row(0, (0, 4), 0, 1),
            row(1, (4, 12), 2, 4),
            row(4, (12, 16), 2, 12),
            row(12, (16, 24), 3, 16),
            row(16, (24, 32), 3, 24),
            row(24, (32, 48), 4, 32),
            row(32, (48, 64), 4, 48),
            row(48, (64, 96), 5, 64),
            row(64, (96, 128), 5, 96),
            row(96, (128, 160), 5, 128),
        ];
        assert_eq!(rows, expected, "{insert:?}");
        // The folios have the orders the table says.
        let mapping = foliocache::raw::mapping(&file);
        for (index, order) in [(4, 2), (8, 2), (12, 2), (16, 3), (32, 4), (64, 5), (128, 5)] {
            let folio = mapping.lookup(index).unwrap();
            assert_eq!((folio.index(), folio.order()), (index, order));
        }
    }
}

#[test]
fn batched_takes_one_lock_per_run_single_one_per_folio() {
    let mut locks = Vec::new();
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        let cache = cache_with(
            Policy {
                insert,
                ..Policy::default()
            },
            16 << 20,
        );
        let (file, _) = open(&cache, 1024, 0);
        let mut handle = file.handle();
        // One forced read of 256 pages: one contiguous run.
        handle.readahead(0, 256 * PAGE).unwrap();
        assert_eq!(file.mapping_stats().cached_pages, 256);
        locks.push(file.mapping_stats().lock_acquisitions);
        assert!(
            (0..256).all(|i| !foliocache::raw::mapping(&file)
                .lookup(i)
                .unwrap()
                .test(flag::READAHEAD)),
            "a forced read sets no mark"
        );
    }
    assert_eq!(locks, [1, 256]);
}

#[test]
fn a_present_folio_splits_the_run_and_is_skipped() {
    for insert in [InsertPolicy::Batched, InsertPolicy::Single] {
        let cache = cache_with(
            Policy {
                insert,
                ..Policy::default()
            },
            16 << 20,
        );
        let (file, backend) = open(&cache, 64, 0);
        let mut handle = file.handle();
        let mut buf = [0u8; 1];
        // Page 10 cached first (a small random read reads only it).
        handle.read_at(&mut buf, 10 * PAGE).unwrap();
        assert_eq!(file.mapping_stats().cached_pages, 1);
        handle.readahead(0, 32 * PAGE).unwrap();
        assert_eq!(file.mapping_stats().cached_pages, 32);
        assert_eq!(file.readahead_stats().present_skips, 1, "{insert:?}");
        let reads = backend.requests();
        // Page 10's own read, then [0, 10) and [11, 32) as separate requests.
        assert_eq!(
            reads,
            [(10 * PAGE, 4096), (0, 40960), (11 * PAGE, 21 * 4096)]
        );
    }
}

/// Cached pages are passed over a run at a time, before anything is allocated for them: a
/// `readahead(2)` over what the program just read takes no lock, and one across runs of cached
/// pages takes one lock per run it reads (batched insertion; one per folio otherwise).
#[test]
fn cached_runs_are_skipped_whole() {
    for (insert, locks_for_the_gaps) in [(InsertPolicy::Batched, 3), (InsertPolicy::Single, 20)] {
        let cache = cache_with(
            Policy {
                insert,
                ..Policy::default()
            },
            16 << 20,
        );
        let (file, backend) = open(&cache, 64, 0);
        let mut handle = file.handle();
        handle.readahead(8 * PAGE, 8 * PAGE).unwrap();
        handle.readahead(24 * PAGE, 4 * PAGE).unwrap();
        let locks = file.mapping_stats().lock_acquisitions;
        handle.readahead(8 * PAGE, 8 * PAGE).unwrap();
        assert_eq!(
            file.mapping_stats().lock_acquisitions,
            locks,
            "{insert:?}: a cached range takes no lock"
        );
        assert_eq!(file.readahead_stats().present_skips, 8, "{insert:?}");
        handle.readahead(0, 32 * PAGE).unwrap();
        assert_eq!(file.mapping_stats().cached_pages, 32);
        assert_eq!(
            file.mapping_stats().lock_acquisitions - locks,
            locks_for_the_gaps,
            "{insert:?}: the gaps [0, 8), [16, 24) and [28, 32)"
        );
        assert_eq!(
            file.readahead_stats().present_skips,
            8 + 8 + 4,
            "{insert:?}"
        );
        assert_eq!(
            backend.requests()[2..],
            [(0, 8 * 4096), (16 * PAGE, 8 * 4096), (28 * PAGE, 4 * 4096)],
            "{insert:?}"
        );
    }
}

#[test]
fn random_reads_start_no_windows() {
    let cache = cache_with(Policy::default(), 16 << 20);
    let (file, backend) = open(&cache, 4096, 9);
    let mut handle = file.handle();
    let mut buf = vec![0u8; 100];
    let mut state = 12345u64;
    let mut pages = std::collections::BTreeSet::new();
    let mut last = u64::MAX - 1;
    while pages.len() < 200 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let page = 1 + (state >> 33) % 4000;
        if page.abs_diff(last) <= 1 || pages.contains(&page) {
            continue;
        }
        // Not next to a page read before either (a neighbour would be history).
        if pages.contains(&(page - 1)) {
            continue;
        }
        last = page;
        pages.insert(page);
        handle.read_at(&mut buf, page * PAGE + 7).unwrap();
        assert!(
            buf.iter()
                .enumerate()
                .all(|(k, &b)| b == byte_at(page * PAGE + 7 + k as u64))
        );
    }
    let stats = file.readahead_stats();
    assert_eq!(stats.windows, 0, "{stats:?}");
    assert_eq!(stats.sync_random, 200);
    assert_eq!(file.mapping_stats().cached_pages, 200);
    assert_eq!(backend.requests().len(), 200);
}

#[test]
fn random_advice_reads_exactly_the_request() {
    let cache = cache_with(Policy::default(), 16 << 20);
    let (file, _) = open(&cache, 256, 9);
    let mut handle = file.handle();
    handle.advise(Advice::Random).unwrap();
    let mut buf = vec![0u8; 3 * PAGE as usize];
    for start in [0, 3, 6, 9] {
        handle.read_at(&mut buf, start * PAGE).unwrap();
    }
    assert_eq!(file.mapping_stats().cached_pages, 12);
    assert_eq!(file.readahead_stats().windows, 0);
    assert_eq!(file.readahead_stats().forced, 4);
}

#[test]
fn two_interleaved_streams_on_one_handle_keep_reading_ahead() {
    let cache = cache_with(Policy::default(), 64 << 20);
    let pages = 8192;
    let (file, backend) = open(&cache, pages, 0);
    let mut handle = file.handle();
    let mut buf = vec![0u8; PAGE as usize];
    let streams = [0u64, 4096];
    let steps = 2000;
    for step in 0..steps {
        for &base in &streams {
            let page = base + step;
            assert_eq!(
                handle.read_at(&mut buf, page * PAGE).unwrap(),
                PAGE as usize
            );
            assert_eq!(buf[5], byte_at(page * PAGE + 5));
        }
    }
    let stats = file.readahead_stats();
    assert!(stats.async_recovered > 0, "{stats:?}");
    // Both streams are served by readahead: far fewer device requests than pages read.
    let requests = backend.requests().len() as u64;
    assert!(
        requests * 8 < 2 * steps,
        "{requests} requests for {} pages: {stats:?}",
        2 * steps
    );
}

#[test]
fn end_of_file_not_on_a_page_boundary() {
    let cache = cache_with(Policy::default(), 16 << 20);
    for size in [1u64, 4095, 4096, 4097, 10 * PAGE + 123, 77 * PAGE - 1] {
        let backend = Arc::new(MemBackend::new(pattern(size)));
        let file = cache.open_backend(backend, None).unwrap();
        assert_eq!(file.size(), size);
        let mut handle = file.handle();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 3000];
        let mut pos = 0;
        loop {
            let n = handle.read_at(&mut buf, pos).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            pos += n as u64;
        }
        assert_eq!(out, pattern(size), "size {size}");
        // A read across end of file is short; at or past it, empty.
        let mut big = vec![0u8; 8192];
        assert_eq!(handle.read_at(&mut big, size - 1).unwrap(), 1);
        assert_eq!(handle.read_at(&mut big, size).unwrap(), 0);
        assert_eq!(handle.read_at(&mut big, size + 5000).unwrap(), 0);
        // No mark is left past the last window (no mark at end of file).
        let mapping = foliocache::raw::mapping(&file);
        let last_page = (size - 1) / PAGE;
        assert!(
            (0..=last_page).all(|i| mapping.lookup(i).is_none_or(|f| !f.test(flag::READAHEAD)))
        );
        // The bytes past end of file in the last folio were zeroed, never the backend's.
        let folio = mapping.lookup(last_page).unwrap();
        let tail = (size - (folio.index() * PAGE)) as usize;
        assert!(folio.bytes().unwrap()[tail..].iter().all(|&b| b == 0));
    }
}

#[test]
fn read_errors_are_reported_and_retried() {
    let cache = cache_with(Policy::default(), 16 << 20);
    let (file, backend) = open(&cache, 64, 0);
    // Page 0's read fails twice: once in readahead, once when the reader retries it alone.
    backend.fail_page(0, 2);
    let mut handle = file.handle();
    let mut buf = vec![0u8; 100];
    let error = handle.read_at(&mut buf, 0).unwrap_err();
    assert!(matches!(error, Error::Io { offset: 0, .. }), "{error}");
    assert_eq!(file.io_stats().errors, 2);
    // The cache is consistent: page 0 is cached but not uptodate, and flagged.
    let folio = foliocache::raw::mapping(&file).lookup(0).unwrap();
    assert!(!folio.is_uptodate() && folio.test(flag::ERROR));
    drop(folio);
    // The next read tries again, and succeeds.
    assert_eq!(handle.read_at(&mut buf, 0).unwrap(), 100);
    assert!(buf.iter().enumerate().all(|(k, &b)| b == byte_at(k as u64)));
    assert!(
        !foliocache::raw::mapping(&file)
            .lookup(0)
            .unwrap()
            .test(flag::ERROR)
    );

    // A failure inside a longer read is an error, not a short count (a short count means end
    // of file): its offset says where the read stopped, and the bytes before it were read.
    backend.fail_page(40, u32::MAX);
    let mut buf = vec![0u8; 20 * PAGE as usize];
    let error = handle.read_at(&mut buf, 30 * PAGE).unwrap_err();
    assert!(
        matches!(error, Error::Io { offset, .. } if offset == 40 * PAGE),
        "{error}"
    );
    let got = (40 - 30) * PAGE as usize;
    assert!(
        buf[..got]
            .iter()
            .enumerate()
            .all(|(k, &b)| b == byte_at(30 * PAGE + k as u64))
    );
    assert!(handle.read_at(&mut buf, 40 * PAGE).is_err());
    // Other pages still read.
    assert_eq!(handle.read_at(&mut buf[..10], 41 * PAGE).unwrap(), 10);
}

#[test]
fn concurrent_readers_see_the_file_bytes() {
    let cache = cache_with(Policy::default(), 64 << 20);
    let size = 600 * PAGE + 77;
    let mut backend = MemBackend::new(pattern(size));
    backend.delay = Some(std::time::Duration::from_micros(200));
    let file = cache.open_backend(Arc::new(backend), None).unwrap();
    std::thread::scope(|scope| {
        for (t, chunk) in [(0usize, 4096usize), (1, 10_000), (2, 65_536), (3, 333)].into_iter() {
            let file = file.clone();
            scope.spawn(move || {
                let mut handle = file.handle();
                let mut buf = vec![0u8; chunk];
                let mut pos = (t as u64 * 12_345) % size;
                let mut seen = 0u64;
                while seen < size {
                    let n = handle.read_at(&mut buf, pos).unwrap();
                    for (k, &b) in buf[..n].iter().enumerate() {
                        assert_eq!(
                            b,
                            byte_at(pos + k as u64),
                            "thread {t} at {}",
                            pos + k as u64
                        );
                    }
                    seen += n.max(1) as u64;
                    pos = if n == 0 { 0 } else { pos + n as u64 };
                }
            });
        }
    });
}

#[test]
fn a_file_larger_than_the_cache_reads_through_eviction() {
    // 1 MiB of cache, a 6 MiB file, a 256 KiB window.
    let cache = Cache::builder()
        .capacity(1 << 20)
        .readahead_bytes(256 << 10)
        .build()
        .unwrap();
    for max_order in [0, 9] {
        let (file, _) = open(&cache, 1536, max_order);
        let mut handle = file.handle();
        let mut buf = vec![0u8; 8192];
        for pos in (0..1536 * PAGE).step_by(8192) {
            assert_eq!(handle.read_at(&mut buf, pos).unwrap(), 8192);
            assert!(
                buf.iter()
                    .enumerate()
                    .all(|(k, &b)| b == byte_at(pos + k as u64))
            );
        }
        let stats = cache.reclaim_stats();
        assert!(stats.evicted_pages >= 1024, "{stats:?}");
        assert!(file.mapping_stats().cached_pages <= 256);
    }
}

#[test]
fn dont_need_drops_idle_folios_and_will_need_reads_ahead() {
    let cache = cache_with(Policy::default(), 16 << 20);
    let (file, backend) = open(&cache, 512, 9);
    let mut handle = file.handle();
    handle
        .advise(Advice::WillNeed {
            offset: 0,
            len: 128 * PAGE,
        })
        .unwrap();
    assert_eq!(file.mapping_stats().cached_pages, 128);
    let before = backend.requests().len();
    let mut buf = vec![0u8; 64 * PAGE as usize];
    handle.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        backend.requests().len(),
        before,
        "the range was already read"
    );
    let held = foliocache::raw::mapping(&file).lookup(3).unwrap();
    handle
        .advise(Advice::DontNeed { offset: 0, len: 0 })
        .unwrap();
    // Everything went except the folio a reader still holds.
    assert_eq!(file.mapping_stats().cached_pages, 1);
    assert_eq!(
        file.drop_cached(0, 0),
        foliocache::DropReport {
            dropped_pages: 0,
            busy_pages: 1
        },
        "the held folio is reported busy"
    );
    drop(held);
    assert_eq!(file.drop_cached(0, 0).dropped_pages, 1);
}

#[test]
fn files_from_storage_are_read_only() {
    let cache = cache_with(Policy::default(), 16 << 20);
    let (file, _) = open(&cache, 4, 0);
    assert!(matches!(file.write_at(b"x", 0), Err(Error::ReadOnly)));
    assert!(matches!(file.set_len(0), Err(Error::ReadOnly)));
    let memory = cache.create_memory_file(0).unwrap();
    assert!(matches!(
        memory.handle().readahead(0, 10),
        Err(Error::NotADiskFile)
    ));
}

#[test]
fn a_request_holds_at_most_1024_folios() {
    // readv takes at most 1024 vectors: with 4 KiB folios, 64 MiB requests and an 8 MiB
    // window, a request would hold 2048 folios; readahead ends it at 1024.
    let cache = Cache::builder()
        .capacity(64 << 20)
        .max_order(0)
        .readahead_bytes(8 << 20)
        .io_request_bytes(64 << 20)
        .build()
        .unwrap();
    let backend = Arc::new(MemBackend::new(pattern(32 << 20)));
    let file = cache.open_backend(backend.clone(), None).unwrap();
    let mut handle = file.handle();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0;
    while pos < 32 << 20 {
        let n = handle.read_at(&mut buf, pos).unwrap();
        assert!(
            buf[..n]
                .iter()
                .enumerate()
                .all(|(k, &b)| b == byte_at(pos + k as u64))
        );
        pos += n as u64;
    }
    let largest = backend
        .requests()
        .iter()
        .map(|&(_, len)| len)
        .max()
        .unwrap();
    assert_eq!(largest, 1024 * PAGE as usize, "the largest request");
}

/// The cached page ranges (first, last) of `file`.
fn cached(file: &File) -> Vec<(u64, u64)> {
    file.cached_ranges()
        .iter()
        .map(|r| (r.first, r.first + r.pages - 1))
        .fold(Vec::new(), |mut out: Vec<(u64, u64)>, (a, b)| {
            match out.last_mut() {
                Some(last) if last.1 + 1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
            out
        })
}

#[test]
fn a_mark_inside_large_folios_recovers_as_linux_6_18_does() {
    // Measured with `fcache ra-diff` on Linux 6.18 (ext4, large folios, read_ahead_kb 8192):
    // a stream at 0, a second one at page 2048 that takes over the readahead state, then the
    // first stream's mark at page 4 (an order-2 folio). The kernel's page_cache_next_miss
    // starts its walk inside that folio, lags one slot, and finds the gap at 21, not 20.
    let cache = Cache::builder()
        .capacity(64 << 20)
        .readahead_bytes(8 << 20)
        .build()
        .unwrap();
    let (file, _) = open(&cache, 4096, 9);
    let mut handle = file.handle();
    let mut buf = vec![0u8; PAGE as usize];
    let mut steps = Vec::new();
    for page in [0, 1, 2048, 2049, 2050, 4] {
        handle.read_at(&mut buf, page * PAGE).unwrap();
        file.wait_for_io();
        steps.push(cached(&file));
    }
    assert_eq!(steps[1], [(0, 19)]);
    assert_eq!(steps[4], [(0, 19), (2048, 2067)]);
    assert_eq!(steps[5], [(0, 19), (21, 79), (2048, 2067)]);
    // The same lag walking back: 4 KiB reads 16 KiB apart leave pages 0-47 cached (the last
    // folio 44-47 of order 2); the miss at 48 looks back from 47, runs off the tree 3 slots
    // early and sizes its window from 45 pages of history: 48-93, not 48-144.
    let (file, _) = open(&cache, 4096, 9);
    let mut handle = file.handle();
    for k in 0..13 {
        handle.read_at(&mut buf, k * 4 * PAGE).unwrap();
    }
    file.wait_for_io();
    assert_eq!(cached(&file), [(0, 93)]);
}

/// Reads of at most `HIT_READ_MAX` bytes copy cached folios without references; what they
/// leave behind must be what the referenced path leaves: the bytes, the readahead state after
/// every read, the windows and marks, what is cached and each folio's visible flags
/// (REFERENCED and ACTIVE: reclaim's record of the accesses).
#[test]
fn the_hit_path_leaves_what_the_referenced_path_leaves() {
    use foliocache::SmallReadPolicy;
    // Sequential 4 KiB reads, reads that straddle pages at odd offsets, re-reads of cached
    // pages, a jump, a read continuing in the folio the last one ended in, one larger than
    // HIT_READ_MAX and one at the end of the file.
    let mut reads: Vec<(u64, usize)> = (0..40).map(|p| (p * PAGE, PAGE as usize)).collect();
    reads.extend([
        (3 * PAGE + 100, 6000),
        (3 * PAGE + 6100, 300),
        (7 * PAGE + 4000, 9000),
        (200 * PAGE, 4096),
        (201 * PAGE + 17, 5000),
        (2 * PAGE, 64),
        (2 * PAGE + 64, 64),
        (10 * PAGE + 1, foliocache::HIT_READ_MAX + 1),
        (40 * PAGE, 16 << 10),
        (255 * PAGE + 4000, 8192),
    ]);
    for max_order in [0u8, 2] {
        let mut seen = Vec::new();
        for small_read in [SmallReadPolicy::Optimistic, SmallReadPolicy::Refcounted] {
            let cache = cache_with(
                Policy {
                    small_read,
                    ..Policy::default()
                },
                16 << 20,
            );
            let (file, _) = open(&cache, 256, max_order);
            let mut handle = file.handle();
            let mut states = Vec::new();
            for &(pos, len) in &reads {
                let mut buf = vec![0u8; len];
                let n = handle.read_at(&mut buf, pos).unwrap();
                let want = len.min((256 * PAGE - pos) as usize);
                assert_eq!(n, want, "{small_read:?} read at {pos}");
                assert!(
                    buf[..n]
                        .iter()
                        .enumerate()
                        .all(|(k, &b)| b == byte_at(pos + k as u64)),
                    "{small_read:?} bytes at {pos}"
                );
                states.push(handle.ra_state());
            }
            let mapping = foliocache::raw::mapping(&file);
            let flags: Vec<_> = (0..256)
                .map(|i| mapping.lookup(i).map(|f| (f.index(), f.order(), f.flags())))
                .collect();
            let hits = file.mapping_stats().unreferenced_hits;
            let recent = file.mapping_stats().recent_hits;
            match small_read {
                SmallReadPolicy::Optimistic => {
                    assert!(hits > 20, "{hits} hits without a reference");
                    // Reads inside the folio the last one copied from start from it.
                    assert!(recent > 0, "{recent} from the recent folio");
                }
                SmallReadPolicy::Refcounted => assert_eq!((hits, recent), (0, 0)),
            }
            seen.push((states, file.readahead_stats(), cached(&file), flags));
        }
        assert_eq!(
            seen[0].0, seen[1].0,
            "readahead state, max order {max_order}"
        );
        assert_eq!(
            seen[0].1, seen[1].1,
            "readahead counters, max order {max_order}"
        );
        assert_eq!(seen[0].2, seen[1].2, "cached ranges, max order {max_order}");
        assert_eq!(seen[0].3, seen[1].3, "folio flags, max order {max_order}");
    }
}
