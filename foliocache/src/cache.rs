//! The cache: owns the memory (arena, allocator, folio table) and opens mappings.

use crate::error::Error;
use crate::file::File;
use crate::mapping::Mapping;
use crate::mem::refcount::RefcountPolicy;
use crate::mem::{FolioRef, MAX_ORDER, Memory, PAGE_SIZE};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Runtime choices between each optimisation's "before" and "after" (the default is "after").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Policy {
    /// The folio reference-count protocol (seed 002).
    pub refcount: RefcountPolicy,
    /// How a read walks the index (seed 004).
    pub read: ReadPolicy,
    /// Whether small reads take a reference (beyond seed 002).
    pub small_read: SmallReadPolicy,
}

/// How a small read (at most [`SMALL_READ_MAX`](crate::read::SMALL_READ_MAX) bytes within one
/// page) gets at the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SmallReadPolicy {
    /// Copy without taking a reference, then validate (the folio's sequence word and its index
    /// slot) and retry, falling back to `Refcounted` after a few failures. Writes no shared
    /// cache line, so readers on many cores scale. The default.
    #[default]
    Optimistic,
    /// Take a reference (`try_get`), copy, drop it (`put`): what the kernel does.
    Refcounted,
}

/// How the read path walks the index (seed 004).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ReadPolicy {
    /// Seed 004: a batch of up to 31 contiguous folios per index walk; holes and folios that
    /// are not uptodate zero the destination in one run. The default.
    #[default]
    Batched,
    /// Before seed 004 (shmem's old loop): one index walk and one lock/unlock per folio, and
    /// per 4 KiB page for holes and not-uptodate folios, zeros copied from a zero page.
    PerFolio,
}

/// Configures and builds a [`Cache`].
#[derive(Debug, Clone)]
pub struct CacheBuilder {
    capacity: u64,
    max_order: u8,
    huge_pages: bool,
    prefault: bool,
    policy: Policy,
}

impl Default for CacheBuilder {
    fn default() -> Self {
        Self {
            capacity: 256 << 20,
            max_order: MAX_ORDER,
            huge_pages: false,
            prefault: false,
            policy: Policy::default(),
        }
    }
}

impl CacheBuilder {
    /// Capacity in bytes: a positive multiple of 4096 (default 256 MiB).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// The largest folio order, at most 9 (2 MiB folios; the default).
    pub fn max_order(mut self, order: u8) -> Self {
        self.max_order = order;
        self
    }

    /// Ask the kernel to back the arena with transparent huge pages (`MADV_HUGEPAGE`).
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Fault the whole arena in at build time (`MADV_POPULATE_WRITE`), so that first touches
    /// are not paid later (benchmarks want this).
    pub fn prefault(mut self, on: bool) -> Self {
        self.prefault = on;
        self
    }

    /// The policies.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Builds the cache. Errors: a capacity that is zero, not a page multiple or above 16 TiB;
    /// a max order above 9; the arena mapping failing.
    pub fn build(self) -> Result<Cache, Error> {
        let page = PAGE_SIZE as u64;
        if self.capacity == 0
            || !self.capacity.is_multiple_of(page)
            || self.capacity / page >= u64::from(u32::MAX)
        {
            return Err(Error::InvalidCapacity(self.capacity));
        }
        if self.max_order > MAX_ORDER {
            return Err(Error::OrderTooLarge {
                order: self.max_order,
                max: MAX_ORDER,
            });
        }
        let pages = usize::try_from(self.capacity / page)
            .map_err(|_| Error::InvalidCapacity(self.capacity))?;
        let mem = Memory::new(pages, self.max_order, self.huge_pages, self.policy.refcount)?;
        if self.prefault {
            mem.prefault().map_err(Error::Prefault)?;
        }
        Ok(Cache {
            inner: Arc::new(CacheInner {
                mem,
                policy: self.policy,
                capacity: self.capacity,
            }),
        })
    }
}

#[derive(Debug)]
pub(crate) struct CacheInner {
    pub(crate) mem: Memory,
    pub(crate) policy: Policy,
    capacity: u64,
}

/// Memory statistics of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Configured capacity in bytes.
    pub capacity_bytes: u64,
    /// Pages in the arena.
    pub total_pages: u64,
    /// Pages not allocated to any folio.
    pub free_pages: u64,
    /// Pages freed but waiting for optimistic readers that might still be copying them to
    /// finish (a grace period) before they can be allocated again.
    pub pending_free_pages: u64,
    /// Bytes of folio descriptors (one per page).
    pub folio_table_bytes: u64,
    /// The largest folio order.
    pub max_order: u8,
    /// Times the allocator's shared free lists were locked (order-0 traffic mostly stays in
    /// per-thread caches and takes it once per batch).
    pub zone_lock_acquisitions: u64,
}

/// A page cache in user space: a bounded arena of folios and the mappings that index them.
#[derive(Debug, Clone)]
pub struct Cache {
    inner: Arc<CacheInner>,
}

static NEXT_MAPPING_ID: AtomicU64 = AtomicU64::new(1);

impl Cache {
    /// A builder with the defaults.
    pub fn builder() -> CacheBuilder {
        CacheBuilder::default()
    }

    /// The policies this cache runs with.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// Creates a new, empty mapping (one file's index).
    pub fn new_mapping(&self) -> Mapping {
        Mapping::new(
            Arc::clone(&self.inner),
            NEXT_MAPPING_ID.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// Creates an empty memory file (data lives only in the cache, like tmpfs) whose folios
    /// are at most `max_order` (0: 4 KiB pages only, like tmpfs `huge=never`; 9: up to 2 MiB,
    /// like `huge=always`).
    pub fn create_memory_file(&self, max_order: u8) -> Result<File, Error> {
        let max = self.inner.mem.max_order;
        if max_order > max {
            return Err(Error::OrderTooLarge {
                order: max_order,
                max,
            });
        }
        Ok(File::new_memory(self, self.new_mapping(), max_order))
    }

    /// Allocates a private folio of `2^order` pages. When no block of that order is free it
    /// fails with [`Error::NoMemory`] and the caller falls back; it waits (at most 20 ms) only
    /// when freed memory is still waiting for a grace period (see `Stats::pending_free_pages`).
    pub fn alloc_folio(&self, order: u8) -> Result<FolioRef<'_>, Error> {
        self.inner.mem.alloc_folio(order)
    }

    /// Memory statistics.
    pub fn stats(&self) -> Stats {
        let mem = &self.inner.mem;
        Stats {
            capacity_bytes: self.inner.capacity,
            total_pages: mem.pages() as u64,
            free_pages: mem.free_pages() as u64,
            pending_free_pages: mem.pending_free_pages() as u64,
            folio_table_bytes: (mem.pages() * std::mem::size_of::<crate::mem::folio::FolioDesc>())
                as u64,
            max_order: mem.max_order,
            zone_lock_acquisitions: mem.zone_lock_count(),
        }
    }

    /// Completes pending grace periods (as far as running readers allow) and returns pages
    /// idling in per-thread allocation caches to the shared free lists.
    pub fn drain_cpu_caches(&self) {
        self.inner.mem.drain_caches();
    }

    /// The number of free blocks of each order in the shared free lists (per-thread caches not
    /// included: call [`drain_cpu_caches`](Self::drain_cpu_caches) first for a full picture).
    pub fn free_blocks_by_order(&self) -> Vec<usize> {
        self.inner.mem.free_blocks_by_order()
    }
}
