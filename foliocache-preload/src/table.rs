//! The fd table: which of the program's file descriptors are served by the cache, and their
//! shared state (the [`Description`]: file offset, flags, readers).
//!
//! # Protocol
//! One slot per fd number below [`MAX_FDS`] (a static array: no allocation, no lock). A slot
//! holds a raw `Arc<Description>` pointer and a counter of *readers* for the threads that
//! cannot use a record (below).
//! * [`get`] (every read, write, seek): if the slot is empty, return at once (the common case
//!   for sockets, pipes and files outside `FOLIOCACHE_PATHS`, one load). Otherwise the thread
//!   marks itself reading the fd, in its own record of `readers` (a store and a fence on its
//!   own lines) or, nested or without a record, in the slot's counter; then it loads the
//!   pointer and hands out an [`FdRef`] that takes the mark back on drop. `readers`' module
//!   documentation has the protocol and its argument.
//! * [`install`] and [`remove`] (open, dup, close) swap the pointer, then wait until no
//!   thread is marked reading the fd since before the swap: a reader that loaded the old
//!   pointer has finished with it. Only then is the old `Arc` dropped.
//!
//! Readers never wait and take no lock, so a hook interrupted by a signal whose handler reads
//! the same fd cannot deadlock here. A remover does wait, but only for readers of that fd; a
//! remover that is itself nested (a signal handler closing an fd the interrupted code was
//! reading) does not wait and leaks the old description instead of freeing it under a reader.
//!
//! Removing the program's last fd of an inode runs the inode's last close
//! (`Inode::last_close`: write back, release the lease, close the library's descriptor) before
//! the caller's real close. A nested remover never does that (it could be a signal handler
//! interrupting a thread that holds the locks writeback takes): the inode keeps its
//! descriptor and lease, and its dirty data is written back by the flusher or the next flush
//! point (fork, exec, exit).
//!
//! dup'd fds share one `Description` (one file offset, as POSIX wants). The kernel fd stays
//! real: every intercepted fd is a normal fd of the program, so `mmap`, `fstat`, `fchmod`,
//! locks and everything not intercepted keep working on it.

use crate::adapter::{Inode, SyncKind};
use crate::guard::{self, HookThread};
use crate::readers::{self, Held, Records};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// fds at or above this number are never intercepted (they pass through).
pub(crate) const MAX_FDS: usize = 1 << 16;

/// What an open file description is (shared by dup'd fds).
#[derive(Debug)]
pub(crate) struct Description {
    pub(crate) inode: Arc<Inode>,
    /// The file offset for read/write/lseek; pread/pwrite do not use it.
    pub(crate) offset: AtomicU64,
    pub(crate) append: AtomicBool,
    /// Another process may hold this open file description (it was inherited by a fork or a
    /// new program): the kernel's offset is then the one to use and move.
    pub(crate) shared: AtomicBool,
    pub(crate) readable: bool,
    pub(crate) writable: bool,
    /// `O_SYNC` (`All`) or `O_DSYNC` (`Data`): each write is synced before it returns.
    pub(crate) sync_writes: Option<SyncKind>,
    /// Write-back mode: this description's handle for syncs, which knows which writeback
    /// errors it was told of (the kernel's errseq is per open file description).
    pub(crate) sync: Mutex<Option<foliocache::Handle>>,
    /// The access-pattern advice (`posix_fadvise`) fresh readahead states start from.
    pub(crate) advice: AtomicI32,
    /// Readahead states (and write-behind streams).
    pub(crate) handles: crate::adapter::Slots,
    /// Debug builds: [`LIVE`] until dropped, so that a use after the free (the fd table's
    /// protocol broken) panics in `FdRef::deref` instead of reading freed memory unseen.
    #[cfg(debug_assertions)]
    canary: AtomicU64,
}

/// A description's canary while it lives (debug builds).
#[cfg(debug_assertions)]
const LIVE: u64 = 0x5EED_F00D_CAFE_D00D;

impl Drop for Description {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        self.canary.store(0, Ordering::SeqCst);
        self.inode.description_closed(self.writable);
    }
}

impl Description {
    /// The file offset: this table's, or the kernel's once the description is shared.
    pub(crate) fn offset(&self, fd: i32) -> Option<u64> {
        if self.shared.load(Ordering::SeqCst) {
            // SAFETY: lseek on an fd of this process, integer arguments.
            let pos = unsafe { crate::real::lseek64(fd, 0, libc::SEEK_CUR) };
            u64::try_from(pos).ok()
        } else {
            Some(self.offset.load(Ordering::SeqCst))
        }
    }

    /// Moves the file offset to `pos` (in the kernel too once the description is shared).
    pub(crate) fn set_offset(&self, fd: i32, pos: u64) {
        self.offset.store(pos, Ordering::SeqCst);
        if self.shared.load(Ordering::SeqCst) {
            // SAFETY: lseek on an fd of this process, integer arguments.
            unsafe { crate::real::lseek64(fd, pos as i64, libc::SEEK_SET) };
        }
    }

    pub(crate) fn new(inode: Arc<Inode>, flags: i32) -> Self {
        let access = flags & libc::O_ACCMODE;
        let sync_writes = if flags & libc::O_SYNC == libc::O_SYNC {
            Some(SyncKind::All)
        } else if flags & libc::O_DSYNC != 0 {
            Some(SyncKind::Data)
        } else {
            None
        };
        inode.description_opened(flags);
        Self {
            sync: Mutex::new(inode.sync_handle()),
            inode,
            offset: AtomicU64::new(0),
            append: AtomicBool::new(flags & libc::O_APPEND != 0),
            shared: AtomicBool::new(false),
            readable: access == libc::O_RDONLY || access == libc::O_RDWR,
            writable: crate::adapter::writable(flags),
            sync_writes,
            advice: AtomicI32::new(libc::POSIX_FADV_NORMAL),
            handles: Default::default(),
            #[cfg(debug_assertions)]
            canary: AtomicU64::new(LIVE),
        }
    }
}

struct Slot {
    description: AtomicPtr<Description>,
    readers: AtomicU32,
}

static TABLE: [Slot; MAX_FDS] = [const {
    Slot {
        description: AtomicPtr::new(std::ptr::null_mut()),
        readers: AtomicU32::new(0),
    }
}; MAX_FDS];

/// One past the highest fd ever installed (so scans stop early).
static HIGH_WATER: AtomicU32 = AtomicU32::new(0);

/// The threads' records (see `readers`).
static RECORDS: Records = Records::new();

/// A description in use through an fd; the slot cannot free it until this is dropped. Not
/// `Send`: it holds this thread's mark and state.
pub(crate) struct FdRef {
    _held: Held<'static>,
    description: *const Description,
    thread: *const HookThread,
    /// A hold that is a count on the fd's counter is also counted on the thread (see `get`).
    /// Declared after `_held`, so given back after the count.
    _counted: Option<CountedHold>,
}

/// A thread's counted hold (`HookThread::hold`), given back when dropped.
struct CountedHold(*const HookThread);

impl Drop for CountedHold {
    fn drop(&mut self) {
        // SAFETY: this thread's state (`get` looked it up on this thread; FdRef is not Send).
        unsafe { &*self.0 }.unhold();
    }
}

impl FdRef {
    /// Marks this thread as inside a hook (`guard::enter`), with the state `get` looked up.
    #[inline]
    pub(crate) fn enter(&self) -> Option<guard::Entered> {
        guard::enter_on(self.thread)
    }
}

impl std::ops::Deref for FdRef {
    type Target = Description;
    fn deref(&self) -> &Description {
        // SAFETY: the pointer came from Arc::into_raw in `install` and was loaded after this
        // FdRef's mark was made (`readers::enter`); removers wait for every such mark to be
        // taken back before dropping the Arc, so the Description is alive for the FdRef's
        // whole life.
        let description = unsafe { &*self.description };
        #[cfg(debug_assertions)]
        assert_eq!(
            description.canary.load(Ordering::SeqCst),
            LIVE,
            "a description used after it was freed"
        );
        description
    }
}

fn slot(fd: i32) -> Option<&'static Slot> {
    usize::try_from(fd).ok().and_then(|fd| TABLE.get(fd))
}

/// The tag a reader of `fd` marks its record with (never 0).
fn tag(fd: i32) -> u32 {
    fd as u32 + 1
}

/// This thread's record, claimed on its first read of a served fd.
fn record(thread: &HookThread) -> Option<&'static readers::Record> {
    let index = thread.record(|| {
        if PROCESS.load(Ordering::Relaxed) == 0 {
            // SAFETY: getpid takes no arguments.
            let _ = PROCESS.compare_exchange(
                0,
                unsafe { libc::getpid() },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        // SAFETY: gettid takes no arguments.
        let tid = unsafe { libc::gettid() };
        RECORDS.claim(tid, |owner| !thread_alive(owner))
    })?;
    RECORDS.get(index)
}

/// The process whose threads own the records: set at the first claim and in a forked child.
/// Not `getpid()` at each call: a child made with `CLONE_VM` but not as a thread (which shares
/// this memory) would find every thread of its parent gone.
static PROCESS: AtomicI32 = AtomicI32::new(0);

/// Whether the thread `tid` of this process still exists.
fn thread_alive(tid: i32) -> bool {
    let process = PROCESS.load(Ordering::Relaxed);
    if process == 0 {
        return true;
    }
    // SAFETY: tgkill with signal 0 only checks that the thread exists; integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, process, tid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The description of `fd` if the cache serves it.
pub(crate) fn get(fd: i32) -> Option<FdRef> {
    let slot = slot(fd)?;
    if slot.description.load(Ordering::Relaxed).is_null() {
        return None;
    }
    let thread = guard::this_thread();
    // SAFETY: this thread's state, valid while it runs (`guard::this_thread`).
    let state = unsafe { &*thread };
    let record = record(state);
    // A count is also counted on the thread, before it is made: a signal handler that closes
    // the fd on top of this thread must not wait for it (see `retire`).
    let mut counted = None;
    let held = readers::enter(record, &slot.readers, tag(fd), || {
        state.hold();
        counted = Some(CountedHold(thread));
    });
    let description = slot.description.load(Ordering::SeqCst);
    if description.is_null() {
        drop(held);
        drop(counted);
        return None;
    }
    Some(FdRef {
        _held: held,
        description,
        thread,
        _counted: counted,
    })
}

/// A new reference to `fd`'s description (for dup), if the cache serves it.
pub(crate) fn get_arc(fd: i32) -> Option<Arc<Description>> {
    let found = get(fd)?;
    // SAFETY: the pointer is a live Arc (see FdRef::deref); incrementing its strong count
    // while we hold a reader count, then rebuilding an Arc from it, gives an owned reference.
    unsafe {
        Arc::increment_strong_count(found.description);
        Some(Arc::from_raw(found.description))
    }
}

/// Makes `fd` served by `description` (replacing whatever it had: the kernel reused the number).
/// An fd beyond the table cannot be served: its file becomes uncached (its writes would
/// otherwise bypass the invalidation). In write-back mode so does a file installed at fd 0, 1
/// or 2: glibc's standard streams read and write those with libc-internal calls no hook sees
/// (a program that `dup2`s a file onto stdout and `printf`s), so the kernel must have every
/// byte and the cache must not be written.
pub(crate) fn install(fd: i32, description: Arc<Description>, nested: bool) {
    let uncache = |description: &Description| match crate::runtime() {
        Some(runtime) if !nested => {
            runtime.set_uncached(description.inode.key, crate::stats::Reason::UntrackedPath);
        }
        _ => description.inode.mark_uncached(),
    };
    let Some(slot) = slot(fd) else {
        uncache(&description);
        return;
    };
    if fd <= 2 && description.inode.is_back() {
        uncache(&description);
    }
    description.inode.fd_installed();
    let old = slot
        .description
        .swap(Arc::into_raw(description).cast_mut(), Ordering::SeqCst);
    HIGH_WATER.fetch_max(fd as u32 + 1, Ordering::Relaxed);
    retire(fd, slot, old, nested);
}

/// Makes `fd` pass through again (it was closed). Returns whether it was served.
pub(crate) fn remove(fd: i32, nested: bool) -> bool {
    let Some(slot) = slot(fd) else { return false };
    if slot.description.load(Ordering::Relaxed).is_null() {
        return false;
    }
    let old = slot
        .description
        .swap(std::ptr::null_mut(), Ordering::SeqCst);
    let was = !old.is_null();
    retire(fd, slot, old, nested);
    was
}

fn retire(fd: i32, slot: &Slot, old: *mut Description, nested: bool) {
    if old.is_null() {
        return;
    }
    // SAFETY: this thread's state, valid while it runs (`guard::this_thread`).
    let thread = unsafe { &*guard::this_thread() };
    let on_a_reader = thread.holding()
        || thread
            .claimed()
            .is_some_and(|index| RECORDS.in_section(index));
    if nested || on_a_reader {
        // A signal handler closing an fd: waiting for readers could deadlock (its
        // interrupted thread may be one), and dropping the description takes its inode's
        // lock (which that thread may hold). A handler that runs on top of a hook before
        // the hook marked itself inside (`guard`) is not seen as nested, but the hook holds
        // a description (maybe this one, see `readers`): the same. The description is leaked; its inode
        // counts the fd gone but keeps its descriptor (no last close here, see the module
        // doc).
        // SAFETY: `old` came from Arc::into_raw in `install` and is not dropped yet (this
        // function owns the slot's reference to it, and leaks it).
        unsafe { &*old }.inode.fd_removed();
        return;
    }
    RECORDS.wait(&slot.readers, tag(fd), thread.claimed(), thread_alive);
    // SAFETY: `old` came from Arc::into_raw in `install`, the slot no longer holds it, and no
    // reader holds it any more (`RECORDS.wait`): this is its last use here.
    let old = unsafe { Arc::from_raw(old) };
    if old.inode.fd_removed() && !nested {
        // The program's last fd of the file: before its real close (see the module doc).
        old.inode.last_close();
        let key = old.inode.key;
        drop(old);
        if let Some(runtime) = crate::runtime() {
            runtime.retain(key);
        }
        return;
    }
    drop(old);
}

/// Calls `each(fd, description)` for every served fd (fork handlers, stats).
pub(crate) fn for_each(mut each: impl FnMut(i32, &Description)) {
    let high = HIGH_WATER.load(Ordering::Relaxed) as i32;
    for fd in 0..high {
        if let Some(found) = get(fd) {
            each(fd, &found);
        }
    }
}

/// Writes every served fd's offset to its kernel fd (before a fork or an exec: a new program
/// inherits the kernel's offsets), and from then on uses the kernel's offset for it.
pub(crate) fn sync_kernel_offsets() {
    for_each(|fd, description| {
        if description.shared.swap(true, Ordering::SeqCst) {
            return; // the kernel's offset is already the one in use
        }
        let offset = description.offset.load(Ordering::SeqCst);
        // SAFETY: lseek on an fd of this process, with plain integer arguments.
        unsafe { crate::real::lseek64(fd, offset as i64, libc::SEEK_SET) };
    });
}

/// In a child after fork: forget every entry without freeing it (its cache belongs to the
/// parent's threads, which do not exist here), so every inherited fd passes through.
pub(crate) fn forget_all() {
    let high = HIGH_WATER.load(Ordering::Relaxed) as usize;
    for slot in TABLE.iter().take(high) {
        slot.description
            .store(std::ptr::null_mut(), Ordering::SeqCst);
        slot.readers.store(0, Ordering::SeqCst);
    }
    // SAFETY: getpid and gettid take no arguments.
    let (process, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    PROCESS.store(process, Ordering::Relaxed);
    // SAFETY: this thread's state, valid while it runs (`guard::this_thread`).
    let mine = unsafe { &*guard::this_thread() }.claimed();
    // This thread keeps its record (a fork from a signal handler may have a section of the
    // interrupted code still to leave on it), now under its new id.
    RECORDS.forget_all(mine, tid);
}
