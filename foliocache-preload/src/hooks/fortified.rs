//! The fortified entry points (`_FORTIFY_SOURCE`): a buffer smaller than the count is glibc's
//! to report (it aborts); otherwise they are read and pread.

use crate::real;
use libc::{c_int, c_void, off_t, off64_t, size_t, ssize_t};

/// # Safety
/// read(2)'s contract, with `buflen` the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    buflen: size_t,
) -> ssize_t {
    if count > buflen {
        // SAFETY: passed on unchanged (glibc reports the overflow).
        return unsafe { real::__read_chk(fd, buf, count, buflen) };
    }
    // SAFETY: the buffer holds at least `count` bytes.
    unsafe { super::read::read(fd, buf, count) }
}

/// # Safety
/// pread(2)'s contract, with `buflen` the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off64_t,
    buflen: size_t,
) -> ssize_t {
    if count > buflen {
        // SAFETY: passed on unchanged (glibc reports the overflow).
        return unsafe { real::__pread64_chk(fd, buf, count, offset, buflen) };
    }
    // SAFETY: the buffer holds at least `count` bytes.
    unsafe { super::read::pread64(fd, buf, count, offset) }
}

/// # Safety
/// pread(2)'s contract, with `buflen` the size of `buf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    buflen: size_t,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { __pread64_chk(fd, buf, count, offset, buflen) }
}
