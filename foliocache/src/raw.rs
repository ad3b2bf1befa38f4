//! The machinery under the page-cache API, for benchmarks, tests and tools: mappings and their
//! index, folios and their locks, the reference count, epochs, the device probe, and fault
//! injection. Nothing here is needed to use the cache, and none of it is a stable interface.
//!
//! Everything here is safe to call: a folio's bytes can be written only through a
//! [`NewFolio`] (a folio no one else can see) or a [`LockedFolio`] (the guard of the folio's
//! lock, which only a locker or an inserter holds). A folio found by a lookup is a
//! [`FolioRef`](crate::FolioRef): it reads, it cannot fill, end a read or unlock. This does not compile:
//!
//! ```compile_fail
//! # fn main() -> Result<(), foliocache::Error> {
//! use foliocache::{Cache, raw};
//! let cache = Cache::builder().capacity(1 << 20).build()?;
//! let mapping = raw::new_mapping(&cache);
//! let (locked, _) = mapping.add_folio(raw::alloc_folio(&cache, 0)?, 0)?;
//! let found = mapping.lookup(0).unwrap();
//! found.end_read(true); // only `locked` can end the read
//! # drop(locked); Ok(()) }
//! ```
//!
//! while the same program with the guard ending the read does:
//!
//! ```
//! # fn main() -> Result<(), foliocache::Error> {
//! use foliocache::{Cache, raw};
//! let cache = Cache::builder().capacity(1 << 20).build()?;
//! let mapping = raw::new_mapping(&cache);
//! let (mut locked, _) = mapping.add_folio(raw::alloc_folio(&cache, 0)?, 0)?;
//! let found = mapping.lookup(0).unwrap();
//! assert!(found.bytes().is_none()); // not uptodate: nothing to read yet
//! locked.bytes_mut().unwrap().fill(7);
//! locked.end_read(true);
//! assert_eq!(found.bytes().unwrap()[0], 7);
//! # Ok(()) }
//! ```

use crate::cache::Cache;
use crate::error::Error;
use crate::file::File;
use crate::inject::Inject;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use crate::fault::MMAP_LOTSAMISS;
pub use crate::index::{
    Cursor, Entry, Index, IndexView, IndexWriter, MAX_ENTRY_ORDER, MAX_VALUE, Mark, NODE_BYTES,
    RangeInsert, RangeStop,
};
pub use crate::io::probe;
pub use crate::io::{DEFAULT_REQUEST_BYTES, DirectFile};
pub use crate::mapping::{
    BATCH_SIZE, BatchEnd, FolioBatch, Mapping, MappingView, OPTIMISTIC_MAX, RangeAdd, RemoveError,
};
pub use crate::mem::{LockedFolio, NewFolio, NodeMeter, flag};
pub use crate::readahead::{DEFAULT_RA_PAGES, Trigger, init_ra_size, next_ra_size};

/// The folio reference count and its two protocols (seed 002).
pub mod refcount {
    pub use crate::mem::refcount::{FROZEN, FROZEN_LIMIT, MAX_REFS, RefCount, free_value};
}

/// The crate's epochs (what keeps index nodes and folio memory from being reused under a
/// lockless reader).
pub mod epoch {
    #[cfg(loom)]
    pub use crate::mem::epoch::{
        AccessTracker, barrier_point, model_barrier, model_without_heavy_barrier,
    };
    /// How pins order themselves, and the variable that chooses it.
    pub use crate::mem::epoch::{BARRIER_VAR, Barrier, barrier};
    /// Readers in other processes (a shared cache's client threads): their pin words, how an
    /// owner counts them in its grace periods, and the mirror of the epoch they pin with.
    pub use crate::mem::epoch::{
        External, add_external, external_pin, external_unpin, pin_caught_up, remove_external,
    };
    pub use crate::mem::epoch::{Guard, collect, defer, epoch, is_pinned, pending, pin};
}

/// A new, empty mapping (one file's index) in `cache`'s memory, attached to no file.
pub fn new_mapping(cache: &Cache) -> Mapping {
    cache.local_only("raw::new_mapping").new_mapping()
}

/// Allocates a private folio of `2^order` pages from `cache`'s arena. When no block of that
/// order is free it fails with [`Error::NoMemory`]; it waits (at most 20 ms) only when freed
/// memory is still waiting for a grace period.
pub fn alloc_folio(cache: &Cache, order: u8) -> Result<NewFolio<'_>, Error> {
    cache.core().mem.alloc_folio(order)
}

/// The mapping of a file, read only (lookups, batches, the index, counters): its changes go
/// through the file.
pub fn mapping(file: &File) -> MappingView<'_> {
    MappingView::new(file.mapping())
}

/// Takes a folio's lock (sleeping while another holder has it) and returns the guard.
pub fn lock<'m>(folio: &crate::mem::FolioRef<'m>) -> LockedFolio<'m> {
    folio.lock()
}

/// Takes a folio's lock if it is free.
pub fn try_lock<'m>(folio: &crate::mem::FolioRef<'m>) -> Option<LockedFolio<'m>> {
    folio.try_lock()
}

/// Completes pending grace periods (as far as running readers allow) and returns pages idling
/// in per-thread allocation caches to the shared free lists.
pub fn drain_cpu_caches(cache: &Cache) {
    cache.core().mem.drain_caches();
}

/// The number of free blocks of each order in the shared free lists (per-thread caches not
/// included: call [`drain_cpu_caches`] first for a full picture).
pub fn free_blocks_by_order(cache: &Cache) -> Vec<usize> {
    cache.core().mem.free_blocks_by_order()
}

/// Arms faults on one cache, for tests: each call arms the next `n` events of its kind (and
/// replaces what was armed of that kind before). Other caches are not affected.
#[derive(Debug, Clone)]
pub struct Injector {
    inject: Arc<Inject>,
}

/// The fault injector of `cache`.
pub fn injector(cache: &Cache) -> Injector {
    Injector {
        inject: Arc::clone(&cache.core().mem.inject),
    }
}

impl Injector {
    /// The next `n` folio allocations fail with [`Error::NoMemory`].
    pub fn fail_allocations(&self, n: u32) {
        self.inject.arm(&self.inject.alloc_failures, n);
    }

    /// The next `n` I/O transfers of the engine report `EIO`: a read after it completed (the
    /// folios stay not uptodate), a write instead of reaching the device (storage keeps its
    /// old bytes, as after a real failure).
    pub fn io_errors(&self, n: u32) {
        self.inject.arm(&self.inject.io_errors, n);
    }

    /// The next `n` writes report `ENOSPC` instead of reaching the device.
    pub fn nospace_errors(&self, n: u32) {
        self.inject.arm(&self.inject.nospace_errors, n);
    }

    /// The next `n` I/O completions of the engine report only `bytes` transferred (when the
    /// request was longer), as a device may: the engine must carry on with the rest.
    pub fn short_transfers(&self, n: u32, bytes: u64) {
        self.inject.short_bytes.store(bytes, Ordering::Relaxed);
        self.inject.arm(&self.inject.short_transfers, n);
    }

    /// The processing of the next `n` I/O completions panics on the engine's completion
    /// thread: the engine must fail those requests (`EIO`) and keep serving the others.
    pub fn completion_panics(&self, n: u32) {
        self.inject.arm(&self.inject.completion_panics, n);
    }

    /// How many armed faults have fired so far (all kinds).
    pub fn fired(&self) -> u64 {
        self.inject.fired.load(Ordering::Relaxed)
    }
}
