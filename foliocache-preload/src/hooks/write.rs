//! Writes. Write-through: to the kernel, then the cached range is invalidated. Write-back: into
//! the cache (`write_back`); the kernel path is taken only when the inode is not (or no longer)
//! served that way, or by a nested hook.

use super::{MAX_RW, preferred_slot, set_errno};
use crate::adapter::{SyncKind, WriteAt};
use crate::guard::{self, Entered};
use crate::table::{self, Description};
use crate::{real, stats};
use libc::{c_int, c_void, iovec, off_t, off64_t, size_t, ssize_t};
use std::sync::atomic::Ordering;

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

/// A write at the description's offset, or appended (`append`: O_APPEND or `RWF_APPEND`), with
/// `io(pos)` doing a positional write and `plain()` the call as the program made it (write-
/// through, and the raw path).
fn write_at_offset(
    d: &Description,
    fd: c_int,
    outer: Option<&Entered>,
    append: bool,
    io: impl FnOnce(u64) -> ssize_t,
    plain: impl FnOnce() -> ssize_t,
) -> ssize_t {
    if append {
        let n = plain();
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

/// What every write hook of a served fd does: in write-back mode the cache takes the write
/// (`vectors`, placed as `place` says); otherwise the kernel writes it, with `positional(pos)`
/// (a write at a position) or `plain()` (the call as the program made it, for an append), the
/// description's offset moved as the kernel would, and write-through drops the range written.
/// `vectors` is `None` when the caller's iovecs are not ones the kernel takes (it then reports
/// the error).
///
/// # Safety
/// The vectors are the caller's buffers (write(2)'s contract).
unsafe fn write_hook(
    d: &Description,
    fd: c_int,
    vectors: Option<&[iovec]>,
    place: Placement,
    positional: impl FnOnce(u64) -> ssize_t,
    plain: impl FnOnce() -> ssize_t,
) -> ssize_t {
    let outer = guard::enter();
    if outer.is_some()
        && let Some(vectors) = vectors
        // SAFETY: the caller's promise, passed on.
        && let Some(n) = unsafe { write_back(d, fd, vectors, place) }
    {
        return n;
    }
    let append = (place.append || d.append.load(Ordering::SeqCst)) && !place.no_append;
    match place.pos {
        None => write_at_offset(d, fd, outer.as_ref(), append, positional, plain),
        Some(pos) => {
            let n = positional(pos);
            // Linux appends a pwrite to an O_APPEND file wherever it was asked to go.
            written(d, (!append).then_some(pos), n, outer.as_ref());
            n
        }
    }
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
    // SAFETY: write(2)'s contract, passed on (here and in both closures).
    unsafe {
        write_hook(
            &d,
            fd,
            Some(&one(buf, count)),
            Placement::at_offset(),
            |pos| real::pwrite64(fd, buf, count, pos as off64_t),
            || real::write(fd, buf, count),
        )
    }
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
    // SAFETY: pwrite(2)'s contract, passed on (here and in both closures).
    unsafe {
        write_hook(
            &d,
            fd,
            Some(&one(buf, count)),
            Placement::at(offset as u64),
            |pos| real::pwrite64(fd, buf, count, pos as off64_t),
            || real::pwrite64(fd, buf, count, offset),
        )
    }
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
    // SAFETY: writev(2)'s contract, passed on (here and in both closures).
    unsafe {
        write_hook(
            &d,
            fd,
            vectors(iov, iovcnt),
            Placement::at_offset(),
            |pos| real::pwritev64(fd, iov, iovcnt, pos as off64_t),
            || real::writev(fd, iov, iovcnt),
        )
    }
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
    // SAFETY: pwritev(2)'s contract, passed on (here and in both closures).
    unsafe {
        write_hook(
            &d,
            fd,
            vectors(iov, iovcnt),
            Placement::at(offset as u64),
            |pos| real::pwritev64(fd, iov, iovcnt, pos as off64_t),
            || real::pwritev64(fd, iov, iovcnt, offset),
        )
    }
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
    // SAFETY: passed on unchanged.
    let kernel = || unsafe { real::pwritev64v2(fd, iov, iovcnt, offset, flags) };
    if d.inode.is_back()
        && flags & !SERVED_RWF != 0
        && let Some(_outer) = guard::enter()
    {
        // A flag the cache does not serve: the kernel writes, around the cache.
        return d.inode.around_kernel(fd, kernel, |n| *n > 0);
    }
    let place = if offset == -1 {
        Placement::at_offset()
    } else {
        Placement::at(offset as u64)
    };
    // SAFETY: pwritev2(2)'s contract, passed on (here and in both closures).
    unsafe {
        write_hook(
            &d,
            fd,
            vectors(iov, iovcnt),
            place.with_flags(flags),
            |pos| real::pwritev64v2(fd, iov, iovcnt, pos as off64_t, flags),
            kernel,
        )
    }
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
