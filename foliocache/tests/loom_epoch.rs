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
//!
//! The local models run in both of the pins' barrier modes (`epoch::Barrier`): symmetric, where
//! each pin executes a `SeqCst` fence, and asymmetric, where a pin only stores and the advancer's
//! modelled `membarrier` has every other thread execute the fence at one of its barrier points
//! (in the pin, the unpin, and between the reader's reads below). A last model runs the
//! asymmetric mode without the heavy barrier and must find a free under a reader.
#![cfg(loom)]

use foliocache::raw::epoch::{self, AccessTracker, Barrier};
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
        epoch::barrier_point();
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
fn pinned_reader_vs_replace_and_free(barrier: Barrier) {
    loom::model(move || {
        epoch::model_barrier(barrier);
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

#[test]
fn pinned_reader_vs_replace_and_free_symmetric() {
    pinned_reader_vs_replace_and_free(Barrier::Symmetric);
}

#[test]
fn pinned_reader_vs_replace_and_free_asymmetric() {
    pinned_reader_vs_replace_and_free(Barrier::Asymmetric);
}

/// A reader pinning twice (its second pin may carry a stale epoch) against two replacements:
/// the epoch moves through several values while the reader comes and goes.
fn repinning_reader_vs_two_replacements(barrier: Barrier) {
    loom::model(move || {
        epoch::model_barrier(barrier);
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

#[test]
fn repinning_reader_vs_two_replacements_symmetric() {
    repinning_reader_vs_two_replacements(Barrier::Symmetric);
}

#[test]
fn repinning_reader_vs_two_replacements_asymmetric() {
    repinning_reader_vs_two_replacements(Barrier::Asymmetric);
}

/// Two readers and a writer: an advance must wait for every pinned participant. In asymmetric
/// mode the model explores where each reader serves the heavy barrier, which multiplies its
/// interleavings: at three preemptions it ran for about five minutes here (and passed), so it
/// runs with at most two unless `FOLIOCACHE_LOOM_DEEP` is set.
fn two_readers_vs_replace_and_free(barrier: Barrier) {
    let mut builder = loom::model::Builder::new();
    if barrier == Barrier::Asymmetric && std::env::var_os("FOLIOCACHE_LOOM_DEEP").is_none() {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(2, |b| b.min(2)));
    }
    builder.check(move || {
        epoch::model_barrier(barrier);
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

#[test]
fn two_readers_vs_replace_and_free_symmetric() {
    two_readers_vs_replace_and_free(Barrier::Symmetric);
}

#[test]
fn two_readers_vs_replace_and_free_asymmetric() {
    two_readers_vs_replace_and_free(Barrier::Asymmetric);
}

/// Asymmetric pins whose advancer skips the heavy barrier: nothing orders the reader's pin
/// store before its load of the slot, so the model must find the free under the reader.
#[test]
fn asymmetric_pins_without_the_heavy_barrier_are_caught() {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let found = seen.clone();
    loom::model(move || {
        epoch::model_without_heavy_barrier();
        let world = World::new(2);
        let reader = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let guard = epoch::pin();
                let found = world.slot.load(Ordering::Acquire);
                loom::thread::yield_now();
                let freed = world.freed[found].load(Ordering::Relaxed);
                drop(guard);
                freed
            })
        };
        world.replace(1);
        if reader.join().unwrap() {
            found.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(
        seen.load(std::sync::atomic::Ordering::Relaxed),
        "the model missed a free under an asymmetric pin with no heavy barrier"
    );
}

/// A local reader in asymmetric mode and a client in another process (whose pin keeps its
/// full barrier, which `membarrier` does not replace) against one replacement.
#[test]
fn asymmetric_local_reader_and_client_vs_replace() {
    loom::model(|| {
        epoch::model_barrier(Barrier::Asymmetric);
        let world = World::new(2);
        let clients = Clients::register(1);
        let reader = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.read())
        };
        let client = {
            let (world, clients) = (Arc::clone(&world), Arc::clone(&clients));
            thread::spawn(move || world.client_read(&clients, 0, false, true))
        };
        world.replace(1);
        reader.join().unwrap();
        assert!(
            !client.join().unwrap(),
            "an object was freed under a pinned client"
        );
    });
}

/// A shared cache's client threads, as its owner's epoch domain counts them: one pin word per
/// client thread and the mirror of the owner's epoch they pin with (in the real cache these
/// words live in the shared mapping; `owner::ClientPins` is this `External`).
struct Clients {
    pins: Vec<loom::sync::atomic::AtomicU64>,
    mirror: loom::sync::atomic::AtomicU64,
}

impl epoch::External for Clients {
    fn caught_up(&self, now: u64) -> bool {
        self.pins
            .iter()
            .all(|p| epoch::pin_caught_up(p.load(Ordering::Relaxed), now))
    }

    fn advanced(&self, now: u64) {
        self.mirror.store(now, Ordering::Release);
    }
}

impl Clients {
    fn register(threads: usize) -> Arc<Self> {
        let clients = Arc::new(Self {
            pins: (0..threads)
                .map(|_| loom::sync::atomic::AtomicU64::new(0))
                .collect(),
            mirror: loom::sync::atomic::AtomicU64::new(0),
        });
        epoch::add_external(clients.clone(), 1);
        clients
    }
}

impl World {
    /// A client thread's read: pins its own word with the mirrored epoch, reads, and unpins
    /// unless it `dies` first (a SIGKILL between pin and unpin leaves the pin set). Returns
    /// whether the object it found was freed while it was pinned (checked by the caller after
    /// the join: a panic in a loom thread would abort the whole run, and the last model
    /// expects this to happen).
    #[must_use]
    fn client_read(&self, clients: &Clients, thread: usize, dies: bool, tracked: bool) -> bool {
        let pin = &clients.pins[thread];
        epoch::external_pin(pin, &clients.mirror);
        let found = self.slot.load(Ordering::Acquire);
        if tracked {
            self.memory[found].read();
        }
        loom::thread::yield_now();
        if tracked {
            self.memory[found].read();
        }
        let freed = self.freed[found].load(Ordering::Relaxed);
        if !dies {
            epoch::external_unpin(pin);
        }
        freed
    }
}

/// A client thread in another process against the owner's replacement and free: the owner's
/// advance waits for the client's pin as for its own threads', even when the mirror the client
/// pinned with lags the owner's epoch.
#[test]
fn client_pin_vs_owner_advance() {
    loom::model(|| {
        let world = World::new(3);
        let clients = Clients::register(1);
        let client = {
            let (world, clients) = (Arc::clone(&world), Arc::clone(&clients));
            thread::spawn(move || {
                let first = world.client_read(&clients, 0, false, true);
                first | world.client_read(&clients, 0, false, true)
            })
        };
        world.replace(1);
        world.replace(2);
        assert!(
            !client.join().unwrap(),
            "an object was freed under a pinned client"
        );
        epoch::collect();
        assert!(world.freed[0].load(Ordering::Relaxed) && world.freed[1].load(Ordering::Relaxed));
    });
}

/// A client killed while pinned: its pin holds every grace period back until the owner, having
/// seen the process fully exited (here: joined), clears the word as `Owner::free_thread_slot`
/// does; then the deferred frees run. Nothing is freed while the client could still read.
#[test]
fn dead_client_pin_is_cleared_after_it_exited() {
    loom::model(|| {
        let world = World::new(2);
        let clients = Clients::register(1);
        let client = {
            let (world, clients) = (Arc::clone(&world), Arc::clone(&clients));
            thread::spawn(move || world.client_read(&clients, 0, true, true))
        };
        world.replace(1);
        assert!(
            !client.join().unwrap(),
            "an object was freed under a pinned client"
        );
        // Death seen (the process has exited): the owner clears its pin.
        clients.pins[0].store(0, Ordering::Release);
        epoch::collect();
        assert!(
            world.freed[0].load(Ordering::Relaxed),
            "a dead pin wedged the grace period"
        );
        assert_eq!(epoch::pending(), 0);
    });
}

/// The same, with the pin cleared before the client is known to have exited (a death taken
/// for granted, say after a timeout): the model must find the free under the client's read.
#[test]
fn clearing_a_live_clients_pin_is_caught() {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let found = seen.clone();
    loom::model(move || {
        let world = World::new(2);
        let clients = Clients::register(1);
        let client = {
            let (world, clients) = (Arc::clone(&world), Arc::clone(&clients));
            thread::spawn(move || world.client_read(&clients, 0, true, false))
        };
        world.replace(1);
        clients.pins[0].store(0, Ordering::Release);
        epoch::collect();
        if client.join().unwrap() {
            found.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(
        seen.load(std::sync::atomic::Ordering::Relaxed),
        "the model missed a free under a live client's pin"
    );
}

/// What is at the root while a takeover has emptied it.
const EMPTY: usize = usize::MAX;

/// A shared cache's takeover against a client's optimistic read (`owner/takeover.rs`,
/// `wait_for_pins`, restated here because the owner is not built under loom): the new owner
/// empties the file's root, moves the clients' epoch mirror on by two, and waits until every
/// client pin is idle or taken with the new value; only then is the old tree's memory reused.
/// A client pins with the mirror's value, then reads the root. `empty_first` false is the
/// flawed order (wait, then empty), which the last model must catch.
fn takeover_vs_client_read(empty_first: bool) -> bool {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let found = seen.clone();
    loom::model(move || {
        let world = World::new(1);
        let clients = Arc::new(Clients {
            pins: vec![loom::sync::atomic::AtomicU64::new(0)],
            mirror: loom::sync::atomic::AtomicU64::new(1),
        });
        let client = {
            let (world, clients) = (Arc::clone(&world), Arc::clone(&clients));
            thread::spawn(move || {
                let pin = &clients.pins[0];
                epoch::external_pin(pin, &clients.mirror);
                let root = world.slot.load(Ordering::Acquire);
                let mut freed = false;
                if root != EMPTY {
                    loom::thread::yield_now();
                    freed = world.freed[root].load(Ordering::Relaxed);
                }
                epoch::external_unpin(pin);
                freed
            })
        };
        let wait_for_pins = || {
            let now = clients.mirror.fetch_add(2, Ordering::SeqCst) + 2;
            loom::sync::atomic::fence(Ordering::SeqCst);
            while !epoch::pin_caught_up(clients.pins[0].load(Ordering::SeqCst), now) {
                loom::thread::yield_now();
            }
        };
        if empty_first {
            world.slot.store(EMPTY, Ordering::Release);
            wait_for_pins();
        } else {
            wait_for_pins();
            world.slot.store(EMPTY, Ordering::Release);
        }
        // The old tree's pages go back to the allocator.
        world.freed[0].store(true, Ordering::Relaxed);
        if client.join().unwrap() {
            found.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    seen.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn takeover_waits_for_a_clients_read_of_the_old_tree() {
    assert!(
        !takeover_vs_client_read(true),
        "a client read memory the takeover had freed"
    );
}

/// The flawed order (wait for the pins, then empty the root): the model must find the read of
/// freed memory.
#[test]
fn takeover_that_waits_before_emptying_the_root_is_caught() {
    assert!(
        takeover_vs_client_read(false),
        "the model missed a takeover that waits before emptying the root"
    );
}
