//! Optimistic reads: copying a folio's bytes without taking a reference.
//!
//! A small read of a cached page costs, on the referenced path, a `try_get` and a `put`: two
//! atomic read-modify-writes on the folio's count, a cache line every reader of that folio
//! writes. With several threads reading one page (seed 002's benchmark) that line bounces
//! between cores on every read. An optimistic read writes nothing shared:
//!
//! 1. find the folio in the index (under the reader's epoch pin);
//! 2. [`Memory::peek_begin`]: read the descriptor's `seq` (acquire), and give up if the folio is
//!    free or frozen or not uptodate;
//! 3. [`Memory::peek_copy`]: copy the bytes into a private buffer with volatile word loads;
//! 4. [`Memory::peek_valid`]: acquire fence, then `seq` must be unchanged and the folio still not
//!    frozen; and the caller re-reads the index slot, which must still hold the folio.
//!
//! Only then are the bytes handed out. Why that is enough: bytes of a folio change only in a
//! new life (uptodate folios are immutable, see `crate::file`), and a new life begins in
//! `Memory::alloc_folio` with `seq` bumped and a release fence *before* the new owner writes a
//! byte. If the copy saw any byte of a new life, the acquire fence after it makes the bumped
//! `seq` visible to step 4, and the read is retried. If `seq` is unchanged, no new life began
//! while we copied, so the bytes are the life we found in the index; the slot re-check proves
//! that life was still this page of this file at that moment (a truncated folio leaves the
//! slot). This is the seqlock pattern of vmcache's optimistic versioned reads and of Linux's
//! seqcounts.
//!
//! The copy races, by design, with the rare writer of a reused folio; its result is then
//! discarded. Rust has no atomic memcpy yet (RFC 3301), so, like crossbeam's `AtomicCell`
//! seqlock and Linux's `data_race()` reads, the copy uses volatile loads, which the compiler
//! may neither elide nor duplicate, and never lets an unvalidated byte escape.

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

    /// Copies `dst.len()` bytes at byte `offset` of the folio into `dst`. The bytes may be
    /// garbage until [`peek_valid`](Self::peek_valid) says otherwise. Returns false (copying
    /// nothing) if the range is not inside the folio.
    pub(crate) fn peek_copy(&self, peek: &Peek, offset: usize, dst: &mut [u8]) -> bool {
        let arena_end = self.pages() * PAGE_SIZE;
        let start = peek.pfn as usize * PAGE_SIZE + offset;
        match offset.checked_add(dst.len()) {
            Some(end) if end <= peek.len && start + dst.len() <= arena_end => {}
            _ => return false,
        }
        let src = self.page_ptr(peek.pfn).wrapping_add(offset);
        let mut words = dst.chunks_exact_mut(8);
        let mut at = 0;
        for word in &mut words {
            // SAFETY: `src + at .. + 8` lies inside the arena (checked above), which stays
            // mapped while `self` lives; the load may race with a writer of a reused folio,
            // and its value is then discarded by `peek_valid` (see the module documentation).
            // Unaligned: the caller's offset is arbitrary.
            let value = unsafe { src.add(at).cast::<u64>().read_volatile_unaligned() };
            word.copy_from_slice(&value.to_ne_bytes());
            at += 8;
        }
        for byte in words.into_remainder() {
            // SAFETY: as above, for one byte inside the checked range.
            *byte = unsafe { src.add(at).read_volatile() };
            at += 1;
        }
        true
    }

    /// Whether the bytes copied since `peek_begin` belong to the life found then: no new life
    /// began and the folio is not frozen for removal.
    pub(crate) fn peek_valid(&self, peek: &Peek) -> bool {
        fence(Ordering::Acquire);
        let desc = self.desc(peek.pfn);
        desc.seq.load(Ordering::Relaxed) == peek.seq && !desc.refcount.is_frozen(self.policy)
    }
}

/// `read_volatile` for a possibly unaligned `u64`.
trait ReadVolatileUnaligned {
    /// # Safety
    /// As `ptr::read_volatile`, minus the alignment requirement.
    unsafe fn read_volatile_unaligned(self) -> u64;
}

impl ReadVolatileUnaligned for *const u64 {
    unsafe fn read_volatile_unaligned(self) -> u64 {
        if self.is_aligned() {
            // SAFETY: aligned and, per the caller's contract, valid for reads.
            unsafe { self.read_volatile() }
        } else {
            let mut bytes = [0u8; 8];
            let src = self.cast::<u8>();
            for (k, byte) in bytes.iter_mut().enumerate() {
                // SAFETY: byte `k` of the 8 the caller vouches for.
                *byte = unsafe { src.add(k).read_volatile() };
            }
            u64::from_ne_bytes(bytes)
        }
    }
}
