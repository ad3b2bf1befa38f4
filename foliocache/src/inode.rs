//! The state one file shares among everyone who opened it (the kernel's inode and its
//! `address_space`): the mapping, where the bytes come from, the file's policies and its
//! counters. [`File`](crate::File) and [`Handle`](crate::Handle) are the public fronts over it;
//! the read path, readahead, faults and writes all work on an `Inode`.

use crate::core::CacheCore;
use crate::error::Error;
use crate::io::{Backend, IoCounters};
use crate::mapping::Mapping;
use crate::policy::Policy;
use crate::readahead::Geometry;
use crate::reclaim::Evictable;
use crate::stats::RaCounters;
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

    /// A file read from `backend`, registered with reclaim (its folios can be evicted).
    pub(crate) fn new_disk(
        core: &Arc<CacheCore>,
        mapping: Mapping,
        max_order: u8,
        policy: Policy,
        backend: Arc<dyn Backend>,
    ) -> Arc<Self> {
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
            }),
            core: Arc::clone(core),
        });
        let evictable: Arc<dyn Evictable> = Arc::clone(&inode) as Arc<dyn Evictable>;
        core.reclaim
            .register(inode.mapping.id(), Arc::downgrade(&evictable));
        inode
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
        if self.source.is_some() {
            self.core.reclaim.unregister(self.mapping.id());
        }
    }
}
