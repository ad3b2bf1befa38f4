//! The library's own descriptors of the program's files (see `adapter`: read-only O_DIRECT
//! opens and duplicates of the program's writable descriptions), listed so that a forked
//! child can close its copies before the program runs again there: the child holds no POSIX
//! lock yet, so closing them takes nothing from it, and a child that later locks a file and
//! execs would otherwise lose its locks when the kernel closed them at the exec.

use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard, PoisonError};

static OWN: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

/// The list (held across a fork by the forking thread, so no child inherits it locked).
pub(crate) fn list() -> MutexGuard<'static, Vec<RawFd>> {
    OWN.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn add(fd: RawFd) {
    list().push(fd);
}

pub(crate) fn remove(fd: RawFd) {
    list().retain(|own| *own != fd);
}

/// In a forked child, with the list held since before the fork: closes every descriptor in
/// it and empties it.
pub(crate) fn close_in_child(list: &mut Vec<RawFd>) {
    for fd in list.drain(..) {
        // SAFETY: the real close of a descriptor the library opened (the child's copy).
        unsafe { crate::real::close(fd) };
    }
}
