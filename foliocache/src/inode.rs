//! The state one file shares among everyone who opened it (the kernel's inode and its
//! `address_space`): the mapping, where the bytes come from, the file's policies and its
//! counters. [`File`](crate::File) and [`Handle`](crate::Handle) are the public fronts over it;
//! the read path, readahead, faults and writes all work on an `Inode`.

use crate::core::CacheCore;
use crate::error::Error;
use crate::io::{Backend, FileStamp, IoCounters};
use crate::mapping::Mapping;
use crate::mem::flag;
use crate::policy::Policy;
use crate::readahead::Geometry;
use crate::reclaim::Evictable;
use crate::stats::RaCounters;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// One file's shared state (see the module documentation).
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) mapping: Mapping,
    pub(crate) policy: Policy,
    pub(crate) max_order: u8,
    /// Serialises changes (writes, truncation, hole punching, fallocate): the kernel's
    /// `i_rwsem`. Readers never take it.
    write_lock: Mutex<()>,
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
    /// Where this file is registered in its cache's file table (a shared file), if it is.
    table: Option<(Arc<FileTable>, (u64, u64))>,
}

/// The files a cache has open from storage, by device and inode number: opening a file that is
/// already open gives the same [`File`](crate::File), so everyone who opens it shares one
/// cache of it, as the kernel keeps one page cache per inode.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    files: Mutex<HashMap<(u64, u64), Weak<Inode>>>,
}

impl FileTable {
    /// The open file with this identity, or the one `open` makes (registered here). The table
    /// is locked meanwhile, so two openers of one new file get one file.
    pub(crate) fn get_or_open(
        self: &Arc<Self>,
        key: (u64, u64),
        open: impl FnOnce(Option<(Arc<FileTable>, (u64, u64))>) -> Result<Arc<Inode>, Error>,
    ) -> Result<(Arc<Inode>, bool), Error> {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(inode) = files.get(&key).and_then(Weak::upgrade) {
            return Ok((inode, false));
        }
        let inode = open(Some((Arc::clone(self), key)))?;
        files.insert(key, Arc::downgrade(&inode));
        Ok((inode, true))
    }

    /// Forgets `key` if its file is gone (called as the file drops).
    fn forget(&self, key: (u64, u64)) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if files.get(&key).is_some_and(|weak| weak.strong_count() == 0) {
            files.remove(&key);
        }
    }
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
            source: None,
            core: Arc::clone(core),
        })
    }

    /// A file read from `backend`, registered with reclaim (its folios can be evicted) and, for
    /// a shared file, in its cache's file table (`table`).
    pub(crate) fn new_disk(
        core: &Arc<CacheCore>,
        mapping: Mapping,
        max_order: u8,
        policy: Policy,
        backend: Arc<dyn Backend>,
        table: Option<(Arc<FileTable>, (u64, u64))>,
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
            source: Some(DiskSource {
                backend,
                io: Arc::default(),
                ra: RaCounters::default(),
                stamp: Mutex::new(stamp),
                table,
            }),
            core: Arc::clone(core),
        });
        let evictable: Arc<dyn Evictable> = Arc::clone(&inode) as Arc<dyn Evictable>;
        core.reclaim
            .register(inode.mapping.id(), Arc::downgrade(&evictable));
        Ok(inode)
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
        let now = disk.backend.stamp().map_err(|source| Error::Io {
            offset: 0,
            len: 0,
            source,
        })?;
        let Some(now) = now else {
            return Ok(unchanged(self.mapping.size()));
        };
        // Serialised with this file's own changes.
        let _changing = self.lock_changes();
        let mut last = disk.stamp.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == Some(now) {
            return Ok(unchanged(self.mapping.size()));
        }
        *last = Some(now);
        // Readers check the size before they look at pages: publish it first.
        self.mapping.set_size(now.size);
        let dropped = self
            .mapping
            .truncate_unless(.., |flags| flags & flag::DIRTY != 0);
        Ok(Revalidated {
            changed: true,
            size: now.size,
            dropped_pages: dropped,
        })
    }

    pub(crate) fn disk(&self) -> Option<&DiskSource> {
        self.source.as_ref()
    }

    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            max_order: self.max_order,
            io_pages: self.core.io_pages,
            file_size: self.mapping.size(),
        }
    }

    /// Whether this file may be changed through the cache.
    pub(crate) fn writable(&self) -> Result<(), Error> {
        match self.source {
            None => Ok(()),
            Some(_) => Err(Error::ReadOnly),
        }
    }

    /// Takes the file's change lock.
    pub(crate) fn lock_changes(&self) -> MutexGuard<'_, ()> {
        self.write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Evictable for Inode {
    fn mapping(&self) -> &Mapping {
        &self.mapping
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if let Some(disk) = &self.source {
            self.core.reclaim.unregister(self.mapping.id());
            if let Some((table, key)) = &disk.table {
                table.forget(*key);
            }
        }
    }
}
