//! Opening, closing, duplicating: an opened regular file under the served directories gets its
//! description in the table (and the adapter tries a lease); closing the program's last fd of
//! a file runs the file's last close before the real close (the table does it); `dup2`,
//! `dup3`, `close_range` and `closefrom` likewise; `fcntl` keeps the table's flags and makes a
//! file pass through where the program reaches what the library set on its description.

use crate::guard;
use crate::stats::Reason;
use crate::table::{self, Description};
use crate::{real, runtime};
use libc::{c_char, c_int, c_uint, mode_t};
use std::sync::atomic::Ordering;

/// After the real open returned `fd`: serve it if it is a regular file under the directories.
fn opened(fd: c_int, flags: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let outer = guard::enter();
    // The number may have been closed behind the table's back (by a libc-internal close).
    table::remove(fd, outer.is_none());
    let (Some(_outer), Some(runtime)) = (outer, runtime()) else {
        return fd;
    };
    if flags & libc::O_PATH != 0 {
        return fd;
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the valid local buffer (`stat` and `stat64` are one layout here,
    // see `SAME_STAT`).
    if unsafe { real::fstat64(fd, st.as_mut_ptr().cast()) } != 0 {
        return fd;
    }
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return fd;
    }
    // Where the fd really is (relative paths, dirfds, symlinks and `..` all resolved).
    let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
        return fd;
    };
    if !runtime.config.covers(&path) {
        return fd;
    }
    if let Some(inode) = runtime.inode_for(fd, &st) {
        if flags & libc::O_DIRECT != 0 {
            // The program does its own direct I/O: its writes would bypass the cache.
            runtime.set_uncached(inode.key, Reason::ProgramDirect);
        }
        let description =
            std::sync::Arc::new(Description::new(std::sync::Arc::clone(&inode), flags));
        table::install(fd, description, false);
        inode.opened(fd);
    }
    fd
}

/// # Safety
/// open(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: passed on (see the module doc for the variadic mode).
    opened(unsafe { real::open64(path, flags, mode) }, flags)
}

/// # Safety
/// open(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::open(path, flags, mode) }, flags)
}

/// # Safety
/// openat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::openat64(dirfd, path, flags, mode) }, flags)
}

/// # Safety
/// openat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::openat(dirfd, path, flags, mode) }, flags)
}

/// # Safety
/// open(2)'s contract (the fortified entry point: no mode).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: passed on; without O_CREAT the mode is not read.
    opened(unsafe { real::open(path, flags, 0) }, flags)
}

/// # Safety
/// open(2)'s contract (the fortified entry point: no mode).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::open64(path, flags, 0) }, flags)
}

/// # Safety
/// openat(2)'s contract (the fortified entry point: no mode).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::openat(dirfd, path, flags, 0) }, flags)
}

/// # Safety
/// openat(2)'s contract (the fortified entry point: no mode).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: passed on.
    opened(unsafe { real::openat64(dirfd, path, flags, 0) }, flags)
}

/// # Safety
/// creat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: passed on.
    opened(unsafe { real::creat64(path, mode) }, flags)
}

/// # Safety
/// creat(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: passed on.
    opened(unsafe { real::creat(path, mode) }, flags)
}

/// # Safety
/// close(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // Out of the table first: once the kernel closes it, the number can be reused.
    if table::get(fd).is_some() {
        let outer = guard::enter();
        table::remove(fd, outer.is_none());
    }
    // SAFETY: an integer argument.
    unsafe { real::close(fd) }
}

/// # Safety
/// close_range(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let known = (libc::CLOSE_RANGE_CLOEXEC | libc::CLOSE_RANGE_UNSHARE) as c_int;
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && flags & !known == 0 && first <= last {
        let outer = guard::enter();
        let last = last.min(table::MAX_FDS as c_uint - 1);
        for fd in first..=last {
            if table::get(fd as c_int).is_some() {
                table::remove(fd as c_int, outer.is_none());
            }
        }
    }
    // SAFETY: integer arguments.
    unsafe { real::close_range(first, last, flags) }
}

/// # Safety
/// closefrom(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(first: c_int) {
    if first >= 0 {
        let outer = guard::enter();
        for fd in first..table::MAX_FDS as c_int {
            if table::get(fd).is_some() {
                table::remove(fd, outer.is_none());
            }
        }
    }
    // SAFETY: an integer argument.
    unsafe { real::closefrom(first) }
}

/// Before a duplication onto `new` (`dup2`, `dup3`): the kernel closes `new` if it is open, so
/// a served `new` leaves the table first (and, if it was its file's last fd, the file's last
/// close runs now, before the kernel's close). Not if `old` is no open fd: the call fails and
/// `new` stays.
fn replacing(old: c_int, new: c_int) {
    if old == new || table::get(new).is_none() {
        return;
    }
    // SAFETY: fcntl on an fd number, integer arguments.
    if unsafe { real::fcntl(old, libc::F_GETFD, 0) } < 0 {
        return;
    }
    let outer = guard::enter();
    table::remove(new, outer.is_none());
}

/// After a duplication made `new` from `old` (or failed, `new` < 0).
fn duplicated(old: c_int, new: c_int) -> c_int {
    if new < 0 {
        return new;
    }
    let outer = guard::enter();
    match table::get_arc(old) {
        Some(d) => table::install(new, d, outer.is_none()),
        None => {
            table::remove(new, outer.is_none());
        }
    }
    new
}

/// # Safety
/// dup(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    duplicated(fd, unsafe { real::dup(fd) })
}

/// # Safety
/// dup2(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    replacing(fd, new);
    // SAFETY: integer arguments.
    let rc = unsafe { real::dup2(fd, new) };
    if fd == new { rc } else { duplicated(fd, rc) }
}

/// # Safety
/// dup3(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    if flags & !libc::O_CLOEXEC == 0 {
        replacing(fd, new);
    }
    // SAFETY: integer arguments.
    duplicated(fd, unsafe { real::dup3(fd, new, flags) })
}

fn fcntl_common(fd: c_int, cmd: c_int, arg: usize, rc: c_int) -> c_int {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => duplicated(fd, rc),
        libc::F_SETFL if rc == 0 => {
            if let Some(d) = table::get(fd) {
                d.append
                    .store(arg as c_int & libc::O_APPEND != 0, Ordering::SeqCst);
            }
            rc
        }
        _ => rc,
    }
}

/// Before `fcntl(fd, cmd, arg)` of a served fd: commands that would reach what the library
/// set on the file's description (its lease, the owner and signal its breaks go to) or make
/// the program's I/O bypass the cache (O_DIRECT) make the file pass through first, for the
/// rest of the process. Locks need nothing: a file is served only while no other process can
/// change it, so taking a lock brings no news, and the library never closes a descriptor
/// that would drop one (see the adapter).
fn before_fcntl(fd: c_int, cmd: c_int, arg: usize) {
    let reaches = match cmd {
        libc::F_SETLEASE
        | libc::F_SETOWN
        | crate::lease::F_SETOWN_EX
        | crate::lease::F_SETSIG
        | libc::F_NOTIFY => true,
        libc::F_SETFL => arg as c_int & libc::O_DIRECT != 0,
        _ => false,
    };
    if !reaches {
        return;
    }
    let Some(d) = table::get(fd) else { return };
    let reason = if cmd == libc::F_SETFL {
        Reason::ProgramDirect
    } else {
        Reason::UntrackedPath
    };
    match (guard::enter(), runtime()) {
        (Some(_outer), Some(runtime)) => runtime.set_uncached(d.inode.key, reason),
        _ => d.inode.mark_uncached(),
    }
}

/// # Safety
/// fcntl(2)'s contract (see the module doc for the variadic argument).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    before_fcntl(fd, cmd, arg);
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::fcntl(fd, cmd, arg) };
    fcntl_common(fd, cmd, arg, rc)
}

/// # Safety
/// fcntl(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    before_fcntl(fd, cmd, arg);
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::fcntl64(fd, cmd, arg) };
    fcntl_common(fd, cmd, arg, rc)
}
