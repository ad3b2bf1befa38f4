//! loom models of the epochs themselves (`foliocache::raw::epoch`): the deferred freeing that
//! index nodes and folio memory rely on.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_epoch`
//!
//! A shared slot names the current object; a writer replaces it, defers the old object's free,
//! and collects (advancing the epoch as far as readers allow). A reader pins, loads the slot and
//! checks the object it found has not been freed, for as long as it stays pinned. Whatever the
//! interleaving, a pinned reader never sees the object it found freed; and once every reader has
//! gone, a collect frees everything deferred.
//!
//! Each object also has an `epoch::AccessTracker` (a `loom::cell::UnsafeCell` of nothing)
//! standing for its memory: the reader's uses are reads of it, the free a write. loom reports a read and a write that are not ordered by
//! happens-before, so the models check causality, not only what the flags show (they fail when
//! the pin's store is relaxed, the hole a re-pin would leave).
#![cfg(loom)]

use foliocache::raw::epoch::{self, AccessTracker};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use std::sync::Arc;

struct World {
    slot: AtomicUsize,
    freed: Vec<AtomicBool>,
    memory: Vec<AccessTracker>,
}

impl World {
    fn new(objects: usize) -> Arc<Self> {
        Arc::new(Self {
            slot: AtomicUsize::new(0),
            freed: (0..objects).map(|_| AtomicBool::new(false)).collect(),
            memory: (0..objects).map(|_| AccessTracker::default()).collect(),
        })
    }

    /// One pinned read: the object found stays unfreed while the pin lives.
    fn read(&self) {
        let guard = epoch::pin();
        let found = self.slot.load(Ordering::Acquire);
        self.memory[found].read();
        assert!(
            !self.freed[found].load(Ordering::Relaxed),
            "object {found} freed before the reader's load"
        );
        loom::thread::yield_now();
        self.memory[found].read();
        assert!(
            !self.freed[found].load(Ordering::Relaxed),
            "object {found} freed under a pinned reader"
        );
        drop(guard);
    }

    /// Replaces the current object with `next`, defers the old one's free, collects.
    fn replace(self: &Arc<Self>, next: usize) {
        let old = self.slot.swap(next, Ordering::AcqRel);
        let world = Arc::clone(self);
        epoch::defer(move || {
            world.memory[old].write();
            world.freed[old].store(true, Ordering::Relaxed);
        });
        epoch::collect();
    }
}

/// One reader, one replacement.
#[test]
fn pinned_reader_vs_replace_and_free() {
    loom::model(|| {
        let world = World::new(2);
        let reader = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.read())
        };
        world.replace(1);
        reader.join().unwrap();
        epoch::collect();
        assert!(world.freed[0].load(Ordering::Relaxed), "never freed");
    });
}

/// A reader pinning twice (its second pin may carry a stale epoch) against two replacements:
/// the epoch moves through several values while the reader comes and goes.
#[test]
fn repinning_reader_vs_two_replacements() {
    loom::model(|| {
        let world = World::new(3);
        let reader = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world.read();
                world.read();
            })
        };
        world.replace(1);
        world.replace(2);
        reader.join().unwrap();
        epoch::collect();
        assert!(world.freed[0].load(Ordering::Relaxed) && world.freed[1].load(Ordering::Relaxed));
        assert_eq!(epoch::pending(), 0);
    });
}

/// Two readers and a writer: an advance must wait for every pinned participant.
#[test]
fn two_readers_vs_replace_and_free() {
    loom::model(|| {
        let world = World::new(2);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let world = Arc::clone(&world);
                thread::spawn(move || world.read())
            })
            .collect();
        world.replace(1);
        for reader in readers {
            reader.join().unwrap();
        }
        epoch::collect();
        assert!(world.freed[0].load(Ordering::Relaxed));
    });
}
