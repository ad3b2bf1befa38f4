//! The direct-file backend: a file opened with O_DIRECT, read by the cache's I/O engine.

use super::{Backend, FileIo, FileStamp, ReadRequest, Transfer, threads, uring};
use crate::error::Error;
use crate::inject::Inject;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most a reader's own read may be (see `DirectFile::read_now`): one readahead request.
const READ_NOW_BYTES: usize = 128 << 10;

/// Which I/O engine a cache uses for files opened from storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring if the kernel allows it, else the thread pool (the default).
    #[default]
    Auto,
    /// io_uring only (opening a file fails if io_uring is unavailable).
    IoUring,
    /// A small pool of threads doing `preadv`.
    Threads,
}

/// The running engine of a cache.
pub(crate) enum Engine {
    Uring(uring::Uring),
    Threads(threads::Pool),
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Engine {
    /// Starts an engine of the asked kind; `Auto` falls back to threads when io_uring cannot
    /// be set up (disabled by `io_uring_disabled`, a seccomp filter, an old kernel).
    pub(crate) fn start(kind: EngineKind, inject: Arc<Inject>) -> Result<Self, Error> {
        match kind {
            EngineKind::IoUring => uring::Uring::start(inject)
                .map(Engine::Uring)
                .map_err(Error::Engine),
            EngineKind::Threads => Ok(Engine::Threads(threads::Pool::start(inject)?)),
            EngineKind::Auto => match uring::Uring::start(Arc::clone(&inject)) {
                Ok(ring) => Ok(Engine::Uring(ring)),
                Err(_) => Ok(Engine::Threads(threads::Pool::start(inject)?)),
            },
        }
    }

    /// The faults armed for this engine's transfers.
    fn inject(&self) -> &Inject {
        match self {
            Engine::Uring(ring) => ring.inject(),
            Engine::Threads(pool) => pool.inject(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Engine::Uring(_) => "io_uring",
            Engine::Threads(_) => "threads (preadv)",
        }
    }

    /// Starts the transfers of one batch on `fd`.
    pub(crate) fn submit(&self, fd: &Arc<OwnedFd>, transfers: Vec<Box<dyn Transfer>>, io: FileIo) {
        match self {
            Engine::Uring(ring) => ring.submit(fd, transfers, io),
            Engine::Threads(pool) => pool.submit(fd, transfers, io),
        }
    }
}

/// How a [`DirectFile`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: the device writes straight into the cache's folios.
    Direct,
    /// Buffered reads through the kernel's page cache, its copy dropped after each read
    /// (`POSIX_FADV_DONTNEED`); chosen explicitly with [`OpenOptions::buffered_fallback`]. On
    /// tmpfs the kernel's copy *is* the file, so it stays.
    Buffered,
}

/// Options for opening a file from storage.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    pub(crate) buffered_fallback: bool,
    pub(crate) max_order: Option<u8>,
    pub(crate) insert: Option<crate::InsertPolicy>,
    pub(crate) shared: bool,
    pub(crate) revalidate: bool,
    pub(crate) write: bool,
    pub(crate) create: bool,
    pub(crate) truncate: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            buffered_fallback: false,
            max_order: None,
            insert: None,
            shared: true,
            revalidate: true,
            write: false,
            create: false,
            truncate: false,
        }
    }
}

impl OpenOptions {
    /// The defaults: O_DIRECT required, folios up to the cache's max order, the file shared
    /// with every other opener in this cache and revalidated when opened again.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the file is the cache's one shared file for it (the default): every opener of
    /// the same file (device and inode) in this cache gets the same [`File`](crate::File) and
    /// sees one cache of it. `false` gives a file of its own, with its own mapping, that is
    /// read only: for comparing policies on one file side by side (the benchmarks do).
    pub fn shared(mut self, on: bool) -> Self {
        self.shared = on;
        self
    }

    /// Open for writing as well (the file must be writable by this process): writes go into
    /// the cache as dirty folios and reach storage by writeback (see
    /// [`File::write_at`](crate::File::write_at) and [`Handle::sync_all`](crate::Handle::sync_all)).
    /// A file the cache already has open read only becomes writable.
    pub fn write(mut self, on: bool) -> Self {
        self.write = on;
        self
    }

    /// Create the file (empty, mode 0644 before the umask) if it does not exist; implies
    /// `write`.
    pub fn create(mut self, on: bool) -> Self {
        self.create = on;
        self.write |= on;
        self
    }

    /// Truncate the file to 0 bytes when opened (through the cache, so cached pages go too);
    /// implies `write`.
    pub fn truncate(mut self, on: bool) -> Self {
        self.truncate = on;
        self.write |= on;
        self
    }

    /// When the cache already has the file open, look at it again
    /// ([`File::revalidate`](crate::File::revalidate)): if another program changed it, the
    /// new size is taken and stale pages are dropped. On by default (one `fstat`).
    pub fn revalidate(mut self, on: bool) -> Self {
        self.revalidate = on;
        self
    }

    /// When the file system has no real direct I/O (tmpfs, or O_DIRECT refused), read through
    /// the kernel's page cache instead of failing with [`Error::NoDirectIo`].
    pub fn buffered_fallback(mut self, on: bool) -> Self {
        self.buffered_fallback = on;
        self
    }

    /// How readahead inserts this file's folios (default: the cache's policy). Two files
    /// opened on one path with different policies compare them on the same memory.
    pub fn insert_policy(mut self, insert: crate::InsertPolicy) -> Self {
        self.insert = Some(insert);
        self
    }

    /// The largest folio order readahead uses for this file (default: the cache's max order;
    /// 0 reads in 4 KiB folios only, like a mapping without large-folio support).
    pub fn max_order(mut self, order: u8) -> Self {
        self.max_order = Some(order);
        self
    }
}

/// The file offset granularity of O_DIRECT transfers on `file` (`STATX_DIOALIGN`, Linux 6.1+),
/// or 512 bytes (the smallest logical block size) when the kernel does not say.
fn direct_io_align(file: &std::fs::File) -> usize {
    rustix::fs::statx(
        file.as_fd(),
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::DIOALIGN,
    )
    .ok()
    .filter(|stat| {
        stat.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() != 0
            && stat.stx_dio_offset_align > 0
    })
    .map_or(512, |stat| stat.stx_dio_offset_align as usize)
}

/// tmpfs's `statfs` magic: it accepts O_DIRECT but keeps the data in the page cache anyway.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A file opened from storage, read by the cache's I/O engine.
pub struct DirectFile {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    /// The descriptor writes go through, once the file was opened for writing (the same
    /// open file description's inode, reopened read-write through `/proc/self/fd`).
    write_fd: std::sync::Mutex<Option<Arc<OwnedFd>>>,
    /// The size on storage, as last seen (at open, or by `stamp`).
    size: std::sync::atomic::AtomicU64,
    mode: IoMode,
    /// How the engine treats the descriptor (its block size for O_DIRECT).
    io: FileIo,
    engine: Arc<Engine>,
}

impl fmt::Debug for DirectFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectFile")
            .field("path", &self.path)
            .field("size", &self.size())
            .field("mode", &self.mode)
            .field("engine", &self.engine.name())
            .finish()
    }
}

impl DirectFile {
    pub(crate) fn open(
        path: &Path,
        options: OpenOptions,
        engine: Arc<Engine>,
    ) -> Result<Self, Error> {
        let open_error = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(open_error)?;
        if !meta.is_file() {
            return Err(open_error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        let refused = match direct {
            Ok(file) => {
                let stat =
                    rustix::fs::fstatfs(file.as_fd()).map_err(|errno| open_error(errno.into()))?;
                #[allow(clippy::cast_lossless, clippy::unnecessary_cast)]
                if stat.f_type as i64 == TMPFS_MAGIC {
                    Err((file, "tmpfs keeps every file in the page cache".to_owned()))
                } else {
                    Ok(file)
                }
            }
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                let plain = std::fs::File::open(path).map_err(open_error)?;
                Err((plain, "O_DIRECT is refused".to_owned()))
            }
            Err(error) => return Err(open_error(error)),
        };
        let (file, mode) = match refused {
            Ok(file) => (file, IoMode::Direct),
            Err((_, reason)) if !options.buffered_fallback => {
                return Err(Error::NoDirectIo {
                    path: path.to_owned(),
                    reason,
                });
            }
            Err(_) => (
                std::fs::File::open(path).map_err(open_error)?,
                IoMode::Buffered,
            ),
        };
        let meta = file.metadata().map_err(open_error)?;
        let io = FileIo {
            drop_behind: mode == IoMode::Buffered,
            align: match mode {
                IoMode::Direct => direct_io_align(&file),
                IoMode::Buffered => 1,
            },
        };
        Ok(Self {
            path: path.to_owned(),
            fd: Arc::new(OwnedFd::from(file)),
            write_fd: std::sync::Mutex::new(None),
            size: std::sync::atomic::AtomicU64::new(meta.len()),
            mode,
            io,
            engine,
        })
    }

    /// How this file is read.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Makes the file writable: opens the same inode read-write (with O_DIRECT when reads use
    /// it), once.
    pub(crate) fn enable_writes(&self) -> Result<(), Error> {
        let mut slot = self
            .write_fd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_some() {
            return Ok(());
        }
        let open_error = |source| Error::Open {
            path: self.path.clone(),
            source,
        };
        // Through /proc/self/fd: the very inode this file reads, even if its path was renamed
        // or removed since.
        let proc = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true);
        if self.mode == IoMode::Direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&proc).map_err(open_error)?;
        *slot = Some(Arc::new(OwnedFd::from(file)));
        Ok(())
    }

    /// The descriptor writes use.
    pub(crate) fn write_fd(&self) -> Result<Arc<OwnedFd>, Error> {
        self.write_fd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(Error::ReadOnly)
    }

    /// Starts writes (writeback) of folios to the file.
    pub(crate) fn submit_writes(&self, transfers: Vec<Box<dyn Transfer>>) -> Result<(), Error> {
        let fd = self.write_fd()?;
        self.engine.submit(&fd, transfers, self.io);
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` synchronously into `buf` (a folio: page aligned, a
    /// page multiple), for a write that covers part of a page not cached (read before write).
    /// Bytes past the end of the file read as zeros. Returns the bytes that came from the file.
    pub(crate) fn read_sync(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let want = buf.len() - done;
            match rustix::io::pread(&*self.fd, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => {
                    let before = done;
                    done += n;
                    if n < want && offset + done as u64 >= self.size() {
                        break; // the end of the file
                    }
                    // Cut short before the end: go on from a block boundary (O_DIRECT).
                    done -= done % self.io.align.max(1);
                    if done <= before {
                        return Err(std::io::Error::from_raw_os_error(libc::EIO));
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        buf[done..].fill(0);
        Ok(done)
    }

    /// Sets the size on storage (`ftruncate`).
    pub(crate) fn set_size(&self, size: u64) -> Result<(), Error> {
        let fd = self.write_fd()?;
        rustix::fs::ftruncate(&*fd, size).map_err(|errno| Error::Io {
            offset: size,
            len: 0,
            source: errno.into(),
        })?;
        self.size.store(size, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Notes that writes reached byte `end` (an O_DIRECT write of a whole last block extends
    /// the file on storage until the size is set exactly).
    pub(crate) fn wrote_to(&self, end: u64) {
        self.size
            .fetch_max(end, std::sync::atomic::Ordering::AcqRel);
    }

    /// `fsync` (or `fdatasync` with `data_only`) of the file.
    pub(crate) fn sync(&self, data_only: bool) -> std::io::Result<()> {
        let fd = self
            .write_fd()
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
        if data_only {
            rustix::fs::fdatasync(&*fd)?;
        } else {
            rustix::fs::fsync(&*fd)?;
        }
        Ok(())
    }

    /// `fallocate`: with `punch`, deallocates `offset..offset + len` (it reads as zeros, the
    /// size stays); else allocates it, growing the size if it ends past it.
    pub(crate) fn fallocate(&self, offset: u64, len: u64, punch: bool) -> std::io::Result<()> {
        let fd = self
            .write_fd()
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
        let mode = if punch {
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE
        } else {
            rustix::fs::FallocateFlags::empty()
        };
        rustix::fs::fallocate(&*fd, mode, offset, len)?;
        if !punch {
            self.wrote_to(offset + len);
        }
        Ok(())
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Backend for DirectFile {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    fn submit(&self, requests: Vec<ReadRequest>) {
        let transfers = requests
            .into_iter()
            .map(|request| Box::new(request) as Box<dyn Transfer>)
            .collect();
        self.engine.submit(&self.fd, transfers, self.io);
    }

    /// Small reads (up to `READ_NOW_BYTES`, 128 KiB, in all) are done in the calling thread with
    /// `preadv`: a reader that missed waits for them anyway, and on this machine the hand-off
    /// to the engine's completion thread and back cost about as much as a random 4 KiB read
    /// itself. Larger batches go to the engine, which keeps them in flight together.
    fn read_now(&self, requests: Vec<ReadRequest>) {
        let bytes: usize = requests.iter().map(ReadRequest::len).sum();
        if bytes > READ_NOW_BYTES || requests.len() > 1 {
            return self.submit(requests);
        }
        for request in requests {
            request.counters.by_caller.inc();
            threads::run_now(&self.fd, Box::new(request), self.io, self.engine.inject());
        }
    }

    /// Also refreshes the size reads are issued against.
    fn stamp(&self) -> std::io::Result<Option<FileStamp>> {
        let stamp = FileStamp::of(&*self.fd)?;
        self.size
            .store(stamp.size, std::sync::atomic::Ordering::Release);
        Ok(Some(stamp))
    }

    fn describe(&self) -> String {
        let mode = match self.mode {
            IoMode::Direct => "O_DIRECT",
            IoMode::Buffered => "buffered (explicit fallback)",
        };
        format!("{mode} via {}", self.engine.name())
    }
}
