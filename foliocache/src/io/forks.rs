//! Which process this is, without a system call: a counter every forked child bumps (a
//! `pthread_atfork` child handler). `getpid` is a system call on every glibc since 2.25; the
//! shared cache's client asks on every read whether it still runs in the process that
//! attached (a forked child must attach anew), so it compares this counter instead.
//!
//! A child made by a raw `clone`/`fork` system call, bypassing libc, runs no handler and is
//! not seen; a program doing that and then using its parent's attachment is not supported.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static FORKS: AtomicU64 = AtomicU64::new(0);
static HANDLER: Once = Once::new();

extern "C" fn in_child() {
    // Async-signal-safe: one atomic add.
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The number of forks between the first process that asked and this one: equal in two calls
/// exactly when they ran in the same process (the handler is registered at the first call,
/// before any fork it must see).
pub(crate) fn generation() -> u64 {
    HANDLER.call_once(|| {
        // SAFETY: registers a handler that only adds to an atomic; no prepare or parent
        // handler. A failure (ENOMEM) leaves forks unseen: see the module's docs.
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    FORKS.load(Ordering::Relaxed)
}
