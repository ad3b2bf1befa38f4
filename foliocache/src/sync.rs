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
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

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

    /// Shards of a per-thread statistics counter. A counter bumped on every read must not be
    /// one shared cache line: with several threads reading one file it would bounce between
    /// cores on every read, the very cost seed 002 removes from the refcount.
    /// 16 shards of 128 bytes: 2 KiB per counter (per file, times its few reader counters).
    const SHARDS: usize = 16;

    /// A statistics counter split in per-thread shards (summed when read).
    #[derive(Debug, Default)]
    pub(crate) struct ShardedCounter {
        shards: [crossbeam_utils::CachePadded<AtomicU64>; SHARDS],
    }

    impl ShardedCounter {
        pub(crate) fn add(&self, n: u64) {
            let shard = &self.shards[super::thread_slot() % SHARDS];
            // A shard is written by its own thread only (unless more than 16 threads share
            // slots, when a rare increment may be lost: these are statistics). A load and a
            // store, not a locked read-modify-write: the read path pays no atomic instruction.
            shard.store(
                shard.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        }
        pub(crate) fn inc(&self) {
            self.add(1);
        }
        pub(crate) fn get(&self) -> u64 {
            self.shards.iter().map(|s| s.load(Ordering::Relaxed)).sum()
        }
    }
}

/// A small number identifying the current thread (assigned round robin on first use): the
/// slot of per-thread allocator caches and counter shards.
pub(crate) fn thread_slot() -> usize {
    use std::cell::Cell;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.with(|slot| {
        if slot.get() == usize::MAX {
            slot.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        slot.get()
    })
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
