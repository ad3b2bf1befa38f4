//! Sizes and allocation. Write-back: the cache's `set_len`, `fallocate` and `punch_hole`; what
//! it cannot do goes to the kernel around it (`Inode::around_kernel`).

use super::status;
use crate::guard;
use crate::table;
use crate::{real, runtime};
use libc::{c_char, c_int, off_t, off64_t};

/// A change of size or of ranges the hook cannot name (truncate, fallocate) made by the
/// kernel: write-through invalidates; the cached file is not used again.
fn resized(fd: c_int, rc: c_int) -> c_int {
    if rc == 0
        && let Some(d) = table::get(fd)
    {
        match guard::enter() {
            Some(_outer) => d.inode.changed_by_kernel(),
            None => d.inode.written_nested(),
        }
    }
    rc
}

/// # Safety
/// ftruncate(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    if let Some(d) = table::get(fd)
        && d.writable
        && len >= 0
        && let Some(_outer) = guard::enter()
        && let Some(result) = d.inode.set_len(fd, len as u64)
    {
        return status(result);
    }
    // SAFETY: integer arguments.
    resized(fd, unsafe { real::ftruncate64(fd, len) })
}

/// # Safety
/// ftruncate(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the same function.
    unsafe { ftruncate64(fd, len) }
}

/// # Safety
/// fallocate(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate64(
    fd: c_int,
    mode: c_int,
    offset: off64_t,
    len: off64_t,
) -> c_int {
    // SAFETY: integer arguments.
    let kernel = || unsafe { real::fallocate64(fd, mode, offset, len) };
    if let Some(d) = table::get(fd)
        && d.inode.is_back()
        && d.writable
        && offset >= 0
        && len > 0
        && let Some(_outer) = guard::enter()
    {
        let (start, count) = (offset as u64, len as u64);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let served = match mode {
            0 => d.inode.fallocate(fd, start, count),
            _ if mode == punch => d.inode.punch_hole(fd, start, count),
            _ => return d.inode.around_kernel(fd, kernel, |rc| *rc == 0),
        };
        if let Some(result) = served {
            return status(result);
        }
    }
    resized(fd, kernel())
}

/// # Safety
/// fallocate(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
    // SAFETY: the same function.
    unsafe { fallocate64(fd, mode, offset, len) }
}

/// # Safety
/// posix_fallocate(3)'s contract (it returns the error, errno stays).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int {
    // SAFETY: integer arguments.
    let kernel = || unsafe { real::posix_fallocate64(fd, offset, len) };
    if let Some(d) = table::get(fd)
        && d.inode.is_back()
        && d.writable
        && offset >= 0
        && len > 0
        && let Some(_outer) = guard::enter()
    {
        let (start, count) = (offset as u64, len as u64);
        match d.inode.fallocate(fd, start, count) {
            Some(Ok(())) => return 0,
            // No fallocate on this file system: glibc writes the blocks itself.
            Some(Err(libc::EOPNOTSUPP)) => {
                return d.inode.around_kernel(fd, kernel, |rc| *rc == 0);
            }
            Some(Err(errno)) => return errno,
            None => {}
        }
    }
    resized(fd, kernel())
}

/// # Safety
/// posix_fallocate(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int {
    // SAFETY: the same function.
    unsafe { posix_fallocate64(fd, offset, len) }
}

/// A path's (device, inode), following symlinks.
fn key_of_path(path: *const c_char) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: `path` is the caller's NUL-terminated path (checked non-null); stat fills the
    // valid local buffer.
    let rc = unsafe { real::stat64(path, st.as_mut_ptr()) };
    (rc == 0).then(|| {
        // SAFETY: stat succeeded, so it filled the struct.
        let st = unsafe { st.assume_init() };
        (st.st_dev, st.st_ino)
    })
}

/// # Safety
/// truncate(2)'s contract.
///
/// The kernel truncates (it checks the path's permissions). A truncate by path breaks any
/// lease on the file, the process's own included, so a file the cache served was written
/// back and stopped being served before the kernel truncated it; what the cache holds of it
/// is dropped before it serves the file again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off64_t) -> c_int {
    let key = if path.is_null() {
        None
    } else {
        key_of_path(path)
    };
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::truncate64(path, len) };
    if rc == 0
        && let Some(_outer) = guard::enter()
        && let Some(runtime) = runtime()
        && let Some(inode) = key.and_then(|key| runtime.find(key))
    {
        inode.changed_by_kernel();
    }
    rc
}

/// # Safety
/// truncate(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: the same function.
    unsafe { truncate64(path, len) }
}
