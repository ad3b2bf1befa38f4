//! Loom model of the serving sequence number (`src/serving.rs`, included as it is): a reader
//! of a file the cache serves, the switch that stops serving it (write back, then odd) before
//! the lease is released, and another process that writes the file through the kernel once
//! the lease is released. Whatever the interleaving, a read that *starts* after the other
//! process's write returned sees that write, and no read ever sees storage older than the
//! cache's write back.
//!
//! The model also runs the switch in the wrong order (odd before the write back), which let
//! PostgreSQL's crash recovery read a block older than the one it had written, and checks
//! that loom finds the stale read there: the model can fail.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p foliocache-preload --test loom_serving`.
#![cfg(loom)]

#[path = "../src/serving.rs"]
#[allow(dead_code, unreachable_pub)]
mod serving;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use serving::Serving;

/// Versions of the one page: 1 on storage at first, 2 written by the program into the cache
/// (dirty), 3 written by the other process after the lease was released.
struct World {
    serving: Serving,
    cache: AtomicU64,
    kernel: AtomicU64,
    released: AtomicU64,
    other_wrote: AtomicU64,
}

/// One read as the adapter does it: from the cache with a ticket kept only if still valid,
/// else from the kernel.
fn read(world: &World) -> u64 {
    if let Some(ticket) = world.serving.ticket() {
        let copy = world.cache.load(Ordering::SeqCst);
        if world.serving.still(ticket) {
            return copy;
        }
    }
    world.kernel.load(Ordering::SeqCst)
}

fn model(write_back_first: bool) {
    let world = Arc::new(World {
        serving: Serving::new(),
        cache: AtomicU64::new(2),
        kernel: AtomicU64::new(1),
        released: AtomicU64::new(0),
        other_wrote: AtomicU64::new(0),
    });
    world.serving.start(); // under the lease, the cache holds version 2 dirty
    let switch = {
        let world = Arc::clone(&world);
        loom::thread::spawn(move || {
            let write_back = || world.kernel.store(2, Ordering::SeqCst);
            if write_back_first {
                world.serving.stop_after(write_back);
            } else {
                world.serving.stop_now();
                write_back();
            }
            world.released.store(1, Ordering::SeqCst); // the lease goes
        })
    };
    let other = {
        let world = Arc::clone(&world);
        loom::thread::spawn(move || {
            // Its open returns only once the lease was released.
            while world.released.load(Ordering::SeqCst) == 0 {
                loom::thread::yield_now();
            }
            world.kernel.store(3, Ordering::SeqCst);
            world.other_wrote.store(1, Ordering::SeqCst);
        })
    };
    let after_the_write = world.other_wrote.load(Ordering::SeqCst) == 1;
    let seen = read(&world);
    assert!(
        seen >= 2,
        "read version {seen}: older than the cache's own write"
    );
    if after_the_write {
        assert_eq!(
            seen, 3,
            "a read started after the other process's write missed it"
        );
    }
    switch.join().unwrap();
    other.join().unwrap();
}

#[test]
fn a_read_never_sees_storage_older_than_the_cache_nor_misses_a_later_write() {
    loom::model(|| model(true));
}

#[test]
fn the_model_finds_the_stale_read_when_the_switch_stops_before_writing_back() {
    let found = std::panic::catch_unwind(|| loom::model(|| model(false)));
    let message = match found {
        Ok(()) => panic!("loom did not find the stale read of the wrong order"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default(),
    };
    assert!(
        message.contains("older than the cache's own write"),
        "loom failed the wrong order for another reason: {message}"
    );
}
