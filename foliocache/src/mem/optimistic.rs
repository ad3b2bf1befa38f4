//! Optimistic reads: copying a folio's bytes without taking a reference.
//!
//! A small read of a cached page costs, on the referenced path, a `try_get` and a `put`: two
//! atomic read-modify-writes on the folio's count, a cache line every reader of that folio
//! writes. With several threads reading one page (seed 002's benchmark) that line bounces
//! between cores on every read. An optimistic read writes nothing shared:
//!
//! 1. take a [`ReadGuard`](super::ReadGuard) (an epoch pin), then find the folio in the index;
//! 2. [`Memory::peek_begin`]: read the descriptor's `seq` (acquire), and give up if the folio is
//!    free or frozen or not uptodate;
//! 3. [`Memory::peek_copy`]: copy the bytes;
//! 4. [`Memory::peek_valid`]: `seq` unchanged and the folio not frozen; and the caller re-reads
//!    the index slot, which must still hold the folio.
//!
//! Why the copy is sound: the memory of a folio that was ever in an index is handed out again
//! only after a grace period ([`super::grace`]): every guard taken before its free is gone. A
//! folio found in the index after taking the guard therefore cannot be reused (rewritten)
//! before the guard is dropped; and while it is uptodate nobody writes it (changes make a new
//! folio, see `crate::file`). Checking UPTODATE with acquire ordering before copying makes the
//! fill visible. So the copy races with no writer.
//!
//! Why the result is right: the slot re-check proves the folio was still this page of this
//! file when the copy ended (a truncated or replaced folio leaves the slot), so the bytes were
//! the page's bytes at some instant of the read. `seq` (bumped at every allocation) and the
//! frozen check are belt and braces: they would catch a reuse even if some future path freed a
//! published folio without a grace period. The loom models in `tests/loom_optimistic.rs` check
//! the whole protocol, and fail when grace periods are taken away.

use super::folio::{FolioDesc, PREFETCH_MAX, prefetch};
use super::refcount::RefcountPolicy;
use super::{Memory, PAGE_SIZE};
use crate::sync::{Ordering, fence};
use std::ptr::NonNull;

/// An optimistic read in progress (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peek {
    pfn: u32,
    seq: u32,
    len: usize,
    /// The folio's flags when the read began.
    flags: u32,
}

impl Peek {
    /// The folio's flags when the read began (a client skips folios carrying the READAHEAD
    /// mark: the owner must see those reads).
    pub(crate) fn flags(&self) -> u32 {
        self.flags
    }
}

/// Proof that the caller pinned before the lookup that found the folio it copies: a private
/// cache's [`ReadGuard`](super::ReadGuard) (or the bare epoch pin inside one), or a shared
/// cache client's pin of its slot (`mem::epoch::ExternalGuard`).
pub(crate) trait Pinned {}

impl Pinned for super::ReadGuard<'_> {}
impl Pinned for super::epoch::Guard {}
#[cfg(not(loom))]
impl Pinned for super::epoch::ExternalGuard<'_> {}

/// What an optimistic read needs of a cache's memory: the folio table and the arena. A private
/// cache's [`Memory`] gives one; a shared cache's client builds one over its mapping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FolioView<'a> {
    table: &'a [FolioDesc],
    base: NonNull<u8>,
    pages: usize,
    policy: RefcountPolicy,
}

impl<'a> FolioView<'a> {
    /// A view of `pages` arena pages from `base` described by `table`.
    ///
    /// # Safety
    /// `base` must be the start of `pages` pages of memory that stays mapped (readable) for
    /// `'a`, and `table` must have `pages` descriptors.
    pub(crate) unsafe fn new(
        table: &'a [FolioDesc],
        base: NonNull<u8>,
        pages: usize,
        policy: RefcountPolicy,
    ) -> Self {
        debug_assert_eq!(table.len(), pages);
        Self {
            table,
            base,
            pages,
            policy,
        }
    }

    /// Starts an optimistic read of folio `pfn`: `None` if it is free, frozen or not uptodate
    /// (or not a folio of this arena at all: a stale or corrupted id).
    pub(crate) fn peek_begin(&self, pfn: u32) -> Option<Peek> {
        let desc = self.table.get(pfn as usize)?;
        let seq = desc.seq.load(Ordering::Acquire);
        let flags = desc.flags.load(Ordering::Acquire);
        if desc.refcount.is_frozen(self.policy) || flags & super::flag::UPTODATE == 0 {
            return None;
        }
        // The order may belong to another life; it only bounds the copy, and the arena bound
        // below keeps even a stale one inside memory we own.
        let order = desc.order.load(Ordering::Relaxed).min(super::MAX_ORDER);
        Some(Peek {
            pfn,
            seq,
            len: PAGE_SIZE << order,
            flags,
        })
    }

    /// Copies `dst.len()` bytes at byte `offset` of the folio into `dst`. Returns false
    /// (copying nothing) if the range is not inside the folio and the arena.
    ///
    /// `_pinned` must have been taken before the lookup that found the folio (see the module
    /// documentation: it is what keeps the folio's memory from being reused under the copy).
    pub(crate) fn peek_copy(
        &self,
        _pinned: &impl Pinned,
        peek: &Peek,
        offset: usize,
        dst: &mut [u8],
    ) -> bool {
        let arena_end = self.pages * PAGE_SIZE;
        let start = peek.pfn as usize * PAGE_SIZE + offset;
        match offset.checked_add(dst.len()) {
            Some(end) if end <= peek.len && start + dst.len() <= arena_end => {}
            _ => return false,
        }
        // SAFETY: the range lies inside the arena (checked above), which stays mapped for 'a.
        // In a private cache no thread writes it during the copy: the folio was found in an
        // index after the pin was taken, so its memory is not handed out again before the pin
        // is dropped, and it was uptodate at `peek_begin` (acquire), so it is not being filled;
        // uptodate folios are never written (module documentation). In a shared cache the
        // memory is also written by other processes, which the protocol keeps off it in the
        // same way; a process that breaks it can only make this copy read wrong bytes, which
        // `peek_valid` and the caller's index re-check then reject, never read outside the
        // mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(start),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }

    /// Starts bringing `len` bytes (at most [`PREFETCH_MAX`]) from byte `from` of the block
    /// at `pfn` into the CPU's cache ([`prefetch`]), so that a copy about to follow finds them
    /// on their way. A hint: nothing is read, so any block of the arena will do, whoever holds
    /// it; a range outside the arena is ignored.
    #[inline]
    pub(crate) fn prefetch(&self, pfn: u32, from: usize, len: usize) {
        if let Some((start, len)) = prefetch_range(self.pages, pfn, from, len) {
            prefetch(self.base.as_ptr().wrapping_add(start), len);
        }
    }

    /// Whether the bytes copied since `peek_begin` belong to the life found then: no new life
    /// began and the folio is not frozen for removal.
    pub(crate) fn peek_valid(&self, peek: &Peek) -> bool {
        fence(Ordering::Acquire);
        let Some(desc) = self.table.get(peek.pfn as usize) else {
            return false;
        };
        desc.seq.load(Ordering::Relaxed) == peek.seq
            && !desc.refcount.is_frozen(self.policy)
            && desc.flags.load(Ordering::Relaxed) & super::flag::UPTODATE != 0
    }

    /// Records an access for reclaim, as a private cache's hit does (`reclaim::mark_accessed`):
    /// the first access sets REFERENCED, the next PROMOTE.
    pub(crate) fn mark_accessed(&self, peek: &Peek) {
        use super::flag;
        let Some(desc) = self.table.get(peek.pfn as usize) else {
            return;
        };
        let now = desc.flags.load(Ordering::Relaxed);
        if now & flag::REFERENCED == 0 {
            desc.flags.fetch_or(flag::REFERENCED, Ordering::Relaxed);
        } else if now & (flag::ACTIVE | flag::PROMOTE) == 0 {
            desc.flags.fetch_or(flag::PROMOTE, Ordering::Relaxed);
        }
    }
}

impl Memory {
    /// The optimistic view of this cache's memory.
    pub(crate) fn view(&self) -> FolioView<'_> {
        // SAFETY: the arena and the table live as long as `self`, and have `pages()` pages.
        unsafe {
            FolioView::new(
                self.table.descs(),
                self.arena.base(),
                self.pages(),
                self.policy,
            )
        }
    }
}

/// The arena bytes `(start, len)` a prefetch of `len` bytes (at most [`PREFETCH_MAX`]) from
/// byte `from` of block `pfn` covers, in an arena of `pages` pages; `None` when any of it lies
/// outside (the values may come from a shared mapping any process can write).
fn prefetch_range(pages: usize, pfn: u32, from: usize, len: usize) -> Option<(usize, usize)> {
    let start = (pfn as usize).checked_mul(PAGE_SIZE)?.checked_add(from)?;
    let len = len.min(PREFETCH_MAX);
    (start.checked_add(len)? <= pages.checked_mul(PAGE_SIZE)?).then_some((start, len))
}

#[cfg(test)]
mod prefetch_tests {
    use super::*;

    /// A prefetch's range stays inside the arena whatever block and offset it is given.
    #[test]
    fn a_prefetch_outside_the_arena_is_dropped() {
        assert_eq!(prefetch_range(4, 1, 100, 64), Some((PAGE_SIZE + 100, 64)));
        assert_eq!(
            prefetch_range(4, 0, 0, 1 << 20),
            Some((0, PREFETCH_MAX)),
            "at most a page"
        );
        assert_eq!(
            prefetch_range(4, 3, PAGE_SIZE - 64, 64),
            Some((4 * PAGE_SIZE - 64, 64))
        );
        assert_eq!(
            prefetch_range(4, 3, PAGE_SIZE - 63, 64),
            None,
            "one byte past the end"
        );
        assert_eq!(prefetch_range(4, 4, 0, 1), None);
        assert_eq!(prefetch_range(4, u32::MAX, 0, 64), None);
        assert_eq!(prefetch_range(4, 0, usize::MAX, 64), None, "no overflow");
        assert_eq!(prefetch_range(usize::MAX, 1, usize::MAX - 10, 64), None);
    }
}
