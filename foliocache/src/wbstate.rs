//! What each file from storage keeps for writeback ([`WbState`]): the pass lock (the kernel's
//! `I_SYNC`), the error sequence ([`ErrSeq`], the kernel's `errseq_t`), when the file became
//! dirty, and counters. Below the inode, which holds one; the passes themselves are in
//! `writeback.rs`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The kernel's errseq_t (`lib/errseq.c`): the last error (errno, 12 bits), whether anyone has
/// seen it (bit 12), and a counter of errors seen (the rest).
/// In a shared cache the word lives in the file's record, so it outlives the owner.
#[derive(Debug)]
pub(crate) struct ErrSeq(crate::mem::word::Word<AtomicU32>);

impl Default for ErrSeq {
    fn default() -> Self {
        Self(crate::mem::word::Word::Own(AtomicU32::new(0)))
    }
}

impl ErrSeq {
    /// The errseq held in `word` (a shared cache's file record).
    pub(crate) fn in_word(word: crate::mem::word::Word<AtomicU32>) -> Self {
        Self(word)
    }
}

const ERRNO_MASK: u32 = (1 << 12) - 1;
const SEEN: u32 = 1 << 12;
/// The "seen" bit of an errseq word (a shared cache's client samples the word itself).
pub(crate) const ERRSEQ_SEEN: u32 = SEEN;
const COUNTER_ONE: u32 = 1 << 13;

impl ErrSeq {
    /// Records an error (`errseq_set`). The counter moves only if the last error was seen:
    /// errors nobody looked at merge into one report.
    pub(crate) fn set(&self, errno: i32) {
        let errno = (errno.unsigned_abs() & ERRNO_MASK).max(1);
        let mut old = self.0.load(Ordering::Acquire);
        loop {
            let mut new = (old & !(ERRNO_MASK | SEEN)) | errno;
            if old & SEEN != 0 {
                new = new.wrapping_add(COUNTER_ONE);
            }
            if new == old {
                return;
            }
            match self
                .0
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) if now == new => return,
                Err(now) => old = now,
            }
        }
    }

    /// What a new reader of the errors starts from (`errseq_sample`): 0 while the current
    /// error is unseen, so a handle opened after an error nobody saw still reports it.
    pub(crate) fn sample(&self) -> u32 {
        let now = self.0.load(Ordering::Acquire);
        if now & SEEN == 0 { 0 } else { now }
    }

    /// The error recorded since `since`, if any, marking it seen and moving `since` on
    /// (`errseq_check_and_advance`): each reader gets each error once.
    pub(crate) fn check_and_advance(&self, since: &mut u32) -> Option<i32> {
        let old = self.0.load(Ordering::Acquire);
        if old == *since {
            return None;
        }
        let new = old | SEEN;
        if new != old {
            // A lost race is fine: someone else marked it seen.
            let _ = self
                .0
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire);
        }
        *since = new;
        match new & ERRNO_MASK {
            0 => None,
            errno => Some(errno as i32),
        }
    }
}

/// What each file from storage keeps for writeback.
#[derive(Debug, Default)]
pub(crate) struct WbState {
    /// One pass at a time (the kernel's `I_SYNC`); also taken by changes that must not run
    /// during a pass (truncation, hole punching).
    pass: Mutex<()>,
    /// Errors of writeback, as an errseq.
    pub(crate) errors: ErrSeq,
    /// When the file first became dirty since it was last clean (the kernel's
    /// `dirtied_when`, for expiry), and whether it is on the flusher's list.
    dirtied: Mutex<Option<std::time::Instant>>,
    /// Pages written back, and writes that failed (counters).
    pub(crate) written_pages: AtomicU64,
    pub(crate) failed_writes: AtomicU64,
}

impl WbState {
    /// A file's writeback state whose errors live in `errors` (a shared cache's record).
    pub(crate) fn with_errors(errors: ErrSeq) -> Self {
        Self {
            errors,
            ..Self::default()
        }
    }

    pub(crate) fn pass_lock(&self) -> Passing<'_> {
        let order = crate::sync::order::taking(crate::sync::order::Rank::Pass);
        Passing {
            _guard: self.pass.lock().unwrap_or_else(PoisonError::into_inner),
            _order: order,
        }
    }

    /// Notes that the file has dirty data; returns true when it just became dirty (the caller
    /// then puts it on the flusher's list).
    pub(crate) fn note_dirtied(&self) -> bool {
        let mut dirtied = self.dirtied.lock().unwrap_or_else(PoisonError::into_inner);
        if dirtied.is_some() {
            return false;
        }
        *dirtied = Some(std::time::Instant::now());
        true
    }

    pub(crate) fn dirtied_when(&self) -> Option<std::time::Instant> {
        *self.dirtied.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets when the file became dirty if `clean()` says it has no dirty data left: asked
    /// under the same lock as `note_dirtied`, so a writer that dirties a folio meanwhile
    /// (counted before it calls `note_dirtied`) either keeps the file dirty here or finds it
    /// clean there and puts it back on the flusher's list.
    pub(crate) fn clear_dirtied_if(&self, clean: impl FnOnce() -> bool) {
        let mut dirtied = self.dirtied.lock().unwrap_or_else(PoisonError::into_inner);
        if clean() {
            *dirtied = None;
        }
    }
}

/// The pass lock, held (see [`WbState::pass_lock`]).
pub(crate) struct Passing<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    _order: crate::sync::order::Held,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errseq_follows_the_kernels_worked_example() {
        // docs/KERNEL.md, "Writeback errors", worked example; EIO = 5.
        let wb = ErrSeq::default();
        let (mut a, mut b) = (wb.sample(), wb.sample());
        assert_eq!((a, b), (0, 0));
        wb.set(-5);
        let mut c = wb.sample(); // opened after the error, before anyone saw it
        assert_eq!(c, 0, "an unseen error reaches a later opener");
        assert_eq!(wb.check_and_advance(&mut a), Some(5));
        let mut d = wb.sample(); // opened after it was seen
        assert_ne!(d, 0);
        assert_eq!(wb.check_and_advance(&mut b), Some(5));
        assert_eq!(wb.check_and_advance(&mut c), Some(5));
        assert_eq!(
            wb.check_and_advance(&mut d),
            None,
            "opened after it was seen"
        );
        assert_eq!(wb.check_and_advance(&mut a), None, "reported once");
        // A second error: everyone sees it once.
        wb.set(-5);
        for since in [&mut a, &mut b, &mut c, &mut d] {
            assert_eq!(wb.check_and_advance(since), Some(5));
            assert_eq!(wb.check_and_advance(since), None);
        }
        // Two errors before anyone looks: one report (the latest errno).
        let mut e = wb.sample();
        wb.set(-5);
        wb.set(-28);
        assert_eq!(wb.check_and_advance(&mut e), Some(28));
        assert_eq!(wb.check_and_advance(&mut e), None);
    }
}
