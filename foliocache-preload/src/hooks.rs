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

use crate::adapter::{SyncKind, WriteAt};
use crate::guard::{self, Entered};
use crate::stats::Reason;
use crate::table::{self, Description};
use crate::{real, runtime, stats};
use foliocache::SyncRange;
use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off_t, off64_t, size_t, ssize_t};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = errno };
}

/// The largest single read or write Linux does (`MAX_RW_COUNT`).
const MAX_RW: usize = 0x7fff_f000;

thread_local! {
    /// This thread's preferred readahead slot in a description.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

fn preferred_slot() -> usize {
    SLOT.try_with(|slot| {
        if slot.get() == usize::MAX {
            slot.set(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % table::HANDLE_SLOTS);
        }
        slot.get()
    })
    .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Reads
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
    if outer.is_none() || !d.readable || count == 0 || buf.is_null() || pos > i64::MAX as u64 {
        return pass();
    }
    let count = count.min(MAX_RW);
    // SAFETY: not null, at most MAX_RW bytes, and by read(2)'s contract writable for `count`
    // bytes and not used by anyone else during the call.
    let slice = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) };
    let advice = d.advice.load(Ordering::Relaxed);
    match d
        .inode
        .read(fd, &d.handles, preferred_slot(), advice, slice, pos)
    {
        Some(Ok(n)) => {
            stats::read_served(n);
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
    let outer = guard::enter();
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
    let outer = guard::enter();
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
    let outer = guard::enter();
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
            let outer = guard::enter();
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
    let outer = guard::enter();
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

// ---------------------------------------------------------------------------------------------
// Writes. Write-through: to the kernel, then the cached range is invalidated. Write-back: into
// the cache (`write_back`); the kernel path is taken only when the inode is not (or no longer)
// served that way, or by a nested hook.

/// After the kernel wrote `n` bytes at `pos` (`None`: somewhere, e.g. an O_APPEND pwrite).
fn written(d: &Description, pos: Option<u64>, n: ssize_t, outer: Option<&Entered>) {
    if n <= 0 {
        return;
    }
    stats::written_through(n as u64);
    match (outer, pos) {
        (Some(_), Some(pos)) => d.inode.written(pos, n as u64),
        (Some(_), None) => d.inode.written(0, u64::MAX),
        // Nested (a signal handler writing): no lock may be taken.
        (None, _) => d.inode.written_nested(),
    }
}

/// A write at the description's offset (or appended), with `io(pos)` doing a positional write
/// and `append()` a plain one for O_APPEND (write-through, and the raw path).
fn write_at_offset(
    d: &Description,
    fd: c_int,
    outer: Option<&Entered>,
    io: impl FnOnce(u64) -> ssize_t,
    append: impl FnOnce() -> ssize_t,
) -> ssize_t {
    if d.append.load(Ordering::SeqCst) {
        let n = append();
        if n > 0 {
            // SAFETY: lseek on the program's fd, integer arguments.
            let end = unsafe { real::lseek64(fd, 0, libc::SEEK_CUR) };
            if end >= 0 {
                d.offset.store(end as u64, Ordering::SeqCst);
                written(d, Some(end as u64 - n as u64), n, outer);
            } else {
                written(d, None, n, outer);
            }
        }
        return n;
    }
    let Some(pos) = d.offset(fd) else {
        return -1; // lseek failed and set errno
    };
    let n = io(pos);
    if n > 0 {
        d.set_offset(fd, pos + n as u64);
        written(d, Some(pos), n, outer);
    }
    n
}

/// How a write-back write is placed.
#[derive(Clone, Copy)]
struct Placement {
    /// `None`: at the description's offset, which moves; `Some`: there (pwrite).
    pos: Option<u64>,
    /// Appended (`RWF_APPEND`; O_APPEND is the description's).
    append: bool,
    /// Not appended even with O_APPEND (`RWF_NOAPPEND`).
    no_append: bool,
    /// Synced before returning (`RWF_SYNC`, `RWF_DSYNC`; O_SYNC is the description's).
    sync: Option<SyncKind>,
}

impl Placement {
    fn at_offset() -> Self {
        Self {
            pos: None,
            append: false,
            no_append: false,
            sync: None,
        }
    }

    fn at(pos: u64) -> Self {
        Self {
            pos: Some(pos),
            ..Self::at_offset()
        }
    }

    /// With pwritev2's flags.
    fn with_flags(mut self, flags: c_int) -> Self {
        self.append = flags & libc::RWF_APPEND != 0;
        self.no_append = flags & libc::RWF_NOAPPEND != 0;
        self.sync = if flags & libc::RWF_SYNC != 0 {
            Some(SyncKind::All)
        } else if flags & libc::RWF_DSYNC != 0 {
            Some(SyncKind::Data)
        } else {
            None
        };
        self
    }
}

/// pwritev2 flags a write-back write serves: the placement and sync ones above, and hints
/// (`RWF_HIPRI`, `RWF_NOWAIT`, `RWF_DONTCACHE`: the cache neither polls nor fails a write
/// for want of memory at once). Others (`RWF_ATOMIC`...) go to the kernel, with the cache
/// written back before and revalidated after.
const SERVED_RWF: c_int = libc::RWF_HIPRI
    | libc::RWF_DSYNC
    | libc::RWF_SYNC
    | libc::RWF_NOWAIT
    | libc::RWF_APPEND
    | libc::RWF_NOAPPEND
    | libc::RWF_DONTCACHE;

/// The largest number of iovecs a vectored call takes (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Write-back mode: a write of a served fd into the cache. `iov` holds the data. `None`: not
/// served in write-back mode (or not writable, or a bad buffer): the caller goes to the
/// kernel. (A description shared with another process makes its file pass through, see the
/// adapter: its appends go to the kernel, which alone appends atomically across processes.)
///
/// # Safety
/// Each iovec is a readable buffer (write(2)'s contract).
unsafe fn write_back(
    d: &Description,
    fd: c_int,
    iov: &[iovec],
    place: Placement,
) -> Option<ssize_t> {
    if !d.inode.is_back() || !d.writable || iov.len() > IOV_MAX {
        return None;
    }
    if iov.iter().any(|v| v.iov_base.is_null() && v.iov_len > 0) {
        return None; // the kernel reports EFAULT
    }
    if iov.iter().all(|v| v.iov_len == 0) {
        return Some(0); // nothing written, no offset moved (not even by O_APPEND)
    }
    let append = (place.append || d.append.load(Ordering::SeqCst)) && !place.no_append;
    let at = if append {
        WriteAt::Append
    } else {
        match place.pos {
            Some(pos) => WriteAt::Pos(pos),
            None => match d.offset(fd) {
                Some(pos) => WriteAt::Pos(pos),
                None => return Some(-1), // lseek failed and set errno
            },
        }
    };
    // At most MAX_RW bytes, as the kernel.
    let mut room = MAX_RW;
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(iov.len());
    for v in iov {
        let len = v.iov_len.min(room);
        if len > 0 {
            // SAFETY: not null (checked), and by write(2)'s contract readable for iov_len
            // bytes during the call.
            pieces.push(unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), len) });
        }
        room -= len;
    }
    let advice = d.advice.load(Ordering::Relaxed);
    let (pos, n) = match d
        .inode
        .write(fd, &d.handles, preferred_slot(), advice, &pieces, at)?
    {
        Ok(done) => done,
        Err(errno) => {
            set_errno(errno);
            return Some(-1);
        }
    };
    if place.pos.is_none() {
        d.set_offset(fd, pos + n as u64);
    }
    if let Some(kind) = place.sync.or(d.sync_writes)
        && n > 0
        && let Some(Err(errno)) = d.inode.sync(fd, &d.sync, kind)
    {
        set_errno(errno);
        return Some(-1);
    }
    Some(n as ssize_t)
}

/// One buffer as an iovec.
fn one(buf: *const c_void, count: size_t) -> [iovec; 1] {
    [iovec {
        iov_base: buf.cast_mut(),
        iov_len: count,
    }]
}

/// The caller's iovecs, if the count is one the kernel takes.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs (writev(2)'s contract).
unsafe fn vectors<'a>(iov: *const iovec, iovcnt: c_int) -> Option<&'a [iovec]> {
    if iov.is_null() || !(0..=IOV_MAX as c_int).contains(&iovcnt) {
        return None;
    }
    // SAFETY: not null, and by the caller's contract `iovcnt` valid iovecs.
    Some(unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) })
}

/// # Safety
/// write(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::write(fd, buf, count) };
    };
    let outer = guard::enter();
    if outer.is_some() {
        // SAFETY: write(2)'s contract, passed on.
        let served = unsafe { write_back(&d, fd, &one(buf, count), Placement::at_offset()) };
        if let Some(n) = served {
            return n;
        }
    }
    write_at_offset(
        &d,
        fd,
        outer.as_ref(),
        // SAFETY: write(2)'s contract, passed on.
        |pos| unsafe { real::pwrite64(fd, buf, count, pos as off64_t) },
        // SAFETY: write(2)'s contract, passed on.
        || unsafe { real::write(fd, buf, count) },
    )
}

/// # Safety
/// pwrite(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off64_t,
) -> ssize_t {
    let Some(d) = table::get(fd).filter(|_| offset >= 0) else {
        // SAFETY: passed on unchanged (a negative offset: the kernel reports EINVAL).
        return unsafe { real::pwrite64(fd, buf, count, offset) };
    };
    let outer = guard::enter();
    if outer.is_some() {
        let place = Placement::at(offset as u64);
        // SAFETY: pwrite(2)'s contract, passed on.
        let served = unsafe { write_back(&d, fd, &one(buf, count), place) };
        if let Some(n) = served {
            return n;
        }
    }
    // SAFETY: passed on unchanged.
    let n = unsafe { real::pwrite64(fd, buf, count, offset) };
    // Linux appends a pwrite to an O_APPEND file wherever it was asked to go.
    let pos = (!d.append.load(Ordering::SeqCst)).then_some(offset as u64);
    written(&d, pos, n, outer.as_ref());
    n
}

/// # Safety
/// pwrite(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { pwrite64(fd, buf, count, offset) }
}

/// # Safety
/// writev(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::writev(fd, iov, iovcnt) };
    };
    let outer = guard::enter();
    // SAFETY: writev(2)'s contract.
    let vectors = unsafe { vectors(iov, iovcnt) };
    if outer.is_some()
        && let Some(vectors) = vectors
    {
        // SAFETY: writev(2)'s contract, passed on.
        let served = unsafe { write_back(&d, fd, vectors, Placement::at_offset()) };
        if let Some(n) = served {
            return n;
        }
    }
    write_at_offset(
        &d,
        fd,
        outer.as_ref(),
        // SAFETY: writev(2)'s contract, passed on.
        |pos| unsafe { real::pwritev64(fd, iov, iovcnt, pos as off64_t) },
        // SAFETY: writev(2)'s contract, passed on.
        || unsafe { real::writev(fd, iov, iovcnt) },
    )
}

/// # Safety
/// pwritev(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off64_t,
) -> ssize_t {
    let Some(d) = table::get(fd).filter(|_| offset >= 0) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::pwritev64(fd, iov, iovcnt, offset) };
    };
    let outer = guard::enter();
    // SAFETY: pwritev(2)'s contract.
    let vectors = unsafe { vectors(iov, iovcnt) };
    if outer.is_some()
        && let Some(vectors) = vectors
    {
        let place = Placement::at(offset as u64);
        // SAFETY: pwritev(2)'s contract, passed on.
        let served = unsafe { write_back(&d, fd, vectors, place) };
        if let Some(n) = served {
            return n;
        }
    }
    // SAFETY: passed on unchanged.
    let n = unsafe { real::pwritev64(fd, iov, iovcnt, offset) };
    let pos = (!d.append.load(Ordering::SeqCst)).then_some(offset as u64);
    written(&d, pos, n, outer.as_ref());
    n
}

/// # Safety
/// pwritev(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off_t,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { pwritev64(fd, iov, iovcnt, offset) }
}

/// # Safety
/// pwritev2(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off64_t,
    flags: c_int,
) -> ssize_t {
    let Some(d) = table::get(fd).filter(|_| offset >= -1) else {
        // SAFETY: passed on unchanged.
        return unsafe { real::pwritev64v2(fd, iov, iovcnt, offset, flags) };
    };
    let outer = guard::enter();
    // SAFETY: passed on unchanged.
    let kernel = || unsafe { real::pwritev64v2(fd, iov, iovcnt, offset, flags) };
    if outer.is_some() && d.inode.is_back() && flags & !SERVED_RWF != 0 {
        // A flag the cache does not serve: the kernel writes, around the cache.
        return d.inode.around_kernel(fd, kernel, |n| *n > 0);
    }
    // SAFETY: pwritev2(2)'s contract.
    let vectors = unsafe { vectors(iov, iovcnt) };
    if outer.is_some()
        && let Some(vectors) = vectors
    {
        let place = if offset == -1 {
            Placement::at_offset()
        } else {
            Placement::at(offset as u64)
        };
        // SAFETY: pwritev2(2)'s contract, passed on.
        let served = unsafe { write_back(&d, fd, vectors, place.with_flags(flags)) };
        if let Some(n) = served {
            return n;
        }
    }
    if offset == -1 {
        return write_at_offset(
            &d,
            fd,
            outer.as_ref(),
            // SAFETY: pwritev2(2)'s contract, passed on.
            |pos| unsafe { real::pwritev64v2(fd, iov, iovcnt, pos as off64_t, flags) },
            // SAFETY: pwritev2(2)'s contract, passed on.
            || unsafe { real::pwritev64v2(fd, iov, iovcnt, -1, flags) },
        );
    }
    let n = kernel();
    let appended = (d.append.load(Ordering::SeqCst) || flags & libc::RWF_APPEND != 0)
        && flags & libc::RWF_NOAPPEND == 0;
    let pos = (!appended).then_some(offset as u64);
    written(&d, pos, n, outer.as_ref());
    n
}

/// # Safety
/// pwritev2(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    iovcnt: c_int,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the same function.
    unsafe { pwritev64v2(fd, iov, iovcnt, offset, flags) }
}

// ---------------------------------------------------------------------------------------------
// Sizes and allocation. Write-back: the cache's `set_len`, `fallocate` and `punch_hole`; what
// it cannot do goes to the kernel around it (`Inode::around_kernel`).

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

// ---------------------------------------------------------------------------------------------
// Offsets, advice, syncs

/// Write-back mode's `SEEK_END`: from the cache's size (the kernel's is behind until
/// writeback). `None`: not served that way.
fn seek_end(d: &Description, fd: c_int, offset: off64_t) -> Option<off64_t> {
    let (size, _) = d.inode.back_view()?;
    let Some(target) = i64::try_from(size)
        .ok()
        .and_then(|size| size.checked_add(offset))
    else {
        set_errno(libc::EOVERFLOW);
        return Some(-1);
    };
    if target < 0 {
        set_errno(libc::EINVAL);
        return Some(-1);
    }
    if d.shared.load(Ordering::SeqCst) {
        // SAFETY: integer arguments.
        let result = unsafe { real::lseek64(fd, target, libc::SEEK_SET) };
        if result >= 0 {
            d.offset.store(result as u64, Ordering::SeqCst);
        }
        return Some(result);
    }
    d.offset.store(target as u64, Ordering::SeqCst);
    Some(target)
}

/// # Safety
/// lseek(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, offset: off64_t, whence: c_int) -> off64_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::lseek64(fd, offset, whence) };
    };
    if d.inode.is_back() {
        match whence {
            libc::SEEK_END => {
                if let Some(result) = seek_end(&d, fd, offset) {
                    return result;
                }
            }
            // The kernel looks for data and holes in what it has: give it everything.
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if let Some(_outer) = guard::enter() {
                    d.inode.flush();
                }
            }
            _ => {}
        }
    }
    if d.shared.load(Ordering::SeqCst) {
        // The kernel's offset is the one in use.
        // SAFETY: integer arguments.
        let result = unsafe { real::lseek64(fd, offset, whence) };
        if result >= 0 {
            d.offset.store(result as u64, Ordering::SeqCst);
        }
        return result;
    }
    let current = d.offset.load(Ordering::SeqCst);
    if whence == libc::SEEK_CUR && offset == 0 {
        return current as off64_t; // tell
    }
    // The kernel does the arithmetic and the checks, from the offset this table keeps.
    // SAFETY: integer arguments.
    let result = unsafe {
        if whence == libc::SEEK_CUR {
            real::lseek64(fd, current as off64_t, libc::SEEK_SET);
        }
        real::lseek64(fd, offset, whence)
    };
    if result >= 0 {
        d.offset.store(result as u64, Ordering::SeqCst);
    }
    result
}

/// # Safety
/// lseek(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, offset: off_t, whence: c_int) -> off_t {
    // SAFETY: the same function.
    unsafe { lseek64(fd, offset, whence) }
}

/// # Safety
/// posix_fadvise(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    offset: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::posix_fadvise64(fd, offset, len, advice) };
    };
    if offset < 0 || len < 0 || !(0..=5).contains(&advice) {
        return libc::EINVAL;
    }
    let Some(_outer) = guard::enter() else {
        return 0; // advice is optional
    };
    match advice {
        libc::POSIX_FADV_NORMAL | libc::POSIX_FADV_SEQUENTIAL | libc::POSIX_FADV_RANDOM => {
            d.advice.store(advice, Ordering::Relaxed);
            // Idle readahead states start again with the new pattern.
            for slot in &d.handles {
                if let Ok(mut slot) = slot.try_lock() {
                    *slot = None;
                }
            }
        }
        libc::POSIX_FADV_WILLNEED => {
            stats::readahead_call();
            let pattern = d.advice.load(Ordering::Relaxed);
            let (offset, len) = (offset as u64, len as u64);
            d.inode
                .will_need(fd, &d.handles, preferred_slot(), pattern, offset, len);
        }
        libc::POSIX_FADV_DONTNEED => {
            d.inode.dont_need(offset as u64, len as u64);
            // The kernel's copy too (pass-through reads may have filled it).
            // SAFETY: integer arguments.
            unsafe { real::posix_fadvise64(fd, offset, len, advice) };
        }
        _ => {} // NOREUSE: nothing to do
    }
    0
}

/// # Safety
/// posix_fadvise(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    offset: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    // SAFETY: the same function.
    unsafe { posix_fadvise64(fd, offset, len, advice) }
}

/// # Safety
/// readahead(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readahead(fd: c_int, offset: off64_t, count: size_t) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::readahead(fd, offset, count) };
    };
    if offset < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    if let Some(_outer) = guard::enter()
        && count > 0
    {
        stats::readahead_call();
        let pattern = d.advice.load(Ordering::Relaxed);
        let (offset, count) = (offset as u64, count as u64);
        d.inode
            .will_need(fd, &d.handles, preferred_slot(), pattern, offset, count);
    }
    0
}

/// fsync, fdatasync and sync_file_range. Write-through: the kernel has every byte; these go
/// to it unchanged. Write-back: the description's handle writes the cache's dirty data back
/// and reports each writeback error once to each description (errseq), as the kernel.
/// Nested, they go to the kernel (which syncs only what it has).
fn sync_served(fd: c_int, kind: SyncKind) -> Option<c_int> {
    let d = table::get(fd)?;
    if !d.inode.is_back() {
        return None;
    }
    let _outer = guard::enter()?;
    d.inode.sync(fd, &d.sync, kind).map(status)
}

/// # Safety
/// fsync(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    sync_served(fd, SyncKind::All).unwrap_or_else(|| unsafe { real::fsync(fd) })
}

/// # Safety
/// fdatasync(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    sync_served(fd, SyncKind::Data).unwrap_or_else(|| unsafe { real::fdatasync(fd) })
}

/// # Safety
/// sync_file_range(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    offset: off64_t,
    nbytes: off64_t,
    flags: c_uint,
) -> c_int {
    let known = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    if offset >= 0 && nbytes >= 0 && flags & !known == 0 {
        if flags == 0 && table::get(fd).is_some_and(|d| d.inode.is_back()) {
            return 0; // no step asked: nothing done, no error reported (as the kernel)
        }
        let mut steps = SyncRange::default();
        for (flag, step) in [
            (libc::SYNC_FILE_RANGE_WAIT_BEFORE, SyncRange::WAIT_BEFORE),
            (libc::SYNC_FILE_RANGE_WRITE, SyncRange::WRITE),
            (libc::SYNC_FILE_RANGE_WAIT_AFTER, SyncRange::WAIT_AFTER),
        ] {
            if flags & flag != 0 {
                steps = steps | step;
            }
        }
        let kind = SyncKind::Range {
            offset: offset as u64,
            len: nbytes as u64,
            flags: steps,
        };
        if let Some(rc) = sync_served(fd, kind) {
            return rc;
        }
    }
    // SAFETY: integer arguments.
    unsafe { real::sync_file_range(fd, offset, nbytes, flags) }
}

/// Write-back mode: `sync(2)` and `syncfs(2)` make durable what the kernel has: write the
/// cache back first.
fn flush_everything() {
    if let Some(runtime) = runtime()
        && let Some(_outer) = guard::enter()
    {
        runtime.flush_all();
    }
}

/// # Safety
/// sync(2)'s contract (none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync() {
    flush_everything();
    real::sync();
}

/// # Safety
/// syncfs(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    flush_everything();
    // SAFETY: an integer argument.
    unsafe { real::syncfs(fd) }
}

// ---------------------------------------------------------------------------------------------
// Opening, closing, duplicating

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

// ---------------------------------------------------------------------------------------------
// Paths around the cache: mmap, copy_file_range, sendfile

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

/// The read hook for `stdio` cookies (a `FILE` opened by `fopen` on a served file).
///
/// # Safety
/// read(2)'s contract.
pub(crate) unsafe fn hook_read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's contract.
    unsafe { read(fd, buf, count) }
}

/// The write hook for `stdio` cookies.
///
/// # Safety
/// write(2)'s contract.
pub(crate) unsafe fn hook_write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's contract.
    unsafe { write(fd, buf, count) }
}

/// The seek hook for `stdio` cookies.
pub(crate) fn hook_lseek(fd: c_int, offset: off64_t, whence: c_int) -> off64_t {
    // SAFETY: integer arguments.
    unsafe { lseek64(fd, offset, whence) }
}

/// The close hook for `stdio` cookies.
pub(crate) fn hook_close(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    unsafe { close(fd) }
}

/// The open hook for `stdio`.
///
/// # Safety
/// open(2)'s contract.
pub(crate) unsafe fn hook_open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { open64(path, flags, mode) }
}

// ---------------------------------------------------------------------------------------------
// New programs: the kernel's offsets of served fds (and, in write-back mode, the files' data)
// are brought up to date before a program can inherit them or read the files. fork does it in
// its atfork handler; these cover the ways around it.

/// vfork cannot be wrapped (the child would return through this frame on the parent's
/// stack): a plain fork, which runs the atfork handlers, takes its place.
///
/// # Safety
/// vfork(2)'s contract (which fork's satisfies: the child may do more than vfork allows).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no arguments; callers of vfork only exec or _exit in the child.
    unsafe { libc::fork() }
}

/// # Safety
/// execve(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execve(path, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execv(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execv(path, argv) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execvp(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execvp(file, argv) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execvpe(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execvpe(file, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// fexecve(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::fexecve(fd, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// The argument list of `execl`, `execle` and `execlp`: variadic in C, received here as
/// [`LIST_ARGS`] fixed pointer arguments (on x86_64 and aarch64 Linux a variadic pointer
/// travels where a fixed one would, see the module doc). The list ends at the first null;
/// for `execle` the environment follows it.
const LIST_ARGS: usize = 32;

/// The arguments up to the null, and what follows it; `None` if there is no null among them.
fn arg_list(args: [*const c_char; LIST_ARGS]) -> Option<(Vec<*const c_char>, *const c_char)> {
    let end = args.iter().position(|arg| arg.is_null())?;
    let mut list = args[..=end].to_vec();
    list[end] = std::ptr::null();
    Some((list, args.get(end + 1).copied().unwrap_or(std::ptr::null())))
}

macro_rules! list_exec {
    ($(#[$doc:meta])* $name:ident, |$path:ident, $list:ident, $after:ident| $call:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C contract of the function: a NULL-terminated list of C strings.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            $path: *const c_char,
            a0: *const c_char, a1: *const c_char, a2: *const c_char, a3: *const c_char,
            a4: *const c_char, a5: *const c_char, a6: *const c_char, a7: *const c_char,
            a8: *const c_char, a9: *const c_char, a10: *const c_char, a11: *const c_char,
            a12: *const c_char, a13: *const c_char, a14: *const c_char, a15: *const c_char,
            a16: *const c_char, a17: *const c_char, a18: *const c_char, a19: *const c_char,
            a20: *const c_char, a21: *const c_char, a22: *const c_char, a23: *const c_char,
            a24: *const c_char, a25: *const c_char, a26: *const c_char, a27: *const c_char,
            a28: *const c_char, a29: *const c_char, a30: *const c_char,
        ) -> c_int {
            let all = [
                a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, std::ptr::null(),
            ];
            let Some(($list, $after)) = arg_list(all) else {
                // More arguments than the library takes through this call: execv takes them.
                set_errno(libc::E2BIG);
                return -1;
            };
            let _ = $after;
            // SAFETY: the list is the caller's NULL-terminated argument list, passed on.
            unsafe { $call }
        }
    };
}

list_exec!(
    /// `execl`: as `execv` (hooked above) with the list.
    execl,
    |path, list, after| execv(path, list.as_ptr())
);
list_exec!(
    /// `execlp`: as `execvp` with the list.
    execlp,
    |path, list, after| execvp(path, list.as_ptr())
);
list_exec!(
    /// `execle`: as `execve` with the list and the environment after it.
    execle,
    |path, list, after| execve(path, list.as_ptr(), after.cast())
);

/// # Safety
/// posix_spawn(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    crate::before_spawn(!actions.is_null());
    // SAFETY: passed on unchanged.
    unsafe { real::posix_spawn(pid, path, actions, attr, argv, envp) }
}

/// # Safety
/// posix_spawnp(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    crate::before_spawn(!actions.is_null());
    // SAFETY: passed on unchanged.
    unsafe { real::posix_spawnp(pid, file, actions, attr, argv, envp) }
}

/// # Safety
/// system(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    crate::before_spawn(false);
    // SAFETY: passed on unchanged.
    unsafe { real::system(command) }
}

/// # Safety
/// popen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    crate::before_spawn(false);
    // SAFETY: passed on unchanged.
    unsafe { real::popen(command, mode) }
}

// ---------------------------------------------------------------------------------------------
// Descriptors sent to another process (`SCM_RIGHTS`): a writable description of a served file
// that goes over a Unix socket lets the receiver write the file unheard, as a forked child
// could, so the file passes through from then on (see the adapter).

/// The served writable descriptions among the descriptors `msg` carries.
///
/// # Safety
/// `msg` is null or points to a readable msghdr whose control buffer is readable.
unsafe fn sending(msg: *const libc::msghdr) {
    if msg.is_null() || runtime().is_none() {
        return;
    }
    let Some(_outer) = guard::enter() else {
        return;
    };
    // SAFETY: the caller's promise: a readable msghdr and control buffer; the CMSG macros
    // walk the buffer within msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<c_int>();
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for k in 0..bytes / std::mem::size_of::<c_int>() {
                    let fd = data.add(k).read_unaligned();
                    if let Some(d) = table::get(fd)
                        && d.writable
                    {
                        d.inode.shared_with_another_process();
                    }
                }
            }
            header = libc::CMSG_NXTHDR(msg, header);
        }
    }
}

/// # Safety
/// sendmsg(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: sendmsg's contract: `msg` is a readable msghdr.
    unsafe { sending(msg) };
    // SAFETY: passed on unchanged.
    unsafe { real::sendmsg(socket, msg, flags) }
}

/// # Safety
/// sendmmsg(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    socket: c_int,
    msgs: *mut libc::mmsghdr,
    count: c_uint,
    flags: c_int,
) -> c_int {
    if !msgs.is_null() {
        for k in 0..count as usize {
            // SAFETY: sendmmsg's contract: `count` readable mmsghdrs.
            unsafe { sending(std::ptr::addr_of!((*msgs.add(k)).msg_hdr)) };
        }
    }
    // SAFETY: passed on unchanged.
    unsafe { real::sendmmsg(socket, msgs, count, flags) }
}

// ---------------------------------------------------------------------------------------------
// Signal dispositions: the one the library hears lease breaks with becomes the program's if
// it sets one for it (see `lease`).

/// # Safety
/// sigaction(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    signum: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if !act.is_null() {
        // SAFETY: sigaction(2)'s contract: a non-null `act` points to a readable sigaction.
        crate::lease::program_set(signum, unsafe { (*act).sa_sigaction });
    }
    // SAFETY: passed on unchanged.
    unsafe { real::sigaction(signum, act, old) }
}

/// # Safety
/// signal(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::signal(signum, handler) }
}

/// # Safety
/// sigset(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigset(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::sigset(signum, handler) }
}

/// # Safety
/// bsd_signal(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bsd_signal(
    signum: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::bsd_signal(signum, handler) }
}

/// # Safety
/// sysv_signal(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sysv_signal(
    signum: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::sysv_signal(signum, handler) }
}

// ---------------------------------------------------------------------------------------------
// The fortified entry points (`_FORTIFY_SOURCE`): a buffer smaller than the count is glibc's
// to report (it aborts); otherwise they are read and pread.

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
    unsafe { read(fd, buf, count) }
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
    unsafe { pread64(fd, buf, count, offset) }
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
