#![allow(unreachable_pub)] // the `pub extern "C"` functions are the C symbols this library exports
//! The interposed system-call wrappers. Each has its libc prototype; an fd the table does not
//! serve goes straight to the real function.
//!
//! Reads of a served fd go through the cache (`adapter`) at the description's offset (read,
//! readv) or the given one (pread, preadv). Writes, in write-through mode, go to the kernel
//! (the real `pwrite` at the description's offset, or the real `write` with `O_APPEND`) and
//! then invalidate; in write-back mode they go into the cache, and the hooks keep what the
//! program sees through the kernel in step: the stat calls and `lseek(SEEK_END)` report the
//! cache's size, and `mmap`, fork, exec, locks and `SEEK_DATA`/`SEEK_HOLE` are flush points
//! (the adapter's module doc has the argument). A hook entered from inside another (see
//! `guard`) does its I/O with the real calls and touches no cache and no lock; in write-back
//! mode a nested write also makes the inode uncached from the next outer call on (the
//! adapter's `written_nested`).
//!
//! The C contracts are the caller's: a buffer of `count` bytes, `iovcnt` valid iovecs, a
//! NUL-terminated path. Like libc, these wrappers trust them (where the kernel would return
//! EFAULT for a bad buffer, a read served from the cache faults).
//!
//! `open`, `openat`, `fcntl` and `ioctl` are variadic in C. They are defined here with the optional
//! argument as a fixed one: on x86_64 and aarch64 Linux a variadic integer argument travels in
//! the same register as a fixed one (the crate refuses to build elsewhere), and the value is
//! only passed on to libc, which reads it only when the flags say it is there.

use libc::{c_char, c_int, c_uint, c_void, off64_t, size_t, ssize_t};

mod around;
mod exec;
mod fortified;
mod offset;
mod open;
mod read;
mod send;
mod signal;
mod size;
mod write;

fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = errno };
}

/// The largest single read or write Linux does (`MAX_RW_COUNT`).
const MAX_RW: usize = 0x7fff_f000;

/// This thread's preferred readahead slot in a description.
fn preferred_slot() -> usize {
    crate::guard::thread_number() % crate::adapter::HANDLE_SLOTS
}

/// A call's 0 or -1 and errno, from the cache's answer.
fn status(result: Result<(), c_int>) -> c_int {
    match result {
        Ok(()) => 0,
        Err(errno) => {
            set_errno(errno);
            -1
        }
    }
}

/// The read hook for `stdio` cookies (a `FILE` opened by `fopen` on a served file).
///
/// # Safety
/// read(2)'s contract.
pub(crate) unsafe fn hook_read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's contract.
    unsafe { read::read(fd, buf, count) }
}

/// The write hook for `stdio` cookies.
///
/// # Safety
/// write(2)'s contract.
pub(crate) unsafe fn hook_write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's contract.
    unsafe { write::write(fd, buf, count) }
}

/// The seek hook for `stdio` cookies.
pub(crate) fn hook_lseek(fd: c_int, offset: off64_t, whence: c_int) -> off64_t {
    // SAFETY: integer arguments.
    unsafe { offset::lseek64(fd, offset, whence) }
}

/// The close hook for `stdio` cookies.
pub(crate) fn hook_close(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    unsafe { open::close(fd) }
}

/// The open hook for `stdio`.
///
/// # Safety
/// open(2)'s contract.
pub(crate) unsafe fn hook_open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { open::open64(path, flags, mode) }
}
