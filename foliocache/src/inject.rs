//! Faults armed on purpose, for tests: allocation failures, I/O errors, short reads and panics
//! on the I/O completion path. Each cache has its own set (tests running in parallel do not
//! disturb each other), armed through [`crate::raw::Injector`]. When nothing is armed, the
//! cost on the paths that check is one relaxed load of a word that is never written.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The faults armed on one cache (counts of events still to fault).
#[derive(Debug, Default)]
pub(crate) struct Inject {
    /// Set while any count below is nonzero (the fast-path check).
    armed: AtomicU32,
    /// Folio allocations to fail with `NoMemory`.
    pub(crate) alloc_failures: AtomicU32,
    /// I/O completions (reads or writes by the engine) to turn into `EIO`.
    pub(crate) io_errors: AtomicU32,
    /// I/O completions to cut short: the engine sees only this many bytes (then continues the
    /// rest as it would after a real short transfer).
    pub(crate) short_transfers: AtomicU32,
    /// The byte count a cut-short completion reports (at most the request's length minus one).
    pub(crate) short_bytes: AtomicU64,
    /// Completions whose processing panics (inside the engine's completion path).
    pub(crate) completion_panics: AtomicU32,
    /// Write completions to turn into `ENOSPC`.
    pub(crate) nospace_errors: AtomicU32,
    /// Events faulted so far, all kinds together.
    pub(crate) fired: AtomicU64,
}

impl Inject {
    /// Whether anything is armed (one relaxed load).
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed) != 0
    }

    pub(crate) fn arm(&self, counter: &AtomicU32, n: u32) {
        counter.store(n, Ordering::Relaxed);
        self.armed.fetch_add(1, Ordering::Relaxed);
    }

    /// An errno for the next write, if an I/O error or a no-space error is armed.
    pub(crate) fn take_write_error(&self) -> Option<i32> {
        if self.take(&self.io_errors) {
            Some(libc::EIO)
        } else if self.take(&self.nospace_errors) {
            Some(libc::ENOSPC)
        } else {
            None
        }
    }

    /// Consumes one event of `counter` if any is left.
    pub(crate) fn take(&self, counter: &AtomicU32) -> bool {
        if !self.armed() {
            return false;
        }
        let taken = counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if taken {
            self.fired.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }
}
