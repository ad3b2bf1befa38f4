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

/// The most bytes [`prefetch`] asks for: one page. A copy out of 4 KiB folios that
/// are not adjacent in the arena starts cold at each folio (the CPU's own prefetchers stop at
/// page boundaries); the next folio's page asked for while this one is copied is on its way
/// when its copy starts. Two pages cost more than they saved (`docs/BENCHMARKS.md`).
pub(crate) const PREFETCH_MAX: usize = PAGE_SIZE;

/// The environment variable that says whether a sequential reader's copies prefetch: `on` or
/// `off`; unset or empty, the default for the CPU ([`sequential_prefetch`]).
pub const SEQ_PREFETCH_VAR: &str = "FOLIOCACHE_SEQ_PREFETCH";

/// Whether a sequential reader (a read that starts where the handle's last one ended) asks the
/// CPU for what it will copy next: the next read's bytes, and each next folio of a read. Decided
/// once per process: [`SEQ_PREFETCH_VAR`], else on for Intel CPUs and off for the others.
///
/// The two hosts this project ran on disagree (`docs/BENCHMARKS.md`, "A sequential reader's
/// prefetch, per CPU"). On an Intel Xeon the prefetch made a memory file's 4 KiB reads in
/// order about 15% faster and cold sequential reads about 30% cheaper in CPU. On an AMD EPYC
/// (Zen 4) it made the same memory reads twice as slow, and cold reads no cheaper: a burst of
/// more than 40 to 48 line prefetches beside a copy that streams stalls the copy. A random
/// reader's prefetch (a read's first folio asked for before its descriptor is loaded) is
/// another matter and stays on everywhere.
pub fn sequential_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var(SEQ_PREFETCH_VAR).as_deref() {
        Ok("on") => true,
        Ok("off") => false,
        Ok("") | Err(_) => cpu_is_intel(),
        Ok(other) => {
            let default = cpu_is_intel();
            eprintln!(
                "foliocache: {SEQ_PREFETCH_VAR}={other:?} is neither \"on\" nor \"off\"; using \
                 the default for this CPU ({})",
                if default { "on" } else { "off" }
            );
            default
        }
    })
}

/// Whether the CPU says it is Intel's (CPUID leaf 0's vendor string).
fn cpu_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        [id.ebx, id.edx, id.ecx] == [b"Genu", b"ineI", b"ntel"].map(|w| u32::from_le_bytes(*w))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks the CPU to bring `len` bytes from `at` (at most [`PREFETCH_MAX`]) into its
/// second-level cache. Into L2, not L1: a page of prefetches into L1 held the fill buffers the
/// copy itself needed (a third of the readers' samples sat on them). The caller keeps `at..at
/// + len` inside the arena, though a prefetch reads nothing the program sees and cannot fault.
#[inline]
pub(crate) fn prefetch(at: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len.min(PREFETCH_MAX)).step_by(64) {
        // SAFETY: a prefetch is a hint: it reads nothing the program sees, and an address it
        // cannot translate is dropped, not faulted on.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                at.wrapping_add(line).cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}

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
    /// The folio holds data newer than the file on storage (the write path).
    pub const DIRTY: u32 = 1 << 7;
    /// The bits `FolioRef::set` and `clear` may change.
    pub(crate) const SETTABLE: u32 = READAHEAD | WORKINGSET | REFERENCED | ACTIVE | ERROR;
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
    /// The folio's bytes are being written to storage. Set and cleared with DIRTY, only under
    /// the mapping's writer lock, together with the index marks.
    pub const WRITEBACK: u32 = 1 << 12;
}

/// One arena page's descriptor: 32 bytes, aligned to 32, so a descriptor never straddles two
/// cache lines (a hit reads its count, flags and sequence word: one miss, not two). The
/// 32-bit words come first so that nothing pads between them.
#[derive(Debug)]
#[repr(C, align(32))]
pub(crate) struct FolioDesc {
    pub(crate) refcount: RefCount,
    pub(crate) flags: AtomicU32,
    /// Bumped each time the folio is allocated (a new life): optimistic readers, who take no
    /// reference, compare it before and after reading (see [`super::optimistic`]).
    pub(crate) seq: AtomicU32,
    pub(crate) order: AtomicU8,
    /// Id of the owning mapping; 0 when the folio is in no mapping.
    pub(crate) mapping: AtomicU64,
    /// Page index of the folio's first page within its mapping.
    pub(crate) index: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<FolioDesc>() == 32);

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

    /// Puts the descriptor in the free state of `policy`, as `new` makes it (a new shared
    /// mapping's table, before anyone else sees it).
    #[cfg(not(loom))]
    pub(crate) fn reset(&self, policy: RefcountPolicy) {
        self.refcount.reset_free(policy);
        self.flags.store(0, Ordering::Relaxed);
        self.order.store(0, Ordering::Relaxed);
        self.mapping.store(0, Ordering::Relaxed);
        self.index.store(0, Ordering::Relaxed);
        self.seq.store(0, Ordering::Relaxed);
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

    /// Unlocks, setting `also_set` in the same step (release: a waiter that sees the lock
    /// free sees them, and the bytes written before).
    pub(crate) fn unlock_with(&self, also_set: u32) {
        self.unlock_changing(also_set, 0);
    }

    /// Unlocks, setting `set` and clearing `clear` in the same atomic step as the lock bit:
    /// one locked instruction where a flag change and an unlock took two or three (a read's
    /// completion sets UPTODATE and clears ERROR on every folio it ends).
    pub(crate) fn unlock_changing(&self, set: u32, clear: u32) {
        debug_assert_eq!(set & (flag::LOCKED | flag::WAITERS), 0);
        let unlocked = |flags: u32| (flags & !(clear | flag::LOCKED | flag::WAITERS)) | set;
        let (Ok(before) | Err(before)) =
            self.flags
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |flags| {
                    Some(unlocked(flags))
                });
        debug_assert!(before & flag::LOCKED != 0, "unlock of an unlocked folio");
        if before & flag::WAITERS != 0 {
            wait::wake_all(self.wait_key());
        }
    }

    fn wait_unlocked(&self) {
        self.wait_clear(flag::LOCKED);
    }

    /// Sleeps until none of `bits` is set (LOCKED, or WRITEBACK): whoever clears them clears
    /// WAITERS in the same step and wakes the queue if it was set (see [`super::wait`]).
    pub(crate) fn wait_clear(&self, bits: u32) {
        if self.flags.load(Ordering::Acquire) & bits == 0 {
            return;
        }
        wait::wait(
            self.wait_key(),
            || {
                self.flags.fetch_or(flag::WAITERS, Ordering::SeqCst);
            },
            || self.flags.load(Ordering::SeqCst) & bits != 0,
        );
    }

    /// Clears `bits` and sets `set`, then wakes the waiters, as an unlock does (for the end
    /// of writeback).
    pub(crate) fn clear_and_wake(&self, bits: u32, set: u32) {
        if set != 0 {
            self.flags.fetch_or(set, Ordering::Release);
        }
        let before = self
            .flags
            .fetch_and(!(bits | flag::WAITERS), Ordering::SeqCst);
        if before & flag::WAITERS != 0 {
            wait::wake_all(self.wait_key());
        }
    }
}

/// A counted reference to a folio: the folio cannot be freed or reused while this exists.
/// Dropping it drops the reference (and frees the folio if it was the last one).
///
/// A reference pins the folio's memory, not its place in a mapping: a referenced folio can still
/// be truncated out of its mapping (its [`mapping_id`](Self::mapping_id) then reads 0). It gives
/// read-only access: the bytes once uptodate, the folio's identity and flags. Filling a folio
/// takes its lock, which only a `LockedFolio` guard holds.
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

    /// The folio's first byte in the arena (crate-internal: the I/O engines hand it to the
    /// kernel while the folio is locked and not uptodate).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.mem.page_ptr(self.pfn)
    }

    /// Asks the CPU to start bringing `len` bytes of the folio from byte `from` (at most a
    /// page) into its cache, for a copy that follows soon ([`prefetch`]).
    pub(crate) fn prefetch(&self, from: usize, len: usize) {
        let len = len.min(self.len().saturating_sub(from));
        prefetch(self.as_ptr().wrapping_add(from), len);
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
        // writes an uptodate folio (see above: UPTODATE is never cleared while the folio is
        // referenced, and no safe API hands out its bytes mutably once it is set), so a shared
        // slice is sound.
        Some(unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) })
    }

    /// The bytes of a run of uptodate folios that lie back to back in the arena (each starts
    /// where the previous one ends), as one slice; `None` if the run is empty, not adjacent or
    /// not all uptodate. A sequentially written file is mostly laid out this way, so a reader
    /// can copy many folios with one `memcpy`.
    pub(crate) fn contiguous_bytes<'a>(run: &'a [FolioRef<'m>]) -> Option<&'a [u8]> {
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

    /// Current number of references (0 if frozen), for tests and statistics.
    pub fn ref_count(&self) -> u32 {
        self.desc().refcount.count(self.mem.policy)
    }

    /// All public flag bits (the `raw::flag` constants; internal bookkeeping bits are masked).
    pub fn flags(&self) -> u32 {
        self.desc().flags.load(Ordering::Acquire) & !flag::INTERNAL
    }

    /// Whether every bit of `bits` is set.
    pub fn test(&self, bits: u32) -> bool {
        self.flags() & bits == bits
    }

    /// Sets bookkeeping flag bits among READAHEAD, WORKINGSET, REFERENCED, ACTIVE and ERROR
    /// (others are ignored: LOCKED belongs to the lock guard, UPTODATE to the end of a fill,
    /// DIRTY and WRITEBACK to the write path).
    pub(crate) fn set(&self, bits: u32) {
        self.desc()
            .flags
            .fetch_or(bits & flag::SETTABLE, Ordering::Release);
    }

    /// Clears flag bits among the same ones as [`set`](Self::set); returns whether any was set.
    pub(crate) fn clear(&self, bits: u32) -> bool {
        let bits = bits & flag::SETTABLE;
        self.desc().flags.fetch_and(!bits, Ordering::AcqRel) & bits != 0
    }

    /// Whether the bytes are valid (acquire: the bytes may be read after this returns true).
    pub fn is_uptodate(&self) -> bool {
        self.test(flag::UPTODATE)
    }

    /// Takes the folio lock, sleeping on a hashed wait queue while another thread holds it.
    pub(crate) fn lock(&self) -> LockedFolio<'m> {
        self.desc().lock();
        LockedFolio {
            folio: Some(self.clone()),
        }
    }

    /// Takes the folio lock if it is free.
    pub(crate) fn try_lock(&self) -> Option<LockedFolio<'m>> {
        self.desc().try_lock().then(|| LockedFolio {
            folio: Some(self.clone()),
        })
    }

    /// Whether the folio lock is held (by anyone).
    pub fn is_locked(&self) -> bool {
        self.desc().is_locked()
    }

    /// Sleeps until the folio is unlocked (a fill in flight has ended).
    pub fn wait_unlocked(&self) {
        self.desc().wait_unlocked();
    }

    /// Sleeps until the folio is not under writeback.
    pub fn wait_writeback(&self) {
        self.desc().wait_clear(flag::WRITEBACK);
    }

    /// Whether the folio holds data not yet written back.
    pub fn is_dirty(&self) -> bool {
        self.test(flag::DIRTY)
    }

    /// Whether the folio is being written back.
    pub fn is_writeback(&self) -> bool {
        self.test(flag::WRITEBACK)
    }
}

impl Clone for FolioRef<'_> {
    /// Takes another reference. Like `Arc::clone`, it aborts the process if the count would
    /// reach `MAX_REFS` (the refcount module's): only leaked references (forgotten
    /// clones) can get there, and going on would set the frozen bit or wrap the count.
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

/// A folio fresh from the allocator: in no mapping and known to no one else, so its owner may
/// write its bytes freely. It becomes visible only by being inserted into a mapping, which
/// consumes it (and returns a [`LockedFolio`] when the insertion leaves it locked for a fill).
pub struct NewFolio<'m> {
    pub(crate) folio: FolioRef<'m>,
}

impl std::fmt::Debug for NewFolio<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewFolio")
            .field("id", &self.folio.pfn)
            .field("order", &self.folio.order())
            .finish()
    }
}

impl<'m> NewFolio<'m> {
    /// The folio's id.
    pub fn id(&self) -> u32 {
        self.folio.pfn
    }

    /// log2 of the number of pages.
    pub fn order(&self) -> u8 {
        self.folio.order()
    }

    /// Number of 4 KiB pages.
    pub fn nr_pages(&self) -> usize {
        self.folio.nr_pages()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.folio.len()
    }

    /// Never true (a folio has at least one page).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The folio's bytes, to fill before it is inserted anywhere.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: a `NewFolio` comes only from the allocator and is consumed by insertion: the
        // folio is in no mapping and no index slot holds it, so no reader can validate a
        // reference to it and read its bytes (a stale speculative reader may touch its
        // *count*, never its bytes). `&mut self` makes this borrow exclusive, and the range is
        // the folio's own inside the arena.
        unsafe { std::slice::from_raw_parts_mut(self.folio.as_ptr(), self.folio.len()) }
    }

    /// Marks the bytes valid: once inserted, readers may copy them. (Nothing is visible yet:
    /// the folio stays private until inserted.)
    pub fn mark_uptodate(&mut self) {
        self.folio
            .desc()
            .flags
            .fetch_or(flag::UPTODATE, Ordering::Release);
    }

    /// Whether [`mark_uptodate`](Self::mark_uptodate) was called.
    pub fn is_uptodate(&self) -> bool {
        self.folio.is_uptodate()
    }

    /// Sets bookkeeping flags before insertion (the READAHEAD mark).
    pub(crate) fn set(&self, bits: u32) {
        self.folio.set(bits);
    }

    /// Sets any flag before insertion (DIRTY for the write path): the folio is private, so
    /// no protocol is involved yet.
    pub(crate) fn set_internal(&self, bits: u32) {
        self.folio.desc().flags.fetch_or(bits, Ordering::Release);
    }

    pub(crate) fn as_ref(&self) -> &FolioRef<'m> {
        &self.folio
    }
}

/// The folio lock, held: whoever locked a folio, or inserted one that stays locked, holds this
/// guard, and only this guard can fill the folio, end its read or unlock it. Nothing reachable
/// from a lookup can, so no one can mark a folio uptodate while another thread still writes it,
/// or unlock it under a fill in progress.
///
/// Dropping the guard unlocks the folio without changing its state (a fill that did not happen
/// leaves the folio not uptodate; the next reader reads it).
///
/// ```compile_fail
/// # use foliocache::Cache;
/// let cache = Cache::builder().capacity(1 << 20).build().unwrap();
/// let file = cache.create_memory_file(0).unwrap();
/// file.write_at(b"hello", 0).unwrap();
/// let found = foliocache::raw::mapping(&file).lookup(0).unwrap();
/// found.end_read(true); // a lookup's reference cannot end a read: it holds no lock
/// ```
pub struct LockedFolio<'m> {
    /// Always `Some` until the guard is consumed.
    folio: Option<FolioRef<'m>>,
}

impl std::fmt::Debug for LockedFolio<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LockedFolio").field(&self.folio).finish()
    }
}

impl<'m> LockedFolio<'m> {
    /// A guard for a folio whose lock the caller just took (and whose reference it gives).
    pub(crate) fn from_locked(folio: FolioRef<'m>) -> Self {
        debug_assert!(folio.desc().is_locked());
        Self { folio: Some(folio) }
    }

    /// The folio (read-only: id, index, flags).
    pub fn folio(&self) -> &FolioRef<'m> {
        self.folio.as_ref().expect("a live guard holds its folio")
    }

    /// The bytes to fill, while the folio is not uptodate (`None` once it is: uptodate folios
    /// are immutable).
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let folio = self.folio();
        if folio.is_uptodate() {
            return None;
        }
        let (ptr, len) = (folio.as_ptr(), folio.len());
        // SAFETY: this guard holds the folio's lock and a reference. While locked and not
        // uptodate, only the lock holder writes the bytes and nobody reads them (readers copy
        // only uptodate folios; optimistic readers check UPTODATE before and after copying and
        // give up on a folio that is not). UPTODATE can only be set by this guard, and
        // `&mut self` makes the borrow exclusive and keeps it from outliving the guard.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Ends a fill: marks the folio uptodate (`ok`) or failed (ERROR), unlocks it and wakes its
    /// waiters. Returns the reference.
    pub fn end_read(mut self, ok: bool) -> FolioRef<'m> {
        let folio = self.folio.take().expect("a live guard holds its folio");
        let bit = if ok { flag::UPTODATE } else { flag::ERROR };
        if ok {
            folio
                .desc()
                .flags
                .fetch_and(!flag::ERROR, Ordering::Relaxed);
        }
        folio.desc().unlock_with(bit);
        folio
    }

    /// Unlocks without changing the folio's state; returns the reference.
    pub fn unlock(mut self) -> FolioRef<'m> {
        let folio = self.folio.take().expect("a live guard holds its folio");
        folio.desc().unlock_with(0);
        folio
    }

    /// Gives up the guard but keeps the lock and the reference, for an I/O request that will
    /// end the read (`ReadRequest`); returns the folio's id.
    pub(crate) fn into_locked_id(mut self) -> u32 {
        let folio = self.folio.take().expect("a live guard holds its folio");
        let pfn = folio.pfn;
        // The reference now belongs to the request, which drops it when it completes.
        std::mem::forget(folio);
        pfn
    }
}

impl Drop for LockedFolio<'_> {
    fn drop(&mut self) {
        if let Some(folio) = self.folio.take() {
            folio.desc().unlock_with(0);
        }
    }
}
