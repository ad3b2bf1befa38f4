//! The adapter: everything the preload library asks of foliocache, in one module. The hooks and
//! the fd table call it; none of them touches a `foliocache::File` themselves.
//!
//! An [`Inode`] is one file of the program (device and inode number), shared by all its fds.
//! It serves the file in one of two modes, chosen for the whole process by
//! `FOLIOCACHE_WRITES` (`config::Writes`).
//!
//! # Write-through (the default): write to the kernel, then invalidate
//! * The inode holds the current `foliocache::File`, opened apart (`shared(false)`, read only)
//!   from `/proc/self/fd/N` (the very inode the program opened, whatever its path does
//!   meanwhile), tagged with the inode's *epoch*.
//! * Writes go to the kernel first (the program's own fd, so the kernel's metadata, `fstat`
//!   and `lseek(SEEK_END)` stay right without interposing them); then [`Inode::written`] drops
//!   the written range (rounded out to 2 MiB, the largest folio) from the cache, waits for reads
//!   in flight there, and checks that nothing is left. A change the current `File` cannot
//!   reflect (the size moved, a folio that could not be dropped) bumps the epoch instead.
//! * A read uses a `File` only if its epoch is the inode's epoch, else opens a new one. A read
//!   that comes back short re-checks the size with `fstat` (the file may have grown) before
//!   it reports end of file.
//! * Opening a file again compares its size and modification time with what the inode saw and
//!   bumps the epoch when they differ: a change made by another program is seen after the file
//!   is opened again (revalidate on open).
//!
//! The order that makes the invalidation safe: the kernel write completes before the drop; a
//! read that inserted its folios before the drop is waited for (its folios are locked until its
//! I/O completes) and then dropped; a read that inserts after the drop submits its I/O after
//! the write completed, and O_DIRECT reads see completed buffered writes (the kernel writes the
//! range back before a direct read).
//!
//! # Write-back (`FOLIOCACHE_WRITES=back`): the cache holds the newest bytes
//! * The inode holds the cache's one *shared* `File` of the file, opened with `write(true)`
//!   once any fd of it is writable (opening it again that way makes it writable). Every open
//!   revalidates it (the library keeps dirty data across a revalidation). No epochs: the `File`
//!   is never replaced.
//! * Writes go into the cache ([`Inode::write`], `Handle::write_at`): dirty folios, written to
//!   storage by the cache's flusher, by write-behind behind sequential writers, by a sync, and
//!   when the last holder of the `File` lets go (the last fd closing). An append takes the
//!   inode's append lock and writes at the cache's size.
//! * So the kernel is *behind* until writeback: its size, its data. Everything that shows the
//!   program the file through the kernel is therefore either corrected (`fstat` and the other
//!   stat calls report [`Inode::back_view`]'s size, `lseek(SEEK_END)` uses it) or preceded by
//!   a *flush* ([`Inode::flush`]: write back and wait): `mmap`, fork, exec and the spawning
//!   calls, `SEEK_DATA`/`SEEK_HOLE`, file locks, and exit. Syncs go to the description's own
//!   handle, so each open file description is told of each writeback error once (errseq).
//! * Locks are how programs coordinate across processes: the inode is flushed before a lock
//!   or unlock, and revalidated after a lock is taken, so a program that reads under a lock
//!   sees what another wrote under it.
//!
//! # Uncached
//! An inode written through a path the library does not see (a shared writable `mmap`, a
//! `FILE` from `fdopen` for writing, an fd the table cannot hold, the program's own O_DIRECT)
//! becomes *uncached* for the rest of the process: every access passes through to the kernel.
//! Write-back mode adds the paths that read or write the kernel's copy while the cache holds
//! newer bytes: any shared mapping, any `fdopen`, streams glibc opens itself (`freopen`), and
//! fds 0 to 2 (glibc's standard streams use them with libc-internal calls).
//! In write-back mode the cache first writes everything back, under the inode's *gate* (held
//! shared by every change made through the cache, exclusively by the switch), so no write into
//! the cache can land after the last writeback. A caller that may take no lock (a hook nested
//! in another, a signal handler) only marks the switch *pending*
//! ([`Inode::mark_uncached`]); the next outer call on the inode carries it out before anything
//! else.

use crate::config::Writes;
use crate::stats;
use foliocache::{Advice, Cache, Error, File, Handle, OpenOptions, PAGE_SIZE, SyncRange};
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

/// The largest folio (2 MiB): an invalidated range is rounded out to it.
const LARGEST_FOLIO: u64 = (PAGE_SIZE as u64) << foliocache::MAX_ORDER;

/// The cache serves the inode.
const CACHED: u8 = 0;
/// It is to become uncached: the next outer call writes it back and switches.
const UNCACHE_PENDING: u8 = 1;
/// Every access passes through to the kernel.
const UNCACHED: u8 = 2;

/// Readahead (and, in write-back mode, write-behind) states of one description: (the inode's
/// epoch they belong to, the handle).
pub(crate) type Slots = [Mutex<Option<(u64, Handle)>>];

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One file of the program (device and inode number), shared by all its fds.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) key: (u64, u64),
    cache: Cache,
    ra_bytes: u64,
    /// `CACHED`, `UNCACHE_PENDING` or `UNCACHED`.
    state: AtomicU8,
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Through(Through),
    Back(Back),
}

/// Write-through state.
#[derive(Debug)]
struct Through {
    /// Bumped by every change the current `File` may not reflect.
    epoch: AtomicU64,
    /// The `File` for reads, opened at an epoch.
    current: Mutex<Option<Current>>,
    /// Size and modification time (ns) last seen by an open, for revalidation.
    seen: Mutex<(u64, i128)>,
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

/// Write-back state.
#[derive(Debug)]
struct Back {
    /// The cache's shared file.
    file: File,
    /// Held shared by every change made through the cache, exclusively while the inode
    /// becomes uncached (see the module doc).
    gate: RwLock<()>,
    /// Appenders, one at a time: each writes at the size the last one left.
    append: Mutex<()>,
    /// The handle flush points write back with. Its sync reports are dropped: errors stay
    /// for the descriptions' own handles (see [`Inode::flush`]).
    flusher: Mutex<Handle>,
    /// When a change through the cache last touched the file (ns since the epoch; 0: never),
    /// for the modification time the stat calls report.
    changed_ns: AtomicI64,
}

impl Drop for Back {
    fn drop(&mut self) {
        // The last fd is gone: what is dirty goes to storage now (the `File`'s last holder
        // would do it too; done here, it is done before the counters are taken).
        let _ = lock(&self.flusher).sync_range(0, 0, SyncRange::ALL);
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

/// Modification time in nanoseconds.
pub(crate) fn mtime_ns(st: &libc::stat) -> i128 {
    i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec)
}

/// Whether open flags allow writing.
pub(crate) fn writable(flags: i32) -> bool {
    let access = flags & libc::O_ACCMODE;
    access == libc::O_WRONLY || access == libc::O_RDWR
}

/// Opens the cache's shared `File` of the file open as `fd` (the same `File` if the cache has
/// it open already: it is then revalidated, and made writable if `write`).
fn open_shared(cache: &Cache, fd: i32, write: bool) -> Result<File, NotCached> {
    let path = format!("/proc/self/fd/{fd}");
    match cache.open_with(&path, OpenOptions::new().write(write)) {
        Ok(file) => Ok(file),
        Err(Error::NoDirectIo { .. }) => Err(NotCached::NoDirectIo),
        Err(_) => Err(NotCached::Failed),
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Inode {
    /// A new inode for the file open as `fd` with `flags` (and stat `st`), its `File` opened
    /// now. In write-back mode an `O_TRUNC` open truncates the cache's file too.
    pub(crate) fn open(
        cache: &Cache,
        fd: i32,
        st: &libc::stat,
        flags: i32,
        ra_bytes: u64,
        writes: Writes,
    ) -> Result<Self, NotCached> {
        let mode = match writes {
            Writes::Through => Mode::Through(Through {
                epoch: AtomicU64::new(0),
                current: Mutex::new(None),
                seen: Mutex::new((st.st_size as u64, mtime_ns(st))),
            }),
            Writes::Back => {
                let write = writable(flags);
                let file = open_shared(cache, fd, write)?;
                if write && flags & libc::O_TRUNC != 0 {
                    file.set_len(0).map_err(|_| NotCached::Failed)?;
                }
                stats::opened_file();
                Mode::Back(Back {
                    flusher: Mutex::new(file.handle()),
                    file,
                    gate: RwLock::new(()),
                    append: Mutex::new(()),
                    changed_ns: AtomicI64::new(0),
                })
            }
        };
        let inode = Self {
            key: (st.st_dev, st.st_ino),
            cache: cache.clone(),
            ra_bytes,
            state: AtomicU8::new(CACHED),
            mode,
        };
        if let Mode::Through(_) = inode.mode {
            inode.file(fd, 0)?;
        }
        Ok(inode)
    }

    /// The file is opened again, as `fd` with `flags` (stat `st`): revalidate on open. In
    /// write-back mode this also makes the cache's file writable if `fd` is, and carries out
    /// `O_TRUNC` in the cache. `Err`: it cannot be served any more (the caller makes it
    /// uncached).
    pub(crate) fn reopen(&self, fd: i32, st: &libc::stat, flags: i32) -> Result<(), NotCached> {
        match &self.mode {
            Mode::Through(through) => {
                let now = (st.st_size as u64, mtime_ns(st));
                let mut seen = lock(&through.seen);
                if *seen != now || flags & libc::O_TRUNC != 0 {
                    *seen = now;
                    self.bump();
                }
                Ok(())
            }
            Mode::Back(back) => {
                if !self.serving() {
                    return Ok(());
                }
                let write = writable(flags);
                let _gate = back.gate.read().unwrap_or_else(PoisonError::into_inner);
                // The same File: opening it revalidates it (and makes it writable).
                drop(open_shared(&self.cache, fd, write)?);
                if write && flags & libc::O_TRUNC != 0 {
                    // The kernel truncated at open; dirty data of the cache must go too, or
                    // writeback would bring it back.
                    back.file.set_len(0).map_err(|_| NotCached::Failed)?;
                    back.changed_ns.store(now_ns(), Ordering::Release);
                }
                Ok(())
            }
        }
    }

    /// Whether this inode runs in write-back mode.
    pub(crate) fn is_back(&self) -> bool {
        matches!(self.mode, Mode::Back(_))
    }

    /// Whether the cache serves the inode, carrying out a pending switch to uncached first.
    /// Only for outer calls (it may write back).
    fn serving(&self) -> bool {
        match self.state.load(Ordering::Acquire) {
            CACHED => true,
            UNCACHED => false,
            _ => {
                self.set_uncached();
                false
            }
        }
    }

    /// Every access passes through from now on. In write-back mode the cache's dirty data is
    /// written back first (and no write into the cache can follow it).
    pub(crate) fn set_uncached(&self) {
        match &self.mode {
            Mode::Through(through) => {
                self.mark_uncached();
                drop(lock(&through.current).take());
            }
            Mode::Back(back) => {
                let _gate = back.gate.write().unwrap_or_else(PoisonError::into_inner);
                if self.state.load(Ordering::Acquire) == UNCACHED {
                    return;
                }
                let _ = lock(&back.flusher).sync_range(0, 0, SyncRange::ALL);
                self.state.store(UNCACHED, Ordering::Release);
            }
        }
    }

    /// Every access passes through from now on, taking no lock: in write-back mode the switch
    /// is left pending for the next outer call (which writes back first); in write-through
    /// mode the current `File` is freed by the next [`set_uncached`](Self::set_uncached) or
    /// when the inode goes.
    pub(crate) fn mark_uncached(&self) {
        match &self.mode {
            Mode::Through(_) => {
                self.state.store(UNCACHED, Ordering::Release);
                self.bump();
            }
            Mode::Back(_) => {
                let _ = self.state.compare_exchange(
                    CACHED,
                    UNCACHE_PENDING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
    }

    /// After a write to the kernel made by a hook nested in another (no lock may be taken):
    /// the cache must not be used as it is. Write-through: the current `File` stops being
    /// used. Write-back: the inode becomes uncached at the next outer call (see
    /// docs/PRELOAD.md for what this means for the order of the writes).
    pub(crate) fn written_nested(&self) {
        match &self.mode {
            Mode::Through(_) => self.bump(),
            Mode::Back(_) => self.mark_uncached(),
        }
    }

    /// Write-through: the current `File` stops being used.
    pub(crate) fn bump(&self) {
        if let Mode::Through(through) = &self.mode {
            through.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn epoch(&self) -> u64 {
        match &self.mode {
            Mode::Through(through) => through.epoch.load(Ordering::Acquire),
            Mode::Back(_) => 0,
        }
    }

    /// The `File` of `epoch`: write-back mode's shared one, or (write-through) the current one,
    /// opened (from the program's `fd`) if it is older.
    fn file(&self, fd: i32, epoch: u64) -> Result<File, NotCached> {
        let through = match &self.mode {
            Mode::Back(back) => return Ok(back.file.clone()),
            Mode::Through(through) => through,
        };
        let mut current = lock(&through.current);
        if let Some(found) = current.as_ref().filter(|c| c.epoch == epoch) {
            return Ok(found.file.clone());
        }
        // Held across the open: a write that invalidates meanwhile waits for it, and then
        // drops its range from the new File too.
        let path = format!("/proc/self/fd/{fd}");
        // A File of its own, with an empty cache: this mode keeps one per inode and epoch.
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

    /// Runs `op` with a handle of the current epoch from `slots` (the one at `preferred`
    /// first; a fresh one when all are busy), and the epoch. `None`: the file is uncached or
    /// cannot be opened for the cache.
    fn with_handle<T>(
        &self,
        fd: i32,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        op: impl FnOnce(&mut Handle, u64) -> T,
    ) -> Option<T> {
        if !self.serving() {
            return None;
        }
        self.with_handle_at(fd, slots, preferred, advice, self.epoch(), op)
    }

    /// [`with_handle`](Self::with_handle) at a given epoch, without the state check.
    fn with_handle_at<T>(
        &self,
        fd: i32,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        epoch: u64,
        op: impl FnOnce(&mut Handle, u64) -> T,
    ) -> Option<T> {
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
        slots: &Slots,
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
                    // Short: end of file as the cache sees it. Has another program moved it?
                    let real = kernel_size(fd)?;
                    match &self.mode {
                        Mode::Through(through) if real != size => {
                            let _ = through.epoch.compare_exchange(
                                epoch,
                                epoch + 1,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            );
                        }
                        // Write-back: the cache's size is ahead of the kernel's while appends
                        // wait for writeback; only a kernel size beyond it is news.
                        Mode::Back(back) if real > size => {
                            if back.file.revalidate().is_err() {
                                return Some(Ok(n));
                            }
                        }
                        _ => return Some(Ok(n)),
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
        slots: &Slots,
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

    /// Write-through: after the kernel wrote `pos..pos + len` (or changed the size, `len` =
    /// `u64::MAX`), no cached byte of the range may survive.
    pub(crate) fn written(&self, pos: u64, len: u64) {
        let Mode::Through(through) = &self.mode else {
            return;
        };
        if self.state.load(Ordering::Acquire) == UNCACHED || len == 0 {
            return;
        }
        stats::invalidation();
        let current = lock(&through.current);
        let Some(current) = current.as_ref() else {
            return; // nothing cached; the next File is opened after this write
        };
        let file = &current.file;
        let end = pos.saturating_add(len);
        if len == u64::MAX || end > file.size() {
            self.bump(); // the size moved: the File's size is fixed at open
            return;
        }
        if !drop_range(file, pos, end) {
            self.bump(); // still referenced by a reader: stop using this File
        }
    }

    /// `POSIX_FADV_DONTNEED`: drop the range's idle pages (dirty ones are written first).
    pub(crate) fn dont_need(&self, fd: i32, offset: u64, len: u64) {
        if !self.serving() {
            return;
        }
        if let Ok(file) = self.file(fd, self.epoch()) {
            file.drop_cached(offset, len);
        }
    }

    /// Memory of this inode's `File` in the stats (live files at exit).
    pub(crate) fn with_file(&self, each: impl FnOnce(&File)) {
        match &self.mode {
            Mode::Through(through) => {
                if let Ok(current) = through.current.try_lock()
                    && let Some(current) = current.as_ref()
                {
                    each(&current.file);
                }
            }
            Mode::Back(back) => each(&back.file),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Write-back mode. Each call answers `None` when the inode is not (or no longer) served in
    // write-back mode: the hook then does what the kernel would, with the real call.

    /// The write-back state, if the cache serves the inode in write-back mode.
    fn back(&self) -> Option<&Back> {
        match &self.mode {
            Mode::Back(back) if self.serving() => Some(back),
            _ => None,
        }
    }

    /// A change through the cache happened now.
    fn changed(back: &Back) {
        back.changed_ns.store(now_ns(), Ordering::Release);
    }

    /// Writes `pieces` (consecutive in the file) into the cache at `at`, with the handle of
    /// `slots` that this thread prefers (its write-behind stream). Returns where the write
    /// went and how many bytes it took (fewer than asked only after an error, as the kernel),
    /// or the errno.
    pub(crate) fn write(
        &self,
        slots: &Slots,
        preferred: usize,
        advice: i32,
        pieces: &[&[u8]],
        at: WriteAt,
    ) -> Option<Result<(u64, usize), i32>> {
        let back = self.back()?;
        let _gate = back.gate.read().unwrap_or_else(PoisonError::into_inner);
        if self.state.load(Ordering::Acquire) == UNCACHED {
            return None;
        }
        // Appenders one at a time, each at the size the last one left.
        let _append = matches!(at, WriteAt::Append).then(|| lock(&back.append));
        let pos = match at {
            WriteAt::Pos(pos) => pos,
            WriteAt::Append => back.file.size(),
        };
        let (done, error) = self.with_handle_at(-1, slots, preferred, advice, 0, |handle, _| {
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
            Self::changed(back);
            stats::written_to_cache(done);
        }
        Some(match (done, error) {
            (0, Some(errno)) => Err(errno),
            (done, _) => Ok((pos, done as usize)),
        })
    }

    /// Before a write through a description another process may hold (inherited by a fork
    /// or a new program): look at the file on storage again, since that process writes
    /// through the kernel.
    pub(crate) fn revalidate(&self) {
        if let Some(back) = self.back() {
            let _ = back.file.revalidate();
        }
    }

    /// An append through a description another process may hold: it must go through the
    /// kernel (only the kernel's append is atomic across processes). The cache is written
    /// back first, so the kernel's end of file is the program's; `kernel_write` does the
    /// append, and the file is revalidated after it.
    pub(crate) fn append_through_kernel(
        &self,
        kernel_write: impl FnOnce() -> isize,
    ) -> Option<isize> {
        let back = self.back()?;
        let _gate = back.gate.read().unwrap_or_else(PoisonError::into_inner);
        if self.state.load(Ordering::Acquire) == UNCACHED {
            return None;
        }
        let _append = lock(&back.append);
        let _ = lock(&back.flusher).sync_range(0, 0, SyncRange::ALL);
        let n = kernel_write();
        if n > 0 {
            stats::written_through(n as u64);
            let _ = back.file.revalidate();
        }
        Some(n)
    }

    /// A handle for a new open file description's syncs (write-back mode): it samples the
    /// file's writeback errors now, as the kernel does at open.
    pub(crate) fn sync_handle(&self) -> Option<Handle> {
        match &self.mode {
            Mode::Back(back) => Some(back.file.handle()),
            Mode::Through(_) => None,
        }
    }

    /// `fsync`, `fdatasync`, `sync_file_range` with the description's handle: its writeback
    /// errors are reported to it once each. `None` also when the cache's file was never
    /// writable (nothing of the cache's to write: the kernel syncs what it has).
    pub(crate) fn sync(
        &self,
        handle: &Mutex<Option<Handle>>,
        kind: SyncKind,
    ) -> Option<Result<(), i32>> {
        let back = self.back()?;
        if !back.file.is_writable() {
            return None;
        }
        let mut slot = lock(handle);
        let handle = slot.get_or_insert_with(|| back.file.handle());
        let result = match kind {
            SyncKind::All => handle.sync_all(),
            SyncKind::Data => handle.sync_data(),
            SyncKind::Range { offset, len, flags } => handle.sync_range(offset, len, flags),
        };
        stats::synced();
        Some(result.map_err(|error| foliocache_capi::errno_of(&error)))
    }

    /// A flush point: writes back the inode's dirty data and waits. Errors of this writeback
    /// are not reported here: each description learns of them at its next sync, as the
    /// kernel's descriptions do (a description opened after a flush point met an error is
    /// not told of it, see docs/PRELOAD.md).
    pub(crate) fn flush(&self) {
        if let Mode::Back(back) = &self.mode
            && self.state.load(Ordering::Acquire) != UNCACHED
        {
            let _ = lock(&back.flusher).sync_range(0, 0, SyncRange::ALL);
            stats::flushed();
        }
    }

    /// Runs a change in the cache's file under the gate; `None` if the inode is not served
    /// in write-back mode or its file is not writable (the kernel then refuses or does it).
    fn change(&self, op: impl FnOnce(&File) -> Result<(), Error>) -> Option<Result<(), i32>> {
        let back = self.back()?;
        let _gate = back.gate.read().unwrap_or_else(PoisonError::into_inner);
        if self.state.load(Ordering::Acquire) == UNCACHED || !back.file.is_writable() {
            return None;
        }
        let result = op(&back.file);
        Self::changed(back);
        Some(result.map_err(|error| foliocache_capi::errno_of(&error)))
    }

    /// `ftruncate`, `truncate`: the cache's `File::set_len` (which sets the size on storage).
    pub(crate) fn set_len(&self, len: u64) -> Option<Result<(), i32>> {
        self.change(|file| file.set_len(len))
    }

    /// `fallocate` without flags, `posix_fallocate`.
    pub(crate) fn fallocate(&self, offset: u64, len: u64) -> Option<Result<(), i32>> {
        self.change(|file| file.fallocate(offset, len))
    }

    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
    pub(crate) fn punch_hole(&self, offset: u64, len: u64) -> Option<Result<(), i32>> {
        self.change(|file| file.punch_hole(offset, len))
    }

    /// A change the cache cannot make itself (the other `fallocate` modes, a `truncate` by
    /// path whose file the cache may not write): everything is written back, `kernel` does it,
    /// and if `done(&result)` the cache takes the file as it is on storage now: revalidated
    /// (a new size), and `offset..end` dropped. A range that cannot be dropped (a reader holds
    /// it) makes the inode uncached. Without write-back mode, just `kernel()`.
    pub(crate) fn around_kernel<T>(
        &self,
        offset: u64,
        end: u64,
        kernel: impl FnOnce() -> T,
        done: impl FnOnce(&T) -> bool,
    ) -> T {
        let Some(back) = self.back() else {
            return kernel();
        };
        let gate = back.gate.read().unwrap_or_else(PoisonError::into_inner);
        let _ = lock(&back.flusher).sync_range(0, 0, SyncRange::ALL);
        let out = kernel();
        if done(&out) {
            let _ = back.file.revalidate();
            let end = end.min(back.file.size().next_multiple_of(LARGEST_FOLIO));
            let dropped = offset >= end || drop_range(&back.file, offset, end);
            Self::changed(back);
            drop(gate);
            if !dropped {
                self.set_uncached();
            }
        }
        out
    }

    /// The size the program's writes made and when they last changed the file (ns since the
    /// epoch; 0: never), for an inode served in write-back mode. Takes no lock (the stat
    /// calls and `lseek` ask, nested or not).
    pub(crate) fn back_view(&self) -> Option<(u64, i64)> {
        match &self.mode {
            Mode::Back(back) if self.state.load(Ordering::Acquire) != UNCACHED => {
                Some((back.file.size(), back.changed_ns.load(Ordering::Acquire)))
            }
            _ => None,
        }
    }
}

/// Drops `pos..end` (rounded out to the largest folio) from `file`'s cache, waiting for reads
/// in flight there; whether nothing is left.
fn drop_range(file: &File, pos: u64, end: u64) -> bool {
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
        return !left();
    }
    true
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
