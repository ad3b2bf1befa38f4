//! loom models of the optimistic small read (no reference taken) against removal with reuse
//! and against truncation with reuse, on real memory files.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom_optimistic`
//!
//! File A's page 0 holds 0xAA; the writer frees that page (punch or truncate) and at once
//! writes file B, whose new folio is very likely the very page A gave back, filled with 0xBB.
//! Whatever the interleaving, a reader of A must get A's bytes, zeros (the hole) or a short
//! read (past end of file): never B's bytes, never a mix.
#![cfg(loom)]

use foliocache::{Cache, Policy, SmallReadPolicy};
use loom::sync::Arc;
use loom::thread;

fn setup() -> (Cache, Arc<foliocache::File>, Arc<foliocache::File>) {
    let cache = Cache::builder()
        .arena_pages(4)
        .max_order(0)
        .policy(Policy {
            small_read: SmallReadPolicy::Optimistic,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let a = cache.create_memory_file(0).unwrap();
    let b = cache.create_memory_file(0).unwrap();
    a.write_at(&[0xAA; 4096], 0).unwrap();
    (cache, Arc::new(a), Arc::new(b))
}

fn reader(a: Arc<foliocache::File>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut handle = a.handle();
        let mut buf = [0x11u8; 64];
        let n = handle.read_at(&mut buf, 100).unwrap();
        let got = &buf[..n];
        assert!(
            got.iter().all(|&b| b == 0xAA) || got.iter().all(|&b| b == 0),
            "read {got:x?}"
        );
    })
}

#[test]
fn optimistic_read_vs_punch_and_reuse() {
    loom::model(|| {
        let (_cache, a, b) = setup();
        let r = reader(a.clone());
        a.punch_hole(0, 4096).unwrap();
        b.write_at(&[0xBB; 4096], 0).unwrap();
        r.join().unwrap();
    });
}

#[test]
fn optimistic_read_vs_truncate_and_reuse() {
    loom::model(|| {
        let (_cache, a, b) = setup();
        let r = reader(a.clone());
        a.set_len(0).unwrap();
        b.write_at(&[0xBB; 4096], 0).unwrap();
        r.join().unwrap();
    });
}

/// A batched read of two pages while page 0 is punched: page 0 may read as old data or zeros,
/// but page 1, untouched, must always read as data. (A retry that found page 0 gone once left
/// the batch empty with no gap measured, and the read zero-filled everything after it.)
#[test]
fn batched_read_vs_punch_keeps_untouched_pages() {
    loom::model(|| {
        let cache = Cache::builder()
            .arena_pages(4)
            .max_order(0)
            .build()
            .unwrap();
        let file = Arc::new(cache.create_memory_file(0).unwrap());
        file.write_at(&[0xAA; 2 * 4096], 0).unwrap();
        let reader = {
            let file = file.clone();
            thread::spawn(move || {
                let mut handle = file.handle();
                let mut buf = vec![0x11u8; 2 * 4096];
                assert_eq!(handle.read_at(&mut buf, 0).unwrap(), 2 * 4096);
                let (page0, page1) = buf.split_at(4096);
                assert!(page0.iter().all(|&b| b == 0xAA) || page0.iter().all(|&b| b == 0));
                assert!(
                    page1.iter().all(|&b| b == 0xAA),
                    "untouched page 1 read as zeros"
                );
            })
        };
        file.punch_hole(0, 4096).unwrap();
        reader.join().unwrap();
    });
}

/// A write to a memory file swaps a copy of the page in (uptodate folios are never written in
/// place). A referenced read that finds the old folio gone from the file by the time it locks
/// it must look again, not read a hole: bytes the write did not touch are always the data.
/// (The per-folio loop once read such a page as zeros.)
fn read_vs_copy_on_write(read: foliocache::ReadPolicy) {
    loom::model(move || {
        let cache = Cache::builder()
            .arena_pages(4)
            .max_order(0)
            .policy(Policy {
                read,
                small_read: SmallReadPolicy::Refcounted,
                ..Policy::default()
            })
            .build()
            .unwrap();
        let file = Arc::new(cache.create_memory_file(0).unwrap());
        file.write_at(&[0xAA; 4096], 0).unwrap();
        let reader = {
            let file = file.clone();
            thread::spawn(move || {
                let mut handle = file.handle();
                let mut buf = vec![0x11u8; 512];
                assert_eq!(handle.read_at(&mut buf, 1024).unwrap(), 512);
                assert!(
                    buf.iter().all(|&b| b == 0xAA),
                    "bytes the write did not touch read as {:x?}",
                    &buf[..8]
                );
            })
        };
        file.write_at(&[0xBB; 100], 0).unwrap();
        reader.join().unwrap();
    });
}

#[test]
fn per_folio_read_vs_copy_on_write_never_reads_a_hole() {
    read_vs_copy_on_write(foliocache::ReadPolicy::PerFolio);
}

#[test]
fn batched_read_vs_copy_on_write_never_reads_a_hole() {
    read_vs_copy_on_write(foliocache::ReadPolicy::Batched);
}

/// A reader's second small read starts from the folio its first one copied from (the handle's
/// recent folio), which it did not find in the index under this read's pin. Meanwhile page 0
/// of A is punched and its block taken again: by file B (`foreign`), filled with 0xBB, or by A
/// itself at the same page, filled with 0xCC (a new life of the same block at the same place,
/// which only its `seq` tells from the old one). The second read must get A's old bytes, zeros
/// or A's new bytes: never B's, never a mix.
fn recent_folio_vs_reuse(foreign: bool) {
    loom::model(move || {
        let (_cache, a, b) = setup();
        let mut handle = a.handle();
        let mut buf = [0x11u8; 64];
        assert_eq!(handle.read_at(&mut buf, 100).unwrap(), 64);
        assert!(buf.iter().all(|&b| b == 0xAA));
        let r = thread::spawn(move || {
            let mut buf = [0x11u8; 64];
            let n = handle.read_at(&mut buf, 200).unwrap();
            let got = &buf[..n];
            assert!(
                [0xAA, 0, 0xCC].iter().any(|&v| got.iter().all(|&b| b == v)),
                "read {got:x?}"
            );
        });
        a.punch_hole(0, 4096).unwrap();
        if foreign {
            b.write_at(&[0xBB; 4096], 0).unwrap();
        } else {
            a.write_at(&[0xCC; 4096], 0).unwrap();
        }
        r.join().unwrap();
    });
}

#[test]
fn optimistic_read_from_the_recent_folio_vs_reuse_by_another_file() {
    recent_folio_vs_reuse(true);
}

#[test]
fn optimistic_read_from_the_recent_folio_vs_reuse_at_the_same_page() {
    recent_folio_vs_reuse(false);
}
