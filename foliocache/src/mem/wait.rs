//! Hashed wait queues for folio flag bits (the kernel's `folio_wait_table`).
//!
//! A thread that must wait for a folio's LOCKED bit to clear parks on one of 256 queues chosen
//! by hashing the descriptor's address; the folio itself carries no queue. To keep unlocking
//! cheap, a waiter first sets the folio's WAITERS bit: `unlock` clears LOCKED and WAITERS in one
//! atomic step and only touches a queue when WAITERS was set.
//!
//! No lost wake-up: a waiter sets WAITERS and re-checks LOCKED *while holding its queue's
//! mutex*; an unlocker that saw WAITERS takes the same mutex before notifying. Either the
//! unlocker's atomic step comes first in the flag word's order (then the waiter's re-check sees
//! LOCKED clear and does not sleep), or the waiter's comes first (then the unlocker sees WAITERS,
//! and cannot notify before the waiter sleeps, since the waiter releases the mutex only by
//! sleeping). Several folios may share a queue, so wake-ups are broadcast and waiters re-check.

#[cfg(not(loom))]
use std::sync::{Condvar, Mutex, PoisonError};

#[cfg(not(loom))]
struct Queue {
    lock: Mutex<()>,
    wake: Condvar,
}

#[cfg(not(loom))]
static TABLE: [Queue; 256] = [const {
    Queue {
        lock: Mutex::new(()),
        wake: Condvar::new(),
    }
}; 256];

#[cfg(not(loom))]
fn queue(key: usize) -> &'static Queue {
    // Fibonacci hashing of the descriptor address (descriptors are 32 bytes apart).
    let hash = (key >> 5).wrapping_mul(0x9E37_79B9_7F4A_7C15_usize);
    &TABLE[hash >> (usize::BITS - 8)]
}

/// Sleeps until `still_waiting()` is false. `announce()` sets the WAITERS bit; the condition is
/// re-checked under the queue's mutex after announcing.
#[cfg(not(loom))]
pub(crate) fn wait(key: usize, announce: impl Fn(), still_waiting: impl Fn() -> bool) {
    let queue = queue(key);
    let mut guard = queue.lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        announce();
        if !still_waiting() {
            return;
        }
        guard = queue
            .wake
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// Every queue's mutex, held by a thread that is about to fork (see [`crate::fork`]): the child
/// then finds them all free. Taken in table order, one at a time, each held only briefly by
/// anyone else.
#[cfg(not(loom))]
pub(crate) fn hold_for_fork() -> Vec<std::sync::MutexGuard<'static, ()>> {
    TABLE
        .iter()
        .map(|queue| queue.lock.lock().unwrap_or_else(PoisonError::into_inner))
        .collect()
}

/// Wakes every thread waiting on `key`'s queue.
#[cfg(not(loom))]
pub(crate) fn wake_all(key: usize) {
    let queue = queue(key);
    let _guard = queue.lock.lock().unwrap_or_else(PoisonError::into_inner);
    queue.wake.notify_all();
}

/// Under loom, waiting yields to the model's scheduler instead of sleeping.
#[cfg(loom)]
pub(crate) fn wait(_key: usize, announce: impl Fn(), still_waiting: impl Fn() -> bool) {
    loop {
        announce();
        if !still_waiting() {
            return;
        }
        loom::thread::yield_now();
    }
}

#[cfg(loom)]
pub(crate) fn wake_all(_key: usize) {}
