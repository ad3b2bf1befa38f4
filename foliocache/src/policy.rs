//! The runtime choices between each optimisation's "before" and "after" (policies, not forks:
//! `docs/KERNEL.md`, "The seeds and their policies"). The default of every choice is the better
//! one.

use crate::error::Error;
use crate::mem::MAX_ORDER;
pub use crate::mem::refcount::RefcountPolicy;

/// Runtime choices between each optimisation's "before" and "after" (the default is "after").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// The folio reference-count protocol (seed 002).
    pub refcount: RefcountPolicy,
    /// How a read walks the index (seed 004).
    pub read: ReadPolicy,
    /// Whether small reads take a reference (beyond seed 002).
    pub small_read: SmallReadPolicy,
    /// How readahead inserts a window's folios (seeds 000/003).
    pub insert: InsertPolicy,
    /// The folio order of executable regions' fault windows (seed 001): 4 = 64 KiB, the
    /// default (arm64's choice); 0 = the behaviour before the seed (plain read-around). At most
    /// [`MAX_ORDER`](crate::MAX_ORDER); [`CacheBuilder::build`](crate::CacheBuilder::build)
    /// refuses larger values.
    pub exec_order: u8,
    /// Which folios eviction picks (active/inactive lists with workingset detection, the
    /// default; or the same lists without it; or one list, a clock approximating LRU).
    pub reclaim: ReclaimPolicy,
    /// What a failed writeback does with the data (beyond the kernel: keep it, the default).
    pub writeback_error: WritebackErrorPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            refcount: RefcountPolicy::default(),
            read: ReadPolicy::default(),
            small_read: SmallReadPolicy::default(),
            insert: InsertPolicy::default(),
            exec_order: 4,
            reclaim: ReclaimPolicy::default(),
            writeback_error: WritebackErrorPolicy::default(),
        }
    }
}

impl Policy {
    /// Checks the values that are numbers rather than choices.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.exec_order > MAX_ORDER {
            return Err(Error::OrderTooLarge {
                order: self.exec_order,
                max: MAX_ORDER,
            });
        }
        Ok(())
    }
}

/// How readahead inserts the folios of a window into the index (seeds 000/003).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum InsertPolicy {
    /// Allocate the window's folios first, then insert each contiguous run under one hold of
    /// the mapping's lock; one by one when the window cannot be allocated whole. The default.
    #[default]
    Batched,
    /// Before the seed: allocate and insert one folio at a time, one lock hold each.
    Single,
}

/// How a small read (at most [`SMALL_READ_MAX`](crate::SMALL_READ_MAX) bytes within one page)
/// gets at the bytes.
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

/// Which folios eviction picks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ReclaimPolicy {
    /// Inactive and active lists, and shadow entries with refault distances (workingset
    /// detection). The default.
    #[default]
    Workingset,
    /// Inactive and active lists, no shadow entries: a refault starts inactive like any read.
    TwoLists,
    /// One list with a second chance (a clock): a folio accessed since the hand last passed is
    /// spared once, the others are evicted. The plain LRU approximation.
    Clock,
}

/// What happens to the data of a folio whose writeback failed (an I/O error, no space).
///
/// Either way the error is reported, with the kernel's errseq semantics, once to every
/// [`Handle`](crate::Handle) that was open when it happened, at its next `sync_all`,
/// `sync_data` or `sync_range` (and to one opened later if nobody has seen it yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WritebackErrorPolicy {
    /// Keep the folio dirty: its data stays in the cache and the next writeback (the next
    /// `sync_all` at the latest) tries it again, so a sync that returns `Ok` after an error
    /// means the data did reach storage. Data that can never be written stays in the cache
    /// (and holds memory: writers are throttled, then wait) until the file is dropped. The
    /// default: what PostgreSQL needed in 2018 ("fsyncgate").
    #[default]
    KeepDirty,
    /// The kernel's behaviour: the folio is left clean, its data kept only until reclaim drops
    /// it, and never retried; a second sync returns `Ok` although the data never reached
    /// storage.
    Discard,
}
