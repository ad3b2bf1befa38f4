//! The direct-file backend: a file opened with O_DIRECT, read by the cache's I/O engine.

use super::{Backend, FileIo, FileStamp, ReadRequest, Transfer, threads, uring};
use crate::error::Error;
use crate::inject::Inject;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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

/// How a file opened from storage reads (`raw::DirectFile::mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: the device writes straight into the cache's folios.
    Direct,
    /// Buffered reads through the kernel's page cache, its copy dropped after each read
    /// (`POSIX_FADV_DONTNEED`); chosen explicitly with [`OpenOptions::buffered_fallback`]. On
    /// tmpfs the kernel's copy *is* the file, so it stays.
    Buffered,
    /// Buffered transfers with `RWF_DONTCACHE` (Linux 6.14): the kernel drops its copy of each
    /// page once the transfer is done. A lent descriptor without O_DIRECT
    /// ([`Cache::open_descriptor`](crate::Cache::open_descriptor)) is used this way where the
    /// kernel offers it.
    Uncached,
}

/// Options for opening a file from storage.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    pub(crate) buffered_fallback: bool,
    pub(crate) max_order: Option<u8>,
    pub(crate) insert: Option<crate::policy::InsertPolicy>,
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
    pub fn insert_policy(mut self, insert: crate::policy::InsertPolicy) -> Self {
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
fn direct_io_align(file: impl AsFd) -> usize {
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

/// `RWF_DONTCACHE` (Linux 6.14): a buffered transfer whose pages the kernel drops once done.
const RWF_DONTCACHE: i32 = 0x80;
/// `RWF_NOAPPEND` (Linux 6.9): a write at its offset even on an `O_APPEND` description.
const RWF_NOAPPEND: i32 = 0x20;

/// How a lent descriptor is used.
struct Lendable {
    readable: bool,
    writable: bool,
    mode: IoMode,
    io: FileIo,
}

/// The descriptors a [`DirectFile`] reads and writes through, and how.
struct Descriptors {
    /// Reads go through it (`None`: the descriptor cannot read, or there is none).
    read: Option<Arc<OwnedFd>>,
    /// Writes go through it, once the file is writable.
    write: Option<Arc<OwnedFd>>,
    /// Whether the caller lent the descriptor ([`DirectFile::from_descriptor`]): it is then the
    /// one descriptor, for reads and writes, and [`DirectFile::detach`] hands it back.
    lent: Option<Arc<OwnedFd>>,
    /// A buffered descriptor of the same inode for writes into the kernel's page cache
    /// ([`DirectFile::submit_writes_to_kernel`]), opened at the first such write.
    kernel: Option<(Arc<OwnedFd>, FileIo)>,
    mode: IoMode,
    io: FileIo,
}

/// A file opened from storage, read by the cache's I/O engine.
pub struct DirectFile {
    path: PathBuf,
    /// Device and inode number: a descriptor attached later must be of the same file.
    identity: (u64, u64),
    /// `None` while detached (no I/O can start).
    fds: std::sync::RwLock<Option<Descriptors>>,
    /// The size on storage, as last seen (at open, or by `stamp`).
    size: std::sync::atomic::AtomicU64,
    engine: Arc<Engine>,
}

impl fmt::Debug for DirectFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectFile")
            .field("path", &self.path)
            .field("size", &self.size())
            .field("mode", &self.mode())
            .field("engine", &self.engine.name())
            .finish()
    }
}

/// `EBADF` as an `io::Error`: the file has no descriptor for this (detached, or one that
/// cannot read or write).
fn no_descriptor() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EBADF)
}

/// Writes one transfer whole with `pwritev2` (going on after short writes and `EINTR`):
/// `Ok(len)` or the error.
fn write_whole(fd: &OwnedFd, transfer: &dyn Transfer, io: FileIo) -> std::io::Result<usize> {
    let all = transfer.io_vectors();
    let mut done = 0usize;
    loop {
        let vectors = super::vectors_from(&all, done);
        // SAFETY: the vectors describe the transfer's folio memory, which its writeback keeps
        // alive and unchanged until it is completed (after this returns); the kernel only
        // reads it.
        let n = unsafe {
            libc::pwritev2(
                fd.as_raw_fd(),
                vectors.as_ptr(),
                vectors.len() as libc::c_int,
                (transfer.offset() + done as u64) as libc::off_t,
                io.write_flags,
            )
        };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        match super::next_step(transfer, io, done, n as usize)? {
            Some(next) => done = next,
            None => return Ok(transfer.len()),
        }
    }
}

/// Whether this kernel accepts `RWF_NOAPPEND` (Linux 6.9 and later).
fn kernel_has_noappend() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        let uname = rustix::system::uname();
        let release = uname.release().to_string_lossy();
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (6, 9)
    })
}

/// Whether buffered transfers on `fd` (readable) take `RWF_DONTCACHE`: tried with a one-byte
/// read, and remembered per device (a write-only descriptor uses what its device answered,
/// or goes without).
fn dontcache_works(fd: &OwnedFd, dev: u64, readable: bool) -> bool {
    static BY_DEVICE: std::sync::Mutex<Vec<(u64, bool)>> = std::sync::Mutex::new(Vec::new());
    let mut known = BY_DEVICE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, works)) = known.iter().find(|(d, _)| *d == dev) {
        return *works;
    }
    if !readable {
        return false;
    }
    let mut byte = [0u8; 1];
    let vector = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: one iovec describing the local one-byte buffer, valid for the call.
    let n = unsafe { libc::preadv2(fd.as_raw_fd(), &vector, 1, 0, RWF_DONTCACHE) };
    let works = n >= 0;
    known.push((dev, works));
    works
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
                _ => 1,
            },
            read_flags: 0,
            write_flags: 0,
        };
        Ok(Self {
            path: path.to_owned(),
            identity: (meta.dev(), meta.ino()),
            fds: std::sync::RwLock::new(Some(Descriptors {
                read: Some(Arc::new(OwnedFd::from(file))),
                write: None,
                lent: None,
                kernel: None,
                mode,
                io,
            })),
            size: std::sync::atomic::AtomicU64::new(meta.len()),
            engine,
        })
    }

    /// A file read (and, with `write`, written) through a descriptor the caller opened and
    /// lends to the cache until [`detach`](Self::detach) hands it back: O_DIRECT if the
    /// descriptor has it, else buffered with `RWF_DONTCACHE` where the kernel has it (so the
    /// kernel keeps no second copy). A descriptor opened for writing only serves writes; a
    /// write that needs bytes from storage (part of a page not cached) then goes to storage
    /// around the cache (see `write.rs`). Refused: the error, and the descriptor back.
    pub(crate) fn from_descriptor(
        fd: OwnedFd,
        write: bool,
        engine: Arc<Engine>,
    ) -> Result<Self, (Error, OwnedFd)> {
        let stat = match rustix::fs::fstat(&fd) {
            Ok(stat) => stat,
            Err(errno) => {
                let error = Error::Open {
                    path: descriptor_path(&fd),
                    source: errno.into(),
                };
                return Err((error, fd));
            }
        };
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        let identity = (stat.st_dev as u64, stat.st_ino as u64);
        let file = Self {
            path: descriptor_path(&fd),
            identity,
            fds: std::sync::RwLock::new(None),
            #[allow(clippy::unnecessary_cast)]
            size: std::sync::atomic::AtomicU64::new(stat.st_size as u64),
            engine,
        };
        file.attach(fd, write)?;
        Ok(file)
    }

    /// Puts a lent descriptor in place (after [`detach`](Self::detach), or at
    /// [`from_descriptor`](Self::from_descriptor)): it must be of the same file. Refused: the
    /// error, and the descriptor back.
    pub(crate) fn attach(&self, fd: OwnedFd, write: bool) -> Result<(), (Error, OwnedFd)> {
        match self.lendable(&fd, write) {
            Ok((descriptors, size)) => {
                let fd = Arc::new(fd);
                let mut slot = self.slot_mut();
                *slot = Some(Descriptors {
                    read: descriptors.readable.then(|| Arc::clone(&fd)),
                    write: descriptors.writable.then(|| Arc::clone(&fd)),
                    lent: Some(fd),
                    kernel: None,
                    mode: descriptors.mode,
                    io: descriptors.io,
                });
                self.size.store(size, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            Err(error) => Err((error, fd)),
        }
    }

    /// Whether `fd` can be lent (for writes too, with `write`), and how it is to be used.
    fn lendable(&self, fd: &OwnedFd, write: bool) -> Result<(Lendable, u64), Error> {
        let path = descriptor_path(fd);
        let fail = |source: std::io::Error| Error::Open {
            path: path.clone(),
            source,
        };
        let conflict = |reason: &str| Error::OpenConflict {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let stat = rustix::fs::fstat(fd).map_err(|errno| fail(errno.into()))?;
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        let identity = (stat.st_dev as u64, stat.st_ino as u64);
        if identity != self.identity || !rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file()
        {
            return Err(conflict("the descriptor is not of the file the cache has"));
        }
        let flags = rustix::fs::fcntl_getfl(fd).map_err(|errno| fail(errno.into()))?;
        let access = flags & rustix::fs::OFlags::RWMODE;
        let readable = access != rustix::fs::OFlags::WRONLY;
        let writable = access != rustix::fs::OFlags::RDONLY;
        if write && !writable {
            return Err(conflict("the descriptor is not open for writing"));
        }
        let direct = flags.contains(rustix::fs::OFlags::DIRECT);
        if !direct && flags.contains(rustix::fs::OFlags::APPEND) && write && !kernel_has_noappend()
        {
            return Err(conflict(
                "O_APPEND, and this kernel has no RWF_NOAPPEND (Linux 6.9)",
            ));
        }
        let statfs = rustix::fs::fstatfs(fd).map_err(|errno| fail(errno.into()))?;
        #[allow(clippy::cast_lossless, clippy::unnecessary_cast)]
        if statfs.f_type as i64 == TMPFS_MAGIC {
            return Err(Error::NoDirectIo {
                path,
                reason: "tmpfs keeps every file in the page cache".to_owned(),
            });
        }
        let (mode, io) = if direct {
            let io = FileIo {
                drop_behind: false,
                align: direct_io_align(fd),
                read_flags: 0,
                write_flags: 0,
            };
            (IoMode::Direct, io)
        } else {
            let dontcache = dontcache_works(fd, identity.0, readable);
            let noappend = if kernel_has_noappend() {
                RWF_NOAPPEND
            } else {
                0
            };
            let cache_flag = if dontcache { RWF_DONTCACHE } else { 0 };
            let io = FileIo {
                drop_behind: !dontcache,
                align: 1,
                read_flags: cache_flag,
                write_flags: cache_flag | noappend,
            };
            let mode = if dontcache {
                IoMode::Uncached
            } else {
                IoMode::Buffered
            };
            (mode, io)
        };
        #[allow(clippy::unnecessary_cast)]
        let size = stat.st_size as u64;
        Ok((
            Lendable {
                readable,
                writable: write && writable,
                mode,
                io,
            },
            size,
        ))
    }

    /// Takes the lent descriptor out: no I/O starts from now on, and it is handed back once no
    /// transfer uses it any more (waits for those in flight). `None` if there was none (the
    /// file was opened by path, or is detached already).
    pub(crate) fn detach(&self) -> Option<OwnedFd> {
        let taken = {
            let mut slot = self.slot_mut();
            if slot.as_ref().is_none_or(|fds| fds.lent.is_none()) {
                return None;
            }
            slot.take()?
        };
        let mut fd = taken.lent?;
        drop((taken.read, taken.write));
        loop {
            // Transfers in flight hold clones until they complete.
            match Arc::try_unwrap(fd) {
                Ok(owned) => return Some(owned),
                Err(shared) => {
                    fd = shared;
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }

    fn slot(&self) -> std::sync::RwLockReadGuard<'_, Option<Descriptors>> {
        self.fds
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slot_mut(&self) -> std::sync::RwLockWriteGuard<'_, Option<Descriptors>> {
        self.fds
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The descriptor reads use, and how to use it.
    fn read_fd(&self) -> Option<(Arc<OwnedFd>, FileIo)> {
        let slot = self.slot();
        let fds = slot.as_ref()?;
        Some((Arc::clone(fds.read.as_ref()?), fds.io))
    }

    /// Whether the file can be read (it has a descriptor that reads).
    pub(crate) fn readable(&self) -> bool {
        self.slot().as_ref().is_some_and(|fds| fds.read.is_some())
    }

    /// How this file is read (`Direct` while detached: the last known way matters little).
    pub fn mode(&self) -> IoMode {
        self.slot().as_ref().map_or(IoMode::Direct, |fds| fds.mode)
    }

    /// Makes the file writable: a lent descriptor must have been lent for writing; a file opened
    /// by path opens the same inode read-write (with O_DIRECT when reads use it), once.
    pub(crate) fn enable_writes(&self) -> Result<(), Error> {
        let mut slot = self.slot_mut();
        let Some(fds) = slot.as_mut() else {
            return Err(Error::Detached);
        };
        if fds.write.is_some() {
            return Ok(());
        }
        if fds.lent.is_some() {
            return Err(Error::ReadOnly);
        }
        let open_error = |source| Error::Open {
            path: self.path.clone(),
            source,
        };
        let Some(read) = &fds.read else {
            return Err(Error::ReadOnly);
        };
        // Through /proc/self/fd: the very inode this file reads, even if its path was renamed
        // or removed since.
        let proc = format!("/proc/self/fd/{}", read.as_raw_fd());
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true);
        if fds.mode == IoMode::Direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&proc).map_err(open_error)?;
        fds.write = Some(Arc::new(OwnedFd::from(file)));
        Ok(())
    }

    /// The descriptor writes use, and how.
    pub(crate) fn write_fd(&self) -> Result<(Arc<OwnedFd>, FileIo), Error> {
        let slot = self.slot();
        let fds = slot.as_ref().ok_or(Error::Detached)?;
        let fd = fds.write.as_ref().ok_or(Error::ReadOnly)?;
        Ok((Arc::clone(fd), fds.io))
    }

    /// Starts writes (writeback) of folios to the file.
    pub(crate) fn submit_writes(&self, transfers: Vec<Box<dyn Transfer>>) -> Result<(), Error> {
        let (fd, io) = self.write_fd()?;
        self.engine.submit(&fd, transfers, io);
        Ok(())
    }

    /// Starts writes of folios into the kernel's page cache rather than to storage: through a
    /// buffered descriptor of the same inode (opened once, beside the O_DIRECT one). The
    /// kernel then owns the bytes as after a plain `write`: every reader of the file sees them
    /// at once, and they reach storage by the kernel's writeback or an fsync of the file
    /// (whose errors the kernel reports to that fsync). The kernel keeps its copy of the
    /// pages, as after any write, until it reclaims them. A file whose descriptors are
    /// buffered already writes as [`submit_writes`](Self::submit_writes) does.
    ///
    /// The writes are memory copies into the kernel: they run here, in the calling thread,
    /// one `pwritev2` each (an engine's round trip costs more than the copy), and each
    /// transfer is completed before this returns.
    pub(crate) fn submit_writes_to_kernel(
        &self,
        transfers: Vec<Box<dyn Transfer>>,
    ) -> Result<(), Error> {
        let (fd, io) = self.kernel_write_fd()?;
        for transfer in transfers {
            let result = write_whole(&fd, transfer.as_ref(), io);
            transfer.complete(result);
        }
        Ok(())
    }

    /// The buffered descriptor for writes into the kernel's page cache, opened the first time.
    fn kernel_write_fd(&self) -> Result<(Arc<OwnedFd>, FileIo), Error> {
        {
            let slot = self.slot();
            let fds = slot.as_ref().ok_or(Error::Detached)?;
            let write = fds.write.as_ref().ok_or(Error::ReadOnly)?;
            if fds.mode != IoMode::Direct {
                return Ok((Arc::clone(write), fds.io));
            }
            if let Some((fd, io)) = &fds.kernel {
                return Ok((Arc::clone(fd), *io));
            }
        }
        let mut slot = self.slot_mut();
        let fds = slot.as_mut().ok_or(Error::Detached)?;
        if let Some((fd, io)) = &fds.kernel {
            return Ok((Arc::clone(fd), *io));
        }
        let write = fds.write.as_ref().ok_or(Error::ReadOnly)?;
        // Through /proc/self/fd: the very inode the cache writes.
        let proc = format!("/proc/self/fd/{}", write.as_raw_fd());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&proc)
            .map_err(|source| Error::Open {
                path: self.path.clone(),
                source,
            })?;
        let fd = Arc::new(OwnedFd::from(file));
        let noappend = if kernel_has_noappend() {
            RWF_NOAPPEND
        } else {
            0
        };
        // A plain buffered write, without RWF_DONTCACHE: that flag starts each page's writeback
        // at once (measured: 8 KiB writes cost 40 us instead of 8 us, and a page rewritten
        // often goes to the device each time), which the program's own write would not do.
        // The kernel keeps its copy as after any write, and reclaims it as any clean page.
        let io = FileIo {
            drop_behind: false,
            align: 1,
            read_flags: 0,
            write_flags: noappend,
        };
        fds.kernel = Some((Arc::clone(&fd), io));
        Ok((fd, io))
    }

    /// Reads `buf.len()` bytes at `offset` synchronously into `buf` (a folio: page aligned, a
    /// page multiple), for a write that covers part of a page not cached (read before write).
    /// Bytes past the end of the file read as zeros. Returns the bytes that came from the file.
    pub(crate) fn read_sync(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let (fd, io) = self.read_fd().ok_or_else(no_descriptor)?;
        let mut done = 0;
        while done < buf.len() {
            let want = buf.len() - done;
            let chunk = &mut buf[done..];
            let vector = libc::iovec {
                iov_base: chunk.as_mut_ptr().cast(),
                iov_len: chunk.len(),
            };
            // SAFETY: one iovec describing the rest of `buf`, writable and not otherwise used
            // during the call.
            let n = unsafe {
                libc::preadv2(
                    fd.as_raw_fd(),
                    &vector,
                    1,
                    (offset + done as u64) as libc::off_t,
                    io.read_flags,
                )
            };
            match n {
                0 => break,
                n if n > 0 => {
                    let n = n as usize;
                    let before = done;
                    done += n;
                    if n < want && offset + done as u64 >= self.size() {
                        break; // the end of the file
                    }
                    // Cut short before the end: go on from a block boundary (O_DIRECT).
                    done -= done % io.align.max(1);
                    if done <= before {
                        return Err(std::io::Error::from_raw_os_error(libc::EIO));
                    }
                }
                _ => {
                    let error = std::io::Error::last_os_error();
                    if error.kind() != std::io::ErrorKind::Interrupted {
                        return Err(error);
                    }
                }
            }
        }
        buf[done..].fill(0);
        Ok(done)
    }

    /// Writes `data` at `offset` straight to storage, around the cache (a write-only
    /// descriptor's write into part of a page that is not cached: its other bytes cannot be
    /// read). Buffered descriptors only (O_DIRECT would want whole blocks).
    pub(crate) fn write_around(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let (fd, io) = self.write_fd().map_err(|_| no_descriptor())?;
        if io.align > 1 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            let vector = libc::iovec {
                iov_base: rest.as_ptr().cast_mut().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: one iovec describing the rest of `data`, which the kernel only reads.
            let n = unsafe {
                libc::pwritev2(
                    fd.as_raw_fd(),
                    &vector,
                    1,
                    (offset + done as u64) as libc::off_t,
                    io.write_flags,
                )
            };
            match n {
                0 => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                n if n > 0 => done += n as usize,
                _ => {
                    let error = std::io::Error::last_os_error();
                    if error.kind() != std::io::ErrorKind::Interrupted {
                        return Err(error);
                    }
                }
            }
        }
        self.wrote_to(offset + data.len() as u64);
        Ok(())
    }

    /// Sets the size on storage (`ftruncate`).
    pub(crate) fn set_size(&self, size: u64) -> Result<(), Error> {
        let (fd, _) = self.write_fd()?;
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
        let (fd, _) = self.write_fd().map_err(|_| no_descriptor())?;
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
        let (fd, _) = self.write_fd().map_err(|_| no_descriptor())?;
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

    /// The path it was opened from (for a lent descriptor: where the descriptor pointed when
    /// it was lent).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device and inode number.
    pub(crate) fn identity(&self) -> (u64, u64) {
        self.identity
    }
}

/// Where a descriptor points, for messages.
fn descriptor_path(fd: &OwnedFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap_or_else(|_| PathBuf::from(format!("descriptor {}", fd.as_raw_fd())))
}

impl Backend for DirectFile {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Without a descriptor that reads (detached, or write-only), the requests fail: their
    /// folios stay not uptodate and a later read tries again.
    fn submit(&self, requests: Vec<ReadRequest>) {
        let Some((fd, io)) = self.read_fd() else {
            for request in requests {
                request.complete(Err(no_descriptor()));
            }
            return;
        };
        let transfers = requests
            .into_iter()
            .map(|request| Box::new(request) as Box<dyn Transfer>)
            .collect();
        self.engine.submit(&fd, transfers, io);
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
        let Some((fd, io)) = self.read_fd() else {
            return self.submit(requests);
        };
        for request in requests {
            request.counters.by_caller.inc();
            threads::run_now(&fd, Box::new(request), io, self.engine.inject());
        }
    }

    /// Also refreshes the size reads are issued against.
    fn stamp(&self) -> std::io::Result<Option<FileStamp>> {
        let fd = {
            let slot = self.slot();
            let fds = slot.as_ref().ok_or_else(no_descriptor)?;
            let any = fds.read.as_ref().or(fds.write.as_ref());
            Arc::clone(any.ok_or_else(no_descriptor)?)
        };
        let stamp = FileStamp::of(&*fd)?;
        self.size
            .store(stamp.size, std::sync::atomic::Ordering::Release);
        Ok(Some(stamp))
    }

    fn describe(&self) -> String {
        let mode = match self.mode() {
            IoMode::Direct => "O_DIRECT",
            IoMode::Uncached => "buffered with RWF_DONTCACHE",
            IoMode::Buffered => "buffered (explicit fallback)",
        };
        format!("{mode} via {}", self.engine.name())
    }
}
