//! The adapter: everything the preload library asks of foliocache, in one module. The hooks and
//! the fd table call it; none of them touches a `foliocache::File` themselves.
//!
//! An [`Inode`] is one file of the program (device and inode number), shared by all its fds,
//! with one cached `foliocache::File` for as long as the process runs: reopening the file
//! finds it again, and its pages stay if the file did not change meanwhile.
//!
//! # When the cache may serve a file
//! Only while the process knows that no other process can change the file, and learns of a
//! change before a read could return old bytes: while it holds a *lease* (see `lease`).
//! * Every description the program has of the file is read-only: a **read lease** on a
//!   descriptor of the library's own, opened read-only with O_DIRECT from `/proc/self/fd/N`
//!   (the very inode). Another process's open for writing, or a truncate, breaks it.
//! * The program has exactly one description of the file and it is writable: a **write
//!   lease** on a duplicate of that description (so the process still has one open of the
//!   file, which a write lease needs). The cache reads and writes through it, buffered with
//!   `RWF_DONTCACHE` (and `RWF_NOAPPEND`). Any other open of the file breaks it.
//! * Anything else (several descriptions and one writable, a description shared with another
//!   process by fork or a spawned program, a shared mapping, the program's own O_DIRECT, a
//!   file system without leases, another user's file): the file *passes through*: every call
//!   goes to the kernel, as without the library.
//!
//! A break is handled on the lease thread ([`Inode::lease_broken`]): in write-back mode the
//! dirty data is written back first (the opener waits for it), then the inode stops serving
//! and the lease is released, which lets the opener go on. From then on the file passes
//! through; the lease is tried again after a back-off, and what the cache may have read in
//! meanwhile is dropped before it serves again.
//!
//! Serving is a sequence number: even while the cache serves, odd while it passes through,
//! bumped by each switch. A read checks it before and after it copies from the cache: if it
//! moved, the copy may postdate the release of the lease, and the read goes to the kernel.
//!
//! # The library's descriptors and the program's locks
//! POSIX record locks belong to the process and the inode: closing *any* descriptor of the
//! file drops all of them. So the library closes its descriptor of a file only where the
//! program's own close drops them anyway: inside the close (or `dup2`, `close_range`) of the
//! program's last fd of the file, just before the real close. At that point the cached file
//! lets go of the descriptor ([`foliocache::File::detach_descriptor`]) and keeps its pages;
//! the next open lends it a new one ([`foliocache::File::attach_descriptor`]), which
//! revalidates them. Elsewhere: a forked child closes its copies before the program runs
//! again (it holds no lock yet); across `exec` a descriptor stays open, leaked into the new
//! program, when the program's own descriptors of the file do (no close-on-exec), since the
//! kernel would otherwise close it at the exec and drop the locks.
//!
//! # Write modes
//! * **Write-through** (the default): writes go to the kernel through the program's fd, then
//!   the written range is dropped from the cache ([`foliocache::File::written_outside`]);
//!   under the write lease nobody else writes, so the cache stays exact.
//! * **Write-back** (`FOLIOCACHE_WRITES=back`): writes go into the cache as dirty folios, written
//!   to storage by the cache's flusher, by a sync, at a break, and at the last close. The
//!   kernel is *behind* until then, so what shows the program the file through the kernel is
//!   corrected (`fstat` and the other stat calls report [`Inode::back_view`]'s size,
//!   `lseek(SEEK_END)` uses it) or preceded by a flush (`mmap`, fork, exec and the spawning
//!   calls, `SEEK_DATA`/`SEEK_HOLE`, exit). A write-only description can be served: a write
//!   into part of a page the cache does not hold goes to storage around the cache.
//!
//! # Never served again
//! An inode written through a path the library does not see (a `FILE` from `fdopen`, an fd the
//! table cannot hold, fds 0 to 2 in write-back mode, the program's own O_DIRECT or lease) or
//! mapped shared is *never served again* in this process: its dirty data is written back
//! first, under the inode's *gate* (held shared by every change made through the cache,
//! exclusively by the switch), so no write into the cache can land after the last writeback.
//! A caller that may take no lock (a hook nested in another, a signal handler) only marks the
//! switch pending ([`Inode::mark_uncached`]); the next outer call carries it out.

use crate::config::Writes;
use crate::lease::{self, Kind, Refused};
use crate::serving::Serving;
use crate::stats::{self, Reason};
use foliocache::{Advice, Cache, Error, File, Handle, OpenOptions, SyncRange};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Readahead (and, in write-back mode, write-behind) states of one description.
pub(crate) type Slots = [Mutex<Option<Handle>>];

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The first wait before a lease is tried again after a break, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const LONGEST_BACKOFF: Duration = Duration::from_secs(1);

/// `never`: served.
const SERVABLE: u8 = 0;
/// `never`: to become never served at the next outer call.
const NEVER_PENDING: u8 = 1;
/// `never`: never served again in this process.
const NEVER: u8 = 2;

/// One file of the program (device and inode number), shared by all its fds.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) key: (u64, u64),
    cache: Cache,
    writes: Writes,
    ra_bytes: u64,
    /// The cached file, made at the first lease; the same for the inode's whole life.
    file: OnceLock<File>,
    /// Whether the cache serves the file now (see `serving`).
    serving: Serving,
    /// Pages may have come into the cache while it did not serve the file (a read racing the
    /// switch, a nested write through the kernel): all are dropped before it serves again.
    stale: AtomicBool,
    /// `SERVABLE`, `NEVER_PENDING` or `NEVER`.
    never: AtomicU8,
    /// Held shared by every change made through the cache, exclusively while the inode stops
    /// serving (write-back).
    gate: RwLock<()>,
    /// Appenders, one at a time: each writes at the size the last one left.
    append: Mutex<()>,
    /// The handle flush points write back with (its sync reports are dropped: errors stay for
    /// the descriptions' own handles).
    flusher: Mutex<Option<Handle>>,
    /// When a change through the cache last touched the file (ns since the epoch; 0: never),
    /// for the modification time the stat calls report.
    changed_ns: AtomicI64,
    /// The program's fds of this file in the table.
    fds: AtomicUsize,
    /// The library's descriptor, the lease, and the program's descriptions.
    io: Mutex<Io>,
}

/// What the library holds of the file, and what it knows of the program's descriptions.
#[derive(Debug, Default)]
struct Io {
    /// The descriptor the cached file is lent (it owns it), while attached.
    lent: Option<RawFd>,
    /// Whether that descriptor is the library's own read-only open (else a duplicate of the
    /// program's writable description).
    own: bool,
    /// A descriptor the cached file refused (kept open until the last close).
    refused: Option<OwnedFd>,
    /// The lease held on `lent`.
    lease: Option<Kind>,
    /// Why the file passes through now (`None` while served, or never tried).
    why: Option<Reason>,
    /// The program's descriptions of the file: read-only ones, writable ones.
    readers: usize,
    writers: usize,
    /// A writable description went to another process: no lease until the last fd closes.
    shared: bool,
    /// When a lease may be tried again, and the back-off after the next break.
    retry_at: Option<Instant>,
    backoff: Duration,
    leased_at: Option<Instant>,
}

/// Where a write goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WriteAt {
    /// At this byte.
    Pos(u64),
    /// At the end of the file (O_APPEND, `RWF_APPEND`).
    Append,
}

/// Which sync.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SyncKind {
    /// `fsync`.
    All,
    /// `fdatasync`.
    Data,
    /// `sync_file_range` of `offset..offset + len` (0: to the end).
    Range {
        offset: u64,
        len: u64,
        flags: SyncRange,
    },
}

/// Whether open flags allow writing.
pub(crate) fn writable(flags: i32) -> bool {
    let access = flags & libc::O_ACCMODE;
    access == libc::O_WRONLY || access == libc::O_RDWR
}

/// `FOLIOCACHE_DEBUG=1`: one line on stderr per lease event (taken, refused, a switch to
/// passing through, a last close, an attach), with the process id and the file's device and
/// inode numbers, for finding out why a file is or is not cached.
pub(crate) fn debug(what: std::fmt::Arguments<'_>) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("FOLIOCACHE_DEBUG").is_some_and(|v| v == "1")) {
        eprintln!("foliocache-preload[{}]: {what}", std::process::id());
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The real `fcntl` (never the hook: a duplicate made here is the library's, not the
/// program's).
fn fcntl(fd: RawFd, cmd: i32, arg: usize) -> i32 {
    // SAFETY: fcntl on a descriptor of this process with an integer argument.
    unsafe { crate::real::fcntl(fd, cmd, arg) }
}

impl Inode {
    pub(crate) fn new(cache: &Cache, key: (u64, u64), ra_bytes: u64, writes: Writes) -> Self {
        Self {
            key,
            cache: cache.clone(),
            writes,
            ra_bytes,
            file: OnceLock::new(),
            serving: Serving::new(),
            stale: AtomicBool::new(false),
            never: AtomicU8::new(SERVABLE),
            gate: RwLock::new(()),
            append: Mutex::new(()),
            flusher: Mutex::new(None),
            changed_ns: AtomicI64::new(0),
            fds: AtomicUsize::new(0),
            io: Mutex::new(Io {
                backoff: FIRST_BACKOFF,
                ..Io::default()
            }),
        }
    }

    /// Whether this inode runs in write-back mode.
    pub(crate) fn is_back(&self) -> bool {
        self.writes == Writes::Back
    }

    // -----------------------------------------------------------------------------------------
    // The program's descriptions and fds

    /// A description of the program's (open flags `flags`) now exists.
    pub(crate) fn description_opened(&self, flags: i32) {
        let mut io = lock(&self.io);
        if writable(flags) {
            io.writers += 1;
        } else {
            io.readers += 1;
        }
    }

    /// A description of the program's went (its last fd closed).
    pub(crate) fn description_closed(&self, writable_description: bool) {
        let mut io = lock(&self.io);
        if writable_description {
            io.writers = io.writers.saturating_sub(1);
        } else {
            io.readers = io.readers.saturating_sub(1);
        }
    }

    /// One more fd of the program's is in the table.
    pub(crate) fn fd_installed(&self) {
        self.fds.fetch_add(1, Ordering::SeqCst);
    }

    /// One fd of the program's left the table; whether it was the last.
    pub(crate) fn fd_removed(&self) -> bool {
        self.fds.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// The program's fds of the file in the table.
    pub(crate) fn fds(&self) -> usize {
        self.fds.load(Ordering::SeqCst)
    }

    /// No fd of the program's and no descriptor of the library's: the inode can go.
    pub(crate) fn idle(&self) -> bool {
        let io = lock(&self.io);
        self.fds() == 0 && io.lent.is_none() && io.refused.is_none()
    }

    /// After the program opened the file as `fd`, its description counted: serve it if a
    /// lease can be had. Only for outer calls.
    pub(crate) fn opened(self: &Arc<Self>, fd: RawFd) {
        self.carry_out_pending();
        let mut io = lock(&self.io);
        if self.serving.now() {
            // Still served: the program's open did not conflict with the lease (a read-only
            // open beside a read lease).
            let fits = match io.lease {
                Some(Kind::Read) => io.writers == 0,
                Some(Kind::Write) => io.writers + io.readers == 1,
                None => false,
            };
            if fits {
                return;
            }
            self.stop(&mut io, Reason::Busy);
        }
        io.retry_at = None;
        self.try_serve(&mut io, fd);
    }

    /// Tries to serve the file: the descriptor, the lease, the cached file. The program's
    /// `fd` is any fd of it (all its fds are of the one description when a write lease is
    /// wanted).
    fn try_serve(self: &Arc<Self>, io: &mut Io, fd: RawFd) {
        match self.serve(io, fd) {
            Ok(()) => {}
            Err(reason) => {
                debug(format_args!(
                    "{:?}: not served ({})",
                    self.key,
                    reason.as_str()
                ));
                // Without a lease another process may write the file from now on: what the
                // cache holds of it is dropped before it serves again.
                self.stale.store(true, Ordering::Release);
                if io.why != Some(reason) {
                    stats::passed_through(reason);
                }
                io.why = Some(reason);
                let retry = matches!(reason, Reason::Busy | Reason::Broken);
                io.retry_at = retry.then(|| Instant::now() + io.backoff);
            }
        }
    }

    fn serve(self: &Arc<Self>, io: &mut Io, fd: RawFd) -> Result<(), Reason> {
        if self.never.load(Ordering::Acquire) != SERVABLE {
            return Err(io.why.unwrap_or(Reason::UntrackedPath));
        }
        if io.shared {
            return Err(Reason::Inherited);
        }
        if !lease::signal_usable() {
            return Err(Reason::Signal);
        }
        let kind = if io.writers == 0 {
            Kind::Read
        } else if io.writers == 1 && io.readers == 0 {
            Kind::Write
        } else {
            return Err(Reason::Busy);
        };
        let program_flags = fcntl(fd, libc::F_GETFL, 0);
        if program_flags < 0 {
            return Err(Reason::Busy);
        }
        let write_only = program_flags & libc::O_ACCMODE == libc::O_WRONLY;
        if kind == Kind::Write && write_only && !self.is_back() {
            return Err(Reason::WriteOnly); // nothing to read, nothing to cache
        }
        // The descriptor: the one lent already if it suits the lease, else a new one.
        let fresh = match io.lent {
            Some(_) if io.own == (kind == Kind::Read) => None,
            // The other kind's descriptor stays open until the last close, and the kernel
            // counts it: no lease of this kind can be had meanwhile.
            Some(_) => return Err(Reason::Busy),
            None if io.refused.is_some() => return Err(Reason::Busy),
            None => Some(self.new_descriptor(kind, fd)?),
        };
        let raw = fresh
            .as_ref()
            .map_or_else(|| io.lent.unwrap_or(-1), AsRawFd::as_raw_fd);
        if let Some(fresh) = &fresh {
            crate::own_fds::add(fresh.as_raw_fd());
        }
        // The lease first: from here on no other process can change the file unheard, so
        // what the cached file checks now stays true.
        let leased = lease::take(raw, kind, self);
        if let Some(fresh) = fresh
            && let Err(reason) = self.lend(io, fresh, kind == Kind::Write)
        {
            if leased.is_ok() {
                lease::release(raw);
            }
            return Err(reason);
        }
        match leased {
            Ok(()) => {}
            Err(Refused::Busy) => return Err(Reason::Busy),
            Err(Refused::Broken) => return Err(Reason::Broken),
            Err(Refused::Unsupported) => return Err(Reason::NoLease),
            Err(Refused::NoSignal) => return Err(Reason::Signal),
        }
        io.lease = Some(kind);
        debug(format_args!("{:?}: {kind:?} lease taken", self.key));
        io.leased_at = Some(Instant::now());
        stats::lease_taken();
        let file = self.file.get().expect("lent a descriptor");
        if self.stale.swap(false, Ordering::AcqRel) {
            // Pages that came in while the file passed through may be older than storage.
            let _ = file.changed_outside();
        }
        io.why = None;
        io.retry_at = None;
        // Served: the lease is held and the cache is exact.
        self.serving.start();
        Ok(())
    }

    /// A descriptor for a lease of `kind`: the library's own read-only O_DIRECT open, or a
    /// duplicate of the program's (single, writable) description.
    fn new_descriptor(&self, kind: Kind, fd: RawFd) -> Result<OwnedFd, Reason> {
        let raw = match kind {
            Kind::Read => {
                let path = format!("/proc/self/fd/{fd}\0");
                // SAFETY: a NUL-terminated path; the real open (the library's own descriptor
                // is not the program's, and is not in the table).
                let raw = unsafe {
                    crate::real::open(
                        path.as_ptr().cast(),
                        libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC,
                        0,
                    )
                };
                if raw < 0 {
                    let errno = std::io::Error::last_os_error().raw_os_error();
                    return Err(if errno == Some(libc::EINVAL) {
                        Reason::NoDirectIo
                    } else {
                        Reason::NoLease
                    });
                }
                raw
            }
            Kind::Write => {
                let raw = fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
                if raw < 0 {
                    return Err(Reason::NoLease);
                }
                raw
            }
        };
        // SAFETY: a descriptor just opened or duplicated here, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Lends `fd` to the cached file (made now at the first time). A descriptor it refuses is
    /// kept in `refused` until the last close: closing it now would drop the program's locks.
    fn lend(&self, io: &mut Io, fd: OwnedFd, write: bool) -> Result<(), Reason> {
        let raw = fd.as_raw_fd();
        let write = write && self.is_back();
        let outcome = match self.file.get() {
            Some(file) => file
                .attach_descriptor(fd, write)
                .map(|r| {
                    if r.changed {
                        debug(format_args!("{:?}: changed since the last close", self.key));
                    }
                })
                .map_err(|refused| (refused.error, refused.fd)),
            None => {
                let options = OpenOptions::new().write(write);
                match self.cache.open_descriptor(fd, options) {
                    Ok(file) => {
                        *lock(&self.flusher) = Some(file.handle());
                        let _ = self.file.set(file);
                        stats::opened_file();
                        Ok(())
                    }
                    Err(refused) => Err((refused.error, refused.fd)),
                }
            }
        };
        match outcome {
            Ok(()) => {
                io.lent = Some(raw);
                io.own = !write && fcntl(raw, libc::F_GETFL, 0) & libc::O_DIRECT != 0;
                Ok(())
            }
            Err((error, fd)) => {
                io.refused = Some(fd);
                Err(match error {
                    Error::NoDirectIo { .. } => Reason::NoDirectIo,
                    Error::OpenConflict { .. } => Reason::Busy,
                    _ => Reason::NoLease,
                })
            }
        }
    }

    /// Stops serving: in write-back mode the dirty data goes to storage first (and, if it
    /// cannot, is dropped as the kernel drops data a writeback failed for: another process is
    /// about to see storage), then the lease is released. Called with the `io` lock.
    fn stop(&self, io: &mut Io, reason: Reason) {
        if self.serving.now() {
            {
                // Writes wait at the gate; reads go on from the cache, which is exact while the
                // lease holds, until the kernel has every byte (see `serving`).
                let _gate = self
                    .is_back()
                    .then(|| self.gate.write().unwrap_or_else(PoisonError::into_inner));
                self.serving.stop_after(|| {
                    self.write_back_all();
                    if let Some(file) = self.file.get()
                        && self.is_back()
                    {
                        let lost = file.discard_dirty(libc::EIO);
                        if lost > 0 {
                            debug(format_args!("{:?}: {lost} dirty pages dropped", self.key));
                        }
                    }
                });
            }
            self.stale.store(true, Ordering::Release);
            if let Some(file) = self.file.get() {
                file.drop_cached(0, 0);
            }
        }
        if io.why != Some(reason) {
            stats::passed_through(reason);
            debug(format_args!(
                "{:?}: passes through ({})",
                self.key,
                reason.as_str()
            ));
        }
        io.why = Some(reason);
        if let (Some(_), Some(fd)) = (io.lease.take(), io.lent) {
            lease::release(fd);
        }
    }

    /// A file passing through: whether it is served again now (its back-off passed and a
    /// lease can be had). Takes no lock if another thread holds the inode's.
    fn retry(self: &Arc<Self>, fd: RawFd) -> bool {
        if self.never.load(Ordering::Acquire) != SERVABLE {
            return false;
        }
        let Ok(mut io) = self.io.try_lock() else {
            return false;
        };
        let Some(at) = io.retry_at else { return false };
        if Instant::now() < at {
            return false;
        }
        io.retry_at = None;
        if io.lease.is_some() {
            // A nested write marked the cache stale under a lease that still stands.
            if let Some(file) = self.file.get() {
                let _ = file.changed_outside();
            }
            self.stale.store(false, Ordering::Release);
            self.serving.start();
            io.why = None;
            return true;
        }
        self.try_serve(&mut io, fd);
        self.serving.now()
    }

    /// The program's last fd of the file is about to close (outer call, before the real
    /// close): what is dirty goes to storage, the lease is released, and the library's
    /// descriptor is closed, now, where the program's close drops its locks anyway. The
    /// cached file keeps its pages for the next open.
    pub(crate) fn last_close(&self) {
        let mut io = lock(&self.io);
        debug(format_args!("{:?}: last close", self.key));
        if self.fds() != 0 {
            return; // reopened meanwhile
        }
        if self.serving.now() && self.is_back() {
            self.write_back_all();
        }
        let was_serving = self.serving.now();
        self.serving.stop_now(); // no fd is left to read through
        let lease = io.lease.take();
        if let Some(file) = self.file.get() {
            if self.stale.swap(false, Ordering::AcqRel)
                || self.never.load(Ordering::Acquire) != SERVABLE
            {
                let _ = file.changed_outside();
            }
            if io.lent.is_some() {
                // The stamp the next attach compares with is taken here, while the lease
                // (if any) still stands: nobody can have changed the file since the cache
                // last knew it.
                match file.detach_descriptor() {
                    Ok(fd) => {
                        if lease.is_some() {
                            lease::release(fd.as_raw_fd());
                        }
                        io.lent = None;
                        crate::own_fds::remove(fd.as_raw_fd());
                        drop(fd);
                    }
                    Err(Error::StillDirty { .. }) => {
                        // The write back failed: everything stays (the flusher tries again),
                        // the descriptor and the lease with it; a later last close ends them.
                        io.lease = lease;
                        if was_serving {
                            self.serving.start();
                        }
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        if let (Some(_), Some(fd)) = (lease, io.lent) {
            lease::release(fd);
        }
        if let Some(fd) = io.refused.take() {
            crate::own_fds::remove(fd.as_raw_fd());
            drop(fd);
        }
        io.own = false;
        io.shared = false;
        io.why = None;
        io.retry_at = None;
        io.backoff = FIRST_BACKOFF;
    }

    /// A writable description of this file went to another process (fork, a spawned
    /// program): the file passes through until its last fd closes.
    pub(crate) fn shared_with_another_process(&self) {
        let mut io = lock(&self.io);
        io.shared = true;
        self.stop(&mut io, Reason::Inherited);
        io.retry_at = None;
    }

    /// Whether the program has a writable description of the file.
    pub(crate) fn has_writer(&self) -> bool {
        lock(&self.io).writers > 0
    }

    /// Before an `exec`: the lease goes (the new program would inherit it on a description
    /// it does not know). Returns the library's descriptors of the file, for the caller to
    /// keep across the exec where the program's are kept.
    pub(crate) fn before_exec(&self) -> Vec<RawFd> {
        let mut io = lock(&self.io);
        self.stop(&mut io, Reason::Exec);
        io.retry_at = None;
        io.lent
            .into_iter()
            .chain(io.refused.as_ref().map(AsRawFd::as_raw_fd))
            .collect()
    }

    // -----------------------------------------------------------------------------------------
    // Never served again

    /// Every access passes through from now on. In write-back mode the cache's dirty data is
    /// written back first (and no write into the cache can follow it). Outer calls only.
    pub(crate) fn set_uncached(&self, reason: Reason) {
        let mut io = lock(&self.io);
        self.never.store(NEVER, Ordering::Release);
        self.stop(&mut io, reason);
        io.retry_at = None;
    }

    /// As [`set_uncached`](Self::set_uncached), taking no lock: the switch is carried out by
    /// the next outer call on the inode; until then the cache is not used.
    pub(crate) fn mark_uncached(&self) {
        let _ = self.never.compare_exchange(
            SERVABLE,
            NEVER_PENDING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if !self.is_back() {
            // Nothing dirty to write back first: stop reading the cache at once.
            self.stale.store(true, Ordering::Release);
            self.serving.stop_now();
        }
    }

    /// An outer call carries out a pending switch.
    fn carry_out_pending(&self) {
        if self.never.load(Ordering::Acquire) == NEVER_PENDING {
            self.set_uncached(Reason::UntrackedPath);
        }
    }

    /// After a write to the kernel made by a hook nested in another (no lock may be taken):
    /// write-through, the cache stops serving until the next outer read drops it all (the
    /// lease still stands); write-back, the inode is never served again (the kernel has bytes
    /// the cache's writeback could overwrite).
    pub(crate) fn written_nested(&self) {
        if self.is_back() {
            self.mark_uncached();
        } else {
            self.stale.store(true, Ordering::Release);
            self.serving.stop_now();
            // The next outer read retries at once (the lease is kept).
            if let Ok(mut io) = self.io.try_lock() {
                io.retry_at = Some(Instant::now());
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Reads

    /// A fresh readahead state for the file, with `advice` (a `POSIX_FADV_*` value).
    fn new_handle(&self, advice: i32) -> Option<Handle> {
        let file = self.file.get()?;
        let mut handle = file.handle();
        handle.set_ra_bytes(self.ra_bytes);
        apply_advice(&mut handle, advice);
        Some(handle)
    }

    /// Runs `op` with a handle from `slots` (the one at `preferred` first; a fresh one when
    /// all are busy).
    fn with_handle<T>(
        &self,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        op: impl FnOnce(&mut Handle) -> T,
    ) -> Option<T> {
        let mut guard = (0..slots.len())
            .map(|k| &slots[(preferred + k) % slots.len()])
            .find_map(|slot| slot.try_lock().ok());
        let mut fresh = None;
        let handle = match guard.as_deref_mut() {
            Some(Some(handle)) => handle,
            Some(slot) => slot.insert(self.new_handle(advice)?),
            None => fresh.insert(self.new_handle(advice)?),
        };
        Some(op(handle))
    }

    /// A ticket to read from the cache (see `serving`) if it serves the file now, trying a
    /// lease again if its back-off passed.
    fn ticket(self: &Arc<Self>, fd: RawFd) -> Option<u64> {
        self.carry_out_pending();
        if let Some(ticket) = self.serving.ticket() {
            return Some(ticket);
        }
        if self.retry(fd) {
            return self.serving.ticket();
        }
        None
    }

    /// Reads at `pos` through the cache. `None`: pass this read through.
    pub(crate) fn read(
        self: &Arc<Self>,
        fd: RawFd,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        buf: &mut [u8],
        pos: u64,
    ) -> Option<Result<usize, i32>> {
        for _attempt in 0..3 {
            let ticket = self.ticket(fd)?;
            let (result, size) = self.with_handle(slots, preferred, advice, |handle| {
                (handle.read_at(buf, pos), handle.file().size())
            })?;
            if !self.serving.still(ticket) {
                return None; // the cache stopped serving meanwhile: the kernel answers
            }
            match result {
                Ok(n) if n == buf.len() => return Some(Ok(n)),
                Ok(n) => {
                    // Short: end of file as the cache sees it. A path the library does not
                    // see (the program's raw system calls) may have grown the file.
                    let real = kernel_size(fd)?;
                    let file = self.file.get()?;
                    let grown = match self.writes {
                        Writes::Through => real != size,
                        // The cache's size is ahead of the kernel's while appends wait for
                        // writeback; only a kernel size beyond it is news.
                        Writes::Back => real > size,
                    };
                    if !grown || file.changed_outside().is_err() {
                        return Some(Ok(n));
                    }
                }
                Err(error) => return Some(Err(foliocache_capi::errno_of(&error))),
            }
        }
        None
    }

    /// `readahead(2)` and `POSIX_FADV_WILLNEED`: start reading the range.
    pub(crate) fn will_need(
        self: &Arc<Self>,
        fd: RawFd,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        offset: u64,
        len: u64,
    ) {
        if self.ticket(fd).is_none() {
            return;
        }
        self.with_handle(slots, preferred, advice, |handle| {
            let len = if len == 0 {
                handle.file().size().saturating_sub(offset)
            } else {
                len
            };
            let _ = handle.readahead(offset, len);
        });
    }

    /// Write-through: after the kernel wrote `pos..pos + len` through the program's fd (or
    /// changed the size in ways the hook cannot name, `len` = `u64::MAX`), no cached byte of
    /// the range may survive.
    pub(crate) fn written(&self, pos: u64, len: u64) {
        if self.writes != Writes::Through || len == 0 {
            return;
        }
        let Some(file) = self.file.get() else { return };
        stats::invalidation();
        if !self.serving.now() {
            // Dropped before the cache serves again.
            self.stale.store(true, Ordering::Release);
            return;
        }
        if len == u64::MAX {
            if file.changed_outside().is_err() {
                self.stale.store(true, Ordering::Release);
                self.serving.stop_now();
            }
        } else {
            file.written_outside(pos, len);
        }
    }

    /// The kernel changed the file through the program's fd in ways the hook cannot name (a
    /// truncate, an `fallocate` the cache does not make), or by path: what the cache holds of
    /// it may be old. While served, the cached file takes the file as storage has it now;
    /// otherwise it is dropped before the cache serves again.
    pub(crate) fn changed_by_kernel(&self) {
        match self.file.get() {
            Some(file) if self.serving.now() => {
                if file.changed_outside().is_err() {
                    self.stale.store(true, Ordering::Release);
                    self.serving.stop_now();
                }
            }
            _ => self.stale.store(true, Ordering::Release),
        }
    }

    /// `POSIX_FADV_DONTNEED`: drop the range's idle pages (dirty ones are written first).
    pub(crate) fn dont_need(&self, offset: u64, len: u64) {
        if let Some(file) = self.file.get() {
            file.drop_cached(offset, len);
        }
    }

    /// The cached file, for the counters at exit.
    pub(crate) fn with_file(&self, each: impl FnOnce(&File)) {
        if let Some(file) = self.file.get() {
            each(file);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Write-back mode. Each call answers `None` when the inode is not (or no longer) served in
    // write-back mode: the hook then does what the kernel would, with the real call.

    /// The cached file, if the cache serves the inode in write-back mode now.
    fn back(self: &Arc<Self>, fd: RawFd) -> Option<&File> {
        if !self.is_back() {
            return None;
        }
        self.ticket(fd)?;
        self.file.get()
    }

    /// A change through the cache happened now.
    fn changed(&self) {
        self.changed_ns.store(now_ns(), Ordering::Release);
    }

    /// Writes `pieces` (consecutive in the file) into the cache at `at`, with the handle of
    /// `slots` that this thread prefers (its write-behind stream). Returns where the write
    /// went and how many bytes it took (fewer than asked only after an error, as the kernel),
    /// or the errno.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        self: &Arc<Self>,
        fd: RawFd,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        pieces: &[&[u8]],
        at: WriteAt,
    ) -> Option<Result<(u64, usize), i32>> {
        let file = self.back(fd)?;
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        if !self.serving.now() || !file.is_writable() {
            return None;
        }
        // Appenders one at a time, each at the size the last one left.
        let _append = matches!(at, WriteAt::Append).then(|| lock(&self.append));
        let pos = match at {
            WriteAt::Pos(pos) => pos,
            WriteAt::Append => file.size(),
        };
        let (done, error) = self.with_handle(slots, preferred, advice, |handle| {
            let mut done = 0u64;
            for piece in pieces.iter().filter(|piece| !piece.is_empty()) {
                let at = pos.saturating_add(done);
                match handle.write_at(piece, at) {
                    Ok(n) => done += n as u64,
                    Err(error) => {
                        // Part of it may have gone in: the first byte not written says.
                        if let Error::Io { offset, .. } = &error
                            && *offset > at
                        {
                            done += offset - at;
                        }
                        return (done, Some(foliocache_capi::errno_of(&error)));
                    }
                }
            }
            (done, None)
        })?;
        if done > 0 {
            self.changed();
            stats::written_to_cache(done);
        }
        Some(match (done, error) {
            (0, Some(errno)) => Err(errno),
            (done, _) => Ok((pos, done as usize)),
        })
    }

    /// A handle for a new open file description's syncs (write-back mode): it samples the
    /// file's writeback errors now, as the kernel does at open.
    pub(crate) fn sync_handle(&self) -> Option<Handle> {
        if !self.is_back() {
            return None;
        }
        self.file.get().map(File::handle)
    }

    /// `fsync`, `fdatasync`, `sync_file_range` with the description's handle: its writeback
    /// errors are reported to it once each, a write back that failed when a lease broke
    /// included (so this goes through the handle whether or not the cache serves the file
    /// now: the cached file's descriptor is the program's description). `None` when the
    /// cached file is not writable (nothing of the cache's to write: the kernel syncs what it
    /// has).
    pub(crate) fn sync(
        self: &Arc<Self>,
        fd: RawFd,
        handle: &Mutex<Option<Handle>>,
        kind: SyncKind,
    ) -> Option<Result<(), i32>> {
        if !self.is_back() {
            return None;
        }
        let serving = self.ticket(fd).is_some(); // a pending switch, or a lease to try again
        let file = self.file.get()?;
        if !file.is_writable() || (!serving && matches!(kind, SyncKind::Range { .. })) {
            // (Passing through, the program's writes are the kernel's: sync_file_range is its
            // to do. fsync and fdatasync through the handle make the kernel's durable too.)
            return None;
        }
        let mut slot = lock(handle);
        let handle = slot.get_or_insert_with(|| file.handle());
        let result = match kind {
            SyncKind::All => handle.sync_all(),
            SyncKind::Data => handle.sync_data(),
            SyncKind::Range { offset, len, flags } => handle.sync_range(offset, len, flags),
        };
        stats::synced();
        Some(result.map_err(|error| foliocache_capi::errno_of(&error)))
    }

    /// Writes back every dirty page and waits (errors stay for the descriptions' syncs).
    fn write_back_all(&self) {
        if let Some(handle) = lock(&self.flusher).as_mut()
            && handle.file().is_writable()
        {
            let _ = handle.sync_range(0, 0, SyncRange::ALL);
        }
    }

    /// A flush point: writes back the inode's dirty data and waits. Errors of this writeback
    /// are not reported here: each description learns of them at its next sync, as the
    /// kernel's descriptions do (a description opened after a flush point met an error is
    /// not told of it, see docs/PRELOAD.md).
    pub(crate) fn flush(&self) {
        if self.is_back() && self.file.get().is_some_and(File::is_writable) {
            self.write_back_all();
            stats::flushed();
        }
    }

    /// Runs a change in the cached file under the gate; `None` if the inode is not served in
    /// write-back mode or its file is not writable (the kernel then refuses or does it).
    fn change(
        self: &Arc<Self>,
        fd: RawFd,
        op: impl FnOnce(&File) -> Result<(), Error>,
    ) -> Option<Result<(), i32>> {
        let file = self.back(fd)?;
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        if !self.serving.now() || !file.is_writable() {
            return None;
        }
        let result = op(file);
        self.changed();
        Some(result.map_err(|error| foliocache_capi::errno_of(&error)))
    }

    /// `ftruncate`, `truncate`: the cached file's `set_len` (which sets the size on storage).
    pub(crate) fn set_len(self: &Arc<Self>, fd: RawFd, len: u64) -> Option<Result<(), i32>> {
        self.change(fd, |file| file.set_len(len))
    }

    /// `fallocate` without flags, `posix_fallocate`.
    pub(crate) fn fallocate(
        self: &Arc<Self>,
        fd: RawFd,
        offset: u64,
        len: u64,
    ) -> Option<Result<(), i32>> {
        self.change(fd, |file| file.fallocate(offset, len))
    }

    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
    pub(crate) fn punch_hole(
        self: &Arc<Self>,
        fd: RawFd,
        offset: u64,
        len: u64,
    ) -> Option<Result<(), i32>> {
        self.change(fd, |file| file.punch_hole(offset, len))
    }

    /// A change the cache cannot make itself (the other `fallocate` modes): everything is
    /// written back, `kernel` does it, and if `done(&result)` the cached file takes the file
    /// as it is on storage now (every clean page dropped, the size taken). Without write-back
    /// mode, just `kernel()`.
    pub(crate) fn around_kernel<T>(
        self: &Arc<Self>,
        fd: RawFd,
        kernel: impl FnOnce() -> T,
        done: impl FnOnce(&T) -> bool,
    ) -> T {
        let Some(file) = self.back(fd) else {
            return kernel();
        };
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        self.write_back_all();
        let out = kernel();
        if done(&out) {
            let _ = file.changed_outside();
            self.changed();
        }
        out
    }

    /// The size the program's writes made and when they last changed the file (ns since the
    /// epoch; 0: never), while the cache serves the inode in write-back mode. Takes no lock
    /// (the stat calls and `lseek` ask, nested or not).
    pub(crate) fn back_view(&self) -> Option<(u64, i64)> {
        if !self.is_back() || !self.serving.now() {
            return None;
        }
        let file = self.file.get()?;
        Some((file.size(), self.changed_ns.load(Ordering::Acquire)))
    }
}

impl lease::Holder for Inode {
    /// The lease on `fd` was broken (on the lease thread).
    fn lease_broken(&self, fd: RawFd) {
        let mut io = lock(&self.io);
        let Some(kind) = io.lease else { return };
        if io.lent != Some(fd) || lease::stands(fd, kind) {
            return; // a signal for a lease given up since, or queued twice
        }
        stats::lease_broken();
        // The back-off doubles while leases break soon after they were taken.
        let lasted = io.leased_at.map_or(Duration::ZERO, |at| at.elapsed());
        io.backoff = if lasted > LONGEST_BACKOFF {
            FIRST_BACKOFF
        } else {
            (io.backoff * 2).min(LONGEST_BACKOFF)
        };
        self.stop(&mut io, Reason::Broken);
        io.retry_at = Some(Instant::now() + io.backoff);
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if let Some(file) = self.file.get() {
            stats::retire_file(file);
        }
    }
}

/// Applies a `POSIX_FADV_*` access pattern to a readahead state.
pub(crate) fn apply_advice(handle: &mut Handle, advice: i32) {
    let advice = match advice {
        libc::POSIX_FADV_SEQUENTIAL => Advice::Sequential,
        libc::POSIX_FADV_RANDOM => Advice::Random,
        _ => Advice::Normal,
    };
    let _ = handle.advise(advice);
}

/// The size the kernel has for `fd`.
fn kernel_size(fd: RawFd) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: fstat writes one stat struct into the valid local buffer.
    let rc = unsafe { crate::real::fstat64(fd, st.as_mut_ptr()) };
    // SAFETY: fstat succeeded, so it filled the struct.
    (rc == 0).then(|| unsafe { st.assume_init() }.st_size as u64)
}

/// A cache with the settings.
pub(crate) fn new_cache(capacity: u64) -> Result<Cache, String> {
    Cache::builder()
        .capacity(capacity)
        .build()
        .map_err(|e| e.to_string())
}
