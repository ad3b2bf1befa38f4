//! loom models of eviction against the other users of a folio: a reader's speculative lookup,
//! and a removal by another path (`drop_cached`). Eviction isolates the folio from the list
//! (taking a reference), then freezes its count at the cache's reference plus its own; whoever
//! loses puts the folio back or leaves it. In every interleaving the folio is either still
//! cached and on exactly one list, or gone with its memory back in the allocator (never both,
//! never neither), and a reader that got it saw its bytes.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_reclaim`
#![cfg(loom)]

use foliocache::{Backend, Cache, File, ReadRequest};
use loom::thread;

/// Completes every read inline, filling each page with `page index + 1`.
#[derive(Debug, Default)]
struct InlineBackend;

impl Backend for InlineBackend {
    fn size(&self) -> u64 {
        4096
    }
    fn submit(&self, requests: Vec<ReadRequest>) {
        for mut request in requests {
            for (offset, bytes) in request.targets() {
                bytes.fill((offset / 4096 + 1) as u8);
            }
            let len = request.len();
            request.complete(Ok(len));
        }
    }
}

/// A cache of 4 pages and a one-page file whose page was read (it is on the inactive list).
fn setup() -> (Cache, File) {
    let cache = Cache::builder()
        .arena_pages(4)
        .max_order(0)
        .readahead_bytes(0)
        .build()
        .unwrap();
    let file = cache
        .open_backend(std::sync::Arc::new(InlineBackend), None)
        .unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(file.handle().read_at(&mut buf, 0).unwrap(), 8);
    assert_eq!(buf, [1u8; 8]);
    (cache, file)
}

/// The folio is cached and listed, or gone and freed: nothing in between.
fn check_consistent(cache: &Cache, file: &File) {
    let cached = foliocache::raw::mapping(file).lookup(0).is_some();
    let stats = cache.stats();
    let listed = cache.reclaim_stats();
    let cached_pages = u64::from(cached);
    assert_eq!(
        stats.free_pages + stats.pending_free_pages + cached_pages,
        4,
        "a page leaked or was freed twice: {stats:?}"
    );
    assert_eq!(
        listed.inactive_pages + listed.active_pages,
        cached_pages,
        "list sizes disagree with the index: {listed:?}"
    );
}

/// The model runner: the setup (a real read through the read path) takes more scheduling
/// branches than loom's default allows, though it runs on one thread, and more stack than loom
/// gives a model's first thread (the body runs on a thread with room, as in `loom_writeback`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let f = std::sync::Arc::new(f);
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 20_000;
    builder.check(move || {
        let f = std::sync::Arc::clone(&f);
        thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(move || f())
            .unwrap()
            .join()
            .unwrap();
    });
}

#[test]
fn eviction_races_a_readers_lookup() {
    model(|| {
        let (cache, file) = setup();
        let evictor = {
            let cache = cache.clone();
            thread::spawn(move || cache.evict(1))
        };
        if let Some(folio) = foliocache::raw::mapping(&file).lookup(0) {
            // A folio handed out is the file's page 0, with its bytes.
            assert_eq!(folio.bytes().map(|b| b[0]), Some(1));
        }
        let freed = evictor.join().unwrap();
        assert!(freed <= 1);
        check_consistent(&cache, &file);
    });
}

#[test]
fn eviction_races_drop_cached() {
    model(|| {
        let (cache, file) = setup();
        let evictor = {
            let cache = cache.clone();
            thread::spawn(move || cache.evict(1))
        };
        let dropped = file.drop_cached(0, 4096).dropped_pages;
        let evicted = evictor.join().unwrap();
        assert!(dropped + evicted <= 1, "removed twice");
        check_consistent(&cache, &file);
    });
}
