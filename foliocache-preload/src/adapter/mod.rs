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
//! # On a shared cache
//! With `FOLIOCACHE_SHARED` (the default) the cache is shared by every process that uses the
//! library (`foliocache::Cache::builder().shared`): its owner process keeps the pages, and the
//! processes are coherent through it, as through the kernel's page cache. No lease is taken
//! here: the owner holds the leases that tell it of writers outside the cache
//! (`docs/SHARED.md`). A file is served from its first open, through the library's own
//! descriptor of it (read-only, or read-write once the program has a writable description),
//! closed only inside the program's last close as above. Writes go into the shared cache in
//! both modes, so another process reads them at once and they survive this process's death;
//! in write-through mode each write is also written back to the kernel before it returns
//! (`through_sync`), so programs outside the cache see it as they would without the
//! library. Nothing is written back at a last close or at exit (the dirty data belongs to the
//! shared cache), and a switch to passing through never drops the shared cache's pages or
//! another process's dirty data: it only makes this process use the kernel.
//!
//! # Never served again
//! An inode written through a path the library does not see (a `FILE` from `fdopen`, an fd the
//! table cannot hold, fds 0 to 2 in write-back mode, the program's own O_DIRECT or lease) or
//! mapped shared is *never served again* in this process: its dirty data is written back
//! first, under the inode's *gate* (held shared by every change made through the cache,
//! exclusively by the switch), so no write into the cache can land after the last writeback.
//! A caller that may take no lock (a hook nested in another, a signal handler) only marks the
//! switch pending ([`Inode::mark_uncached`]); the next outer call carries it out.

mod back;
mod serve;
mod slot;
mod through;

use crate::config::Writes;
use crate::lease::Kind;
use crate::serving::Serving;
use crate::stats::{self, Reason};
use foliocache::{Advice, Cache, File, Handle, SyncRange};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Readahead (and, in write-back mode, write-behind) states of one description.
pub(crate) type Slots = [HandleSlot; HANDLE_SLOTS];

/// Readahead state slots per description: readers on different threads use different ones.
pub(crate) const HANDLE_SLOTS: usize = 4;

/// One readahead state of a description (a thread takes one on every read; see `slot`).
pub(crate) type HandleSlot = slot::TrySlot<Option<Handle>>;

/// A free slot other than the `preferred` one, which another thread holds.
#[cold]
#[inline(never)]
fn other_slot(slots: &Slots, preferred: usize) -> Option<slot::Taken<'_, Option<Handle>>> {
    (1..HANDLE_SLOTS)
        .map(|k| &slots[(preferred + k) % HANDLE_SLOTS])
        .find_map(HandleSlot::try_lock)
}

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
    /// On a shared cache (see the module documentation).
    shared: bool,
    /// Shared cache, write-through mode: each write is written back before it returns.
    through_sync: bool,
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
    /// Shared cache: read-only descriptors given up for a writable one (kept open until the
    /// last close).
    parked: Vec<OwnedFd>,
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

/// How a read through the cache went, as [`Inode::read`] needs it.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// Every byte asked for.
    Full,
    /// Fewer bytes, and the cache's size of the file then.
    Short(usize, u64),
    /// An error, as an errno.
    Failed(i32),
}

impl Inode {
    pub(crate) fn new(cache: &Cache, key: (u64, u64), ra_bytes: u64, writes: Writes) -> Self {
        let shared = cache.is_shared();
        Self {
            key,
            cache: cache.clone(),
            // A shared cache takes the writes in both modes.
            writes: if shared { Writes::Back } else { writes },
            shared,
            through_sync: shared && writes == Writes::Through,
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
        self.fds() == 0 && io.lent.is_none() && io.refused.is_none() && io.parked.is_empty()
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
        // The thread's own slot first; the others only when another thread holds it (in a
        // function of their own, so that the common case does not compute their addresses).
        let mut guard = slots[preferred % HANDLE_SLOTS]
            .try_lock()
            .or_else(|| other_slot(slots, preferred));
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
        let wanted = buf.len();
        for _attempt in 0..3 {
            let ticket = self.ticket(fd)?;
            // What the closure hands back is small and has no error value in it (an errno
            // instead): a full read, the common case, returns in registers, and the cache's
            // size is read only for a short one.
            let read = self.with_handle(slots, preferred, advice, |handle| {
                match handle.read_at(buf, pos) {
                    Ok(n) if n == wanted => Read::Full,
                    Ok(n) => Read::Short(n, handle.file().size()),
                    Err(error) => {
                        debug(format_args!("{:?}: a read failed: {error}", self.key));
                        Read::Failed(foliocache_capi::errno_of(&error))
                    }
                }
            })?;
            if !self.serving.still(ticket) {
                return None; // the cache stopped serving meanwhile: the kernel answers
            }
            match read {
                Read::Full => return Some(Ok(wanted)),
                Read::Short(n, size) => {
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
                Read::Failed(errno) => return Some(Err(errno)),
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

/// A cache with the settings: a private one, or an attachment to the shared cache `shared`
/// (whose settings, `io` among them, are the ones of the process that created it).
pub(crate) fn new_cache(
    capacity: u64,
    (io, place_by_offset): (foliocache::EngineKind, bool),
    shared: Option<&str>,
) -> Result<Cache, String> {
    let mut builder = Cache::builder()
        .capacity(capacity)
        .io_engine(io)
        .place_by_offset(place_by_offset);
    if let Some(name) = shared {
        builder = builder.shared(name);
        if std::env::var_os("FOLIOCACHE_OWNER").is_none()
            && let Some(owner) = owner_beside_library()
        {
            builder = builder.owner_program(owner);
        }
    }
    builder.build().map_err(|e| e.to_string())
}

/// `foliocache-owner` in the directory this library was loaded from, if it is there (a
/// build's `target/release`, or where both were installed).
fn owner_beside_library() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::uninit();
    let here = new_cache as *const () as *const libc::c_void;
    // SAFETY: dladdr fills the local struct for an address inside this library.
    if unsafe { libc::dladdr(here, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so it filled the struct.
    let fname = unsafe { info.assume_init() }.dli_fname;
    if fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated file name owned by the dynamic loader for as long as the
    // library stays loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(fname) };
    let path = std::path::Path::new(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()),
    );
    let owner = path.parent()?.join("foliocache-owner");
    owner.is_file().then_some(owner)
}
