//! Grace periods for folio memory: a folio that optimistic readers may still be copying is not
//! handed out again until they are done.
//!
//! An optimistic reader ([`super::optimistic`]) copies a folio's bytes without a reference. If
//! the folio could be freed *and reused* during that copy, the copy would race with the new
//! owner's writes. So the memory of a folio that was ever published in an index is given back
//! to the allocator only after a grace period: every reader that might have found it in an
//! index has finished. Readers hold a [`ReadGuard`] around the lookup and the copy; a free
//! defers the block's return until no guard taken before it is still alive. (Folios that never
//! reached an index are freed at once: no reader can know them.)
//!
//! In production the guard is a crossbeam-epoch pin and the return is `Guard::defer`: the
//! same epochs that protect index nodes, so a reader's cursor pin and its read guard are one
//! cheap nested pin. Under loom, crossbeam's internals would swamp the model, so a stand-in
//! with the same guarantee is used: readers register under a mutex, and deferred returns run
//! only when no reader is registered. The models then check the optimistic read *given*
//! grace periods; crossbeam's authors model their epochs themselves.

use super::buddy::Buddy;
use crate::sync::unmodelled::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Folio memory waiting for a grace period, and the allocator to return it to.
#[derive(Debug)]
pub(crate) struct Grace {
    buddy: Arc<Buddy>,
    /// Pages deferred and not yet returned (statistics, and for `reclaim_deferred`).
    pending: Arc<AtomicUsize>,
    #[cfg(loom)]
    stand_in: crate::sync::Mutex<StandIn>,
}

#[cfg(loom)]
#[derive(Debug, Default)]
struct StandIn {
    readers: usize,
    deferred: Vec<(u32, u8)>,
}

/// Held by an optimistic reader from before its index lookup until after its validation.
#[must_use]
pub(crate) struct ReadGuard<'g> {
    #[cfg(not(loom))]
    _pin: crossbeam_epoch::Guard,
    #[cfg(not(loom))]
    _grace: std::marker::PhantomData<&'g Grace>,
    #[cfg(loom)]
    grace: &'g Grace,
}

impl Grace {
    pub(crate) fn new(buddy: Arc<Buddy>) -> Self {
        Self {
            buddy,
            pending: Arc::new(AtomicUsize::new(0)),
            #[cfg(loom)]
            stand_in: crate::sync::Mutex::new(StandIn::default()),
        }
    }

    pub(crate) fn buddy(&self) -> &Buddy {
        &self.buddy
    }

    /// Starts a read that may copy folio bytes without a reference.
    pub(crate) fn read_guard(&self) -> ReadGuard<'_> {
        #[cfg(not(loom))]
        {
            ReadGuard {
                _pin: crossbeam_epoch::pin(),
                _grace: std::marker::PhantomData,
            }
        }
        #[cfg(loom)]
        {
            self.stand_in.lock().readers += 1;
            ReadGuard { grace: self }
        }
    }

    /// Returns a published folio's block to the allocator once every read guard alive now has
    /// been dropped.
    pub(crate) fn free_after_grace(&self, pfn: u32, order: u8) {
        self.pending.fetch_add(1 << order, Ordering::Relaxed);
        #[cfg(not(loom))]
        {
            let (buddy, pending) = (Arc::clone(&self.buddy), Arc::clone(&self.pending));
            let guard = crossbeam_epoch::pin();
            guard.defer(move || {
                buddy.free(pfn, order);
                pending.fetch_sub(1 << order, Ordering::Relaxed);
            });
            // Deferred functions wait in this thread's own bag until it fills up or is flushed;
            // a reader thread that happened to drop a folio's last reference may not pin again
            // for a long time, stranding the memory. Hand it to the global queue now (frees of
            // published folios are rare and off the hit path).
            guard.flush();
        }
        #[cfg(loom)]
        {
            let mut stand_in = self.stand_in.lock();
            stand_in.deferred.push((pfn, order));
            if stand_in.readers == 0 {
                self.return_deferred(&mut stand_in);
            }
        }
    }

    #[cfg(loom)]
    fn return_deferred(&self, stand_in: &mut StandIn) {
        for (pfn, order) in stand_in.deferred.drain(..) {
            self.buddy.free(pfn, order);
            self.pending.fetch_sub(1 << order, Ordering::Relaxed);
        }
    }

    /// Pages freed but still waiting for a grace period.
    pub(crate) fn pending_pages(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Pushes deferred frees along (they complete once no reader that could see them is left);
    /// returns whether none is pending any more. Each push advances the epoch if every pinned
    /// thread has caught up, and runs a few batches of deferred frees. A thread descheduled
    /// while pinned holds the epoch back until it runs again, so when pushing stops helping,
    /// this yields the CPU and tries again, for at most `patience`.
    pub(crate) fn reclaim_deferred(&self, patience: std::time::Duration) -> bool {
        #[cfg(not(loom))]
        {
            // A caller that is itself pinned (holding a cursor, say) holds the epoch back: waiting
            // would only wait for itself. Push once and report.
            let patience = if crossbeam_epoch::is_pinned() {
                std::time::Duration::ZERO
            } else {
                patience
            };
            let start = std::time::Instant::now();
            let mut last = self.pending_pages();
            let mut idle = 0u32;
            while last > 0 {
                crossbeam_epoch::pin().flush();
                let now = self.pending_pages();
                idle = if now < last { 0 } else { idle + 1 };
                last = now;
                if start.elapsed() >= patience {
                    break;
                }
                if idle >= 64 {
                    std::thread::yield_now();
                    idle = 0;
                }
            }
        }
        #[cfg(loom)]
        let _ = patience;
        #[cfg(loom)]
        {
            let mut stand_in = self.stand_in.lock();
            if stand_in.readers == 0 {
                self.return_deferred(&mut stand_in);
            }
        }
        self.pending_pages() == 0
    }
}

#[cfg(loom)]
impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let mut stand_in = self.grace.stand_in.lock();
        stand_in.readers -= 1;
        if stand_in.readers == 0 {
            self.grace.return_deferred(&mut stand_in);
        }
    }
}
