//! Write-back mode: the program's writes go into the cache as dirty folios, written back by
//! the flusher, a sync, a flush point, a lease break or the last close. Each call answers
//! `None` when the inode is not (or no longer) served in write-back mode: the hook then does
//! what the kernel would, with the real call.

use super::{Inode, Slots, SyncKind, WriteAt, lock, now_ns};
use crate::stats;
use foliocache::{Error, File, Handle, SyncRange};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

impl Inode {
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
                // Shared cache, write-through: the kernel has the bytes before the call
                // returns, as the program's own write would have put them there (one request
                // to the owner for both).
                let wrote = if self.through_sync {
                    handle.write_to_kernel_at(piece, at)
                } else {
                    handle.write_at(piece, at)
                };
                match wrote {
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
            if self.through_sync {
                stats::written_through(done);
            } else {
                stats::written_to_cache(done);
            }
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
        if self.shared && !serving {
            // Passing through on a shared cache: the kernel has this process's writes (and
            // the shared cache's were written back at the switch).
            return None;
        }
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
        Some(result.map_err(|error| {
            super::debug(format_args!("{:?}: a sync failed: {error}", self.key));
            foliocache_capi::errno_of(&error)
        }))
    }

    /// Writes back every dirty page and waits (errors stay for the descriptions' syncs). On
    /// a shared cache this is every process's dirty data of the file, whether or not this one
    /// may write it: whatever makes this process read the file through the kernel must find
    /// the kernel holding what the shared cache acknowledged.
    pub(super) fn write_back_all(&self) {
        if let Some(handle) = lock(&self.flusher).as_mut()
            && (self.shared || handle.file().is_writable())
        {
            let _ = handle.sync_range(0, 0, SyncRange::ALL);
        }
    }

    /// A flush point: writes back the inode's dirty data and waits. Errors of this writeback
    /// are not reported here: each description learns of them at its next sync, as the
    /// kernel's descriptions do (a description opened after a flush point met an error is
    /// not told of it, see docs/PRELOAD.md).
    pub(crate) fn flush(&self) {
        if self.is_back()
            && self
                .file
                .get()
                .is_some_and(|f| self.shared || f.is_writable())
        {
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
