//! Reentrancy: whether this thread is already inside a hook.
//!
//! The library's own code calls `open`, `read`, `fstat`... through the same symbols the
//! program does (they resolve to this library's hooks). So does a signal handler that
//! interrupts a hook and reads a file. A hook entered while the thread is already inside one
//! must not touch the cache or take any lock of this library: it takes the *raw path* (the
//! real libc call, at the offset the fd table keeps). [`enter`] tells which case it is.

use std::cell::Cell;
use std::sync::atomic::{Ordering, compiler_fence};

thread_local! {
    // A const-initialised Cell without a destructor: no allocation, no registration, safe to
    // touch at any point of a thread's life.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread entered a hook from outside; leaving clears the mark.
#[derive(Debug)]
pub(crate) struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        // Everything the hook did comes before the mark goes, for a handler on this thread.
        compiler_fence(Ordering::SeqCst);
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}

/// Marks this thread as inside a hook, or `None` if it already was (a nested call: the library
/// itself, or a signal handler that interrupted a hook), or if the cache is starting a shared
/// cache's owner in this thread (its own calls, whatever called the cache).
pub(crate) fn enter() -> Option<Entered> {
    // The cache starting a shared cache's owner (from a request, a thread's exit, anywhere):
    // its own calls, as if nested.
    if foliocache::starting_owner() {
        return None;
    }
    let entered = INSIDE
        .try_with(|inside| {
            if inside.replace(true) {
                None
            } else {
                Some(Entered(()))
            }
        })
        .ok()
        .flatten();
    // The mark is in place before anything the hook does (a lock it takes, say), for a
    // handler on this thread: only the compiler could reorder them.
    compiler_fence(Ordering::SeqCst);
    entered
}
