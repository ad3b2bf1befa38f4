//! Grace periods for folio memory: a folio that optimistic readers may still be copying is not
//! handed out again until they are done.
//!
//! An optimistic reader ([`super::optimistic`]) copies a folio's bytes without a reference. If
//! the folio could be freed *and reused* during that copy, the copy would race with the new
//! owner's writes. So the memory of a folio that was ever published in an index is given back
//! to the allocator only after a grace period: every reader that might have found it in an
//! index has finished. Readers hold a [`ReadGuard`] (an epoch pin, [`super::epoch`]) around the
//! lookup and the copy; a free defers the block's return until no pin taken before it is still
//! alive. (Folios that never reached an index are freed at once: no reader can know them.)
//!
//! The pins are the same epochs that protect index nodes, so a reader's cursor pin nested in its
//! read guard costs a counter increment.

use super::buddy::Buddy;
use super::epoch;
use crate::sync::unmodelled::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Folio memory waiting for a grace period, and the allocator to return it to.
#[derive(Debug)]
pub(crate) struct Grace {
    buddy: Arc<Buddy>,
    /// Pages deferred and not yet returned (statistics, and for `reclaim_deferred`).
    pending: Arc<AtomicUsize>,
}

/// Held by an optimistic reader from before its index lookup until after its validation.
#[must_use]
pub(crate) struct ReadGuard<'g> {
    _pin: epoch::Guard,
    _grace: std::marker::PhantomData<&'g Grace>,
}

impl ReadGuard<'_> {
    /// The reading thread's [`thread_slot`](crate::sync::thread_slot) (no thread-local access).
    #[inline]
    pub(crate) fn thread_slot(&self) -> usize {
        self._pin.thread_slot()
    }
}

impl Grace {
    pub(crate) fn new(buddy: Arc<Buddy>) -> Self {
        Self {
            buddy,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn buddy(&self) -> &Buddy {
        &self.buddy
    }

    /// Starts a read that may copy folio bytes without a reference.
    #[inline]
    pub(crate) fn read_guard(&self) -> ReadGuard<'_> {
        ReadGuard {
            _pin: epoch::pin(),
            _grace: std::marker::PhantomData,
        }
    }

    /// Returns a published folio's block to the allocator once every read guard alive now has
    /// been dropped.
    pub(crate) fn free_after_grace(&self, pfn: u32, order: u8) {
        self.pending.fetch_add(1 << order, Ordering::Relaxed);
        let (buddy, pending) = (Arc::clone(&self.buddy), Arc::clone(&self.pending));
        epoch::defer(move || {
            buddy.free(pfn, order);
            pending.fetch_sub(1 << order, Ordering::Relaxed);
        });
    }

    /// Pages freed but still waiting for a grace period.
    pub(crate) fn pending_pages(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Pushes deferred frees along (they complete once no reader that could see them is left);
    /// returns whether none is pending any more. A reader descheduled while pinned holds the
    /// epoch back until it runs again, so when collecting stops helping this yields the CPU and
    /// tries again, for at most `patience`.
    pub(crate) fn reclaim_deferred(&self, patience: std::time::Duration) -> bool {
        self.reclaim_until(patience, || false)
    }

    /// As [`reclaim_deferred`](Self::reclaim_deferred), but calls `enough` after each collect
    /// and stops as soon as it says so (an allocation that got what it asked for), even with
    /// frees still pending. Returns whether none is pending any more.
    ///
    /// An allocation must not wait for the whole queue: while other threads evict, it never
    /// empties, and each collect in asymmetric mode interrupts every CPU running a reader
    /// (`membarrier`), so waiting for it would cost a barrier per spin for the whole patience.
    pub(crate) fn reclaim_until(
        &self,
        patience: std::time::Duration,
        mut enough: impl FnMut() -> bool,
    ) -> bool {
        // A caller that is itself pinned (holding a cursor, say) holds the epoch back: waiting
        // would only wait for itself. Collect once and report. Under loom, one attempt too: a
        // model must not spin on the clock.
        let patience = if epoch::is_pinned() || cfg!(loom) {
            std::time::Duration::ZERO
        } else {
            patience
        };
        let start = std::time::Instant::now();
        loop {
            epoch::collect();
            // `enough` first: it takes what the collect gave back even when nothing is left
            // pending.
            if enough() || self.pending_pages() == 0 || start.elapsed() >= patience {
                break;
            }
            std::thread::yield_now();
        }
        self.pending_pages() == 0
    }
}
