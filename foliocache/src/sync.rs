//! The one place the crate takes its synchronisation primitives from.
//!
//! Under `--cfg loom` the atomics and the mutex that take part in a lock-free protocol come from
//! [loom](https://docs.rs/loom), so the model tests in `tests/loom_*.rs` check the very code that
//! runs in production (the habit of tokio's `src/loom/mod.rs`). Locks outside every modelled
//! protocol (those paired with a condvar, the file table, a file's change and pass locks) are
//! std's; the lock order of all of them, and its debug-build check ([`order`]), is here too.
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
            self.add_in(super::thread_slot(), n);
        }
        /// [`add`](Self::add) with the caller's [`thread_slot`](super::thread_slot), for a
        /// caller bumping several counters.
        #[inline]
        pub(crate) fn add_in(&self, slot: usize, n: u64) {
            let shard = &self.shards[slot % SHARDS];
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
    // While the thread's thread-locals are being destroyed the slot is gone: slot 0 then.
    SLOT.try_with(|slot| {
        if slot.get() == usize::MAX {
            slot.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        slot.get()
    })
    .unwrap_or(0)
}

/// A mutex whose `lock` never fails: a panic while holding it cannot leave the protected data
/// half-updated in a way later users could observe (every critical section in this crate either
/// completes or changes nothing), so poisoning is ignored. One made with [`Mutex::ranked`] has a
/// place in the lock order, which debug builds check at each `lock` ([`order`]).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: std::sync::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
    rank: Option<order::Rank>,
}

/// A held [`Mutex`].
pub(crate) struct MutexGuard<'a, T> {
    #[cfg(not(loom))]
    inner: std::sync::MutexGuard<'a, T>,
    #[cfg(loom)]
    inner: loom::sync::MutexGuard<'a, T>,
    // Dropped after the guard: the lock is released before it stops counting as held.
    _order: Option<order::Held>,
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            inner: std::sync::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
            rank: None,
        }
    }

    /// A mutex with a place in the lock order.
    pub(crate) fn ranked(rank: order::Rank, value: T) -> Self {
        Self {
            rank: Some(rank),
            ..Self::new(value)
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        let order = self.rank.map(order::taking);
        MutexGuard {
            inner: self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            _order: order,
        }
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

/// The lock order (docs/ARCHITECTURE.md, "Lock ordering"), checked in debug builds: a thread
/// that takes a ranked lock while it holds one of a higher rank (one that must be taken after
/// it) panics at once, naming both, instead of deadlocking one day against a thread that takes
/// them the other way. Each ranked lock is taken through [`order::taking`], whose token is
/// dropped with the guard. Release builds and loom models compile the check away (loom runs its
/// threads on one OS thread, whose thread-local state they would share).
pub(crate) mod order {
    /// A lock's place in the order: lower ranks are taken first (outermost).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(crate) enum Rank {
        /// The cache's file table (`opened.rs`).
        FileTable = 1,
        /// A file's change lock (`Inode::lock_changes`, the kernel's `i_rwsem`).
        Change,
        /// A file's writeback pass lock (`WbState::pass_lock`, `I_SYNC`).
        Pass,
        /// A whole-file-commit file's size lock (`Inode::lock_size`).
        Size,
        /// One eviction scan at a time (`Reclaim::evict`).
        ReclaimScan,
        /// The io_uring submission queue.
        Submit,
        /// The flusher's state (`Dirty`).
        DirtyState,
        /// A file's index writer lock (`Index::lock`, the xarray's lock).
        IndexWriter,
        /// The arena pages set aside for index nodes.
        IndexReserve,
        /// The arena blocks set aside for files' regions (`mem::place`).
        Placement,
        /// A per-thread page cache of the buddy allocator.
        PageCache,
        /// The buddy allocator's free lists.
        Zone,
        /// The epoch's garbage queue.
        EpochGarbage,
        /// The epoch's participants.
        EpochParticipants,
        /// The reclaim lists (a leaf: nothing is taken while they are held).
        Lists,
    }

    /// A std guard with its place in the order (for locks that are not [`super::Mutex`]es).
    pub(crate) struct Ordered<G> {
        guard: G,
        _order: Held,
    }

    impl<G> Ordered<G> {
        pub(crate) fn new(guard: G, order: Held) -> Self {
            Self {
                guard,
                _order: order,
            }
        }
    }

    impl<G: std::ops::Deref> std::ops::Deref for Ordered<G> {
        type Target = G::Target;
        fn deref(&self) -> &G::Target {
            &self.guard
        }
    }

    impl<G: std::ops::DerefMut> std::ops::DerefMut for Ordered<G> {
        fn deref_mut(&mut self) -> &mut G::Target {
            &mut self.guard
        }
    }

    impl Rank {
        /// The ranks' names, by number.
        #[cfg(all(debug_assertions, not(loom)))]
        const NAMES: [&'static str; 17] = [
            "",
            "FileTable",
            "Change",
            "Pass",
            "Size",
            "ReclaimScan",
            "Submit",
            "DirtyState",
            "IndexWriter",
            "IndexReserve",
            "Placement",
            "PageCache",
            "Zone",
            "EpochGarbage",
            "EpochParticipants",
            "Lists",
            "",
        ];
    }

    /// Held while the lock of its rank is held; drop it with the guard.
    #[derive(Debug)]
    #[must_use]
    pub(crate) struct Held {
        #[cfg(all(debug_assertions, not(loom)))]
        rank: Rank,
    }

    #[cfg(all(debug_assertions, not(loom)))]
    thread_local! {
        /// How many locks of each rank this thread holds.
        static HELD: std::cell::Cell<[u8; 16]> = const { std::cell::Cell::new([0; 16]) };
    }

    /// About to take a lock of `rank`: in debug builds, checks that this thread holds no lock
    /// that must come after it, and counts it held until the token drops. Locks of one rank
    /// may nest (two files' locks are never taken together; where they could be, the code
    /// says so).
    pub(crate) fn taking(rank: Rank) -> Held {
        #[cfg(all(debug_assertions, not(loom)))]
        {
            let _ = HELD.try_with(|held| {
                let mut counts = held.get();
                if let Some(later) = (rank as usize + 1..counts.len()).find(|&r| counts[r] > 0) {
                    panic!(
                        "lock order: taking {rank:?} while holding {} (see \
                         docs/ARCHITECTURE.md, \"Lock ordering\")",
                        Rank::NAMES.get(later).copied().unwrap_or("?")
                    );
                }
                counts[rank as usize] = counts[rank as usize].saturating_add(1);
                held.set(counts);
            });
            Held { rank }
        }
        #[cfg(not(all(debug_assertions, not(loom))))]
        {
            let _ = rank;
            Held {}
        }
    }

    #[cfg(all(debug_assertions, not(loom)))]
    impl Drop for Held {
        fn drop(&mut self) {
            let _ = HELD.try_with(|held| {
                let mut counts = held.get();
                counts[self.rank as usize] = counts[self.rank as usize].saturating_sub(1);
                held.set(counts);
            });
        }
    }
}

#[cfg(all(test, debug_assertions, not(loom)))]
mod tests {
    use super::order::{Rank, taking};

    #[test]
    fn locks_in_order_are_fine() {
        let _change = taking(Rank::Change);
        let _pass = taking(Rank::Pass);
        let _writer = taking(Rank::IndexWriter);
        let _zone = taking(Rank::Zone);
    }

    #[test]
    #[should_panic(expected = "lock order: taking IndexWriter while holding Zone")]
    fn a_lock_taken_out_of_order_panics() {
        let _zone = taking(Rank::Zone);
        let _writer = taking(Rank::IndexWriter);
    }

    #[test]
    fn a_released_lock_no_longer_counts() {
        drop(taking(Rank::Zone));
        let _writer = taking(Rank::IndexWriter);
    }
}
