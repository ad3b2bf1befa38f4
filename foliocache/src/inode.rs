//! The state one file shares among everyone who opened it (the kernel's inode and its
//! `address_space`): the mapping, where the bytes come from, the file's policies and its
//! counters. [`File`](crate::File) and [`Handle`](crate::Handle) are the public fronts over it;
//! the read path, readahead, faults and writes all work on an `Inode`.

use crate::core::CacheCore;
use crate::error::Error;
use crate::io::{Backend, DirectFile, FileStamp, IoCounters, WriteBackend};
use crate::mapping::Mapping;
use crate::mem::flag;
use crate::policy::Policy;
use crate::reclaim::Evictable;
use crate::stats::RaCounters;
use crate::sync::order::{self, Rank};
use crate::wbstate::WbState;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One file's shared state (see the module documentation).
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) mapping: Mapping,
    pub(crate) policy: Policy,
    pub(crate) max_order: u8,
    /// Serialises changes (writes, truncation, hole punching, fallocate): the kernel's
    /// `i_rwsem`. Readers never take it.
    write_lock: Mutex<()>,
    /// For a file of whole-file commits: held by a write from putting a folio in to raising
    /// the size, by a truncation while it changes the size, and by a commit while it takes
    /// the dirty folios and the size (so that a version's size covers its folios). Short: no
    /// one waits for memory or I/O under it, so a writer throttled under the change lock does
    /// not keep the flusher's commit of the same file out.
    size_lock: Mutex<()>,
    /// Where the bytes come from: `None` for a memory file.
    source: Option<DiskSource>,
    /// Keeps the cache (and so the arena the mapping's folios live in) alive.
    pub(crate) core: Arc<CacheCore>,
}

/// A file read from storage: its backend and its counters.
#[derive(Debug)]
pub(crate) struct DiskSource {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) io: Arc<IoCounters>,
    pub(crate) ra: RaCounters,
    /// How the file looked when last checked (at open, or by `revalidate`).
    stamp: Mutex<Option<FileStamp>>,
    /// Whether this is the cache's one shared file for its inode (only such a file may be
    /// written: a file opened apart is read only).
    shared: bool,
    /// The file's direct-I/O backend, for writes (`None` for a custom backend: read only).
    pub(crate) direct: Option<Arc<DirectFile>>,
    /// A custom backend that takes writes as whole-file commits (the same backend as
    /// `backend`), or `None`.
    pub(crate) writer: Option<Arc<dyn WriteBackend>>,
    /// Writeback state: one pass at a time, errors, when the file became dirty.
    pub(crate) wb: WbState,
}

/// The outcome of [`File::revalidate`](crate::File::revalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revalidated {
    /// Whether the file had changed on storage (size, modification or change time, identity).
    pub changed: bool,
    /// The file size after revalidation.
    pub size: u64,
    /// Cached pages dropped because they may be stale.
    pub dropped_pages: u64,
}

impl Inode {
    /// A memory file's state (no backend).
    pub(crate) fn new_memory(core: &Arc<CacheCore>, mapping: Mapping, max_order: u8) -> Arc<Self> {
        Arc::new(Self {
            mapping,
            policy: core.policy,
            max_order,
            write_lock: Mutex::new(()),
            size_lock: Mutex::new(()),
            source: None,
            core: Arc::clone(core),
        })
    }

    /// A file read from `backend`, registered with reclaim (its folios can be evicted) and, for
    /// a shared file, in its cache's file table (`table`). `direct` is the same backend when it
    /// is a file opened from storage (which can be written).
    #[allow(clippy::too_many_arguments)] // one per part of a disk file; a struct would only name them again
    pub(crate) fn new_disk(
        core: &Arc<CacheCore>,
        mapping: Mapping,
        max_order: u8,
        policy: Policy,
        backend: Arc<dyn Backend>,
        direct: Option<Arc<DirectFile>>,
        writer: Option<Arc<dyn WriteBackend>>,
        shared: bool,
        wb: WbState,
    ) -> Result<Arc<Self>, Error> {
        let stamp = backend.stamp().map_err(|source| Error::Io {
            offset: 0,
            len: 0,
            source,
        })?;
        mapping.set_size(backend.size());
        let inode = Arc::new(Self {
            mapping,
            policy,
            max_order,
            write_lock: Mutex::new(()),
            size_lock: Mutex::new(()),
            source: Some(DiskSource {
                backend,
                io: Arc::default(),
                ra: RaCounters::default(),
                stamp: Mutex::new(stamp),
                shared,
                direct,
                writer,
                wb,
            }),
            core: Arc::clone(core),
        });
        let evictable: Arc<dyn Evictable> = Arc::clone(&inode) as Arc<dyn Evictable>;
        core.reclaim
            .register(inode.mapping.id(), Arc::downgrade(&evictable));
        Ok(inode)
    }

    /// Puts back clean folios a new owner kept from a dead owner's mapping (`owner::takeover`):
    /// `(folio, page index, order)`, uptodate and in no index. Each gets a new life and goes
    /// into this file's index and on the reclaim lists, as if read from storage just now; one
    /// past the file's end, or whose place is taken, is freed. Returns the pages put back.
    #[cfg(not(loom))]
    pub(crate) fn adopt_clean(&self, folios: &[(u32, u64, u8)]) -> u64 {
        let mem = &self.core.mem;
        let end = self.mapping.size().div_ceil(crate::mem::PAGE_SIZE as u64);
        let mut pages = 0;
        let mut inserted = Vec::with_capacity(folios.len());
        // The references `add_inserted` wants held, dropped after it.
        let mut held = Vec::with_capacity(folios.len());
        for &(pfn, index, order) in folios {
            let mut folio = mem.adopt_folio(pfn, order);
            if index + (1u64 << order) > end {
                continue; // dropped: freed
            }
            folio.mark_uptodate();
            if let Ok((locked, shadow)) = self.mapping.add_folio(folio, index) {
                held.push(locked.unlock());
                inserted.push((pfn, shadow));
                pages += 1u64 << order;
            }
        }
        self.core.reclaim.add_inserted(mem, &inserted);
        drop(held);
        pages
    }

    /// Looks at the file on storage again; if it changed since it was last looked at (another
    /// program wrote or truncated it), takes the new size and drops every clean cached page (any
    /// may be stale), as the kernel's `invalidate_mapping_pages` does. Pages this cache holds
    /// dirty (not yet written back) stay: they are newer than what storage has.
    pub(crate) fn revalidate(&self) -> Result<Revalidated, Error> {
        let unchanged = |size| Revalidated {
            changed: false,
            size,
            dropped_pages: 0,
        };
        let Some(disk) = self.disk() else {
            return Ok(unchanged(self.mapping.size()));
        };
        // Serialised with this file's own changes, writeback passes included: a pass that
        // writes the last page extends the file on storage to a block boundary until it sets
        // the size back, and that size must not be taken for another program's change.
        let _changing = self.lock_changes();
        let _no_pass = disk.wb.pass_lock();
        let now = disk.backend.stamp().map_err(|source| Error::Io {
            offset: 0,
            len: 0,
            source,
        })?;
        let Some(now) = now else {
            return Ok(unchanged(self.mapping.size()));
        };
        let mut last = disk.stamp.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == Some(now) {
            return Ok(unchanged(self.mapping.size()));
        }
        if let Some(writer) = &disk.writer
            && (self.mapping.dirty_pages() + self.mapping.writeback_pages() > 0 || writer.resized())
        {
            // Changes not yet committed were made on the version in the cache: taking another
            // one under them would commit them over the other writer's (a page written in
            // part holds the old version's bytes around the write). A conflict, left as it is
            // until the changes are committed or discarded.
            return Err(Error::Io {
                offset: 0,
                len: 0,
                source: std::io::Error::from_raw_os_error(libc::ESTALE),
            });
        }
        *last = Some(now);
        // Data this cache holds dirty past the end on storage (appends not yet written back)
        // is newer than storage: the size it made stays.
        let size = if self.mapping.size() > now.size && self.holds_dirty_from(now.size) {
            self.mapping.size()
        } else {
            now.size
        };
        // Readers check the size before they look at pages: publish it first.
        self.mapping.set_size(size);
        let dropped = self
            .mapping
            .truncate_unless(.., |flags| flags & (flag::DIRTY | flag::WRITEBACK) != 0);
        disk.backend.revalidated();
        Ok(Revalidated {
            changed: true,
            size,
            dropped_pages: dropped,
        })
    }

    /// Takes out the lent descriptor (see [`File::detach_descriptor`](crate::File::detach_descriptor)).
    pub(crate) fn detach_descriptor(&self) -> Result<std::os::fd::OwnedFd, Error> {
        let disk = self.disk().ok_or(Error::NotADiskFile)?;
        let direct = disk.direct.as_ref().ok_or(Error::Detached)?;
        // No change and no writeback pass under way, and none can start meanwhile.
        let _changing = self.lock_changes();
        let _no_pass = disk.wb.pass_lock();
        let busy = self.mapping.dirty_pages() + self.mapping.writeback_pages();
        if busy > 0 {
            return Err(Error::StillDirty { pages: busy });
        }
        // Storage as it is now is what the cache holds (every change it made is on storage):
        // an attach compares with this.
        if let Ok(now) = disk.backend.stamp() {
            *disk.stamp.lock().unwrap_or_else(PoisonError::into_inner) = now;
        }
        direct.detach().ok_or(Error::Detached)
    }

    /// Attaches a descriptor again (see [`File::attach_descriptor`](crate::File::attach_descriptor)).
    pub(crate) fn attach_descriptor(
        &self,
        fd: std::os::fd::OwnedFd,
        write: bool,
    ) -> Result<Revalidated, crate::error::DescriptorRefused> {
        let refuse = |error, fd| crate::error::DescriptorRefused { error, fd };
        let Some(disk) = self.disk() else {
            return Err(refuse(Error::NotADiskFile, fd));
        };
        let Some(direct) = &disk.direct else {
            return Err(refuse(Error::NotADiskFile, fd));
        };
        if write && !disk.shared {
            return Err(refuse(Error::ReadOnly, fd));
        }
        if let Err((error, fd)) = direct.attach(fd, write) {
            return Err(refuse(error, fd));
        }
        match self.revalidate() {
            Ok(revalidated) => Ok(revalidated),
            Err(error) => {
                // Storage could not be looked at: the descriptor goes back (no I/O used it).
                let fd = direct.detach().expect("the descriptor just lent");
                Err(refuse(error, fd))
            }
        }
    }

    /// The caller wrote `offset..offset + len` on storage itself (see
    /// [`File::written_outside`](crate::File::written_outside)).
    pub(crate) fn written_outside(&self, offset: u64, len: u64) {
        let Some(disk) = self.disk() else { return };
        if len == 0 {
            return;
        }
        let end = offset.saturating_add(len);
        // Whole folios around the range: the largest this file uses.
        let span = 1u64 << self.max_order;
        let first = (offset >> crate::mem::PAGE_SHIFT) & !(span - 1);
        let last = ((end - 1) >> crate::mem::PAGE_SHIFT) | (span - 1);
        let _changing = self.lock_changes();
        if let Some(direct) = &disk.direct {
            direct.wrote_to(end);
        }
        self.mapping.drop_shadows_in(first, last);
        self.mapping.truncate_unless(first..=last, |flags| {
            flags & (flag::DIRTY | flag::WRITEBACK) != 0
        });
        if end > self.mapping.size() {
            self.mapping.set_size(end);
        }
    }

    /// The caller changed the file on storage in ways it cannot name (see
    /// [`File::changed_outside`](crate::File::changed_outside)).
    pub(crate) fn changed_outside(&self) -> Result<Revalidated, Error> {
        if let Some(disk) = self.disk() {
            *disk.stamp.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        self.revalidate()
    }

    /// Drops the file's dirty data (see [`File::discard_dirty`](crate::File::discard_dirty)).
    pub(crate) fn discard_dirty(&self, errno: i32) -> u64 {
        let Some(disk) = self.disk() else { return 0 };
        let _changing = self.lock_changes();
        let _no_pass = disk.wb.pass_lock();
        let resized = disk.writer.as_ref().is_some_and(|writer| writer.resized());
        if self.mapping.dirty_pages() == 0 && !resized {
            return 0;
        }
        let dropped = if self.mapping.dirty_pages() > 0 {
            disk.wb.errors.set(errno);
            self.mapping
                .truncate_unless(.., |flags| flags & flag::DIRTY == 0)
        } else {
            0
        };
        if let Some(writer) = &disk.writer {
            // Nothing of the changes is left: the file is the version on storage again, its
            // size included (pages past that size, zeros read where it had grown, go).
            writer.discard();
            let _sizing = self.lock_size();
            let size = disk.backend.size();
            self.mapping.set_size(size);
            self.mapping
                .truncate_unless(size.div_ceil(crate::mem::PAGE_SIZE as u64).., |_| false);
        }
        disk.wb.clear_dirtied_if(|| self.mapping.dirty_pages() == 0);
        dropped
    }

    /// Whether a folio at or past byte `pos` is dirty or under writeback.
    fn holds_dirty_from(&self, pos: u64) -> bool {
        use crate::index::Mark;
        let first = pos >> crate::mem::PAGE_SHIFT;
        [Mark::Dirty, Mark::Writeback]
            .into_iter()
            .any(|mark| self.mapping.next_marked(first, u64::MAX, mark).is_some())
    }

    /// Runs `change`, a change this cache makes to the file on storage (writeback, setting
    /// the size, fallocate, hole punching), and keeps the stamp revalidation compares with
    /// current: if storage looked as last checked before the change, the stamp after it is
    /// taken, so that the cache's own changes are not mistaken for another program's (which
    /// would drop every clean page at the next open). Callers hold the pass lock, so the
    /// cache's own changes do not interleave; another program's change made during `change` is
    /// missed, as one within a clock tick is.
    pub(crate) fn own_change<T>(&self, change: impl FnOnce() -> T) -> T {
        let Some(disk) = self.disk() else {
            return change();
        };
        if disk.writer.is_some() {
            // Nothing reaches storage but a commit, which keeps the stamp itself.
            return change();
        }
        let before = disk.backend.stamp().ok().flatten();
        let out = change();
        let after = disk.backend.stamp().ok().flatten();
        let mut last = disk.stamp.lock().unwrap_or_else(PoisonError::into_inner);
        if before.is_some() && *last == before {
            *last = after;
        }
        out
    }

    /// Takes the stamp of the version this cache's own commit just put on storage.
    pub(crate) fn committed(&self, stamp: Option<FileStamp>) {
        if let Some(disk) = self.disk() {
            *disk.stamp.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        }
    }

    /// Where reads issued now end: bytes past it are zeroed when they arrive. The smaller of
    /// the size on storage (a shorter transfer there is the end of the file, not an error) and
    /// the file's size (the bytes of a folio past the end of the file stay zero, whatever
    /// storage still holds there while a truncation is under way).
    pub(crate) fn read_limit(&self) -> u64 {
        let disk = self.disk().map_or(u64::MAX, |disk| disk.backend.size());
        disk.min(self.mapping.size())
    }

    pub(crate) fn disk(&self) -> Option<&DiskSource> {
        self.source.as_ref()
    }

    /// Whether this file may be changed through the cache: a memory file, or a file from
    /// storage opened for writing (shared: a file opened apart is read only).
    pub(crate) fn writable(&self) -> Result<(), Error> {
        match &self.source {
            None => Ok(()),
            Some(disk) if disk.writer.is_some() => Ok(()),
            Some(disk) => match &disk.direct {
                Some(direct) if disk.shared && direct.write_fd().is_ok() => Ok(()),
                _ => Err(Error::ReadOnly),
            },
        }
    }

    /// Takes the file's change lock.
    pub(crate) fn lock_changes(&self) -> Changing<'_> {
        let order = order::taking(Rank::Change);
        Changing {
            _guard: self
                .write_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            _order: order,
        }
    }
}

impl Inode {
    /// Takes the file's size lock (see `size_lock`), for a file of whole-file commits only
    /// (`None` for any other: its writeback needs no snapshot of the size).
    pub(crate) fn lock_size(&self) -> Option<order::Ordered<MutexGuard<'_, ()>>> {
        let disk = self.disk()?;
        disk.writer.as_ref()?;
        let order = order::taking(Rank::Size);
        let guard = self
            .size_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(order::Ordered::new(guard, order))
    }
}

/// The change lock, held (see [`Inode::lock_changes`]).
pub(crate) struct Changing<'a> {
    _guard: MutexGuard<'a, ()>,
    _order: order::Held,
}

impl Evictable for Inode {
    fn mapping(&self) -> &Mapping {
        &self.mapping
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if self.source.is_some() {
            self.core.reclaim.unregister(self.mapping.id());
        }
    }
}
