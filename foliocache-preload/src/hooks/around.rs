//! Paths around the cache: mmap, copy_file_range, sendfile

use super::set_errno;
use crate::guard;
use crate::stats::Reason;
use crate::table;
use crate::{real, runtime};
use libc::{c_int, c_uint, c_void, off_t, off64_t, size_t, ssize_t};

/// Before a mapping of a served fd. A shared mapping sees the kernel's page cache, and may
/// write it: the file passes through for the rest of the process (the mapping may outlive
/// every fd), after a write back in write-back mode. A private mapping reads the kernel's
/// copy: write-back mode writes the file back first. Nested, no lock may be taken: a shared
/// mapping only marks the inode, and the mapping may show what the kernel had.
fn mapped(fd: c_int, flags: c_int) {
    let Some(d) = table::get(fd) else { return };
    let shared = flags & libc::MAP_SHARED != 0; // MAP_SHARED_VALIDATE has the bit too
    match (guard::enter(), runtime()) {
        (Some(_outer), Some(runtime)) if shared => {
            runtime.set_uncached(d.inode.key, Reason::SharedMapping);
        }
        (Some(_outer), _) => d.inode.flush(),
        (None, _) if shared => d.inode.mark_uncached(),
        (None, _) => {}
    }
}

/// # Safety
/// mmap(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off64_t,
) -> *mut c_void {
    mapped(fd, flags);
    // SAFETY: passed on unchanged.
    unsafe { real::mmap64(addr, len, prot, flags, fd, offset) }
}

/// # Safety
/// mmap(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the same function.
    unsafe { mmap64(addr, len, prot, flags, fd, offset) }
}

/// Kernel-side copies would bypass the cache and the table's offsets: refused for served fds,
/// as for files on different file systems; callers fall back to read and write.
///
/// # Safety
/// copy_file_range(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if table::get(fd_in).is_some() || table::get(fd_out).is_some() {
        set_errno(libc::EXDEV);
        return -1;
    }
    // SAFETY: passed on unchanged.
    unsafe { real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags) }
}

/// # Safety
/// sendfile(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    if table::get(in_fd).is_some() || table::get(out_fd).is_some() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: passed on unchanged.
    unsafe { real::sendfile64(out_fd, in_fd, offset, count) }
}

/// # Safety
/// sendfile(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the same function (off_t is 64 bits here).
    unsafe { sendfile64(out_fd, in_fd, offset, count) }
}

/// `FICLONE` and `FICLONERANGE` (reflink copies, `cp --reflink`): `struct file_clone_range`'s
/// first field is the source fd.
const FICLONE: libc::c_ulong = 0x4004_9409;
const FICLONERANGE: libc::c_ulong = 0x4020_940d;

/// ioctl: a reflink clone from or into a served fd is refused (`EOPNOTSUPP`, as a file system
/// without it answers, and callers copy instead): the kernel would share its own copy of the
/// data, around the cache. Everything else passes on.
///
/// # Safety
/// ioctl(2)'s contract (see the module doc for the variadic argument).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: usize) -> c_int {
    let source = match request {
        FICLONE => Some(arg as c_int),
        FICLONERANGE if arg != 0 => {
            // SAFETY: for FICLONERANGE, ioctl's contract makes `arg` a pointer to a readable
            // struct file_clone_range, whose first field is the source fd (an s64).
            Some(unsafe { (arg as *const i64).read_unaligned() } as c_int)
        }
        _ => None,
    };
    if let Some(source) = source
        && (table::get(fd).is_some() || table::get(source).is_some())
    {
        set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    // SAFETY: passed on unchanged.
    unsafe { real::ioctl(fd, request, arg) }
}

/// Refused for served fds like sendfile: the kernel would read or write its own copy at its
/// own offset, around the cache and the table's offsets.
///
/// # Safety
/// splice(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if table::get(fd_in).is_some() || table::get(fd_out).is_some() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: passed on unchanged.
    unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) }
}
