//! Work for after a thread's thread-local destructors: a pthread key's destructor. glibc runs
//! those after the thread-locals' destructors, and runs them again while a destructor leaves a
//! key with a value, so work registered from another key's destructor still runs; but at most
//! `PTHREAD_DESTRUCTOR_ITERATIONS` (4) rounds: work registered in the last round never runs.
//! Nothing runs for a thread that ends the process (`exit`, or the main thread returning): the
//! process's end frees what the work would have.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

type Work = Vec<Box<dyn FnOnce()>>;

/// The key, made on first use (`None` if the system had no key left).
static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();

extern "C" fn run(value: *mut c_void) {
    // SAFETY: every value of this key is a `Box<Work>` from `Box::into_raw` in `later`, set
    // for this thread only; glibc clears the key's value before it calls this, so each box is
    // taken back once.
    let work = unsafe { Box::from_raw(value.cast::<Work>()) };
    for f in *work {
        // A panic must not unwind into glibc: the work is lost, the thread goes on exiting.
        let _ = catch_unwind(AssertUnwindSafe(f));
    }
}

/// Runs `f` when this thread exits, after its thread-locals' destructors: for work that a
/// thread takes on after those destructors ran. `false` if it cannot be registered (no key
/// left): `f` is dropped without running.
pub(crate) fn later(f: Box<dyn FnOnce()>) -> bool {
    let key = KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: makes a key whose destructor is `run`, which only takes values this module
        // set.
        (unsafe { libc::pthread_key_create(&mut key, Some(run)) } == 0).then_some(key)
    });
    let Some(key) = *key else {
        return false;
    };
    // SAFETY: this thread's value of this module's key: null or a box `later` set.
    let old = unsafe { libc::pthread_getspecific(key) }.cast::<Work>();
    let mut work: Box<Work> = if old.is_null() {
        Box::default()
    } else {
        // SAFETY: a box from `Box::into_raw` below, still set as the value (so not yet taken).
        unsafe { Box::from_raw(old) }
    };
    work.push(f);
    let raw = Box::into_raw(work);
    // SAFETY: sets this thread's value of this module's key to a box `run` takes back.
    if unsafe { libc::pthread_setspecific(key, raw.cast()) } != 0 {
        // SAFETY: not set: still ours alone.
        drop(unsafe { Box::from_raw(raw) });
        return false;
    }
    true
}
