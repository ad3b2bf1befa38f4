//! loom models of the dirty/writeback flag protocol against eviction and truncation.
//!
//! DIRTY and WRITEBACK change only under the mapping's writer lock, together with the Dirty
//! and Writeback marks: a write swaps in a dirty copy (`replace_dirty`), writeback takes a
//! dirty folio (`start_writeback`) and releases it (`end_writeback`), eviction refuses dirty
//! and written-back folios under the same lock (`remove_folio`), and truncation of a file
//! from storage keeps folios under writeback. In every interleaving: dirty data is never
//! dropped without having been written, a folio under writeback is never removed, flags and
//! marks agree once everyone is done, and no memory leaks.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_writeback`
#![cfg(loom)]

use foliocache::Cache;
use foliocache::raw::{self, Mark, RemoveError, flag};
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::thread;
use std::sync::Arc;

const NONE: u32 = u32::MAX;

/// loom's model, the body on a thread with room on its stack for the write path's frames
/// (loom's default stacks are small).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let f = Arc::new(f);
    let mut builder = loom::model::Builder::new();
    // Three threads with lock-heavy steps: two preemptions explore them in seconds, three
    // take about seven minutes (LOOM_WRITEBACK_PREEMPTIONS=3 asks for that).
    builder.preemption_bound = Some(
        std::env::var("LOOM_WRITEBACK_PREEMPTIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    );
    builder.check(move || {
        let f = Arc::clone(&f);
        thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(move || f())
            .unwrap()
            .join()
            .unwrap();
    });
}

/// A thread with room on its stack.
fn spawn(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
}

fn cache() -> Cache {
    Cache::builder()
        .arena_pages(4)
        .max_order(0)
        .build()
        .unwrap()
}

/// A clean, uptodate folio at page 0.
fn clean_page(cache: &Cache, mapping: &raw::Mapping) -> u32 {
    let (locked, _) = mapping
        .add_folio(raw::alloc_folio(cache, 0).unwrap(), 0)
        .unwrap();
    locked.end_read(true).id()
}

/// A new, filled folio holding the write.
fn written(cache: &Cache) -> raw::NewFolio<'_> {
    let mut folio = raw::alloc_folio(cache, 0).unwrap();
    folio.bytes_mut().fill(9);
    folio.mark_uptodate();
    folio
}

/// Flags and marks agree (nobody holds the lock), and the page holds what it should.
fn check_page(mapping: &raw::Mapping) {
    if let Some(folio) = mapping.lookup(0) {
        assert_eq!(
            folio.is_dirty(),
            mapping.has_mark(0, Mark::Dirty),
            "DIRTY vs mark"
        );
        assert_eq!(
            folio.is_writeback(),
            mapping.has_mark(0, Mark::Writeback),
            "WRITEBACK vs mark"
        );
        assert!(!folio.is_writeback(), "writeback left running");
        assert!(!mapping.has_mark(0, Mark::ToWrite));
    }
}

/// A write (copy on write of the clean page, or a new dirty page if eviction took it), a
/// writeback of whatever is dirty, and an eviction, all at once. The written bytes are never
/// lost: at the end they are either in the cache, or were written back before eviction took
/// them.
#[test]
fn write_writeback_and_eviction() {
    model(|| {
        let cache = cache();
        let mapping = Arc::new(raw::new_mapping(&cache));
        let _original = clean_page(&cache, &mapping);
        let written_id = Arc::new(AtomicU32::new(NONE));
        let wrote_back = Arc::new(AtomicU32::new(NONE));
        let evicted = Arc::new(AtomicU32::new(NONE));
        let writer = {
            let (cache, mapping, written_id) =
                (cache.clone(), Arc::clone(&mapping), Arc::clone(&written_id));
            spawn(move || {
                let new = written(&cache);
                let id = new.id();
                let done = match mapping.lookup(0) {
                    Some(old) => mapping.replace_dirty(&old, new).is_ok(),
                    None => mapping.add_dirty_folio(new, 0).is_ok(),
                };
                if done {
                    written_id.store(id, Ordering::SeqCst);
                } else {
                    // Evicted between the lookup and the swap: the page is empty now.
                    let new = written(&cache);
                    let id = new.id();
                    if mapping.add_dirty_folio(new, 0).is_ok() {
                        written_id.store(id, Ordering::SeqCst);
                    }
                }
            })
        };
        let flusher = {
            let (mapping, wrote_back) = (Arc::clone(&mapping), Arc::clone(&wrote_back));
            spawn(move || {
                let (folios, _) = mapping.start_writeback(0, 0, Mark::Dirty, 1);
                for folio in folios {
                    assert!(folio.is_writeback() && !folio.is_dirty());
                    wrote_back.store(folio.id(), Ordering::SeqCst);
                    mapping.end_writeback(&folio, false);
                }
            })
        };
        {
            if let Some(folio) = mapping.lookup(0) {
                let id = folio.id();
                let clean = !folio.is_dirty();
                match mapping.remove_folio(folio, None) {
                    Ok(()) => evicted.store(id, Ordering::SeqCst),
                    Err(RemoveError::Dirty(_) | RemoveError::Busy(_)) => {}
                    Err(RemoveError::NotInMapping(_)) => {}
                    Err(other) => panic!("{other:?}"),
                }
                let _ = clean;
            }
        }
        writer.join().unwrap();
        flusher.join().unwrap();
        assert_ne!(written_id.load(Ordering::SeqCst), NONE, "the write went in");
        // Folio ids are reused (a four-page arena), so judge by contents: the page holds the
        // written bytes, or it was evicted, which only a written-back folio can be.
        match mapping.lookup(0) {
            Some(folio) => {
                assert!(
                    folio.bytes().is_some_and(|b| b[0] == 9),
                    "the page lost the write"
                );
                assert!(folio.is_dirty() || wrote_back.load(Ordering::SeqCst) != NONE);
            }
            None => {
                assert_ne!(evicted.load(Ordering::SeqCst), NONE);
                assert_ne!(
                    wrote_back.load(Ordering::SeqCst),
                    NONE,
                    "dirty data evicted without being written back"
                );
            }
        }
        check_page(&mapping);
        drop(mapping);
        raw::drain_cpu_caches(&cache);
        assert_eq!(cache.stats().free_pages, 4, "a folio leaked");
    });
}

/// A writeback in flight and a truncation of a file from storage (which keeps folios under
/// writeback; dirty ones it drops with their data, as the kernel's truncation does): the
/// folio is never removed while under writeback, and its end finds it in the index.
#[test]
fn writeback_against_truncation() {
    model(|| {
        let cache = cache();
        let mapping = Arc::new(raw::new_mapping(&cache));
        clean_page(&cache, &mapping);
        let old = mapping.lookup(0).unwrap();
        mapping.replace_dirty(&old, written(&cache)).unwrap();
        drop(old);
        let flusher = {
            let mapping = Arc::clone(&mapping);
            spawn(move || {
                let (folios, _) = mapping.start_writeback(0, 0, Mark::Dirty, 1);
                for folio in folios {
                    assert!(
                        folio.mapping_id() != 0,
                        "under writeback, yet not in the file"
                    );
                    mapping.end_writeback(&folio, false);
                }
            })
        };
        mapping.truncate_unless(.., |flags| flags & flag::WRITEBACK != 0);
        flusher.join().unwrap();
        check_page(&mapping);
        drop(mapping);
        raw::drain_cpu_caches(&cache);
        assert_eq!(cache.stats().free_pages, 4, "a folio leaked");
    });
}

/// A write and a writeback of the same page at once: the write waits for a folio under
/// writeback (`FolioWriteback`), so a folio's bytes never change while they go to storage,
/// and the new bytes are either still dirty after the writeback ends (the redirty is not
/// lost) or were what the writeback wrote.
#[test]
fn a_write_during_writeback_stays_dirty() {
    model(|| {
        let cache = cache();
        let mapping = Arc::new(raw::new_mapping(&cache));
        clean_page(&cache, &mapping);
        let old = mapping.lookup(0).unwrap();
        mapping.replace_dirty(&old, written(&cache)).unwrap();
        drop(old);
        let wrote_back = Arc::new(AtomicU32::new(NONE));
        let flusher = {
            let (mapping, wrote_back) = (Arc::clone(&mapping), Arc::clone(&wrote_back));
            spawn(move || {
                let (folios, _) = mapping.start_writeback(0, 0, Mark::Dirty, 1);
                for folio in folios {
                    wrote_back.store(folio.id(), Ordering::SeqCst);
                    mapping.end_writeback(&folio, false);
                }
            })
        };
        let mut new_id = NONE;
        for _ in 0..3 {
            let current = mapping.lookup(0).unwrap();
            let new = written(&cache);
            let id = new.id();
            match mapping.replace_dirty(&current, new) {
                Ok(_) => {
                    new_id = id;
                    break;
                }
                Err(foliocache::Error::FolioWriteback { .. }) => {
                    current.wait_writeback();
                }
                Err(other) => panic!("{other}"),
            }
        }
        flusher.join().unwrap();
        if new_id == NONE {
            // Three tries all met writeback: impossible, there is only one.
            panic!("the write never went in");
        }
        let now = mapping.lookup(0).unwrap();
        assert_eq!(now.id(), new_id);
        // Written during (or after) the first folio's writeback, the new bytes are still dirty,
        // unless the writeback took them (it started after the write).
        assert!(
            now.is_dirty() || wrote_back.load(Ordering::SeqCst) == new_id,
            "the second write's bytes were neither kept dirty nor written"
        );
        drop(now);
        check_page(&mapping);
        drop(mapping);
        raw::drain_cpu_caches(&cache);
        assert_eq!(cache.stats().free_pages, 4, "a folio leaked");
    });
}
