//! Loom model of the fd table's readers (`src/readers.rs`, included as it is): threads that
//! mark themselves, load an fd's description pointer and use what it points to, against a
//! remover that swaps the pointer, waits for the readers and frees the old object.
//!
//! Whatever the interleaving, a reader never finds freed what it loaded: through its record,
//! through the fd's counter (a nested read inside a section), across the generations of two
//! sections in a row, and on a record taken over from a dead thread.
//!
//! A reader reads its object's bytes and a free writes them: loom reports the two if nothing
//! orders the read before the free (by hand: the leave's store `Relaxed`, or the remover
//! skipping the records, fail the first three models).
//!
//! Negative control (run with the others): sections without their fence, so nothing orders a
//! reader's mark before its load; the model must find a free under a reader.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p foliocache-preload --test loom_readers`.
#![cfg(loom)]

#[path = "../src/readers.rs"]
#[allow(dead_code, unreachable_pub)]
mod readers;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use loom::thread;
use readers::Records;

/// The fd's tag in the model.
const TAG: u32 = 8;

/// One fd slot and the objects it can point to (0 is "no pointer").
struct World {
    records: Records,
    counter: AtomicU32,
    slot: AtomicUsize,
    /// Set when an object is freed (what the negative control looks for).
    freed: [AtomicBool; 3],
    /// The objects' bytes: a reader reads them, a free writes them, and loom reports the two
    /// unordered (when `checked`; the negative control only counts what it finds).
    bytes: [UnsafeCell<u64>; 3],
    checked: bool,
}

impl World {
    fn new() -> Arc<Self> {
        Self::with_checks(true)
    }

    fn with_checks(checked: bool) -> Arc<Self> {
        Arc::new(Self {
            records: Records::new(),
            counter: AtomicU32::new(0),
            slot: AtomicUsize::new(1),
            freed: [
                AtomicBool::new(false),
                AtomicBool::new(false),
                AtomicBool::new(false),
            ],
            bytes: [UnsafeCell::new(0), UnsafeCell::new(1), UnsafeCell::new(2)],
            checked,
        })
    }

    /// A read through `record` (or the counter): whether it found its object freed.
    fn read(&self, record: Option<usize>, fenced: bool) -> bool {
        let held = readers::enter_fenced(
            record.and_then(|i| self.records.get(i)),
            &self.counter,
            TAG,
            fenced,
            || {},
        );
        let found = self.slot.load(Ordering::SeqCst);
        let freed = found != 0 && self.use_object(found);
        drop(held);
        freed
    }

    /// A reader's use of object `found`: whether it was freed.
    fn use_object(&self, found: usize) -> bool {
        if self.checked {
            // SAFETY: loom's cell; the model checks that no free overlaps this read.
            let value = self.bytes[found].with(|p| unsafe { *p });
            assert!(value == found as u64, "read a freed object's bytes");
        }
        self.freed[found].load(Ordering::Relaxed)
    }

    /// A close: swap in `new`, wait for the readers, free the old object.
    fn replace(&self, new: usize) {
        self.replace_as(None, new);
    }

    /// [`Self::replace`] by a thread whose own record is `me`.
    fn replace_as(&self, me: Option<usize>, new: usize) {
        let old = self.slot.swap(new, Ordering::SeqCst);
        self.records.wait(&self.counter, TAG, me, |_| true);
        if old != 0 {
            if self.checked {
                // SAFETY: loom's cell; the model checks that no reader overlaps this free.
                self.bytes[old].with_mut(|p| unsafe { *p = u64::MAX });
            }
            self.freed[old].store(true, Ordering::Relaxed);
        }
    }
}

/// A reader with a record reads twice (two sections, two generations), one without reads
/// once (the counter); the remover frees object 1 under them.
fn readers_vs_remover(fenced: bool, checked: bool) -> bool {
    let world = World::with_checks(checked);
    let with_record = {
        let world = world.clone();
        thread::spawn(move || {
            let index = world.records.claim(1, |_| false).expect("a free record");
            world.read(Some(index), fenced) | world.read(Some(index), fenced)
        })
    };
    let counted = {
        let world = world.clone();
        thread::spawn(move || world.read(None, fenced))
    };
    world.replace(2);
    let a = with_record.join().unwrap();
    let b = counted.join().unwrap();
    a | b
}

#[test]
fn a_reader_never_finds_its_object_freed() {
    loom::model(|| {
        assert!(
            !readers_vs_remover(true, true),
            "a reader found its object freed"
        );
    });
}

/// A nested read (inside a section on the same thread) counts in the counter; the remover
/// waits for both.
#[test]
fn a_nested_reader_is_counted_and_waited_for() {
    loom::model(|| {
        let world = World::new();
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let index = world.records.claim(1, |_| false).expect("a free record");
                let record = world.records.get(index);
                let outer = readers::enter(record, &world.counter, TAG, || {});
                assert!(
                    matches!(outer, readers::Held::Section { .. }),
                    "the outer read has a section"
                );
                let nested = world.read(Some(index), true);
                let found = world.slot.load(Ordering::SeqCst);
                let freed = found != 0 && world.use_object(found);
                drop(outer);
                nested | freed
            })
        };
        world.replace(0);
        assert!(!reader.join().unwrap(), "a reader found its object freed");
    });
}

/// A record whose thread died inside a section is taken over by a new thread; a remover
/// waiting on the dead section goes on, and the new thread's reads are safe.
#[test]
fn a_dead_threads_record_is_taken_over() {
    loom::model(|| {
        let world = World::new();
        // The dead thread: claimed record 0 and entered a section it never left.
        let dead = world.records.claim(7, |_| false).expect("a free record");
        std::mem::forget(readers::enter(
            world.records.get(dead),
            &world.counter,
            TAG,
            || {},
        ));
        // Fill the other record, so that the new thread must take over the dead one.
        world.records.claim(9, |_| false).expect("a free record");
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let index = world
                    .records
                    .claim(1, |tid| tid == 7)
                    .expect("the dead thread's record");
                assert_eq!(index, dead);
                world.read(Some(index), true)
            })
        };
        world.replace(2);
        assert!(!reader.join().unwrap(), "a reader found its object freed");
    });
}

/// The remover has a record of its own, which it used to read the fd before (as a program's
/// thread reads a file, then closes it): the wait skips that record, and still waits for the
/// other thread's.
#[test]
fn a_remover_with_a_record_of_its_own_waits_for_the_others() {
    loom::model(|| {
        let world = World::new();
        let mine = world.records.claim(2, |_| false).expect("a free record");
        assert!(!world.read(Some(mine), true), "the remover's own read");
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let index = world.records.claim(1, |_| false).expect("a free record");
                assert_ne!(index, mine);
                world.read(Some(index), true)
            })
        };
        world.replace_as(Some(mine), 2);
        assert!(!reader.join().unwrap(), "a reader found its object freed");
    });
}

/// Negative control: sections without their fence. The model must catch a free under a
/// reader.
#[test]
fn sections_without_their_fence_are_caught() {
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let found = seen.clone();
    loom::model(move || {
        if readers_vs_remover(false, false) {
            found.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(
        seen.load(std::sync::atomic::Ordering::Relaxed),
        "the model missed a free under a section with no fence"
    );
}
