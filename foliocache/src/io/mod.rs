//! Where a file's bytes come from: the [`Backend`] trait (the kernel's `->readahead` and
//! `->read_folio`), the direct-file backend and the I/O engines behind it.
//!
//! Readahead hands a backend a list of [`ReadRequest`]s, one per contiguous run of locked,
//! not-uptodate folios (split at the cache's request size, [`DEFAULT_REQUEST_BYTES`] unless
//! changed, so one window becomes several I/Os in flight). The backend starts them and returns; each request is completed later, on any thread,
//! with [`ReadRequest::complete`], which marks its folios uptodate (or failed), unlocks them and
//! wakes their waiters: `folio_end_read` in the kernel. A request dropped without being completed
//! completes as failed, so no reader can wait forever on a folio whose read was lost.
//!
//! Engines ([`EngineKind`]): io_uring (one ring per cache, one submission per readahead batch,
//! a completion thread standing in for the kernel's interrupt), or a small pool of threads doing
//! `preadv` when io_uring is unavailable. The choice is automatic and reported
//! ([`crate::Cache::io_engine`]).
//!
//! `unsafe` in this module is limited to the raw I/O: handing folio memory to the kernel (or to
//! a backend as `&mut [u8]`) while the folio is locked and not uptodate, and the io_uring
//! submission and completion queues.

#[cfg(not(loom))]
pub(crate) mod claim;
mod direct;
pub(crate) mod fanotify;
pub(crate) mod forks;
#[cfg(not(loom))]
pub(crate) mod lease;
pub mod probe;
#[cfg(not(loom))]
pub(crate) mod thread_exit;
mod threads;
mod uring;

/// Closes every descriptor above standard error. A process that a program starts (the shared
/// cache's owner, which a process using the preload library starts, at any point of its life)
/// inherits every descriptor the program left without close-on-exec: a database backend's
/// client socket, its data files open for writing. Held by a long-lived owner, such a socket
/// would not close when the program closed it, and such a file would look written by another
/// process (no read lease for anyone). Call first thing in `main`, before the process opens
/// any descriptor of its own.
#[cfg(not(loom))]
pub(crate) fn close_inherited_descriptors() {
    // SAFETY: called first thing in the owner's `main`, before it opens or is handed any
    // descriptor above 2: none of those closed belongs to any value of this process.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if closed == 0 {
        return;
    }
    // No close_range (Linux before 5.9): the descriptors /proc lists, gathered before closing
    // (the directory's own descriptor is among them and is closed when the listing drops).
    let listed: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect(),
        Err(_) => return,
    };
    for fd in listed {
        // SAFETY: as above; the listing's own descriptor is closed already (EBADF, ignored).
        unsafe { libc::close(fd) };
    }
}

pub(crate) use direct::Engine;
pub use direct::{DirectFile, EngineKind, IoMode, OpenOptions};

use crate::mem::Memory;
use crate::mem::{LockedFolio, PAGE_SIZE, flag};
use crate::sync::unmodelled::Counter;
use std::fmt;
use std::io;
use std::sync::Arc;

/// The default largest single I/O readahead submits: a window is split into requests of at most
/// this many bytes, so a large window keeps several I/Os in flight, each completing (and waking
/// its readers) on its own. 512 KiB: on this project's disk, reading into huge-page memory,
/// 128 KiB requests topped out at about 85% of what 512 KiB ones do, and 2 MiB requests made
/// a reader wait longer for a window's first pages (`docs/BENCHMARKS.md`, "Disk reads").
/// `CacheBuilder::io_request_bytes` changes it.
pub const DEFAULT_REQUEST_BYTES: usize = 512 << 10;

/// The most I/O vectors one request may have (the kernel's `UIO_MAXIOV`: a `readv` with more
/// fails with `EINVAL`). Readahead ends a request at this many folios; the engines also split
/// any longer vector list they are handed.
pub(crate) const MAX_IOVECS: usize = 1024;

/// Where a file's bytes come from (the kernel's address-space operations for reads).
///
/// [`submit`](Self::submit) starts reads and returns; each request must eventually be completed
/// with [`ReadRequest::complete`] (from any thread), or dropped, which completes it as failed.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The file size in bytes.
    fn size(&self) -> u64;

    /// Starts the reads (one readahead batch). Requests are contiguous runs of whole pages at
    /// page-aligned offsets.
    fn submit(&self, requests: Vec<ReadRequest>);

    /// Reads the caller waits for at once (a reader's miss): a backend may do them in the
    /// calling thread, as the kernel's synchronous reads are, sparing the hand-off to a
    /// completion thread and back. The default submits them.
    fn read_now(&self, requests: Vec<ReadRequest>) {
        self.submit(requests);
    }

    /// A short description for reports (engine, mode).
    fn describe(&self) -> String {
        format!("{self:?}")
    }

    /// What the file looks like now (identity, size, change times), to tell whether it changed
    /// since it was last looked at ([`File::revalidate`](crate::File::revalidate)). `None` (the
    /// default) for a source that does not change behind the cache's back.
    fn stamp(&self) -> io::Result<Option<FileStamp>> {
        Ok(None)
    }

    /// Called by [`File::revalidate`](crate::File::revalidate) when it found the file changed,
    /// under the file's locks, after the cached pages of the old version were dropped and the
    /// new size taken: a backend pinned to one version takes the one [`stamp`](Self::stamp)
    /// just saw (no page of the old version is left to sit beside the new one's, and no
    /// change can land in between). The default does nothing.
    fn revalidated(&self) {}
}

/// A backend whose file can be written too, and whose storage takes a file's changes all at
/// once: a new version of the whole file replaces the old one when [`commit`](Self::commit)
/// returns, and not before (an object store, where a PUT is the only way to change an
/// object). A file opened on one ([`Cache::open_writable_backend`](crate::Cache::open_writable_backend))
/// holds its writes as dirty folios, as a file from a disk does; every writeback pass of it
/// (a sync, the flusher, the last holder letting go) is one commit of the whole file, whatever
/// range or budget the pass was given, so the file on storage is always one version the cache
/// held, never a mix.
pub trait WriteBackend: Backend {
    /// Reads `buf.len()` bytes at `offset` of the version on storage (the rest of a page a
    /// write covers only in part), zeros past [`size`](Backend::size).
    fn read_sync(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// The file is `size` bytes long from now on (truncation or extension): the next commit
    /// writes that many. Until then [`size`](Backend::size) is at most `size` (storage's bytes
    /// past it are no longer the file's: reads there give zeros).
    fn set_size(&self, size: u64);

    /// Whether a change made without dirtying a folio (a [`set_size`](Self::set_size)) waits
    /// for the next commit.
    fn resized(&self) -> bool;

    /// The file's changes not yet committed were dropped
    /// ([`File::discard_dirty`](crate::File::discard_dirty)): forget what waits for a commit
    /// (a size change). Called under the file's locks, with no commit under way; afterwards
    /// [`size`](Backend::size) is the version on storage's.
    fn discard(&self);

    /// Puts the file described by `changes` on storage as its new version: the dirty bytes
    /// where `changes` has them, storage's bytes elsewhere (zeros past [`size`](Backend::size)).
    /// `Ok` once the new version is in place, after which `size` and
    /// [`stamp`](Backend::stamp) describe it; `Err` if nothing changed on storage (the dirty
    /// folios stay dirty under [`WritebackErrorPolicy::KeepDirty`](crate::WritebackErrorPolicy::KeepDirty),
    /// and the error's errno goes to the file's error sequence).
    fn commit(&self, changes: &Changes<'_>) -> io::Result<()>;
}

/// What one commit writes ([`WriteBackend::commit`]): the file's size and its dirty bytes.
/// The folios stay under writeback during the commit, so their bytes do not change under it.
#[derive(Debug)]
pub struct Changes<'a> {
    pub(crate) size: u64,
    pub(crate) dirty: Vec<(u64, &'a [u8])>,
    pub(crate) clean: Vec<(u64, &'a [u8])>,
}

impl Changes<'_> {
    /// The file's size: the new version has exactly this many bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The dirty bytes: `(file offset, bytes)`, in file order, not overlapping, none past
    /// [`size`](Self::size) (adjacent folios are separate pieces).
    pub fn dirty(&self) -> &[(u64, &[u8])] {
        &self.dirty
    }

    /// Bytes the cache holds clean, which are storage's bytes there (zeros past
    /// [`size`](Backend::size)): a backend may take them instead of reading storage. Same
    /// shape as [`dirty`](Self::dirty), and never overlapping it.
    pub fn clean(&self) -> &[(u64, &[u8])] {
        &self.clean
    }

    /// Bytes [`dirty`](Self::dirty) holds.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.iter().map(|(_, bytes)| bytes.len() as u64).sum()
    }
}

/// What a file looks like at one moment: its identity and what changes when its bytes do.
/// Compared by [`File::revalidate`](crate::File::revalidate). The times have the file
/// system's granularity (ext4: nanoseconds, updated at a few milliseconds' ticks), so a
/// rewrite that keeps the size within one tick is not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// Device and inode number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Last status change (also moved by writes and truncation), nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// A version the backend names (an object's ETag, hashed), 0 for a file on a file system.
    pub version: u128,
}

impl FileStamp {
    /// The stamp of an open file (its `fstat`).
    pub(crate) fn of(fd: impl std::os::fd::AsFd) -> io::Result<Self> {
        let stat = rustix::fs::fstat(fd)?;
        let ns = |sec: i64, nsec: i64| i128::from(sec) * 1_000_000_000 + i128::from(nsec);
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        Ok(Self {
            dev: stat.st_dev as u64,
            ino: stat.st_ino as u64,
            size: stat.st_size as u64,
            mtime_ns: ns(stat.st_mtime as i64, stat.st_mtime_nsec as i64),
            ctime_ns: ns(stat.st_ctime as i64, stat.st_ctime_nsec as i64),
            version: 0,
        })
    }

    /// The stamp of a source that names its versions (an object store: `size` and the
    /// object's version or ETag, hashed into `version`); identity and times are zero.
    pub fn versioned(size: u64, version: u128) -> Self {
        Self {
            dev: 0,
            ino: 0,
            size,
            mtime_ns: 0,
            ctime_ns: 0,
            version,
        }
    }
}

/// One I/O an engine carries out: a contiguous run of folio memory at a file offset, read into
/// or written from. The engine transfers it whole (continuing after short transfers), then
/// completes it once with the bytes moved or the error.
pub(crate) trait Transfer: Send {
    /// The file offset of the first byte.
    fn offset(&self) -> u64;
    /// Bytes to move.
    fn len(&self) -> usize;
    /// The memory, as I/O vectors (adjacent folios merged).
    fn io_vectors(&self) -> Vec<libc::iovec>;
    /// Whether this is a write (else a read).
    fn is_write(&self) -> bool;
    /// Where a read may end early without error: the file size when it was issued.
    fn end_of_file(&self) -> u64;
    /// Ends the transfer: `Ok(bytes moved)` or the error.
    fn complete(self: Box<Self>, result: io::Result<usize>);
}

/// How an engine must treat one file's descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileIo {
    /// Drop the kernel's cached copy after each transfer (the buffered fallback).
    pub(crate) drop_behind: bool,
    /// The offset and length granularity of a transfer on this descriptor (O_DIRECT's logical
    /// block size; 1 when buffered): where a transfer cut short restarts.
    pub(crate) align: usize,
    /// `RWF_*` flags of every read (`preadv2`, io_uring's `rw_flags`): `RWF_DONTCACHE` for a
    /// buffered descriptor, so the kernel does not keep a second copy.
    pub(crate) read_flags: i32,
    /// `RWF_*` flags of every write: `RWF_DONTCACHE`, and `RWF_NOAPPEND` so that a descriptor
    /// opened with `O_APPEND` still writes where the cache says.
    pub(crate) write_flags: i32,
}

/// The vectors of `all` from byte `skip` on, at most [`MAX_IOVECS`] of them.
pub(crate) fn vectors_from(all: &[libc::iovec], mut skip: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(all.len().min(MAX_IOVECS));
    for vector in all {
        if out.len() == MAX_IOVECS {
            break;
        }
        if skip >= vector.iov_len {
            skip -= vector.iov_len;
            continue;
        }
        out.push(libc::iovec {
            iov_base: vector.iov_base.cast::<u8>().wrapping_add(skip).cast(),
            iov_len: vector.iov_len - skip,
        });
        skip = 0;
    }
    out
}

/// After a transfer moved `done` of `len` bytes: where it goes on from (rounded down to the
/// file's granularity), or `None` when it is over (all moved, or a read reached the end of
/// the file). `Err` when a write made no progress at all.
pub(crate) fn next_step(
    transfer: &dyn Transfer,
    io: FileIo,
    before: usize,
    moved: usize,
) -> io::Result<Option<usize>> {
    let done = before + moved;
    if done >= transfer.len() {
        return Ok(None);
    }
    if moved == 0 {
        if transfer.is_write() {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        return Ok(None); // end of file
    }
    if !transfer.is_write() && transfer.offset() + done as u64 >= transfer.end_of_file() {
        return Ok(None);
    }
    let restart = done - done % io.align.max(1);
    if restart <= before {
        // Less than one block moved: going on from the same place would loop.
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(Some(restart))
}

impl Transfer for ReadRequest {
    fn offset(&self) -> u64 {
        self.offset
    }
    fn len(&self) -> usize {
        self.len
    }
    fn io_vectors(&self) -> Vec<libc::iovec> {
        ReadRequest::io_vectors(self)
    }
    fn is_write(&self) -> bool {
        false
    }
    fn end_of_file(&self) -> u64 {
        self.file_size
    }
    fn complete(self: Box<Self>, result: io::Result<usize>) {
        ReadRequest::complete(*self, result);
    }
}

/// I/O counters of one file (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Read requests completed.
    pub requests: u64,
    /// Bytes asked for by completed requests.
    pub bytes: u64,
    /// Requests that failed (their folios are left not uptodate, with the ERROR flag).
    pub errors: u64,
    /// Requests that read fewer bytes than asked because the file ended.
    pub short_at_eof: u64,
    /// Requests the reader that needed them did in its own thread (small reads a reader
    /// waits for, see `Backend::read_now`), not through the engine.
    pub by_caller: u64,
}

impl std::ops::Add for IoStats {
    type Output = Self;

    /// Field-wise sums (counters of several files).
    fn add(self, b: Self) -> Self {
        Self {
            requests: self.requests + b.requests,
            bytes: self.bytes + b.bytes,
            errors: self.errors + b.errors,
            short_at_eof: self.short_at_eof + b.short_at_eof,
            by_caller: self.by_caller + b.by_caller,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    requests: Counter,
    bytes: Counter,
    errors: Counter,
    short_at_eof: Counter,
    pub(crate) by_caller: Counter,
    /// The last failed read's errno (-1: an error without one), 0 if none yet.
    last_errno: std::sync::atomic::AtomicI32,
}

impl IoCounters {
    /// The error of the last failed read, as well as it is known.
    pub(crate) fn last_error(&self) -> io::Error {
        match self.last_errno.load(crate::sync::Ordering::Relaxed) {
            errno if errno > 0 => io::Error::from_raw_os_error(errno),
            _ => io::Error::other("the backend reported a read error"),
        }
    }

    pub(crate) fn snapshot(&self) -> IoStats {
        IoStats {
            requests: self.requests.get(),
            bytes: self.bytes.get(),
            errors: self.errors.get(),
            short_at_eof: self.short_at_eof.get(),
            by_caller: self.by_caller.get(),
        }
    }
}

/// A read of a contiguous run of locked, not-uptodate folios from one file offset: what a
/// backend is handed. It holds a reference on each folio until it completes.
pub struct ReadRequest {
    mem: Arc<Memory>,
    counters: Arc<IoCounters>,
    /// Folio ids, in file order; each holds one reference taken for this request.
    folios: Vec<u32>,
    offset: u64,
    len: usize,
    /// The file size when the read was issued: bytes past it are zero-filled.
    file_size: u64,
    /// Set by the first `finish`: the outcome is decided (bytes arrived, end of file reached).
    completed: bool,
    arrived: usize,
    at_eof: bool,
    /// Folios ended so far, and their bytes (see `finish`).
    ended: usize,
    ended_bytes: usize,
}

impl fmt::Debug for ReadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadRequest")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("folios", &self.folios.len())
            .finish_non_exhaustive()
    }
}

impl ReadRequest {
    /// A request for `folios` (in file order, not uptodate, contiguous in the file from byte
    /// `offset`): the request takes over their locks and references, and gives both up when it
    /// completes.
    pub(crate) fn new(
        mem: Arc<Memory>,
        counters: Arc<IoCounters>,
        folios: Vec<LockedFolio<'_>>,
        offset: u64,
        file_size: u64,
    ) -> Self {
        let mut len = 0;
        let folios: Vec<u32> = folios
            .into_iter()
            .map(|locked| {
                debug_assert!(std::ptr::eq(locked.folio().mem, &*mem));
                len += locked.folio().len();
                locked.into_locked_id()
            })
            .collect();
        Self {
            mem,
            counters,
            folios,
            offset,
            len,
            file_size,
            completed: false,
            arrived: 0,
            at_eof: false,
            ended: 0,
            ended_bytes: 0,
        }
    }

    /// The file offset of the first byte to read (a multiple of the page size).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes to read (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a request reads at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of folios the request fills.
    pub fn folio_count(&self) -> usize {
        self.folios.len()
    }

    /// The destination, one `(file offset, bytes)` piece per folio, for backends that fill
    /// folios themselves (a test backend, a memory backend).
    pub fn targets(&mut self) -> Vec<(u64, &mut [u8])> {
        let mut offset = self.offset;
        let mut out = Vec::with_capacity(self.folios.len());
        for &pfn in &self.folios {
            let len = self.folio_len(pfn);
            // SAFETY: the folio is referenced by this request (not freed or reused), locked and
            // not uptodate until `complete` runs, and that is the state in which only the lock
            // holder (the read in progress, i.e. this request) writes its bytes and nobody
            // reads them (readers copy only uptodate folios; optimistic readers validate the
            // uptodate bit after copying and discard what they copied). The folios of one
            // request are distinct, and `&mut self` keeps the slices from outliving the
            // request or aliasing another call's.
            let bytes = unsafe { std::slice::from_raw_parts_mut(self.mem.page_ptr(pfn), len) };
            out.push((offset, bytes));
            offset += len as u64;
        }
        out
    }

    fn folio_len(&self, pfn: u32) -> usize {
        PAGE_SIZE
            << self
                .mem
                .desc(pfn)
                .order
                .load(crate::sync::Ordering::Relaxed)
    }

    /// The destination as I/O vectors (folios adjacent in the arena merged into one vector).
    /// Valid until the request completes; see `targets` for why the kernel may write there.
    pub(crate) fn io_vectors(&self) -> Vec<libc::iovec> {
        let mut out: Vec<libc::iovec> = Vec::with_capacity(self.folios.len());
        for &pfn in &self.folios {
            let base = self.mem.page_ptr(pfn);
            let len = self.folio_len(pfn);
            if let Some(last) = out.last_mut()
                && last.iov_base.cast::<u8>().wrapping_add(last.iov_len) == base
            {
                last.iov_len += len;
                continue;
            }
            out.push(libc::iovec {
                iov_base: base.cast(),
                iov_len: len,
            });
        }
        out
    }

    /// Ends the read: with `Ok(n)`, the first `n` bytes arrived. Folios fully covered become
    /// uptodate; when the read stopped at end of file, the rest of the last folio is zeroed
    /// and it becomes uptodate too; any other folio (a short read before end of file, or an
    /// error) is left not uptodate with the ERROR flag. All are unlocked and their waiters
    /// woken.
    pub fn complete(mut self, result: io::Result<usize>) {
        self.finish(result);
    }

    /// Decides the outcome (once), then ends every folio not ended yet: uptodate, or failed.
    ///
    /// Folios are ended one at a time, and `ended` moves past a folio *before* it is unlocked
    /// and released: if anything panics in here, the `Drop` that follows resumes with the next
    /// folio and never ends one twice (a second unlock could release someone else's lock, a
    /// second put a reference it does not own). What `Drop` resumes, it fails.
    fn finish(&mut self, result: io::Result<usize>) {
        if !self.completed {
            self.completed = true;
            self.counters.requests.inc();
            self.counters.bytes.add(self.len as u64);
            self.arrived = match result {
                Ok(n) => n.min(self.len),
                Err(error) => {
                    self.counters.errors.inc();
                    self.counters.last_errno.store(
                        error.raw_os_error().unwrap_or(-1),
                        crate::sync::Ordering::Relaxed,
                    );
                    0
                }
            };
            self.at_eof = self.offset + self.arrived as u64 >= self.file_size;
            if self.arrived < self.len && self.at_eof {
                self.counters.short_at_eof.inc();
            }
            if self.arrived > 0 && self.arrived < self.len && !self.at_eof {
                // A short read before end of file: the folios it did not reach fail.
                self.counters.errors.inc();
                self.counters
                    .last_errno
                    .store(libc::EIO, crate::sync::Ordering::Relaxed);
            }
        }
        while self.ended < self.folios.len() {
            let pfn = self.folios[self.ended];
            let len = self.folio_len(pfn);
            let start = self.ended_bytes;
            let ok = if start + len <= self.arrived {
                true
            } else if self.at_eof {
                let from = self.arrived.saturating_sub(start);
                // SAFETY: as in `targets`: referenced, locked, not uptodate, written only by
                // this request, which no one else touches now that the I/O has ended.
                let bytes = unsafe { std::slice::from_raw_parts_mut(self.mem.page_ptr(pfn), len) };
                bytes[from..].fill(0);
                true
            } else {
                false
            };
            self.ended += 1;
            self.ended_bytes += len;
            let desc = self.mem.desc(pfn);
            if ok {
                desc.unlock_changing(flag::UPTODATE, flag::ERROR);
            } else {
                desc.unlock_with(flag::ERROR);
            }
            self.mem.put(pfn);
            if self.ended == 1 && self.mem.inject.take(&self.mem.inject.completion_panics) {
                panic!("foliocache: injected panic while completing a read");
            }
        }
    }
}

impl Drop for ReadRequest {
    fn drop(&mut self) {
        if self.completed {
            // A completion that panicked part way: the folios it had not reached yet fail
            // (their state is not to be trusted), so readers retry them.
            self.arrived = 0;
            self.at_eof = false;
        }
        // A request lost on the way (a backend that dropped it, an engine shutting down, a
        // panic while completing): fail its folios rather than leave readers waiting on their
        // locks.
        self.finish(Err(io::Error::other("read request dropped")));
    }
}
