//! Forking a process that uses the cache.
//!
//! A [`Cache`](crate::Cache) is not usable in the child of a `fork`: its I/O and flusher
//! threads did not come along, and locks they held stay held. The child must forget such a cache
//! (`std::mem::forget`, not drop: dropping waits for those threads) and make a new one. What the
//! caches of one process share must come through whole, though: the epochs (the grace periods
//! before memory is reused) and the hashed wait queues of folio locks. Call [`prepare`] in the
//! forking thread right before `fork` (a `pthread_atfork` prepare handler), and the returned
//! value's [`parent`](Prepared::parent) or [`child`](Prepared::child) right after, on each
//! side. The preload library does this.

use crate::mem::{epoch, wait};

/// The shared locks, held across a fork by the forking thread.
#[must_use = "call parent() or child() after the fork"]
pub struct Prepared {
    epoch: epoch::ForkHold,
    waits: Vec<std::sync::MutexGuard<'static, ()>>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").finish_non_exhaustive()
    }
}

/// Takes every lock the process's caches share, so that none is held by a thread that will not
/// exist in the child. Blocks while another thread holds one (each is held only briefly). The
/// calling thread must hold no epoch pin and be inside no cache call.
pub fn prepare() -> Prepared {
    let epoch = epoch::hold_for_fork();
    let waits = wait::hold_for_fork();
    Prepared { epoch, waits }
}

impl Prepared {
    /// In the parent after the fork: releases the locks.
    pub fn parent(self) {
        drop(self);
    }

    /// In the child after the fork: forgets the threads that did not come along (their epoch
    /// pins would hold every later grace period back) and the deferred frees of the parent's
    /// caches, then releases the locks.
    pub fn child(self) {
        let Prepared { epoch, waits } = self;
        epoch.child();
        drop(waits);
    }
}
