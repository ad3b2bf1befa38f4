//! Whether the cache serves a file now: a sequence number, even while it does, odd while the
//! file passes through to the kernel, bumped by each switch. No lock on the read path.
//!
//! # The protocol
//! * A reader takes a *ticket* ([`Serving::ticket`]: the number, if even), copies from the
//!   cache, and keeps the copy only if the number is still the same afterwards
//!   ([`Serving::still`]); otherwise it reads through the kernel.
//! * A switch to passing through ([`Serving::stop_after`]) first runs `write_back` (the kernel
//!   gets every byte the cache holds newer than storage; writers are held off by the caller's
//!   gate meanwhile), then makes the number odd. The caller releases the lease only after it
//!   returns: only then can another process write.
//! * A switch back ([`Serving::start`]) makes the number even, after the caller dropped what
//!   the cache may have read while it did not serve.
//!
//! So a copy a reader keeps was made while the number was even, before the switch made it
//! odd, hence before the lease was released and before any other process could write: it is
//! what a read racing the other process's write may return. A reader that sees the number odd
//! reads the kernel, which by then has every byte of the write back. (Making the number odd
//! *before* the write back would let such a reader read what storage had before the cache's
//! newer bytes: the PostgreSQL crash-recovery corruption this order fixes.) The loom model
//! is `tests/loom_serving.rs`.
//!
//! All accesses are `SeqCst`: the reader's second load must not move before its copy, and the
//! switch's store must not move before the write back.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Serving {
    seq: AtomicU64,
}

impl Serving {
    /// Passing through (odd), until the first [`start`](Self::start).
    pub(crate) fn new() -> Self {
        Self {
            seq: AtomicU64::new(1),
        }
    }

    /// A ticket to read from the cache, if it serves the file now.
    pub(crate) fn ticket(&self) -> Option<u64> {
        let seq = self.seq.load(Ordering::SeqCst);
        (seq & 1 == 0).then_some(seq)
    }

    /// Whether a copy made with `ticket` may be kept (no switch since).
    pub(crate) fn still(&self, ticket: u64) -> bool {
        self.seq.load(Ordering::SeqCst) == ticket
    }

    /// Whether the cache serves the file now.
    pub(crate) fn now(&self) -> bool {
        self.ticket().is_some()
    }

    /// Starts serving (the caller holds the lease and dropped what may be stale). The caller
    /// serialises switches.
    pub(crate) fn start(&self) {
        if self.seq.load(Ordering::SeqCst) & 1 == 1 {
            self.seq.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Stops serving: `write_back` first, then readers go to the kernel. Returns whether it
    /// was serving.
    pub(crate) fn stop_after(&self, write_back: impl FnOnce()) -> bool {
        if !self.now() {
            return false;
        }
        write_back();
        self.seq.fetch_or(1, Ordering::SeqCst);
        true
    }

    /// Stops serving at once, taking no lock (a hook nested in another: the caller has no
    /// newer bytes than storage, see the adapter).
    pub(crate) fn stop_now(&self) {
        self.seq.fetch_or(1, Ordering::SeqCst);
    }
}
