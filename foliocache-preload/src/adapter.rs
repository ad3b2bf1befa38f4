//! The adapter: everything the preload library asks of foliocache, in one module. When the
//! library gains its write path (`OpenOptions::write`, `Handle::write_at`, `File::set_len`,
//! the sync calls, one shared `File` per inode and `File::revalidate`), this module is what
//! changes; the hooks and the fd table do not.
//!
//! # Coherence today: write-through and invalidate
//! foliocache files are read only, with their size taken at open. So:
//! * an [`Inode`] (one per device and inode number, shared by every fd of the file) holds the
//!   current `foliocache::File`, opened from `/proc/self/fd/N` (the very inode the program
//!   opened, whatever its path does meanwhile), tagged with the inode's *epoch*;
//! * writes go to the kernel first (the program's own fd, so the kernel's metadata, `fstat`
//!   and `lseek(SEEK_END)` stay right without interposing them); then [`Inode::written`] drops
//!   the written range (rounded out to 2 MiB, the largest folio) from the cache, waits for reads
//!   in flight there, and checks that nothing is left. A change the current `File` cannot
//!   reflect (the size moved, a folio that could not be dropped) bumps the epoch instead;
//! * a read uses a `File` only if its epoch is the inode's epoch, else opens a new one. A read
//!   that comes back short re-checks the size with `fstat` (the file may have grown) before
//!   it reports end of file;
//! * opening a file again compares its size and modification time with what the inode saw and
//!   bumps the epoch when they differ: a change made by another program is seen after the file
//!   is opened again (revalidate on open);
//! * an inode written through a path the library does not see (a shared writable `mmap`, a
//!   `FILE` in append mode or from `fdopen` for writing) becomes *uncached* for the rest of the
//!   process: every access passes through to the kernel.
//!
//! The order that makes the invalidation safe: the kernel write completes before the drop; a
//! read that inserted its folios before the drop is waited for (its folios are locked until its
//! I/O completes) and then dropped; a read that inserts after the drop submits its I/O after
//! the write completed, and O_DIRECT reads see completed buffered writes (the kernel writes the
//! range back before a direct read).

use crate::stats;
use foliocache::{Advice, Cache, Error, File, Handle, OpenOptions, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The largest folio (2 MiB): an invalidated range is rounded out to it.
const LARGEST_FOLIO: u64 = (PAGE_SIZE as u64) << foliocache::MAX_ORDER;

/// One file of the program (device and inode number), shared by all its fds.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) key: (u64, u64),
    cache: Cache,
    ra_bytes: u64,
    /// Bumped by every change the current `File` may not reflect.
    epoch: AtomicU64,
    /// The `File` for reads, opened at an epoch.
    current: Mutex<Option<Current>>,
    /// Size and modification time (ns) last seen by an open, for revalidation.
    seen: Mutex<(u64, i128)>,
    /// Every access passes through to the kernel (see the module doc).
    uncached: AtomicBool,
}

#[derive(Debug)]
struct Current {
    epoch: u64,
    file: File,
}

impl Drop for Current {
    fn drop(&mut self) {
        stats::retire_file(&self.file);
    }
}

/// Why an inode cannot be cached.
#[derive(Debug)]
pub(crate) enum NotCached {
    /// Its file system has no direct I/O (tmpfs, or O_DIRECT refused).
    NoDirectIo,
    /// Opening it for the cache failed (the program's fd stays valid and passes through).
    Failed,
}

/// Modification time in nanoseconds.
pub(crate) fn mtime_ns(st: &libc::stat) -> i128 {
    i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec)
}

impl Inode {
    /// A new inode for the file open as `fd` (with stat `st`), its `File` opened now.
    pub(crate) fn open(
        cache: &Cache,
        fd: i32,
        st: &libc::stat,
        ra_bytes: u64,
    ) -> Result<Self, NotCached> {
        let inode = Self {
            key: (st.st_dev, st.st_ino),
            cache: cache.clone(),
            ra_bytes,
            epoch: AtomicU64::new(0),
            current: Mutex::new(None),
            seen: Mutex::new((st.st_size as u64, mtime_ns(st))),
            uncached: AtomicBool::new(false),
        };
        inode.file(fd, 0)?;
        Ok(inode)
    }

    /// Revalidate on open: a size or modification time other than the last open saw means the
    /// file changed behind the cache's back; the cached `File` is then not used again.
    pub(crate) fn revalidate(&self, st: &libc::stat) {
        let now = (st.st_size as u64, mtime_ns(st));
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if *seen != now {
            *seen = now;
            self.bump();
        }
    }

    pub(crate) fn is_uncached(&self) -> bool {
        self.uncached.load(Ordering::Acquire)
    }

    /// Every access passes through from now on.
    pub(crate) fn set_uncached(&self) {
        self.mark_uncached();
        drop(
            self.current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }

    /// Every access passes through from now on; takes no lock (the current `File` is freed by
    /// the next [`set_uncached`](Self::set_uncached) or when the inode goes).
    pub(crate) fn mark_uncached(&self) {
        self.uncached.store(true, Ordering::Release);
        self.bump();
    }

    /// The current `File` stops being used.
    pub(crate) fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The `File` of `epoch`, opened (from the program's `fd`) if the current one is older.
    fn file(&self, fd: i32, epoch: u64) -> Result<File, NotCached> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = current.as_ref().filter(|c| c.epoch == epoch) {
            return Ok(found.file.clone());
        }
        // Held across the open: a write that invalidates meanwhile waits for it, and then
        // drops its range from the new File too.
        let path = format!("/proc/self/fd/{fd}");
        // A File of its own, with an empty cache: this module keeps one per inode and epoch
        // itself (switching to the library's shared, revalidated files is the next step here).
        let options = OpenOptions::new().shared(false);
        let file = match self.cache.open_with(&path, options) {
            Ok(file) => file,
            Err(Error::NoDirectIo { .. }) => return Err(NotCached::NoDirectIo),
            Err(_) => return Err(NotCached::Failed),
        };
        stats::opened_file();
        *current = Some(Current {
            epoch,
            file: file.clone(),
        });
        Ok(file)
    }

    /// A fresh readahead state for `fd`, at `epoch`, with `advice` (a `POSIX_FADV_*` value).
    fn new_handle(&self, fd: i32, epoch: u64, advice: i32) -> Option<Handle> {
        let file = self.file(fd, epoch).ok()?;
        let mut handle = file.handle();
        handle.set_ra_bytes(self.ra_bytes);
        apply_advice(&mut handle, advice);
        Some(handle)
    }

    /// Runs `op` with a readahead state of the current epoch from `slots` (the one at
    /// `preferred` first; a fresh one when all are busy), and the epoch. `None`: the file is
    /// uncached or cannot be opened for the cache.
    fn with_handle<T>(
        &self,
        fd: i32,
        slots: &[Mutex<Option<(u64, Handle)>>],
        preferred: usize,
        advice: i32,
        op: impl FnOnce(&mut Handle, u64) -> T,
    ) -> Option<T> {
        if self.is_uncached() {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut guard = (0..slots.len())
            .map(|k| &slots[(preferred + k) % slots.len()])
            .find_map(|slot| slot.try_lock().ok());
        let mut fresh = None;
        let handle = match guard.as_deref_mut() {
            Some(Some((at, handle))) if *at == epoch => handle,
            Some(slot) => &mut slot.insert((epoch, self.new_handle(fd, epoch, advice)?)).1,
            None => fresh.insert(self.new_handle(fd, epoch, advice)?),
        };
        Some(op(handle, epoch))
    }

    /// Reads at `pos` through the cache. `None`: pass this read through.
    pub(crate) fn read(
        &self,
        fd: i32,
        slots: &[Mutex<Option<(u64, Handle)>>],
        preferred: usize,
        advice: i32,
        buf: &mut [u8],
        pos: u64,
    ) -> Option<Result<usize, i32>> {
        for _attempt in 0..3 {
            let (result, size, epoch) =
                self.with_handle(fd, slots, preferred, advice, |handle, epoch| {
                    (handle.read_at(buf, pos), handle.file().size(), epoch)
                })?;
            match result {
                Ok(n) if n == buf.len() => return Some(Ok(n)),
                Ok(n) => {
                    // Short: end of file as the File saw it at open. Has it moved since?
                    match kernel_size(fd) {
                        Some(real) if real == size => return Some(Ok(n)),
                        Some(_) => {
                            let _ = self.epoch.compare_exchange(
                                epoch,
                                epoch + 1,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            );
                        }
                        None => return None,
                    }
                }
                Err(error) => return Some(Err(foliocache_capi::errno_of(&error))),
            }
        }
        None
    }

    /// `readahead(2)` and `POSIX_FADV_WILLNEED`: start reading the range.
    pub(crate) fn will_need(
        &self,
        fd: i32,
        slots: &[Mutex<Option<(u64, Handle)>>],
        preferred: usize,
        advice: i32,
        offset: u64,
        len: u64,
    ) {
        self.with_handle(fd, slots, preferred, advice, |handle, _| {
            let len = if len == 0 {
                handle.file().size().saturating_sub(offset)
            } else {
                len
            };
            let _ = handle.readahead(offset, len);
        });
    }

    /// After the kernel wrote `pos..pos + len` (or changed the size, `len` = `u64::MAX`): no
    /// cached byte of the range may survive.
    pub(crate) fn written(&self, pos: u64, len: u64) {
        if self.is_uncached() || len == 0 {
            return;
        }
        stats::invalidation();
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(current) = current.as_ref() else {
            return; // nothing cached; the next File is opened after this write
        };
        let file = &current.file;
        let end = pos.saturating_add(len);
        if len == u64::MAX || end > file.size() {
            self.bump(); // the size moved: the File's size is fixed at open
            return;
        }
        let first = pos & !(LARGEST_FOLIO - 1);
        let last = end.div_ceil(LARGEST_FOLIO) * LARGEST_FOLIO;
        let (first_page, last_page) = (first / PAGE_SIZE as u64, last / PAGE_SIZE as u64 - 1);
        let left = || {
            foliocache::raw::mapping(file)
                .index()
                .next_present(first_page, last_page)
                .is_some()
        };
        file.drop_cached(first, last - first);
        if left() {
            // Reads in flight there: wait for them, then drop what they brought.
            file.wait_for_io();
            file.drop_cached(first, last - first);
            if left() {
                self.bump(); // still referenced by a reader: stop using this File
            }
        }
    }

    /// `POSIX_FADV_DONTNEED`: drop the range's idle pages.
    pub(crate) fn dont_need(&self, fd: i32, offset: u64, len: u64) {
        if self.is_uncached() {
            return;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        if let Ok(file) = self.file(fd, epoch) {
            file.drop_cached(offset, len);
        }
    }

    /// Memory of this inode's current `File` in the stats (live files at exit).
    pub(crate) fn with_file(&self, each: impl FnOnce(&File)) {
        if let Ok(current) = self.current.try_lock()
            && let Some(current) = current.as_ref()
        {
            each(&current.file);
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
fn kernel_size(fd: i32) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one stat struct into the valid local buffer.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
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
