//! Folio descriptors (`FolioTable`), their flags, and the `FolioRef` guard.
//!
//! Every arena page has a descriptor, allocated with the cache and never freed: the table is
//! *type-stable*, so a reader holding a stale folio id from a lockless index walk can always
//! attempt [`RefCount::try_get`](super::refcount::RefCount::try_get) on it safely. A folio is
//! its head page's descriptor; the descriptors of its tail pages stay in the free state, so a
//! speculative reference on a tail always fails.
//!
//! Field protocol:
//! * `refcount`: [`super::refcount`].
//! * `flags`: atomic bits. LOCKED is a sleeping bit-lock (waiters park on a hashed queue, see
//!   [`super::wait`]); UPTODATE is set with release ordering after the folio's bytes were filled
//!   and tested with acquire ordering before they are read.
//! * `order`, `mapping`, `index`: written by the owner of a folio that is not yet visible in any
//!   index (right after allocation, before insertion), or under the mapping's writer lock; readers
//!   read them only through a validated reference.

use super::refcount::{RefCount, RefcountPolicy};
use super::{Memory, PAGE_SIZE, wait};
use crate::sync::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// Folio flag bits (the subset of the kernel's page flags the read path uses).
pub mod flag {
    /// Held for the whole duration of a fill (I/O or zeroing), and by anyone changing the
    /// folio's identity. A locked, not uptodate folio means "being read".
    pub const LOCKED: u32 = 1 << 0;
    /// The folio's bytes are valid.
    pub const UPTODATE: u32 = 1 << 1;
    /// Touching this folio starts the next asynchronous readahead window.
    pub const READAHEAD: u32 = 1 << 2;
    /// The folio refaulted while it was part of the working set.
    pub const WORKINGSET: u32 = 1 << 3;
    /// Accessed since it was last aged.
    pub const REFERENCED: u32 = 1 << 4;
    /// On the active list.
    pub const ACTIVE: u32 = 1 << 5;
    /// Reading it failed.
    pub const ERROR: u32 = 1 << 6;
    /// Reserved for a write-back path.
    pub const DIRTY: u32 = 1 << 7;
    /// The bits [`FolioRef::set`](super::FolioRef::set) and `clear` may change.
    pub(crate) const SETTABLE: u32 = READAHEAD | WORKINGSET | REFERENCED | ACTIVE | ERROR | DIRTY;
    /// Someone is parked waiting for LOCKED to clear (internal).
    pub(crate) const WAITERS: u32 = 1 << 8;
    /// Has been in an index: optimistic readers may know it, so its memory is returned only
    /// after a grace period (internal).
    pub(crate) const PUBLISHED: u32 = 1 << 9;
    /// On one of the reclaim lists (internal; see `mem::lru`).
    pub(crate) const LRU: u32 = 1 << 10;
    /// Accessed again after REFERENCED was set, while inactive: the next scan activates it
    /// (internal; the hit path only sets bits, see `reclaim`).
    pub(crate) const PROMOTE: u32 = 1 << 11;
    /// Bits [`FolioRef::flags`](super::FolioRef::flags) does not show.
    pub(crate) const INTERNAL: u32 = WAITERS | PUBLISHED | LRU | PROMOTE;
}

/// One arena page's descriptor (32 bytes).
#[derive(Debug)]
pub(crate) struct FolioDesc {
    pub(crate) refcount: RefCount,
    pub(crate) flags: AtomicU32,
    pub(crate) order: AtomicU8,
    /// Id of the owning mapping; 0 when the folio is in no mapping.
    pub(crate) mapping: AtomicU64,
    /// Page index of the folio's first page within its mapping.
    pub(crate) index: AtomicU64,
    /// Bumped each time the folio is allocated (a new life): optimistic readers, who take no
    /// reference, compare it before and after reading (see [`super::optimistic`]).
    pub(crate) seq: AtomicU32,
}

impl FolioDesc {
    pub(crate) fn new(policy: RefcountPolicy) -> Self {
        Self {
            refcount: RefCount::new_free(policy),
            flags: AtomicU32::new(0),
            order: AtomicU8::new(0),
            mapping: AtomicU64::new(0),
            index: AtomicU64::new(0),
            seq: AtomicU32::new(0),
        }
    }

    fn wait_key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    fn lock(&self) {
        while !self.try_lock() {
            wait::wait(
                self.wait_key(),
                || {
                    self.flags.fetch_or(flag::WAITERS, Ordering::SeqCst);
                },
                || self.flags.load(Ordering::SeqCst) & flag::LOCKED != 0,
            );
        }
    }

    fn try_lock(&self) -> bool {
        self.flags.fetch_or(flag::LOCKED, Ordering::Acquire) & flag::LOCKED == 0
    }

    pub(crate) fn is_locked(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & flag::LOCKED != 0
    }

    /// Unlocks, setting `also_set` first (release: a waiter that sees the lock free sees
    /// them, and the bytes written before).
    pub(crate) fn unlock_with(&self, also_set: u32) {
        if also_set != 0 {
            self.flags.fetch_or(also_set, Ordering::Release);
        }
        let before = self
            .flags
            .fetch_and(!(flag::LOCKED | flag::WAITERS), Ordering::SeqCst);
        debug_assert!(before & flag::LOCKED != 0, "unlock of an unlocked folio");
        if before & flag::WAITERS != 0 {
            wait::wake_all(self.wait_key());
        }
    }

    fn wait_unlocked(&self) {
        if self.flags.load(Ordering::Acquire) & flag::LOCKED == 0 {
            return;
        }
        wait::wait(
            self.wait_key(),
            || {
                self.flags.fetch_or(flag::WAITERS, Ordering::SeqCst);
            },
            || self.flags.load(Ordering::SeqCst) & flag::LOCKED != 0,
        );
    }
}

/// A counted reference to a folio: the folio cannot be freed or reused while this exists.
/// Dropping it drops the reference (and frees the folio if it was the last one).
///
/// A reference pins the folio's memory, not its place in a mapping: a referenced folio can still
/// be truncated out of its mapping (its [`mapping_id`](Self::mapping_id) then reads 0).
pub struct FolioRef<'m> {
    pub(crate) mem: &'m Memory,
    pub(crate) pfn: u32,
}

impl std::fmt::Debug for FolioRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolioRef")
            .field("id", &self.pfn)
            .field("order", &self.order())
            .field("mapping", &self.mapping_id())
            .field("index", &self.index())
            .field("flags", &format_args!("{:#x}", self.flags()))
            .finish()
    }
}

impl<'m> FolioRef<'m> {
    pub(crate) fn desc(&self) -> &'m FolioDesc {
        self.mem.desc(self.pfn)
    }

    /// The folio's id: its first page's number in the arena.
    pub fn id(&self) -> u32 {
        self.pfn
    }

    /// log2 of the number of pages.
    pub fn order(&self) -> u8 {
        self.desc().order.load(Ordering::Relaxed)
    }

    /// Number of 4 KiB pages.
    pub fn nr_pages(&self) -> usize {
        1 << self.order()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        PAGE_SIZE << self.order()
    }

    /// Never true: a folio has at least one page (provided for API symmetry with `len`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The owning mapping's id, 0 when the folio is in no mapping.
    pub fn mapping_id(&self) -> u64 {
        self.desc().mapping.load(Ordering::Acquire)
    }

    /// The page index of the folio's first page in its mapping (meaningful while in one).
    pub fn index(&self) -> u64 {
        self.desc().index.load(Ordering::Acquire)
    }

    /// The folio's first byte. The bytes may be read through this pointer while the folio is
    /// uptodate (prefer [`bytes`](Self::bytes)), and written only by the thread that holds the
    /// folio's lock while it is not uptodate, or by the owner of a folio that is in no mapping
    /// yet. An uptodate folio must never be written: readers rely on it being immutable.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.page_ptr(self.pfn)
    }

    /// The folio's bytes, if it is uptodate.
    ///
    /// Folios are immutable once uptodate: their bytes are written only while the folio is
    /// private (before insertion) or while it is locked and not yet uptodate (a fill), and a
    /// changed file range gets a *new* folio swapped into the index instead (copy on write).
    /// An uptodate folio is only freed after its last reference is dropped, so the slice stays
    /// valid and unchanged for as long as this reference lives.
    pub fn bytes(&self) -> Option<&[u8]> {
        if !self.is_uptodate() {
            return None;
        }
        // SAFETY: the folio spans `len()` bytes of the arena from `as_ptr()`; the reference
        // keeps it allocated; it is uptodate (acquire: its fill happened before), and nothing
        // writes an uptodate folio (see above), so a shared slice is sound.
        Some(unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) })
    }

    /// The bytes of a run of uptodate folios that lie back to back in the arena (each starts
    /// where the previous one ends), as one slice; `None` if the run is empty, not adjacent or
    /// not all uptodate. A sequentially written file is mostly laid out this way, so a reader
    /// can copy many folios with one `memcpy`.
    pub fn contiguous_bytes<'a>(run: &'a [FolioRef<'m>]) -> Option<&'a [u8]> {
        let first = run.first()?;
        let mut len = 0usize;
        for (k, folio) in run.iter().enumerate() {
            if !std::ptr::eq(folio.mem, first.mem) || !folio.is_uptodate() {
                return None;
            }
            if k > 0 && folio.pfn as usize != first.pfn as usize + len / PAGE_SIZE {
                return None;
            }
            len += folio.len();
        }
        // SAFETY: the folios are adjacent in the arena (checked above), so the range from the
        // first one's start spans exactly their bytes; every one is referenced (pinned for
        // 'a) and uptodate, hence immutable (see `bytes`).
        Some(unsafe { std::slice::from_raw_parts(first.as_ptr(), len) })
    }

    /// The bytes of a *private* folio, for filling it before it is inserted anywhere.
    ///
    /// Contract (crate-internal callers): `self` came from `alloc_folio`, was never inserted
    /// into a mapping nor cloned, and is not uptodate. Then no other thread can access its
    /// bytes: a stale speculative reader may touch its *count*, but reads bytes only after
    /// re-validating against an index slot, and no slot holds this folio.
    pub(crate) fn private_bytes_mut(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.mapping_id(), 0, "not a private folio");
        debug_assert!(!self.is_uptodate(), "an uptodate folio is immutable");
        // SAFETY: per the contract above the caller has exclusive access to these bytes for
        // the lifetime of the `&mut self` borrow; the range is inside the arena.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// Marks a private folio uptodate after filling it (before it is inserted).
    pub(crate) fn mark_uptodate(&self) {
        self.desc()
            .flags
            .fetch_or(flag::UPTODATE, Ordering::Release);
    }

    /// Current number of references (0 if frozen), for tests and statistics.
    pub fn ref_count(&self) -> u32 {
        self.desc().refcount.count(self.mem.policy)
    }

    /// All public flag bits (the [`flag`] constants; internal bookkeeping bits are masked).
    pub fn flags(&self) -> u32 {
        self.desc().flags.load(Ordering::Acquire) & !flag::INTERNAL
    }

    /// Whether every bit of `bits` is set.
    pub fn test(&self, bits: u32) -> bool {
        self.flags() & bits == bits
    }

    /// Sets flag bits among READAHEAD, WORKINGSET, REFERENCED, ACTIVE, ERROR and DIRTY; other
    /// bits are ignored (LOCKED has [`lock`](Self::lock), UPTODATE is set by
    /// [`end_read`](Self::end_read), the rest are internal).
    pub fn set(&self, bits: u32) {
        self.desc()
            .flags
            .fetch_or(bits & flag::SETTABLE, Ordering::Release);
    }

    /// Clears flag bits among the same ones as [`set`](Self::set) (never UPTODATE: an uptodate
    /// folio stays so, which lock-free readers rely on); returns whether any was set.
    pub fn clear(&self, bits: u32) -> bool {
        let bits = bits & flag::SETTABLE;
        self.desc().flags.fetch_and(!bits, Ordering::AcqRel) & bits != 0
    }

    /// Whether the bytes are valid (acquire: the bytes may be read after this returns true).
    pub fn is_uptodate(&self) -> bool {
        self.test(flag::UPTODATE)
    }

    /// Takes the folio lock, sleeping on a hashed wait queue while another thread holds it.
    pub fn lock(&self) {
        self.desc().lock();
    }

    /// Takes the folio lock if it is free.
    pub fn try_lock(&self) -> bool {
        self.desc().try_lock()
    }

    /// Releases the folio lock and wakes its waiters.
    pub fn unlock(&self) {
        self.desc().unlock_with(0);
    }

    /// Ends a fill: marks the folio uptodate (or failed) and unlocks it, waking waiters.
    pub fn end_read(&self, success: bool) {
        let bit = if success { flag::UPTODATE } else { flag::ERROR };
        self.desc().unlock_with(bit);
    }

    /// Sleeps until the folio is unlocked.
    pub fn wait_unlocked(&self) {
        self.desc().wait_unlocked();
    }
}

impl Clone for FolioRef<'_> {
    fn clone(&self) -> Self {
        self.desc().refcount.get();
        Self {
            mem: self.mem,
            pfn: self.pfn,
        }
    }
}

impl Drop for FolioRef<'_> {
    fn drop(&mut self) {
        self.mem.put(self.pfn);
    }
}
