#![allow(unreachable_pub)] // the `pub extern "C"` functions are the C symbols this library exports
//! stdio. glibc's `FILE` functions call libc-internal entry points (`__read`, `__open`,
//! `__close`), not the interposable symbols, so a `FILE` would bypass the hooks. Hence:
//! * `fopen` of a served file opens it through the `open` hook and wraps the fd in a
//!   `fopencookie` stream whose read, write, seek and close are the hooks; `fileno` of such a
//!   stream returns the fd (glibc's would say -1).
//! * `fdopen` of a served fd gives glibc's own stream: its reads are the kernel's (correct in
//!   write-through mode, since the kernel has every byte), its writes would bypass the
//!   invalidation, so a stream opened for writing makes the file uncached. In write-back mode
//!   any `fdopen` does (the kernel is behind the cache: the file is written back first). The
//!   kernel's offset is set to the table's first, so the stream starts where the program's
//!   reads left off.
//! * `fclose` of a stream on a served fd takes the fd out of the table *before* glibc closes
//!   it (afterwards the number could already belong to another file).
//! * Streams glibc opens itself (`freopen`, an `fopen` mode this library leaves to glibc such
//!   as `,ccs=`) read and write with libc-internal calls: in write-back mode their file becomes
//!   uncached for the rest of the process (after a write back), as for `fdopen`.

use crate::guard;
use crate::hooks::{hook_close, hook_lseek, hook_open, hook_read, hook_write};
use crate::{real, runtime, table};
use libc::{FILE, c_char, c_int, c_void, off64_t, size_t, ssize_t};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

#[repr(C)]
struct CookieIoFunctions {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

unsafe extern "C" {
    fn fopencookie(
        cookie: *mut c_void,
        mode: *const c_char,
        functions: CookieIoFunctions,
    ) -> *mut FILE;
}

/// The streams made here: (stream address, fd).
static COOKIES: Mutex<Vec<(usize, c_int)>> = Mutex::new(Vec::new());
/// How many there are (so `fileno` of other streams takes no lock).
static COOKIE_COUNT: AtomicUsize = AtomicUsize::new(0);

fn cookies() -> std::sync::MutexGuard<'static, Vec<(usize, c_int)>> {
    COOKIES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A cookie is the fd, boxed.
struct Cookie {
    fd: c_int,
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: glibc hands back the cookie made in `fopen` (a live Box<Cookie>).
    let fd = unsafe { &*cookie.cast::<Cookie>() }.fd;
    // SAFETY: glibc's buffer of `size` bytes.
    unsafe { hook_read(fd, buf.cast(), size) }
}

unsafe extern "C" fn cookie_write(
    cookie: *mut c_void,
    buf: *const c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: as in cookie_read.
    let fd = unsafe { &*cookie.cast::<Cookie>() }.fd;
    // SAFETY: glibc's buffer of `size` bytes.
    let n = unsafe { hook_write(fd, buf.cast(), size) };
    // fopencookie's write returns 0 on error (errno is set).
    n.max(0)
}

unsafe extern "C" fn cookie_seek(
    cookie: *mut c_void,
    offset: *mut off64_t,
    whence: c_int,
) -> c_int {
    // SAFETY: as in cookie_read.
    let fd = unsafe { &*cookie.cast::<Cookie>() }.fd;
    // SAFETY: glibc passes a valid pointer to the offset.
    let wanted = unsafe { *offset };
    let result = hook_lseek(fd, wanted, whence);
    if result < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *offset = result };
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: glibc calls close once, with the cookie made in `fopen`: ownership comes back.
    let cookie = unsafe { Box::from_raw(cookie.cast::<Cookie>()) };
    cookies().retain(|(_, fd)| *fd != cookie.fd);
    COOKIE_COUNT.store(cookies().len(), Ordering::Relaxed);
    hook_close(cookie.fd)
}

/// # Safety
/// fopen(3)'s contract.
unsafe fn open_stream(
    path: *const c_char,
    mode: *const c_char,
    real_fopen: fn(*const c_char, *const c_char) -> *mut FILE,
) -> *mut FILE {
    if path.is_null() || mode.is_null() || runtime().is_none() {
        return real_fopen(path, mode);
    }
    // SAFETY: not null, and by fopen's contract NUL-terminated.
    let mode_bytes = unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes();
    let Some(flags) = crate::config::fopen_flags(mode_bytes) else {
        return unseen_stream(real_fopen(path, mode));
    };
    {
        // Only an outermost call is served (the library's own fopen calls pass through).
        let Some(_probe) = guard::enter() else {
            return real_fopen(path, mode);
        };
    }
    // SAFETY: fopen's contract (a NUL-terminated path); 0666 as fopen creates files.
    let fd = unsafe { hook_open(path, flags, 0o666) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    if table::get(fd).is_none() {
        // Not served: glibc's own stream on the fd.
        // SAFETY: a valid fd and fopen's mode string.
        let stream = unsafe { real::fdopen(fd, mode) };
        if stream.is_null() {
            // SAFETY: our fd, not handed out.
            unsafe { real::close(fd) };
        }
        return stream;
    }
    let cookie = Box::into_raw(Box::new(Cookie { fd }));
    let functions = CookieIoFunctions {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: a live cookie, fopen's NUL-terminated mode, and functions that match glibc's
    // cookie_io_functions_t.
    let stream = unsafe { fopencookie(cookie.cast(), mode, functions) };
    if stream.is_null() {
        // SAFETY: the cookie was not handed out; ownership comes back.
        drop(unsafe { Box::from_raw(cookie) });
        hook_close(fd);
        return stream;
    }
    let mut list = cookies();
    list.push((stream as usize, fd));
    COOKIE_COUNT.store(list.len(), Ordering::Relaxed);
    stream
}

/// Write-back mode: a stream glibc opened on a file itself, whose reads and writes the hooks
/// never see, makes the file uncached (written back first, never served again here).
fn unseen_stream(stream: *mut FILE) -> *mut FILE {
    if stream.is_null() {
        return stream;
    }
    let Some(runtime) = runtime().filter(|r| r.config.writes == crate::config::Writes::Back) else {
        return stream;
    };
    let Some(_outer) = guard::enter() else {
        return stream;
    };
    // SAFETY: a stream glibc just returned.
    let fd = unsafe { real::fileno(stream) };
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: fstat fills the valid local buffer.
    if fd >= 0 && unsafe { real::fstat64(fd, st.as_mut_ptr()) } == 0 {
        // SAFETY: fstat succeeded.
        let st = unsafe { st.assume_init() };
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            runtime.set_uncached((st.st_dev, st.st_ino), crate::stats::Reason::UntrackedPath);
        }
    }
    stream
}

/// # Safety
/// freopen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    // SAFETY: passed on unchanged.
    unseen_stream(unsafe { real::freopen(path, mode, stream) })
}

/// # Safety
/// freopen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    // SAFETY: passed on unchanged.
    unseen_stream(unsafe { real::freopen64(path, mode, stream) })
}

fn real_fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's contract, passed on.
    unsafe { real::fopen(path, mode) }
}

fn real_fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's contract, passed on.
    unsafe { real::fopen64(path, mode) }
}

/// # Safety
/// fopen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's contract.
    unsafe { open_stream(path, mode, real_fopen) }
}

/// # Safety
/// fopen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's contract.
    unsafe { open_stream(path, mode, real_fopen64) }
}

/// # Safety
/// fdopen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if let Some(d) = table::get(fd) {
        let writes = if mode.is_null() {
            true
        } else {
            // SAFETY: not null, NUL-terminated by fdopen's contract.
            let m = unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes();
            m.first() != Some(&b'r') || m.contains(&b'+')
        };
        let uncache = writes || d.inode.is_back();
        match (guard::enter(), runtime()) {
            (Some(_outer), Some(runtime)) if uncache => {
                runtime.set_uncached(d.inode.key, crate::stats::Reason::UntrackedPath);
            }
            (_, _) if uncache => d.inode.mark_uncached(),
            _ => {}
        }
        // glibc's stream uses the kernel's offset from now on: so does the table.
        if !d.shared.swap(true, Ordering::SeqCst) {
            let offset = d.offset.load(Ordering::SeqCst);
            // SAFETY: integer arguments.
            unsafe { real::lseek64(fd, offset as off64_t, libc::SEEK_SET) };
        }
    }
    // SAFETY: passed on unchanged.
    unsafe { real::fdopen(fd, mode) }
}

fn cookie_fd(stream: *mut FILE) -> Option<c_int> {
    if COOKIE_COUNT.load(Ordering::Relaxed) == 0 {
        return None;
    }
    cookies()
        .iter()
        .find(|(s, _)| *s == stream as usize)
        .map(|(_, fd)| *fd)
}

/// # Safety
/// fileno(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno(stream: *mut FILE) -> c_int {
    // SAFETY: passed on unchanged.
    cookie_fd(stream).unwrap_or_else(|| unsafe { real::fileno(stream) })
}

/// # Safety
/// fileno(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut FILE) -> c_int {
    // SAFETY: passed on unchanged.
    cookie_fd(stream).unwrap_or_else(|| unsafe { real::fileno_unlocked(stream) })
}

/// # Safety
/// fclose(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    if !stream.is_null() && cookie_fd(stream).is_none() {
        // SAFETY: a stream the caller owns (fclose's contract).
        let fd = unsafe { real::fileno(stream) };
        if table::get(fd).is_some() {
            let outer = guard::enter();
            table::remove(fd, outer.is_none());
        }
    }
    // SAFETY: passed on unchanged (a cookie stream closes through cookie_close).
    unsafe { real::fclose(stream) }
}

/// Flushes the streams made here (their buffered writes go through the hooks now), with
/// glibc's `fflush(NULL)`: it walks the stream list under glibc's own lock, so a stream closed
/// meanwhile by another thread is never touched.
pub(crate) fn flush_streams() {
    if COOKIE_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    // SAFETY: fflush(NULL) takes no pointer of ours.
    unsafe { real::fflush(std::ptr::null_mut()) };
}
