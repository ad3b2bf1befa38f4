#![allow(unreachable_pub)] // the `pub extern "C"` functions are the C symbols this library exports
//! The stat calls, in write-back mode: the kernel's size (and block count, and modification
//! time) of a file the cache serves is behind until writeback, so each call asks the kernel
//! and then, if the file is one of the inodes served in write-back mode (by its device and
//! inode number, whatever name or fd reached it), reports what the program's writes made:
//! * `st_size`: the cache's size;
//! * `st_blocks`: at least enough 512-byte blocks to hold that size, when it is not the
//!   kernel's (so that tools which take fewer blocks than the size for a sparse file, and then
//!   skip its "holes", do not skip data that is only in the cache);
//! * `st_mtime` and `st_ctime`: no older than the last change made through the cache.
//!
//! Covered: `stat`, `fstat`, `lstat`, `fstatat` and their `64` names, `statx`, and glibc's
//! older `__xstat` family (programs built before glibc 2.33 call those). glibc exports no
//! `newfstatat` (that is the system call's name), so there is nothing to interpose for it.
//! Write-through mode, a failed call and a nested call (a signal handler: the registry may be
//! locked by the code it interrupted) report the kernel's answer unchanged.

use crate::config::Writes;
use crate::{guard, real, runtime, table};
use libc::{c_char, c_int, c_uint};

// `stat` and `stat64` are one layout on the 64-bit targets this library builds for (it checks
// the target in lib.rs): the `stat` names are served by the `64` functions.
const _: () = assert!(
    std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>()
        && std::mem::align_of::<libc::stat>() == std::mem::align_of::<libc::stat64>()
);

/// The `version` argument of glibc's `__xstat` family for `struct stat` (`_STAT_VER`).
#[cfg(target_arch = "x86_64")]
const STAT_VERSION: c_int = 1;
#[cfg(target_arch = "aarch64")]
const STAT_VERSION: c_int = 0;

/// The size and last change (ns since the epoch) of the file `(dev, ino)` if the cache serves
/// it in write-back mode; `fd` (if any) is looked up in the fd table first, which takes no
/// lock.
fn view(fd: Option<c_int>, dev: u64, ino: u64) -> Option<(u64, i64)> {
    let runtime = runtime()?;
    if runtime.config.writes != Writes::Back {
        return None;
    }
    if let Some(d) = fd.and_then(table::get)
        && d.inode.key == (dev, ino)
    {
        return d.inode.back_view();
    }
    let _outer = guard::enter()?;
    runtime.find_back((dev, ino))?.back_view()
}

fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

/// Corrects a stat result (see the module doc).
fn patch(fd: Option<c_int>, st: &mut libc::stat64) {
    let Some((size, changed)) = view(fd, st.st_dev, st.st_ino) else {
        return;
    };
    if st.st_size as u64 != size {
        st.st_size = size as i64;
        st.st_blocks = st.st_blocks.max(size.div_ceil(512) as i64);
    }
    let ns = |sec: i64, nsec: i64| i128::from(sec) * 1_000_000_000 + i128::from(nsec);
    let (sec, nsec) = split_ns(changed);
    if i128::from(changed) > ns(st.st_mtime, st.st_mtime_nsec) {
        (st.st_mtime, st.st_mtime_nsec) = (sec, nsec);
    }
    if i128::from(changed) > ns(st.st_ctime, st.st_ctime_nsec) {
        (st.st_ctime, st.st_ctime_nsec) = (sec, nsec);
    }
}

/// Corrects a `statx` result (the fields it was asked for and filled).
fn patch_statx(fd: Option<c_int>, stx: &mut libc::statx) {
    if stx.stx_mask & libc::STATX_INO == 0 {
        return;
    }
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    let Some((size, changed)) = view(fd, dev, stx.stx_ino) else {
        return;
    };
    if stx.stx_mask & libc::STATX_SIZE != 0 && stx.stx_size != size {
        stx.stx_size = size;
        if stx.stx_mask & libc::STATX_BLOCKS != 0 {
            stx.stx_blocks = stx.stx_blocks.max(size.div_ceil(512));
        }
    }
    let (sec, nsec) = split_ns(changed);
    let newer = |t: &libc::statx_timestamp| {
        i128::from(changed) > i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
    };
    for (bit, t) in [
        (libc::STATX_MTIME, &mut stx.stx_mtime),
        (libc::STATX_CTIME, &mut stx.stx_ctime),
    ] {
        if stx.stx_mask & bit != 0 && newer(t) {
            t.tv_sec = sec;
            t.tv_nsec = nsec as u32;
        }
    }
}

/// Patches `*buf` after a successful call (`rc` 0).
///
/// # Safety
/// When `rc` is 0, `buf` points to the stat struct the call filled.
unsafe fn patched(rc: c_int, fd: Option<c_int>, buf: *mut libc::stat64) -> c_int {
    if rc == 0 && !buf.is_null() {
        // SAFETY: the call succeeded, so it filled the caller's struct, which the caller
        // does not use until this function returns.
        patch(fd, unsafe { &mut *buf });
    }
    rc
}

/// # Safety
/// fstat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int {
    // SAFETY: passed on unchanged; the result is the caller's struct.
    unsafe { patched(real::fstat64(fd, buf), Some(fd), buf) }
}

/// # Safety
/// fstat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same function (one layout, see above).
    unsafe { fstat64(fd, buf.cast()) }
}

/// # Safety
/// stat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    // SAFETY: passed on unchanged; the result is the caller's struct.
    unsafe { patched(real::stat64(path, buf), None, buf) }
}

/// # Safety
/// stat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same function.
    unsafe { stat64(path, buf.cast()) }
}

/// # Safety
/// lstat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    // SAFETY: passed on unchanged; the result is the caller's struct.
    unsafe { patched(real::lstat64(path, buf), None, buf) }
}

/// # Safety
/// lstat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same function.
    unsafe { lstat64(path, buf.cast()) }
}

/// # Safety
/// fstatat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: passed on unchanged; the result is the caller's struct.
    unsafe { patched(real::fstatat64(dirfd, path, buf, flags), None, buf) }
}

/// # Safety
/// fstatat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the same function.
    unsafe { fstatat64(dirfd, path, buf.cast(), flags) }
}

/// # Safety
/// statx(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::statx(dirfd, path, flags, mask, buf) };
    if rc == 0 && !buf.is_null() {
        // SAFETY: the call succeeded, so it filled the caller's struct.
        patch_statx(None, unsafe { &mut *buf });
    }
    rc
}

/// # Safety
/// glibc's `__fxstat64` (fstat with a struct version).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(version: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::__fxstat64(version, fd, buf) };
    if version != STAT_VERSION {
        return rc; // another struct layout: left alone
    }
    // SAFETY: a `struct stat` of this layout, filled if rc is 0.
    unsafe { patched(rc, Some(fd), buf) }
}

/// # Safety
/// glibc's `__fxstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(version: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the same function.
    unsafe { __fxstat64(version, fd, buf.cast()) }
}

/// # Safety
/// glibc's `__xstat64` (stat with a struct version).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat64(
    version: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::__xstat64(version, path, buf) };
    if version != STAT_VERSION {
        return rc;
    }
    // SAFETY: as in __fxstat64.
    unsafe { patched(rc, None, buf) }
}

/// # Safety
/// glibc's `__xstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat(
    version: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: the same function.
    unsafe { __xstat64(version, path, buf.cast()) }
}

/// # Safety
/// glibc's `__lxstat64` (lstat with a struct version).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat64(
    version: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::__lxstat64(version, path, buf) };
    if version != STAT_VERSION {
        return rc;
    }
    // SAFETY: as in __fxstat64.
    unsafe { patched(rc, None, buf) }
}

/// # Safety
/// glibc's `__lxstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat(
    version: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: the same function.
    unsafe { __lxstat64(version, path, buf.cast()) }
}

/// # Safety
/// glibc's `__fxstatat64` (fstatat with a struct version).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    version: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::__fxstatat64(version, dirfd, path, buf, flags) };
    if version != STAT_VERSION {
        return rc;
    }
    // SAFETY: as in __fxstat64.
    unsafe { patched(rc, None, buf) }
}

/// # Safety
/// glibc's `__fxstatat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    version: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the same function.
    unsafe { __fxstatat64(version, dirfd, path, buf.cast(), flags) }
}
