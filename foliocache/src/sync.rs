//! The one place the crate takes its synchronisation primitives from.
//!
//! Under `--cfg loom` the atomics and the mutex that take part in a lock-free protocol come from
//! [loom](https://docs.rs/loom), so the model tests in `tests/loom_*.rs` check the very code that
//! runs in production (the habit of tokio's `src/loom/mod.rs`). Everything else imports them
//! from here, never from `std::sync` directly.
//!
//! Two kinds of atomics are deliberately *not* modelled and live in [`unmodelled`]:
//! statistics counters, and fields that are only ever touched with the index's writer lock held
//! (node slot counts). Neither is part of any protocol a concurrent reader relies on, and
//! leaving them out keeps the models small enough to explore exhaustively.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Atomics that are never part of a lock-free protocol (see the module comment).
pub(crate) mod unmodelled {
    pub(crate) use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};

    /// A statistics counter: relaxed increments, read for reporting only.
    #[derive(Debug, Default)]
    pub(crate) struct Counter(AtomicU64);

    impl Counter {
        pub(crate) fn add(&self, n: u64) {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
        pub(crate) fn inc(&self) {
            self.add(1);
        }
        pub(crate) fn get(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }
}

/// A mutex whose `lock` never fails: a panic while holding it cannot leave the protected data
/// half-updated in a way later users could observe (every critical section in this crate either
/// completes or changes nothing), so poisoning is ignored.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: std::sync::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            inner: std::sync::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a reader does before retrying a lockless step that lost a race: a CPU pause normally,
/// a yield to the model's scheduler under loom (so a model cannot spin forever).
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
