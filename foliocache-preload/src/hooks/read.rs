//! Reads: `read`, `pread`, `readv`, `preadv` and `preadv2` of a served fd go through the cache at
//! the description's offset (moving it) or at the given one; a hook nested in another, or a
//! file passing through, reads with the real call.

use super::{MAX_RW, set_errno};
use crate::guard::Entered;
use crate::table::{self, Description};
use crate::{real, stats};
use libc::{c_int, c_void, iovec, off_t, off64_t, size_t, ssize_t};
use std::sync::atomic::Ordering;

/// Reads `count` bytes at `pos` of a served fd into `buf`: through the cache when `outer`,
/// else (nested) with the real pread.
///
/// # Safety
/// `buf` points to `count` writable bytes (read(2)'s contract).
unsafe fn read_at(
    d: &Description,
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    pos: u64,
    outer: Option<&Entered>,
) -> ssize_t {
    let pass = || {
        stats::read_passed_through();
        // SAFETY: the caller's buffer promise, passed on.
        unsafe { real::pread64(fd, buf, count, pos as off64_t) }
    };
    let Some(outer) = outer else {
        return pass();
    };
    if !d.readable || count == 0 || buf.is_null() || pos > i64::MAX as u64 {
        return pass();
    }
    let count = count.min(MAX_RW);
    // SAFETY: not null, at most MAX_RW bytes, and by read(2)'s contract writable for `count`
    // bytes and not used by anyone else during the call.
    let slice = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) };
    let advice = d.advice.load(Ordering::Relaxed);
    let thread = outer.thread().number();
    let slot = thread % crate::adapter::HANDLE_SLOTS;
    match d.inode.read(fd, &d.handles, slot, advice, slice, pos) {
        Some(Ok(n)) => {
            stats::read_served(thread, n);
            n as ssize_t
        }
        Some(Err(errno)) => {
            set_errno(errno);
            -1
        }
        None => pass(),
    }
}

/// Reads into `iov` at `pos` (vectored), one iovec after another, stopping at a short read.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs, each a writable buffer.
unsafe fn readv_at(
    d: &Description,
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    pos: u64,
    outer: Option<&Entered>,
) -> ssize_t {
    if outer.is_none() || !d.readable || iov.is_null() || !(0..=1024).contains(&iovcnt) {
        // SAFETY: the caller's promise, passed on (the kernel checks the count).
        return unsafe { real::preadv64(fd, iov, iovcnt, pos as off64_t) };
    }
    // SAFETY: not null, and by readv(2)'s contract `iovcnt` valid iovecs.
    let vectors = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let mut total: usize = 0;
    for v in vectors {
        if v.iov_len == 0 {
            continue;
        }
        let want = v.iov_len.min(MAX_RW - total);
        // SAFETY: each iovec is a writable buffer of iov_len bytes (readv's contract).
        let n = unsafe { read_at(d, fd, v.iov_base, want, pos + total as u64, outer) };
        if n < 0 {
            return if total > 0 { total as ssize_t } else { n };
        }
        total += n as usize;
        if (n as usize) < want || total >= MAX_RW {
            break;
        }
    }
    total as ssize_t
}

/// read/readv at the description's offset, moving it.
fn at_offset(d: &Description, fd: c_int, io: impl FnOnce(u64) -> ssize_t) -> ssize_t {
    let Some(pos) = d.offset(fd) else {
        return -1; // lseek failed and set errno
    };
    let n = io(pos);
    if n > 0 {
        d.set_offset(fd, pos + n as u64);
    }
    n
}

/// # Safety
/// read(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::read(fd, buf, count) };
    };
    let outer = d.enter();
    // SAFETY: read(2)'s contract, passed on.
    at_offset(&d, fd, |pos| unsafe {
        read_at(&d, fd, buf, count, pos, outer.as_ref())
    })
}

/// # Safety
/// pread(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off64_t,
) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::pread64(fd, buf, count, offset) };
    };
    if offset < 0 {
        // SAFETY: passed on unchanged (the kernel reports EINVAL).
        return unsafe { real::pread64(fd, buf, count, offset) };
    }
    let outer = d.enter();
    // SAFETY: pread(2)'s contract, passed on.
    unsafe { read_at(&d, fd, buf, count, offset as u64, outer.as_ref()) }
}

/// # Safety
/// pread(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    // SAFETY: the same function (off_t is 64 bits here).
    unsafe { pread64(fd, buf, count, offset) }
}

/// # Safety
/// readv(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::readv(fd, iov, iovcnt) };
    };
    let outer = d.enter();
    // SAFETY: readv(2)'s contract, passed on.
    at_offset(&d, fd, |pos| unsafe {
        readv_at(&d, fd, iov, iovcnt, pos, outer.as_ref())
    })
}

/// # Safety
/// preadv(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off64_t,
) -> ssize_t {
    match table::get(fd) {
        Some(d) if offset >= 0 => {
            let outer = d.enter();
            // SAFETY: preadv(2)'s contract, passed on.
            unsafe { readv_at(&d, fd, iov, iovcnt, offset as u64, outer.as_ref()) }
        }
        // SAFETY: passed on unchanged.
        _ => unsafe { real::preadv64(fd, iov, iovcnt, offset) },
    }
}

/// # Safety
/// preadv(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off_t,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { preadv64(fd, iov, iovcnt, offset) }
}

/// preadv2 flags that are only hints for a read (polling, not waiting, not caching).
const READ_HINTS: c_int = libc::RWF_HIPRI | libc::RWF_NOWAIT | libc::RWF_DONTCACHE;

/// # Safety
/// preadv2(2)'s contract. Flags (RWF_NOWAIT, RWF_HIPRI...) are the kernel's business: such a
/// read passes through (in write-back mode, hint flags are ignored and the cache serves the
/// read; any other flag passes it through after a write back).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off64_t,
    flags: c_int,
) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::preadv64v2(fd, iov, iovcnt, offset, flags) };
    };
    let outer = d.enter();
    let outer = match outer {
        Some(outer) if flags == 0 => Some(outer),
        // Write-back: hints only, served from the cache, which has the newest bytes.
        Some(outer) if d.inode.is_back() && flags & !READ_HINTS == 0 => Some(outer),
        Some(_outer) => {
            // The kernel reads: give it everything first.
            d.inode.flush();
            None
        }
        None => None,
    };
    if offset == -1 {
        // The current offset, moved.
        // SAFETY: preadv2's contract, passed on.
        return at_offset(&d, fd, |pos| unsafe {
            readv_at(&d, fd, iov, iovcnt, pos, outer.as_ref())
        });
    }
    if offset < 0 || (flags != 0 && outer.is_none()) {
        // SAFETY: passed on unchanged.
        return unsafe { real::preadv64v2(fd, iov, iovcnt, offset, flags) };
    }
    // SAFETY: preadv2's contract, passed on.
    unsafe { readv_at(&d, fd, iov, iovcnt, offset as u64, outer.as_ref()) }
}

/// # Safety
/// preadv2(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { preadv64v2(fd, iov, iovcnt, offset, flags) }
}
