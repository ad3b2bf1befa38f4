//! `libfoliocache_preload.so`: unmodified programs read (and, with `FOLIOCACHE_WRITES=back`,
//! write) the files under `FOLIOCACHE_PATHS` through a private foliocache
//! (`LD_PRELOAD=.../libfoliocache_preload.so`). docs/PRELOAD.md is the user's guide: the
//! settings, when a file is cached, the two write modes and which programs each is safe for.
//!
//! # How it fits together
//! * `hooks` and `stdio` define the interposed symbols (`open`, `read`, `pwrite64`, `fstat`,
//!   `fopen`...). Each looks its fd up in the `table`; an fd that is not served (and every call
//!   made before the constructor ran) goes straight to libc (`real`: `dlsym(RTLD_NEXT)`).
//! * An intercepted fd stays a real kernel fd of the program, opened normally: `mmap`, `fstat`,
//!   `fchmod`, locks, `fsync` all work on it. The table adds what the cache needs: the shared
//!   file offset (dup'd fds share it), flags, readahead states and (write-back) sync handles.
//! * `adapter` is the only module that calls foliocache's file API. Its module doc is the
//!   coherence argument: a file is served only while a lease (`lease`) says no other process
//!   can change it, through a descriptor of the library's own that it closes only inside the
//!   program's last close of the file (so no POSIX lock of the program is ever dropped), and
//!   the two write modes on top. `serving` is the switch between serving and passing through.
//! * `guard`: a hook entered while its thread is already inside one (the library's own I/O,
//!   or a signal handler that interrupted a hook) takes the *raw path*: the real call at the
//!   offset the table keeps, no cache, no lock.
//!
//! # Lifecycle
//! * The constructor reads the settings (`config`); a bad one is one line on stderr and the
//!   program runs uncached. The cache itself is made on the first open of a file it serves;
//!   the lease thread at the first lease.
//! * fork: `pthread_atfork` handlers first write back every inode served in write-back mode
//!   (the child reads the file through the kernel) and make every file with a writable
//!   description pass through (the child can write through it unheard), then hold the
//!   registry locks across the fork (so the child never inherits them locked) and write every
//!   served fd's offset back to its kernel fd. The child closes its copies of the library's
//!   descriptors (`own_fds`: it holds no lock yet) and forgets the parent's cache and fd table
//!   without freeing them (their threads stayed in the parent): inherited fds pass through
//!   there, and the child's own opens get a fresh cache.
//! * exec (`execve`, `execv`, `execvp`, `execvpe`, `fexecve`, `execl`, `execle`, `execlp`): the
//!   same write back and offsets first, every lease released, and the library's descriptors kept
//!   open across the exec where the program's own are (see the adapter); the new image starts
//!   with an empty table, so inherited fds pass through. A spawn (`posix_spawn`, `system`,
//!   `popen`) makes a file pass through whose writable description the child inherits.
//! * exit: in write-back mode an `atexit` handler flushes the library's own `FILE` streams,
//!   writes back every inode and makes it uncached (what is written later in the exit goes to
//!   the kernel). With `FOLIOCACHE_STATS`, an `atexit` handler appends the counters (`stats`),
//!   after the write back.

// The hooks (which use nearly everything) are left out of the unit-test build: a test binary
// that interposed its own libc calls would test itself.
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!(
    "foliocache-preload interposes glibc's symbols and relies on the x86_64/aarch64 Linux \
     calling convention for variadic open/fcntl arguments"
);

mod adapter;
mod alloc;
mod config;
mod guard;
#[cfg(not(test))]
mod hooks;
mod lease;
mod own_fds;
mod readers;
mod real;
mod serving;
#[cfg(not(test))]
mod stat;
mod stats;
#[cfg(not(test))]
mod stdio;
mod table;
mod threads;

use adapter::Inode;
use config::{Config, Writes};
use foliocache::Cache;
use stats::Reason;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

/// Not started: every call passes through (calls made before the constructor ran).
const NOT_STARTED: u8 = 0;
/// Serving the files under `FOLIOCACHE_PATHS`.
const ACTIVE: u8 = 1;
/// Off (no `FOLIOCACHE_PATHS`, or a bad setting): every call passes through.
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Entries in [`Runtime::back`] (so the stat calls of a process with none take no lock).
static BACK_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// The exit flush ran: files opened from now on are not served in write-back mode.
static EXITING: AtomicBool = AtomicBool::new(false);

/// The settings and the registry of files.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) config: Config,
    registry: Mutex<Registry>,
    /// The inodes served in write-back mode, for the stat calls and the flush points: a lock
    /// of its own, held only for a lookup (the registry's is held while files are opened).
    /// Written under the registry lock.
    back: Mutex<BackMap>,
}

type BackMap = HashMap<(u64, u64), Weak<Inode>>;

/// Inodes kept after their last fd closed (their cached pages, for the next open), at most.
const MAX_RETAINED: usize = 1024;

#[derive(Debug, Default)]
struct Registry {
    cache: Option<Cache>,
    cache_failed: bool,
    /// Every file the program opened through the cache, by device and inode: one cached file
    /// each, kept after the last fd closes (up to `MAX_RETAINED` of those).
    inodes: HashMap<(u64, u64), Arc<Inode>>,
    /// Keys of inodes whose fds all closed, oldest first.
    retained: VecDeque<(u64, u64)>,
    /// Inodes written through paths the library cannot see, or mapped shared: never cached
    /// again here (kept apart: a retained inode may be let go).
    uncached: HashSet<(u64, u64)>,
    /// Devices without direct I/O.
    no_direct: HashSet<u64>,
}

/// The runtime, if the library is serving files.
pub(crate) fn runtime() -> Option<&'static Runtime> {
    if STATE.load(Ordering::Acquire) == ACTIVE {
        RUNTIME.get()
    } else {
        None
    }
}

/// tmpfs's `statfs` magic: it keeps every file in the page cache, no direct I/O.
const TMPFS_MAGIC: i64 = 0x0102_1994;

impl Runtime {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn back_map(&self) -> MutexGuard<'_, BackMap> {
        self.back.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The inode for a regular file under the served directories, open as `fd` (stat `st`):
    /// the one the program opened before, or a new one. `None`: the fd passes through.
    pub(crate) fn inode_for(&self, fd: RawFd, st: &libc::stat) -> Option<Arc<Inode>> {
        let key = (st.st_dev, st.st_ino);
        let writes = self.config.writes;
        let mut registry = self.registry();
        if registry.no_direct.contains(&st.st_dev) {
            return None;
        }
        if let Some(inode) = registry.inodes.get(&key) {
            let inode = Arc::clone(inode);
            registry.retained.retain(|retained| *retained != key);
            // On a shared cache an idle inode is not kept for its pages (the shared cache
            // keeps them): a new one is made, which also serves a new file that was given a
            // deleted file's inode number.
            if !(self.config.shared.is_some() && inode.idle()) {
                return Some(inode);
            }
            registry.inodes.remove(&key);
        }
        if writes == Writes::Back && EXITING.load(Ordering::Acquire) {
            return None;
        }
        let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: fstatfs fills the valid local buffer for an fd of this process. (A shared
        // cache's owner reads tmpfs files buffered: only a private cache needs direct I/O.)
        if self.config.shared.is_none() && unsafe { libc::fstatfs(fd, fs.as_mut_ptr()) } == 0 {
            // SAFETY: fstatfs succeeded, so it filled the struct.
            #[allow(clippy::unnecessary_cast, clippy::cast_lossless)]
            if unsafe { fs.assume_init() }.f_type as i64 == TMPFS_MAGIC {
                registry.no_direct.insert(st.st_dev);
                return None;
            }
        }
        let cache = match &registry.cache {
            Some(cache) => cache.clone(),
            None if registry.cache_failed => return None,
            None => match adapter::new_cache(
                self.config.capacity,
                (self.config.io, self.config.place_by_offset),
                self.config.shared.as_deref(),
            ) {
                Ok(cache) => registry.cache.insert(cache).clone(),
                Err(error) => {
                    registry.cache_failed = true;
                    eprintln!(
                        "foliocache-preload: cannot make the cache ({error}); running uncached"
                    );
                    return None;
                }
            },
        };
        let ra_bytes = self
            .config
            .ra_bytes
            .or_else(|| config::device_read_ahead_bytes(st.st_dev))
            .unwrap_or(128 << 10);
        let inode = Arc::new(Inode::new(&cache, key, ra_bytes, writes));
        if registry.uncached.contains(&key) {
            inode.set_uncached(Reason::UntrackedPath);
        }
        registry.inodes.insert(key, Arc::clone(&inode));
        if inode.is_back() {
            let mut back = self.back_map();
            back.retain(|_, weak| weak.strong_count() > 0);
            back.insert(key, Arc::downgrade(&inode));
            BACK_ENTRIES.store(back.len(), Ordering::Release);
        }
        Some(inode)
    }

    /// An inode's last fd closed: it is kept (its pages serve the next open) until more than
    /// `MAX_RETAINED` are kept; the oldest idle ones then go.
    pub(crate) fn retain(&self, key: (u64, u64)) {
        let mut registry = self.registry();
        registry.retained.retain(|retained| *retained != key);
        registry.retained.push_back(key);
        let mut gone = Vec::new();
        while registry.retained.len() > MAX_RETAINED {
            let Some(oldest) = registry.retained.pop_front() else {
                break;
            };
            if let Some(inode) = registry.inodes.get(&oldest)
                && inode.idle()
            {
                gone.extend(registry.inodes.remove(&oldest));
            }
        }
        drop(registry);
        drop(gone); // their cached files go, outside the lock
    }

    /// An inode (by key) is never served again in this process (in write-back mode, after
    /// its dirty data was written back).
    pub(crate) fn set_uncached(&self, key: (u64, u64), reason: Reason) {
        let inode = {
            let mut registry = self.registry();
            registry.uncached.insert(key);
            registry.inodes.get(&key).cloned()
        };
        if let Some(inode) = inode {
            inode.set_uncached(reason);
        }
    }

    /// The inode for a key, if the program opened it (for `truncate(path)`).
    pub(crate) fn find(&self, key: (u64, u64)) -> Option<Arc<Inode>> {
        self.registry().inodes.get(&key).cloned()
    }

    /// The live inode served in write-back mode for a key, if any (for the stat calls).
    pub(crate) fn find_back(&self, key: (u64, u64)) -> Option<Arc<Inode>> {
        if BACK_ENTRIES.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.back_map().get(&key).and_then(Weak::upgrade)
    }

    /// The live inodes served in write-back mode.
    fn back_inodes(&self) -> Vec<Arc<Inode>> {
        if BACK_ENTRIES.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.back_map().values().filter_map(Weak::upgrade).collect()
    }

    /// Every inode the program opened.
    fn all_inodes(&self) -> Vec<Arc<Inode>> {
        self.registry().inodes.values().cloned().collect()
    }

    /// A flush point for the whole process: writes back every inode served in write-back
    /// mode, and waits. Only for outer calls.
    pub(crate) fn flush_all(&self) {
        for inode in self.back_inodes() {
            inode.flush();
        }
    }
}

/// Before a new program (or a child process) can read the files through the kernel: every
/// served fd's offset goes to its kernel fd and, in write-back mode, every inode is written
/// back. Nested (a signal handler spawning) there is no writing back: it would take locks.
pub(crate) fn before_new_program() {
    if foliocache::starting_owner() {
        // The library's own child, the shared cache's owner: it reads no descriptor of the
        // program's.
        return;
    }
    if let Some(runtime) = runtime()
        && let Some(_outer) = guard::enter()
    {
        runtime.flush_all();
    }
    table::sync_kernel_offsets();
}

/// Whether `fd` has close-on-exec set.
fn cloexec(fd: RawFd) -> bool {
    // SAFETY: fcntl on a descriptor of this process, integer arguments.
    let flags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    flags >= 0 && flags & libc::FD_CLOEXEC != 0
}

/// Before a program is spawned (`posix_spawn`, `system`, `popen`): as
/// [`before_new_program`], and every file whose writable description the child inherits (an
/// fd without close-on-exec; every one when `file_actions` may duplicate any) stops being
/// cached: the child can write through it, and no lease tells of that.
pub(crate) fn before_spawn(file_actions: bool) {
    before_new_program();
    let (Some(_outer), Some(_runtime)) = (guard::enter(), runtime()) else {
        return;
    };
    let mut inherited: Vec<Arc<Inode>> = Vec::new();
    table::for_each(|fd, d| {
        if d.writable
            && (file_actions || !cloexec(fd))
            && !inherited.iter().any(|i| Arc::ptr_eq(i, &d.inode))
        {
            inherited.push(Arc::clone(&d.inode));
        }
    });
    for inode in inherited {
        inode.shared_with_another_process();
    }
}

/// What an exec in this process must put back if it fails: descriptors made to survive it.
pub(crate) struct ExecUndo(Vec<RawFd>);

/// Before this process execs (`execve` and the others): the files are written back (in
/// write-back mode), every lease goes (the new program would inherit a lease it does not
/// know of), and the library's descriptor of a file stays open across the exec where the
/// program's own do (none has close-on-exec): the kernel closing it at the exec would drop
/// the program's locks on the file, which the exec keeps otherwise.
pub(crate) fn before_exec() -> ExecUndo {
    before_new_program();
    let (Some(_outer), Some(runtime)) = (guard::enter(), runtime()) else {
        return ExecUndo(Vec::new());
    };
    // Which files have a program fd with close-on-exec (the kernel drops their locks then).
    let mut closing: HashSet<(u64, u64)> = HashSet::new();
    table::for_each(|fd, d| {
        if cloexec(fd) {
            closing.insert(d.inode.key);
        }
    });
    let mut kept = Vec::new();
    for inode in runtime.all_inodes() {
        for fd in inode.before_exec() {
            if !closing.contains(&inode.key) && cloexec(fd) {
                // SAFETY: fcntl on the library's own descriptor, integer arguments.
                unsafe { real::fcntl(fd, libc::F_SETFD, 0) };
                kept.push(fd);
            }
        }
    }
    lease::before_exec();
    ExecUndo(kept)
}

/// The exec failed: the descriptors get close-on-exec back (the files pass through until
/// their last fd closes: their leases went).
pub(crate) fn after_failed_exec(undo: ExecUndo) {
    for fd in undo.0 {
        // SAFETY: fcntl on the library's own descriptor, integer arguments.
        unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as usize) };
    }
    lease::after_failed_exec();
}

extern "C" fn start() {
    let Some(_entered) = guard::enter() else {
        return;
    };
    match Config::from_env(|key| std::env::var(key).ok()) {
        Ok(Some(config)) => {
            let stats = config.stats_path.is_some();
            let back = config.writes == Writes::Back;
            let _ = RUNTIME.set(Runtime {
                config,
                registry: Mutex::new(Registry::default()),
                back: Mutex::new(BackMap::new()),
            });
            // The cache's epochs choose their barrier while the program most likely has one
            // thread: registering for `membarrier` is then cheap.
            let _ = foliocache::epoch_barrier();
            // SAFETY: the three handlers are `extern "C" fn()` items of this library, which
            // stays loaded for the life of the process (an LD_PRELOAD library is never
            // unloaded).
            unsafe {
                libc::pthread_atfork(
                    Some(before_fork),
                    Some(after_fork_parent),
                    Some(after_fork_child),
                )
            };
            // atexit handlers run last registered first: the write back before the counters.
            if stats {
                // SAFETY: as above, a function of this library that lives as long as the process.
                unsafe { libc::atexit(write_stats) };
            }
            if back {
                // SAFETY: as above.
                unsafe { libc::atexit(exit_flush) };
            }
            STATE.store(ACTIVE, Ordering::Release);
        }
        Ok(None) => STATE.store(OFF, Ordering::Release),
        Err(line) => {
            eprintln!("foliocache-preload: {line}; running uncached");
            STATE.store(OFF, Ordering::Release);
        }
    }
}

/// Every Rust allocation of the library: its own allocator, never glibc's (see `alloc`: a hook
/// run by a signal handler that interrupted the program's `malloc` must not need `malloc`).
#[global_allocator]
static ALLOCATOR: alloc::Allocator = alloc::Allocator;

/// The constructor: run by the dynamic loader when the library is loaded.
#[used]
#[unsafe(link_section = ".init_array")]
static START: extern "C" fn() = start;

/// What a forking thread holds across the fork: the registry locks, its mark as inside a hook,
/// and the locks the process's caches share (`foliocache::fork`). Between `before_fork` and the handler after it, glibc holds its allocator's locks: a
/// signal handler that interrupts the fork and reads a served file must take the raw path
/// (the real call, no allocation, no lock of this library), not the cache.
type ForkLocks = (
    MutexGuard<'static, Registry>,
    MutexGuard<'static, BackMap>,
    MutexGuard<'static, Vec<RawFd>>,
    MutexGuard<'static, Vec<lease::Held>>,
    Option<guard::Entered>,
    Option<foliocache::fork::Prepared>,
);

thread_local! {
    /// What `before_fork` holds until the fork is done, in the forking thread.
    static FORK_LOCK: RefCell<Option<ForkLocks>> = const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    let Some(runtime) = runtime() else { return };
    // The child reads the files through the kernel: it must have every byte.
    let entered = guard::enter();
    if entered.is_some() {
        runtime.flush_all();
        // A writable description goes to the child, which can write through it unheard.
        for inode in runtime.all_inodes() {
            if inode.has_writer() {
                inode.shared_with_another_process();
            }
        }
    }
    let registry = runtime.registry();
    let back = runtime.back_map();
    let own = own_fds::list();
    let leases = lease::held();
    // The kernel fds' offsets: a child (or a program exec'd by it) reads them.
    table::sync_kernel_offsets();
    // Last: the locks every cache of the process shares (epochs, folio wait queues). Not when
    // nested (a signal handler forking): the interrupted hook may hold one of them.
    let shared = entered.as_ref().map(|_| foliocache::fork::prepare());
    let _ = FORK_LOCK
        .try_with(|slot| *slot.borrow_mut() = Some((registry, back, own, leases, entered, shared)));
}

/// After the fork, on either side: `finish` ends the shared part, `child` runs with the
/// locks still held (in the child), then the rest is let go.
fn release_fork_locks(finish: fn(foliocache::fork::Prepared), child: bool) {
    let held = FORK_LOCK
        .try_with(|slot| slot.borrow_mut().take())
        .ok()
        .flatten();
    if let Some((registry, back, mut own, mut leases, entered, shared)) = held {
        if let Some(shared) = shared {
            finish(shared);
        }
        if child {
            // The child holds no POSIX lock yet: closing its copies of the library's
            // descriptors takes nothing from it (and a child that locks a file and then execs
            // would lose the lock when the kernel closed them at the exec). The leases stay
            // the parent's, heard by its lease thread.
            own_fds::close_in_child(&mut own);
            std::mem::forget(std::mem::take(&mut *leases));
            lease::forget_in_child();
        }
        drop((registry, back, own, leases, entered));
    }
}

extern "C" fn after_fork_parent() {
    release_fork_locks(foliocache::fork::Prepared::parent, false);
}

extern "C" fn after_fork_child() {
    let Some(runtime) = runtime() else { return };
    // First: the allocator's state may be mid-change by a thread that did not come along.
    alloc::reset_in_child();
    release_fork_locks(foliocache::fork::Prepared::child, true);
    let mut registry = runtime.registry();
    // The parent's cache and files belong to threads that did not come along: forget them
    // without running their destructors (which would wait for those threads).
    std::mem::forget(registry.cache.take());
    std::mem::forget(std::mem::take(&mut registry.inodes));
    registry.retained.clear();
    drop(registry);
    std::mem::forget(std::mem::take(&mut *runtime.back_map()));
    BACK_ENTRIES.store(0, Ordering::Release);
    table::forget_all();
    stats::reset();
}

extern "C" fn write_stats() {
    let Some(_entered) = guard::enter() else {
        return;
    };
    let Some(runtime) = runtime() else { return };
    let Some(path) = &runtime.config.stats_path else {
        return;
    };
    // At exit another thread may hold the registry: wait a little, then report without it.
    let mut registry = None;
    for _ in 0..50 {
        if let Ok(locked) = runtime.registry.try_lock() {
            registry = Some(locked);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let counters = registry
        .as_ref()
        .and_then(|r| r.cache.as_ref())
        .map_or_else(stats::CacheCounters::default, |cache| {
            let totals = cache.stats();
            stats::CacheCounters {
                evicted_pages: cache.reclaim_stats().evicted_pages,
                writeback_pages: totals.dirty.written_pages,
                shared: runtime
                    .config
                    .shared
                    .as_deref()
                    .map(|name| shared_counters(name, &totals)),
            }
        });
    let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let json = stats::json(
        |each| {
            if let Some(registry) = &registry {
                for inode in registry.inodes.values() {
                    inode.with_file(&mut *each);
                }
            }
        },
        counters,
        program.trim(),
    );
    let Some(json) = json else { return };
    let path = path
        .to_string_lossy()
        .replace("%p", &std::process::id().to_string());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| std::io::Write::write_all(&mut file, json.as_bytes()));
    if let Err(error) = written {
        eprintln!("foliocache-preload: cannot write FOLIOCACHE_STATS={path}: {error}");
    }
}

/// A shared cache's own counters for `FOLIOCACHE_STATS`: its pages, those in use, dirty, and
/// the processes attached now (this one included).
fn shared_counters(name: &str, totals: &foliocache::Stats) -> String {
    let status =
        foliocache::cache_command(name, foliocache::CacheCommand::Status).unwrap_or_default();
    let processes = status
        .split("\"processes\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map_or(0, |list| list.split(',').filter(|p| !p.is_empty()).count());
    format!(
        "{{\"name\":{name:?},\"total_pages\":{},\"used_pages\":{},\"dirty_pages\":{},\
         \"attached_processes\":{processes}}}",
        totals.total_pages,
        totals.total_pages.saturating_sub(totals.free_pages),
        totals.dirty.dirty_pages,
    )
}

/// Write-back mode, at exit: the library's `FILE` streams are flushed (exit would write their
/// buffers after this handler), then every inode is written back and made uncached, so what
/// later exit handlers write goes to the kernel. `_exit` and fatal signals skip this.
extern "C" fn exit_flush() {
    // Outside the guard: the streams' writes must take the hooks' outer path.
    #[cfg(not(test))]
    stdio::flush_streams();
    let Some(_entered) = guard::enter() else {
        return; // exit called from inside a hook (a signal handler): no lock may be taken
    };
    let Some(runtime) = runtime() else { return };
    if runtime.config.shared.is_some() {
        return; // the dirty data belongs to the shared cache, which outlives this process
    }
    EXITING.store(true, Ordering::Release);
    for inode in runtime.back_inodes() {
        inode.set_uncached(Reason::Exit);
    }
}
