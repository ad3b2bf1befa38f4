//! `libfoliocache_preload.so`: unmodified programs read the files under `FOLIOCACHE_PATHS`
//! through a private foliocache (`LD_PRELOAD=.../libfoliocache_preload.so`).
//!
//! # How it fits together
//! * `hooks` and `stdio` define the interposed symbols (`open`, `read`, `pread64`, `fopen`...).
//!   Each looks its fd up in the `table`; an fd that is not served (and every call made before
//!   the constructor ran, or after a fork) goes straight to libc (`real`: `dlsym(RTLD_NEXT)`).
//! * An intercepted fd stays a real kernel fd of the program, opened normally: `mmap`, `fstat`,
//!   `fchmod`, locks, `fsync` all work on it. The table adds what the cache needs: the shared
//!   file offset (dup'd fds share it), flags, and readahead states.
//! * `adapter` is the only module that calls foliocache's file API: reads through the cache,
//!   writes through to the kernel and invalidated (until the library has its write path), and
//!   revalidation on open. Its module doc is the coherence argument.
//! * `guard`: a hook entered while its thread is already inside one (the library's own I/O,
//!   or a signal handler that interrupted a hook) takes the *raw path*: the real call at the
//!   offset the table keeps, no cache, no lock.
//!
//! # Lifecycle
//! * The constructor reads the settings (`config`); a bad one is one line on stderr and the
//!   program runs uncached. The cache itself is made on the first open of a file it serves.
//! * fork: `pthread_atfork` handlers hold the registry lock across the fork (so the child never
//!   inherits it locked) and write every served fd's offset back to its kernel fd. The child
//!   forgets the parent's cache and fd table without freeing them (their threads stayed in the
//!   parent): inherited fds pass through there, and the child's own opens get a fresh cache.
//! * exec: the kernel fds keep their flags (`O_CLOEXEC` included); the new image starts with an
//!   empty table, so inherited fds pass through.
//! * exit: with `FOLIOCACHE_STATS`, an `atexit` handler appends the counters (`stats`).

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
mod config;
mod guard;
#[cfg(not(test))]
mod hooks;
mod real;
mod stats;
#[cfg(not(test))]
mod stdio;
mod table;

use adapter::{Inode, NotCached};
use config::Config;
use foliocache::Cache;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

/// Not started: every call passes through (calls made before the constructor ran).
const NOT_STARTED: u8 = 0;
/// Serving the files under `FOLIOCACHE_PATHS`.
const ACTIVE: u8 = 1;
/// Off (no `FOLIOCACHE_PATHS`, or a bad setting): every call passes through.
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The settings and the registry of files.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) config: Config,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    cache: Option<Cache>,
    cache_failed: bool,
    inodes: HashMap<(u64, u64), Weak<Inode>>,
    /// Inodes written through paths the library cannot see: never cached again here.
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

impl Runtime {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The inode for a regular file under the served directories, open as `fd` with `flags`
    /// (`None`: the fd passes through).
    pub(crate) fn inode_for(&self, fd: i32, st: &libc::stat, flags: i32) -> Option<Arc<Inode>> {
        let key = (st.st_dev, st.st_ino);
        let mut registry = self.registry();
        if registry.no_direct.contains(&st.st_dev) || registry.uncached.contains(&key) {
            return None;
        }
        if flags & libc::O_DIRECT != 0 {
            // The program does its own direct I/O: its writes would bypass the invalidation.
            registry.uncached.insert(key);
            if let Some(inode) = registry.inodes.get(&key).and_then(Weak::upgrade) {
                inode.set_uncached();
            }
            return None;
        }
        if let Some(inode) = registry.inodes.get(&key).and_then(Weak::upgrade) {
            inode.revalidate(st);
            if flags & libc::O_TRUNC != 0 {
                inode.bump();
            }
            return Some(inode);
        }
        let cache = match &registry.cache {
            Some(cache) => cache.clone(),
            None if registry.cache_failed => return None,
            None => match adapter::new_cache(self.config.capacity) {
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
        match Inode::open(&cache, fd, st, ra_bytes) {
            Ok(inode) => {
                let inode = Arc::new(inode);
                registry.inodes.retain(|_, weak| weak.strong_count() > 0);
                registry.inodes.insert(key, Arc::downgrade(&inode));
                Some(inode)
            }
            Err(NotCached::NoDirectIo) => {
                registry.no_direct.insert(st.st_dev);
                None
            }
            Err(NotCached::Failed) => {
                // This fd passes through; its writes would bypass any later cache of the file.
                registry.uncached.insert(key);
                None
            }
        }
    }

    /// An inode (by key) becomes uncached for the rest of the process.
    pub(crate) fn set_uncached(&self, key: (u64, u64)) {
        let mut registry = self.registry();
        registry.uncached.insert(key);
        if let Some(inode) = registry.inodes.get(&key).and_then(Weak::upgrade) {
            inode.set_uncached();
        }
    }

    /// The live inode for a key, if any (for `truncate(path)`).
    pub(crate) fn find(&self, key: (u64, u64)) -> Option<Arc<Inode>> {
        self.registry().inodes.get(&key).and_then(Weak::upgrade)
    }
}

extern "C" fn start() {
    let Some(_entered) = guard::enter() else {
        return;
    };
    match Config::from_env(|key| std::env::var(key).ok()) {
        Ok(Some(config)) => {
            let stats = config.stats_path.is_some();
            let _ = RUNTIME.set(Runtime {
                config,
                registry: Mutex::new(Registry::default()),
            });
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
            if stats {
                // SAFETY: as above, a function of this library that lives as long as the process.
                unsafe { libc::atexit(write_stats) };
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

/// The constructor: run by the dynamic loader when the library is loaded.
#[used]
#[unsafe(link_section = ".init_array")]
static START: extern "C" fn() = start;

thread_local! {
    /// The registry lock held across a fork by the forking thread.
    static FORK_LOCK: RefCell<Option<MutexGuard<'static, Registry>>> = const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    let Some(runtime) = runtime() else { return };
    let registry = runtime.registry();
    // The kernel fds' offsets: a child (or a program exec'd by it) reads them.
    table::sync_kernel_offsets();
    let _ = FORK_LOCK.try_with(|slot| *slot.borrow_mut() = Some(registry));
}

extern "C" fn after_fork_parent() {
    let _ = FORK_LOCK.try_with(|slot| slot.borrow_mut().take());
}

extern "C" fn after_fork_child() {
    let Some(runtime) = runtime() else { return };
    let _ = FORK_LOCK.try_with(|slot| slot.borrow_mut().take());
    let mut registry = runtime.registry();
    // The parent's cache and files belong to threads that did not come along: forget them
    // without running their destructors (which would wait for those threads).
    std::mem::forget(registry.cache.take());
    std::mem::forget(std::mem::take(&mut registry.inodes));
    drop(registry);
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
    let evicted = registry
        .as_ref()
        .and_then(|r| r.cache.as_ref())
        .map_or(0, |cache| cache.reclaim_stats().evicted_pages);
    let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let json = stats::json(
        |each| {
            if let Some(registry) = &registry {
                for inode in registry.inodes.values().filter_map(Weak::upgrade) {
                    inode.with_file(&mut *each);
                }
            }
        },
        evicted,
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
