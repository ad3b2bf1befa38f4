//! A value that threads only ever *try* to take, never wait for: one flag and a cell.
//!
//! A description's readahead states live in such slots (`adapter`): every read takes one,
//! and a thread that finds its slot busy tries the next one, then makes a fresh state. No
//! thread waits, so the lock needs no waiter list: taking it is one compare-and-swap of the
//! flag (false to true, acquire), leaving it a plain store of false (release). A mutex's
//! unlock is an exchange instead, to learn whether to wake a waiter, and this runs on every
//! read.
//!
//! # The protocol
//! * The value is reached only through a [`Taken`], and one exists only while the flag is
//!   true and was made true by the compare-and-swap that made that `Taken`. So at most one
//!   thread reaches the value at a time.
//! * A `Taken` stores false when it is dropped, after its last access to the value (its
//!   fields drop in order: the access, then the flag). The store releases what the holder
//!   wrote; the next compare-and-swap that succeeds acquires it.
//! * A process that dies holding a slot leaves nothing behind: the slots live in the
//!   process's own memory (not in a shared mapping).
//!
//! The loom model is `tests/loom_slot.rs` (this file, included as it is).

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, Ordering};

/// See the module documentation. Aligned to 128 bytes, so that a slot is alone on its cache
/// lines (and on the pair the CPU's adjacent-line prefetcher fetches together): each thread
/// takes its own slot on every read, and two slots on one line would move it between their
/// CPUs.
#[repr(align(128))]
pub(crate) struct TrySlot<T> {
    busy: AtomicBool,
    value: cell::Cell<T>,
}

// SAFETY: the value is only reached through a `Taken`, and `busy` lets one exist at a time
// (the compare-and-swap that makes one acquires what the last one's drop released), so the
// value moves between threads but is never used by two at once: what `T: Send` allows.
unsafe impl<T: Send> Sync for TrySlot<T> {}

impl<T: Default> Default for TrySlot<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> std::fmt::Debug for TrySlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrySlot")
            .field("busy", &self.busy.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T> TrySlot<T> {
    /// A free slot holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            busy: AtomicBool::new(false),
            value: cell::Cell::new(value),
        }
    }

    /// The slot's value, unless another thread has it now.
    pub(crate) fn try_lock(&self) -> Option<Taken<'_, T>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(Taken {
            access: self.value.access(),
            _leave: Leave(&self.busy),
        })
    }
}

/// A slot taken by [`TrySlot::try_lock`]; dropping it gives the slot back.
pub(crate) struct Taken<'a, T> {
    // Declared before `_leave`, so dropped first: the access ends before the flag is cleared.
    access: cell::Access<T>,
    _leave: Leave<'a>,
}

/// Clears a slot's flag when dropped (the last step of a [`Taken`]'s drop).
struct Leave<'a>(&'a AtomicBool);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<T> std::ops::Deref for Taken<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this `Taken` is the only one of its slot (see `TrySlot`'s `Sync`), and it
        // lives no longer than the slot (its lifetime).
        unsafe { &*self.access.ptr() }
    }
}

impl<T> std::ops::DerefMut for Taken<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` is the only borrow of the `Taken`.
        unsafe { &mut *self.access.ptr() }
    }
}

/// The cell, and one holder's access to it: `std`'s in a build, loom's (which checks that no
/// two accesses overlap without ordering between them) in the model.
#[cfg(not(loom))]
mod cell {
    pub(super) struct Cell<T>(std::cell::UnsafeCell<T>);
    pub(super) struct Access<T>(*mut T);

    impl<T> Cell<T> {
        pub(super) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }
        pub(super) fn access(&self) -> Access<T> {
            Access(self.0.get())
        }
    }

    impl<T> Access<T> {
        pub(super) fn ptr(&self) -> *mut T {
            self.0
        }
    }
}

#[cfg(loom)]
mod cell {
    pub(super) struct Cell<T>(loom::cell::UnsafeCell<T>);
    /// Loom counts the access as live until this is dropped.
    pub(super) struct Access<T>(loom::cell::MutPtr<T>);

    impl<T> Cell<T> {
        pub(super) fn new(value: T) -> Self {
            Self(loom::cell::UnsafeCell::new(value))
        }
        pub(super) fn access(&self) -> Access<T> {
            Access(self.0.get_mut())
        }
    }

    impl<T> Access<T> {
        pub(super) fn ptr(&self) -> *mut T {
            self.0.with(|ptr| ptr)
        }
    }
}
