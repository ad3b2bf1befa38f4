//! Loom model of a description's readahead slot (`src/adapter/slot.rs`, included as it is):
//! threads that only ever try the slot, never wait for it, and change its value while they
//! hold it, as a read changes its readahead state.
//!
//! Whatever the interleaving: no two threads reach the value at once (loom's cell reports an
//! access that overlaps another without ordering between them), every change a holder made
//! is seen by the next holder (the value counts the takes exactly), and a slot given back can
//! be taken again.
//!
//! Negative controls, by hand: with the take's compare-and-swap `Relaxed`, or the leave's
//! store `Relaxed`, loom reports the next holder's write as racing the last one's.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p foliocache-preload --test loom_slot`.
#![cfg(loom)]

#[path = "../src/adapter/slot.rs"]
#[allow(dead_code, unreachable_pub)]
mod slot;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use slot::TrySlot;

/// One read's use of the slot: take it if free, and count the take in its value. Returns
/// whether it got the slot.
fn try_once(slot: &TrySlot<u64>, takes: &AtomicUsize) -> bool {
    let Some(mut taken) = slot.try_lock() else {
        return false;
    };
    *taken += 1;
    takes.fetch_add(1, Ordering::Relaxed);
    true
}

/// Two threads try twice each and the first thread once; at the end the value holds every
/// take exactly once.
#[test]
fn threads_that_try_the_slot_never_share_it_and_lose_no_change() {
    loom::model(|| {
        let slot = Arc::new(TrySlot::new(0u64));
        let takes = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (slot, takes) = (slot.clone(), takes.clone());
                loom::thread::spawn(move || {
                    try_once(&slot, &takes);
                    try_once(&slot, &takes);
                })
            })
            .collect();
        try_once(&slot, &takes);
        for thread in threads {
            thread.join().unwrap();
        }
        let taken = slot.try_lock().expect("every holder gave the slot back");
        assert_eq!(*taken, takes.load(Ordering::Relaxed) as u64);
    });
}

/// A holder that finds the slot busy does not get it; once given back, the slot can be taken.
#[test]
fn a_busy_slot_is_refused_and_a_given_back_one_taken() {
    loom::model(|| {
        let slot = TrySlot::new(7u64);
        let taken = slot.try_lock().expect("a new slot is free");
        assert!(slot.try_lock().is_none(), "taken twice at once");
        drop(taken);
        let mut again = slot.try_lock().expect("given back");
        *again += 1;
        drop(again);
        assert_eq!(*slot.try_lock().expect("given back"), 8);
    });
}
