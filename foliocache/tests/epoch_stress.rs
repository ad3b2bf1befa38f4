//! The epochs (`foliocache::raw::epoch`) with real threads: readers pin, find the current object
//! through a shared slot and check it stays alive while they are pinned; writers replace
//! objects and defer their frees. The oracle is a `Vec` of per-object free counts: at the end
//! every replaced object was freed exactly once and the current one never, and no pinned
//! reader ever saw its object freed. It runs in both of the pins' barrier modes: asymmetric in
//! the test process (the default), symmetric in a child process started with
//! `FOLIOCACHE_EPOCH_BARRIER=symmetric` (the mode is chosen once per process).
//!
//! Duration: `FOLIOCACHE_STRESS_SECS` seconds (default 2).

mod common;

use foliocache::raw::epoch;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Objects a run can create (writers stop when they run out).
const OBJECTS: usize = 1 << 22;

struct World {
    /// The current object.
    slot: AtomicUsize,
    /// Next object number to hand out.
    next: AtomicUsize,
    /// How many times each object was freed (the oracle: 1 once replaced, 0 while current).
    freed: Vec<AtomicU32>,
    /// Each object's payload, written when it is created; a reader checks it.
    payload: Vec<AtomicU64>,
}

fn payload_of(object: usize) -> u64 {
    (object as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

#[test]
fn pinned_readers_never_see_their_object_freed_with_asymmetric_barriers() {
    if epoch::barrier() != epoch::Barrier::Asymmetric {
        common::skip("the kernel refuses membarrier's private expedited command here");
        return;
    }
    hammer();
}

#[test]
fn pinned_readers_never_see_their_object_freed_with_symmetric_barriers() {
    const NAME: &str = "pinned_readers_never_see_their_object_freed_with_symmetric_barriers";
    if common::child_role().is_some() {
        assert_eq!(epoch::barrier(), epoch::Barrier::Symmetric);
        hammer();
        return;
    }
    let status = common::run_child_with(NAME, "symmetric", &[(epoch::BARRIER_VAR, "symmetric")]);
    assert!(status.success(), "the symmetric run failed: {status}");
}

/// Readers and writers for the stress duration, then the oracle's checks.
fn hammer() {
    let world = Arc::new(World {
        slot: AtomicUsize::new(0),
        next: AtomicUsize::new(1),
        freed: (0..OBJECTS).map(|_| AtomicU32::new(0)).collect(),
        payload: (0..OBJECTS)
            .map(|i| AtomicU64::new(if i == 0 { payload_of(0) } else { 0 }))
            .collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));

    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (world, stop, reads) = (world.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = epoch::pin();
                    let found = world.slot.load(Ordering::Acquire);
                    // Nested pins must not shorten the outer one.
                    drop(epoch::pin());
                    for _ in 0..8 {
                        assert_eq!(
                            world.freed[found].load(Ordering::Acquire),
                            0,
                            "object {found} freed under a pinned reader"
                        );
                        assert_eq!(
                            world.payload[found].load(Ordering::Relaxed),
                            payload_of(found),
                            "object {found}'s payload changed under a pinned reader"
                        );
                    }
                    drop(guard);
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let writers: Vec<_> = (0..2)
        .map(|_| {
            let (world, stop) = (world.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let new = world.next.fetch_add(1, Ordering::Relaxed);
                    if new >= OBJECTS {
                        break;
                    }
                    world.payload[new].store(payload_of(new), Ordering::Relaxed);
                    let old = world.slot.swap(new, Ordering::AcqRel);
                    let w = world.clone();
                    epoch::defer(move || {
                        // "Free": poison the payload, count the free.
                        w.payload[old].store(0, Ordering::Relaxed);
                        w.freed[old].fetch_add(1, Ordering::Release);
                    });
                    if new % 64 == 0 {
                        epoch::collect();
                    }
                    // Leave the readers time to pin across replacements (and the run enough
                    // objects for its duration).
                    for _ in 0..256 {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(common::stress_duration());
    stop.store(true, Ordering::Relaxed);
    for t in readers.into_iter().chain(writers) {
        t.join().unwrap();
    }
    // Nobody is pinned now: everything deferred can run (the other test of this binary pins
    // only in its child process).
    let start = Instant::now();
    while epoch::pending() > 0 {
        epoch::collect();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "deferred frees never ran"
        );
        std::thread::yield_now();
    }
    let created = world.next.load(Ordering::Relaxed).min(OBJECTS);
    let current = world.slot.load(Ordering::Relaxed);
    for object in 0..created {
        let expected = u32::from(object != current);
        assert_eq!(
            world.freed[object].load(Ordering::Relaxed),
            expected,
            "object {object} (current {current}) freed the wrong number of times"
        );
    }
    assert!(
        reads.load(Ordering::Relaxed) > 0 && created > 1,
        "no progress"
    );
    eprintln!(
        "{} pinned reads, {} objects replaced and freed ({} barriers)",
        reads.load(Ordering::Relaxed),
        created - 1,
        epoch::barrier().name()
    );
}
