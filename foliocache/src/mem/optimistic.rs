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

use super::{Memory, PAGE_SIZE};
use crate::sync::{Ordering, fence};

/// An optimistic read in progress (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peek {
    pfn: u32,
    seq: u32,
    len: usize,
}

impl Memory {
    /// Starts an optimistic read of folio `pfn`: `None` if it is free, frozen or not uptodate
    /// (the caller then takes the referenced path).
    pub(crate) fn peek_begin(&self, pfn: u32) -> Option<Peek> {
        let desc = self.desc(pfn);
        let seq = desc.seq.load(Ordering::Acquire);
        if desc.refcount.is_frozen(self.policy)
            || desc.flags.load(Ordering::Acquire) & super::flag::UPTODATE == 0
        {
            return None;
        }
        // The order may belong to another life; it only bounds the copy, and the arena bound
        // below keeps even a stale one inside memory we own.
        let len = PAGE_SIZE << desc.order.load(Ordering::Relaxed);
        Some(Peek { pfn, seq, len })
    }

    /// Copies `dst.len()` bytes at byte `offset` of the folio into `dst`. Returns false
    /// (copying nothing) if the range is not inside the folio.
    ///
    /// `_guard` must have been taken before the lookup that found the folio (see the module
    /// documentation: it is what keeps the folio's memory from being reused under the copy).
    pub(crate) fn peek_copy(
        &self,
        _guard: &super::ReadGuard<'_>,
        peek: &Peek,
        offset: usize,
        dst: &mut [u8],
    ) -> bool {
        let arena_end = self.pages() * PAGE_SIZE;
        let start = peek.pfn as usize * PAGE_SIZE + offset;
        match offset.checked_add(dst.len()) {
            Some(end) if end <= peek.len && start + dst.len() <= arena_end => {}
            _ => return false,
        }
        // SAFETY: the range lies inside the arena (checked above), which stays mapped while
        // `self` lives. No thread writes it during the copy: the folio was found in an index
        // after `_guard` was taken, so its memory is not handed out again before the guard is
        // dropped, and it was uptodate at `peek_begin` (acquire), so it is not being filled;
        // uptodate folios are never written (module documentation).
        let src =
            unsafe { std::slice::from_raw_parts(self.page_ptr(peek.pfn).add(offset), dst.len()) };
        dst.copy_from_slice(src);
        true
    }

    /// Whether the bytes copied since `peek_begin` belong to the life found then: no new life
    /// began and the folio is not frozen for removal.
    pub(crate) fn peek_valid(&self, peek: &Peek) -> bool {
        fence(Ordering::Acquire);
        let desc = self.desc(peek.pfn);
        desc.seq.load(Ordering::Relaxed) == peek.seq
            && !desc.refcount.is_frozen(self.policy)
            && desc.flags.load(Ordering::Relaxed) & super::flag::UPTODATE != 0
    }
}
