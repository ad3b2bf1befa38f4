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
//!
//! # A reader's recent folio
//!
//! A handle remembers the folio its last optimistic read copied from last
//! (`mapping::Recent`: its block, its life `seq`, its pages in the file), and its next small
//! read inside those pages starts from that folio rather than from the index walk: a program
//! that reads a page in small pieces, reads a large folio 4 KiB at a time, or reads one record
//! again and again (seed 002's benchmark) walks the index once per folio. Memory files
//! (`Mapping::read_optimistic`) and files from storage (`Mapping::copy_hits`, which also
//! leaves a folio carrying the READAHEAD mark to the referenced path, and a read reaching the
//! folio's end to the walk, which prefetches the next folio) both do it. This folio was not found in an index under the current
//! pin, so the slot re-check cannot be the proof. The descriptor's `mapping` takes its place:
//! [`FolioView::peek_again`] loads it (acquire) before `index` and `seq`, and goes on only if
//! the folio is still at the hint's page of the reader's mapping and `seq` is still the life
//! the hint was taken in; after the copy, [`FolioView::peek_valid_in`] checks `mapping` and
//! `seq` again.
//!
//! - **Why the copy is sound.** A folio's `mapping` is set once per life, before it goes into
//!   an index, and set to 0 (release) right after it leaves the index, under the mapping's
//!   lock, before it can be freed. If the free's grace period did not wait for this pin, the
//!   epoch's guarantee makes everything before that free visible after the pin: the load of
//!   `mapping` then reads 0, or the id a later life stored. A later life's id is stored after
//!   its `seq` bump and the release fence behind it (`Memory::new_life`), so reading that id
//!   (acquire) makes the bump visible and the `seq` check fails. Either way nothing is copied
//!   from memory that could be handed out during the pin.
//! - **Why the result is right.** A `mapping` that still names the file, in the same life,
//!   means the folio was in the file's index when it was loaded, or had just left it inside a
//!   change that has not returned yet (the slot store and the clearing of `mapping` share one
//!   hold of the lock). Its bytes do not change in a life while it is uptodate, so the copy is
//!   the page's bytes at that moment. The read also checks that the folio's length is the one
//!   the hint was taken with, so a hint never reaches past its folio.
//! - **If `seq` wraps.** It is 32 bits: a block freed and reallocated a multiple of 2^32
//!   times while a handle sits between two reads would pass for its old life if it went into
//!   the same file again. The `index` check (the id is stored with release after it) keeps
//!   even that read right: the folio is then at the hint's page, in the file's index, and its
//!   bytes are that page's.
//!
//! A hint that fails is dropped and the read walks the index as any other. The loom models
//! `optimistic_read_from_the_recent_folio_vs_reuse_*` in `tests/loom_optimistic.rs` check the
//! protocol against a block taken by another file and by the same page in a new life.

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

    /// The life of the folio the read began on (its descriptor's `seq`).
    pub(crate) fn seq(&self) -> u32 {
        self.seq
    }

    /// The folio's length in bytes when the read began.
    pub(crate) fn len(&self) -> usize {
        self.len
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

    /// Asks for block `pfn`'s descriptor (a hint, as [`FolioView::prefetch`]: a block outside
    /// the table is ignored).
    pub(crate) fn prefetch_desc(&self, pfn: u32) {
        if let Some(desc) = self.table.get(pfn as usize) {
            prefetch(std::ptr::from_ref(desc).cast::<u8>(), 32);
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

    /// Starts an optimistic read of folio `pfn` that an earlier read, under another pin, found
    /// at page `index` of mapping `mapping` in life `seq` (a handle's recent folio, see the
    /// module documentation): `None` unless it is still there, in that life, uptodate and not
    /// frozen.
    #[inline]
    pub(crate) fn peek_again(
        &self,
        pfn: u32,
        seq: u32,
        (mapping, index): (u64, u64),
    ) -> Option<Peek> {
        let desc = self.table.get(pfn as usize)?;
        // Acquire, and before the rest: an id stored by a later life's insertion (release)
        // comes after that life's index and its `seq` bump (and the release fence behind it,
        // `Memory::new_life`), so reading that id makes both visible to the loads below.
        if mapping == 0
            || desc.mapping.load(Ordering::Acquire) != mapping
            || desc.index.load(Ordering::Relaxed) != index
        {
            return None;
        }
        self.peek_begin(pfn).filter(|peek| peek.seq == seq)
    }

    /// [`peek_valid`](Self::peek_valid) for a read begun with [`peek_again`](Self::peek_again):
    /// also still in mapping `mapping` after the copy.
    #[inline]
    pub(crate) fn peek_valid_in(&self, peek: &Peek, mapping: u64) -> bool {
        // `peek_valid`'s acquire fence orders the copy's loads before this one.
        self.peek_valid(peek)
            && self
                .table
                .get(peek.pfn as usize)
                .is_some_and(|desc| desc.mapping.load(Ordering::Relaxed) == mapping)
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
