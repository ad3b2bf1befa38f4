//! Files opened from storage: O_DIRECT through io_uring and through the thread pool, and the
//! refusal (or explicit buffered fallback) on a file system without real direct I/O.

mod common;

use common::{byte_at, pattern};
use foliocache::{Cache, EngineKind, Error, IoMode, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

fn test_file(name: &str, size: u64) -> PathBuf {
    // Under target/, on the checkout's file system (a disk here, not tmpfs).
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&pattern(size)).unwrap();
    file.sync_all().unwrap();
    path
}

fn read_all(cache: &Cache, path: &PathBuf, chunk: usize) -> Vec<u8> {
    let file = cache.open(path).unwrap();
    let mut handle = file.handle();
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    let mut pos = 0;
    loop {
        let n = handle.read_at(&mut buf, pos).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        pos += n as u64;
    }
    out
}

#[test]
fn both_engines_read_a_file_with_o_direct() {
    let size = 3 * (1 << 20) + 5000;
    let path = test_file("disk-engines", size);
    for kind in [EngineKind::IoUring, EngineKind::Threads] {
        let cache = match Cache::builder().capacity(1 << 20).io_engine(kind).build() {
            Ok(cache) => cache,
            Err(error) => panic!("{error}"),
        };
        let probe = match cache.open(&path) {
            Ok(file) => file,
            Err(Error::NoDirectIo { .. }) => {
                common::skip("the target directory's file system has no direct I/O");
                return;
            }
            Err(Error::Engine(error)) if kind == EngineKind::IoUring => {
                common::skip(&format!("no io_uring here ({error})"));
                continue;
            }
            Err(error) => panic!("{error}"),
        };
        assert!(probe.backend_description().unwrap().starts_with("O_DIRECT"));
        drop(probe);
        // Odd chunk sizes: unaligned user buffers and offsets are the cache's business.
        for chunk in [8192, 1000, 70_000] {
            let out = read_all(&cache, &path, chunk);
            assert_eq!(out.len() as u64, size);
            assert!(
                out.iter().enumerate().all(|(k, &b)| b == byte_at(k as u64)),
                "{kind:?} {chunk}"
            );
        }
        // 1 MiB of cache for a 3 MiB file: eviction ran.
        assert!(cache.reclaim_stats().evicted_pages > 0);
        let engine = cache.io_engine().unwrap();
        match kind {
            EngineKind::IoUring => assert_eq!(engine, "io_uring"),
            _ => assert!(engine.starts_with("threads")),
        }
    }
}

#[test]
fn tmpfs_is_refused_unless_buffered_is_asked_for() {
    let dir = PathBuf::from("/dev/shm");
    if !dir.is_dir() {
        common::skip("no /dev/shm");
        return;
    }
    let path = dir.join(format!("foliocache-test-{}", std::process::id()));
    std::fs::write(&path, pattern(50_000)).unwrap();
    let cache = Cache::builder().capacity(1 << 20).build().unwrap();
    let error = cache.open(&path).unwrap_err();
    assert!(matches!(error, Error::NoDirectIo { .. }), "{error}");
    assert!(error.to_string().contains("buffered_fallback"));
    let file = cache
        .open_with(&path, OpenOptions::new().buffered_fallback(true))
        .unwrap();
    assert!(file.backend_description().unwrap().starts_with("buffered"));
    let mut buf = vec![0u8; 50_000];
    assert_eq!(file.handle().read_at(&mut buf, 0).unwrap(), 50_000);
    assert_eq!(buf, pattern(50_000));
    let _ = IoMode::Buffered;
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn opening_a_missing_file_or_a_directory_is_a_clear_error() {
    let cache = Cache::builder().capacity(1 << 20).build().unwrap();
    let error = cache.open("/nonexistent/foliocache").unwrap_err();
    assert!(matches!(error, Error::Open { .. }), "{error}");
    let error = cache.open(env!("CARGO_TARGET_TMPDIR")).unwrap_err();
    assert!(error.to_string().contains("could not open"), "{error}");
}

/// A device probe's result, or `None` (the test skipped) where the target directory's file
/// system has no direct I/O or the machine no io_uring.
fn direct_or_skip<T>(result: Result<T, Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(Error::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
            common::skip("the target directory's file system has no direct I/O");
            None
        }
        Err(Error::Engine(error)) => {
            common::skip(&format!("no io_uring here ({error})"));
            None
        }
        Err(error) => panic!("{error}"),
    }
}

#[test]
fn the_device_probe_reads_every_byte_into_each_kind_of_buffer() {
    use foliocache::raw::probe::{Buffers, Probe, concurrent_read, sequential_read};
    // Not a multiple of the block: the last read is short (O_DIRECT stops at end of file).
    let size = 5 * (128 << 10) + 3 * 4096;
    let path = test_file("disk-probe", size);
    for buffers in [Buffers::Keep, Buffers::Reused, Buffers::ReusedSmallPages] {
        let Some(read) = direct_or_skip(sequential_read(
            &[path.as_path(), path.as_path()],
            128 << 10,
            4,
            buffers,
        )) else {
            return;
        };
        assert_eq!(read.bytes, 2 * size, "{buffers:?}");
        let groups = vec![vec![path.as_path()], vec![path.as_path()]];
        let together = concurrent_read(&groups, 128 << 10, 2, buffers).unwrap();
        assert_eq!(together.bytes, 2 * size, "{buffers:?}, two threads");
    }
    for (block, depth) in [(0, 4), (1000, 4), (4096, 0), (4096, 5000)] {
        let error = Probe::prepare(&[path.as_path()], block, depth, Buffers::Keep).unwrap_err();
        assert!(error.to_string().contains("block"), "{error}");
    }
}

#[test]
fn a_direct_stream_serves_every_byte_in_any_record_size_and_order() {
    use foliocache::raw::probe::DirectStream;
    // Not a multiple of the block: the last request is short.
    let size = 9 * (64 << 10) + 3 * 4096 + 100;
    let path = test_file("disk-stream", size);
    // `n`: the depth, or with `windowed` the window in blocks (reading ahead as the kernel).
    for (block, n, windowed, record) in [
        (64 << 10, 4, false, 8192),
        (4096, 1, false, 1000),
        (1 << 20, 8, false, 70_000),
        (64 << 10, 2, true, 8192),
        (4096, 1, true, 1000),
        (64 << 10, 3, true, 70_000),
        (4096, 2, true, 300_000),
    ] {
        let prepared = if windowed {
            DirectStream::prepare_windowed(&path, block, block * n)
        } else {
            DirectStream::prepare(&path, block, n)
        };
        let Some(mut stream) = direct_or_skip(prepared) else {
            return;
        };
        assert_eq!(stream.size(), size);
        let mut buf = vec![0u8; record];
        let mut at = 0u64;
        loop {
            let n = stream.read_at(&mut buf, at).unwrap();
            if n == 0 {
                break;
            }
            assert!(
                buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == byte_at(at + k as u64)),
                "block {block}, record {record}, at {at}"
            );
            at += n as u64;
        }
        assert_eq!(at, size, "block {block}, record {record}");
        // Backwards, after the whole file has arrived, and from the middle of a block.
        let n = stream.read_at(&mut buf[..5], 70_001).unwrap();
        assert_eq!(n, 5);
        assert!((0..5).all(|k| buf[k] == byte_at(70_001 + k as u64)));
        assert_eq!(stream.read_at(&mut buf, size).unwrap(), 0);
    }
    // A windowed stream issues the reader's window and the next one, no further.
    let (block, window) = (64 << 10, 2 * (64 << 10));
    if let Some(mut stream) = direct_or_skip(DirectStream::prepare_windowed(&path, block, window)) {
        let mut buf = vec![0u8; 8192];
        let mut at = 0u64;
        while at < size {
            let n = stream.read_at(&mut buf, at).unwrap() as u64;
            let ahead = (at / window as u64 + 2) * window as u64;
            assert_eq!(stream.requested(), ahead.min(size), "at {at}");
            at += n;
        }
    }
    // Far ahead first: the reader waits for every block up to the one it asked for.
    let mut stream = DirectStream::prepare(&path, 64 << 10, 2).unwrap();
    let mut buf = vec![0u8; 300];
    let at = size - 300;
    assert_eq!(stream.read_at(&mut buf, at).unwrap(), 300);
    assert!((0..300).all(|k| buf[k] == byte_at(at + k as u64)));
    for (block, depth) in [(0, 4), (1000, 4), (4096, 0), (4096, 5000)] {
        let error = DirectStream::prepare(&path, block, depth).unwrap_err();
        assert!(error.to_string().contains("block"), "{error}");
    }
    for (block, window) in [
        (0, 4096),
        (4096, 0),
        (4096, 6000),
        (8192, 4096),
        (4096, 4096 * 4096),
    ] {
        let error = DirectStream::prepare_windowed(&path, block, window).unwrap_err();
        assert!(error.to_string().contains("window"), "{error}");
    }
}

#[test]
fn a_readers_small_misses_are_read_in_its_own_thread_and_windows_by_the_engine() {
    let size = 8 << 20;
    let path = test_file("disk-by-caller", size);
    for (kind, cache, file) in common::per_engine(
        |kind| {
            Cache::builder()
                .capacity(32 << 20)
                .io_engine(kind)
                .readahead_bytes(2 << 20)
                .build()
                .unwrap()
        },
        &path,
    ) {
        // Random 4 KiB misses: each is one small request the reader waits for.
        let mut handle = file.handle();
        handle.advise(foliocache::Advice::Random).unwrap();
        let mut buf = vec![0u8; 4096];
        for k in 0..64u64 {
            let pos = (k * 7919 % 2048) * 4096;
            assert_eq!(handle.read_at(&mut buf, pos).unwrap(), 4096);
            assert!(
                buf.iter()
                    .enumerate()
                    .all(|(i, &b)| b == byte_at(pos + i as u64))
            );
        }
        let io = file.io_stats();
        assert!(io.requests >= 1, "{kind:?}");
        assert_eq!(io.by_caller, io.requests, "{kind:?}: {io:?}");
        // A sequential read: its windows grow past one request and go to the engine.
        let out = read_all(&cache, &path, 1 << 20);
        assert_eq!(out, pattern(size), "{kind:?}");
        let io = file.io_stats();
        assert!(io.by_caller < io.requests, "{kind:?}: {io:?}");
    }
}

#[test]
fn the_arena_is_populated_ahead_of_the_allocator_unless_turned_off() {
    let size = 16 << 20;
    let path = test_file("disk-populate", size);
    for populate in [true, false] {
        let cache = Cache::builder()
            .capacity(64 << 20)
            .populate_ahead(populate)
            .build()
            .unwrap();
        let file = match cache.open(&path) {
            Ok(file) => file,
            Err(Error::NoDirectIo { .. }) => {
                common::skip("the target directory's file system has no direct I/O");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        drop(file);
        assert_eq!(read_all(&cache, &path, 1 << 20), pattern(size));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while populate
            && cache.stats().populated_ahead_bytes == 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let populated = cache.stats().populated_ahead_bytes;
        if populate {
            assert!(populated > 0, "nothing was populated ahead");
            assert!(populated <= cache.stats().total_pages * 4096 + (2 << 20));
        } else {
            assert_eq!(populated, 0);
        }
    }
}

/// The probes refuse a block larger than one request can carry (an io_uring entry's length is
/// 32 bits) before they open anything, as they refuse one that is not a multiple of 4096.
#[test]
fn probes_refuse_blocks_one_request_cannot_carry() {
    use foliocache::raw::probe::{self, DirectStream, MAX_BLOCK};
    let nowhere = PathBuf::from("/nonexistent/foliocache-probe");
    let refused = |result: Result<(), Error>| matches!(result, Err(Error::Engine(e)) if e.kind() == std::io::ErrorKind::InvalidInput);
    for block in [MAX_BLOCK + 4096, 4 << 30, 4095, 0] {
        assert!(
            refused(DirectStream::prepare(&nowhere, block, 1).map(drop)),
            "DirectStream took a block of {block}"
        );
        assert!(
            refused(probe::write_blocks(&nowhere, &[0], block, 1, 0).map(drop)),
            "write_blocks took a block of {block}"
        );
    }
}

/// With `place_by_offset`, a random reader's 4 KiB fills are placed by their offset in the
/// file: the folios of pages `i` and `j` of one 64 KiB region lie `j - i` pages apart in the
/// arena, whatever order they were read in (`mem/place.rs`). When memory runs out the regions
/// give their unused pages back before anything is evicted, and every read still returns the
/// file's bytes. Without the option nothing is set aside.
#[test]
fn a_random_readers_pages_are_placed_by_offset_and_given_back_under_pressure() {
    let size = 16u64 << 20;
    let path = test_file("disk-placed", size);
    let expected = pattern(size);
    let read = |handle: &mut foliocache::Handle, buf: &mut [u8], page: u64| {
        let n = handle.read_at(buf, page << 12).unwrap();
        assert_eq!(n, 4096);
        assert!(
            buf == &expected[(page << 12) as usize..][..4096],
            "page {page}"
        );
    };
    let pages = [9u64, 3, 15, 4, 0, 12];
    for place in [false, true] {
        // 8 MiB: half the file, so that reading all of it presses on memory.
        let builder = Cache::builder().capacity(8 << 20).place_by_offset(place);
        let Some(cache) = direct_or_skip(builder.build()) else {
            return;
        };
        let Some(file) = direct_or_skip(cache.open(&path)) else {
            return;
        };
        let mut handle = file.handle();
        handle.advise(foliocache::Advice::Random).unwrap();
        let mut buf = vec![0u8; 4096];
        // Pages of the first region, out of order.
        for page in pages {
            read(&mut handle, &mut buf, page);
        }
        let held = cache.stats().placed_unused_pages;
        if !place {
            assert_eq!(held, 0, "nothing set aside without the option");
            continue;
        }
        let view = foliocache::raw::mapping(&file);
        let pfn = |page: u64| view.lookup(page).expect("cached").id();
        let base = pfn(0);
        assert_eq!(base % 16, 0, "the region's block is naturally aligned");
        for page in pages {
            assert_eq!(pfn(page), base + page as u32, "page {page} at its offset");
        }
        assert_eq!(held, 16 - 6, "the region's other pages wait for the file");
        // Pages of the whole file at random: far more than the cache holds.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            read(&mut handle, &mut buf, x % (size >> 12));
        }
        // Eviction frees a few dozen pages at a time, never the quarter of the arena a new
        // region needs: once given back, no region holds pages again.
        let stats = cache.stats();
        assert_eq!(
            stats.placed_unused_pages, 0,
            "the regions gave their unused pages back: {stats:?}"
        );
    }
}

/// A dense random reader without advice: its random reads meet cached neighbours and turn
/// into readahead windows (as the kernel's do), whose pages are not placed. Their places in
/// the regions come back to the allocator as those windows are filled, so once every page is
/// cached no region holds a page unused (`mem/place.rs`): the data takes no more of the arena
/// than without placement.
#[test]
fn places_of_pages_read_by_windows_are_given_back() {
    let size = 4u64 << 20;
    let pages = size >> 12;
    let path = test_file("disk-placed-windows", size);
    let expected = pattern(size);
    let builder = Cache::builder().capacity(32 << 20).place_by_offset(true);
    let Some(cache) = direct_or_skip(builder.build()) else {
        return;
    };
    let Some(file) = direct_or_skip(cache.open(&path)) else {
        return;
    };
    let mut handle = file.handle();
    // Every page once, in a shuffled order (Fisher-Yates on a xorshift).
    let mut order: Vec<u64> = (0..pages).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut buf = vec![0u8; 4096];
    for page in order {
        assert_eq!(handle.read_at(&mut buf, page << 12).unwrap(), 4096);
        assert!(
            buf == expected[(page << 12) as usize..][..4096],
            "page {page}"
        );
    }
    // Not vacuous: some pages were filled outside their regions. A region's place for page
    // `p` is its block's first page plus `p % 16`; the block is where most of its pages are.
    let view = foliocache::raw::mapping(&file);
    let mut elsewhere = 0;
    for region in 0..pages / 16 {
        let bases: Vec<u32> = (0..16u64)
            .map(|k| {
                let page = region * 16 + k;
                let folio = view.lookup(page).expect("cached");
                let pfn = folio.id() + (page - folio.index()) as u32;
                pfn.wrapping_sub(k as u32)
            })
            .collect();
        let most = bases
            .iter()
            .max_by_key(|b| bases.iter().filter(|c| c == b).count())
            .copied()
            .unwrap();
        elsewhere += bases.iter().filter(|&&b| b != most).count();
    }
    assert!(
        elsewhere > 0,
        "no page was read by a window outside its region"
    );
    let stats = cache.stats();
    assert_eq!(
        stats.placed_unused_pages, 0,
        "{elsewhere} pages filled elsewhere; the regions hold unused places: {stats:?}"
    );
}
