//! The shared core of one cache: its memory, policies, reclaim state, I/O engine and tunables.
//!
//! Everything that works on files (reads, readahead, faults, writes) reaches the cache through
//! this one value, held by every file in an `Arc`; the public [`Cache`](crate::Cache) is a thin
//! front over it. It sits below the modules that use it, so dependencies point downward:
//! `cache` → `file` → `read`/`readahead`/`fault` → `inode` → `core` → `reclaim`/`io`/`mapping`
//! → `mem`/`index`.

use crate::dirty::Dirty;
use crate::error::Error;
use crate::io::{Engine, EngineKind};
use crate::mem::{Memory, NewFolio};
use crate::policy::Policy;
use crate::reclaim::Reclaim;
use std::sync::{Arc, OnceLock};

/// The shared core of a cache (see the module documentation).
#[derive(Debug)]
pub(crate) struct CacheCore {
    pub(crate) mem: Arc<Memory>,
    pub(crate) policy: Policy,
    /// The memory budget in bytes (see `CacheBuilder::capacity`).
    pub(crate) capacity: u64,
    pub(crate) reclaim: Reclaim,
    /// Dirty memory: its counts, the flusher, the throttling of writers.
    pub(crate) dirty: Dirty,
    pub(crate) engine_kind: EngineKind,
    /// Started on the first file opened from storage.
    pub(crate) engine: OnceLock<Arc<Engine>>,
    /// Default maximum readahead window, in pages.
    pub(crate) ra_pages: u64,
    /// The device's largest useful request, in pages.
    pub(crate) io_pages: u64,
    /// The largest single read readahead submits, in bytes.
    pub(crate) request_bytes: usize,
}

/// Pages one eviction pass tries to free at least (so a stream does not evict page by page).
const EVICT_BATCH_PAGES: u64 = 64;

/// A readahead window that finds the arena dry evicts what it still needs in one pass, up to
/// this share of the arena (1/32). Evicted memory comes back after a grace period, and ending
/// one is a process-wide barrier in asymmetric mode (`membarrier`, see `mem::epoch`): paid
/// once per window, not once per [`EVICT_BATCH_PAGES`] (readseq's over-capacity case,
/// docs/BENCHMARKS.md, "Eviction and the grace period's barrier").
const EVICT_WINDOW_SHARE: u64 = 32;

/// Free pages beyond this share of the arena (1/64) are used in 4 KiB folios before anything
/// is evicted to make a block for a large one (see [`CacheCore::free_pages_apart`]). Below it,
/// a large folio still evicts for its block, so a cache under pressure keeps its large folios
/// where evictions free runs (the default policy's scans).
const FREE_APART_SHARE: usize = 64;

impl CacheCore {
    /// The I/O engine, started on first use.
    pub(crate) fn engine(&self) -> Result<Arc<Engine>, Error> {
        if let Some(engine) = self.engine.get() {
            return Ok(Arc::clone(engine));
        }
        let started = Arc::new(Engine::start(
            self.engine_kind,
            Arc::clone(&self.mem.inject),
        )?);
        // Two threads may race to start it: the loser's engine is dropped (it has no work).
        Ok(Arc::clone(self.engine.get_or_init(|| started)))
    }

    /// `n` order-0 folios for a readahead window into `out`, the allocator locked once for
    /// all (the fast path of [`alloc_for_readahead`](Self::alloc_for_readahead)). Reclaim is
    /// left to the caller: when this returns fewer than `n`, it asks for the rest one by one.
    pub(crate) fn alloc_pages_for_readahead<'c>(
        &'c self,
        n: usize,
        out: &mut Vec<NewFolio<'c>>,
    ) -> usize {
        self.mem.alloc_folios(n, out)
    }

    /// A folio of a readahead window: as [`Self::alloc_for_readahead`], except that a large
    /// folio that finds no free block while free pages are plenty
    /// ([`Self::free_pages_apart`]) fails at once, evicting nothing. The window then finishes
    /// in 4 KiB folios, as the kernel's `page_cache_ra_order` does when a large folio cannot
    /// be had. (Writes and staging folios keep evicting for their block: a write's fallback
    /// writes a dirty folio back, and a truncation's copy of the folio at the new end has
    /// none.) `window_pages` is what the window still needs, this folio included: an
    /// eviction frees that much at once (see [`EVICT_WINDOW_SHARE`]).
    pub(crate) fn alloc_for_window(
        &self,
        order: u8,
        window_pages: u64,
    ) -> Result<NewFolio<'_>, Error> {
        match self.mem.alloc_folio_now(order) {
            Err(Error::NoMemory { .. }) if order > 0 && self.free_pages_apart(order) => {
                Err(Error::NoMemory { order })
            }
            Err(Error::NoMemory { .. }) => {
                let most = self.mem.pages() as u64 / EVICT_WINDOW_SHARE;
                self.alloc_after_eviction(order, window_pages.min(most))
            }
            other => other,
        }
    }

    /// Allocates a folio for readahead, a read or a write, evicting idle folios read from
    /// storage when the arena is dry (and waking the flusher when what is left is dirty).
    pub(crate) fn alloc_for_readahead(&self, order: u8) -> Result<NewFolio<'_>, Error> {
        match self.mem.alloc_folio_now(order) {
            Err(Error::NoMemory { .. }) => self.alloc_after_eviction(order, 0),
            other => other,
        }
    }

    /// Evicts `pages`, but at least a batch (or the folio's size), then allocates a folio of
    /// `order`, waiting briefly for memory in a grace period: what this eviction freed, and
    /// what was freed before it (the first try, `Memory::alloc_folio_now`, did not wait).
    fn alloc_after_eviction(&self, order: u8, pages: u64) -> Result<NewFolio<'_>, Error> {
        let want = (1u64 << order).max(EVICT_BATCH_PAGES).max(pages);
        if self.reclaim.evict(&self.mem, want) == 0 && self.dirty.stats().dirty_pages > 0 {
            // Reclaim found nothing clean to drop: dirty data must be written first
            // (`wakeup_flusher_threads(WB_REASON_VMSCAN)`).
            self.dirty.kick();
        }
        self.mem.alloc_folio(order)
    }

    /// Whether free pages are plenty (at least a folio of `order`'s worth, and
    /// [`FREE_APART_SHARE`] of the arena) though no block of `order` is free: they lie apart,
    /// as evictions leave them when the pages around them are still cached. Evicting until a
    /// block forms would then drop cached data while free pages sit unused: under the clock
    /// policy, windows that did so ended `fcache bench reclaim`'s hot+scan with 17% of the
    /// arena free (29% with placement by offset), and the hot set hit 41.0% (38.2%) of its
    /// reads, against 46.5% (46.5%) now (docs/BENCHMARKS.md, "Free pages that lie apart").
    fn free_pages_apart(&self, order: u8) -> bool {
        let plenty = (1usize << order).max(self.mem.pages() / FREE_APART_SHARE);
        self.mem.free_pages() >= plenty
    }

    /// Writeback of `pages` pages completed.
    pub(crate) fn writeback_done(&self, pages: u64) {
        self.dirty.written(pages);
    }
}
