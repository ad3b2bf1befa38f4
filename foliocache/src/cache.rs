//! The cache: the public front. It builds the shared core (`crate::core`) and opens files.

use crate::core::CacheCore;
use crate::dirty::{Dirty, DirtySettings, DirtyStats};
use crate::error::{DescriptorRefused, Error};
use crate::file::File;
use crate::inode::Inode;
use crate::io::{Backend, DirectFile, EngineKind, OpenOptions};
use crate::mapping::Mapping;
use crate::mem::{MAX_ORDER, METADATA_BYTES_PER_PAGE, Memory, PAGE_SHIFT, PAGE_SIZE};
use crate::opened::{FileTable, Opened};
use crate::policy::Policy;
use crate::readahead::{DEFAULT_RA_PAGES, MAX_READAHEAD_BYTES};
use crate::reclaim::{Reclaim, ReclaimStats};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Configures and builds a [`Cache`].
#[derive(Debug, Clone)]
pub struct CacheBuilder {
    capacity: u64,
    arena_pages: Option<usize>,
    max_order: u8,
    huge_pages: bool,
    prefault: bool,
    populate_ahead: bool,
    policy: Policy,
    io_engine: EngineKind,
    ra_bytes: u64,
    io_bytes: u64,
    request_bytes: usize,
    dirty: DirtySettings,
}

impl Default for CacheBuilder {
    fn default() -> Self {
        Self {
            capacity: 256 << 20,
            arena_pages: None,
            max_order: MAX_ORDER,
            huge_pages: true,
            prefault: false,
            populate_ahead: true,
            policy: Policy::default(),
            io_engine: EngineKind::Auto,
            ra_bytes: DEFAULT_RA_PAGES << PAGE_SHIFT,
            io_bytes: DEFAULT_IO_BYTES,
            request_bytes: crate::io::DEFAULT_REQUEST_BYTES,
            dirty: DirtySettings::default(),
        }
    }
}

/// The default largest readahead request (`bdi->io_pages`): 2 MiB, which is also the forced
/// path's chunk.
const DEFAULT_IO_BYTES: u64 = 2 << 20;

impl CacheBuilder {
    /// The memory budget in bytes (default 256 MiB): a hard bound on folio memory and the
    /// cache's metadata together (folio descriptors, reclaim list links, allocator words and
    /// index nodes, see [`Stats`]). The arena gets what the per-page metadata leaves, and index
    /// nodes are paid for with arena pages set aside as they grow. At least 64 KiB.
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self.arena_pages = None;
        self
    }

    /// Sizes the cache by its arena instead of a budget: exactly `pages` pages for folios, with
    /// the metadata on top and index nodes not charged to the arena. For tests and
    /// micro-benchmarks that count pages; [`capacity`](Self::capacity) is the bound to use
    /// otherwise.
    pub fn arena_pages(mut self, pages: usize) -> Self {
        self.arena_pages = Some(pages);
        self
    }

    /// The largest folio order, at most 9 (2 MiB folios; the default).
    pub fn max_order(mut self, order: u8) -> Self {
        self.max_order = order;
        self
    }

    /// Ask the kernel to back the arena with transparent huge pages (`MADV_HUGEPAGE`; on by
    /// default). Besides sparing TLB misses, huge pages make a folio run physically contiguous,
    /// so an O_DIRECT read into it reaches the disk as one segment instead of one per 4 KiB
    /// page. On this machine's virtual disk, reads into 4 KiB pages got 1.3 GiB/s and reads
    /// into huge pages 3.3 (`fcache bench readseq`, rows `device/reused-4k-pages` and
    /// `device/reused`), and foliocache's own readseq went from 2.0 to 2.5 GiB/s. Best effort:
    /// where THP is disabled the arena keeps small pages. Off: 4 KiB pages, whatever the system
    /// setting.
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Fault the whole arena in at build time (`MADV_POPULATE_WRITE`), so that first touches
    /// are not paid later (benchmarks want this).
    pub fn prefault(mut self, on: bool) -> Self {
        self.prefault = on;
        self
    }

    /// Fault the arena in ahead of the allocator, on a thread of its own (on by default): the
    /// next 16 MiB the allocator will hand out are touched before a reader needs them, so the
    /// kernel's zeroing of fresh memory is not paid inside cold reads (see `mem/populate.rs`;
    /// on this machine it was a third of db_bench's cold-read profile). The total work is the
    /// same, done on another core; once the arena was handed out whole the thread ends. Off:
    /// readers fault pages in themselves, as an O_DIRECT read into fresh memory does.
    pub fn populate_ahead(mut self, on: bool) -> Self {
        self.populate_ahead = on;
        self
    }

    /// The policies.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The I/O engine for files opened from storage (default: io_uring when available, else a
    /// thread pool).
    pub fn io_engine(mut self, kind: EngineKind) -> Self {
        self.io_engine = kind;
        self
    }

    /// The default maximum readahead window of files opened from this cache, in bytes
    /// (rounded down to pages; 0 disables readahead). Default 128 KiB, the kernel's
    /// `VM_READAHEAD_PAGES`; a handle can change it ([`crate::Handle::set_ra_bytes`]). At most
    /// [`MAX_READAHEAD_BYTES`](crate::MAX_READAHEAD_BYTES) (1 GiB): `build` refuses more (a
    /// window is planned one folio slot per page before it is read).
    pub fn readahead_bytes(mut self, bytes: u64) -> Self {
        self.ra_bytes = bytes;
        self
    }

    /// The largest single read readahead submits, in bytes (rounded down to pages, at least
    /// one page; default 128 KiB): a window is split into requests of this size. At most
    /// 64 MiB: `build` refuses more.
    pub fn io_request_bytes(mut self, bytes: usize) -> Self {
        self.request_bytes = bytes;
        self
    }

    /// The device's largest useful request in bytes (the kernel's `bdi->io_pages`): a read
    /// larger than the window may read up to this much at once, and `readahead()` reads at
    /// most the larger of this and the window. Default 2 MiB, at most
    /// [`MAX_READAHEAD_BYTES`](crate::MAX_READAHEAD_BYTES).
    pub fn max_io_bytes(mut self, bytes: u64) -> Self {
        self.io_bytes = bytes;
        self
    }

    /// The share of the arena dirty data may reach before background writeback starts
    /// (default 0.10, the kernel's `dirty_background_ratio`). In `(0, 1]`; at or above
    /// [`dirty_ratio`](Self::dirty_ratio) it is taken as half of it, as the kernel does.
    pub fn dirty_background_ratio(mut self, ratio: f64) -> Self {
        self.dirty.background_ratio = ratio;
        self
    }

    /// The share of the arena dirty and written-back data may reach before writers are
    /// throttled to the speed of writeback (default 0.20, the kernel's `dirty_ratio`): past
    /// halfway between the background ratio and this one writers pause, at it they wait. In
    /// `(0, 1]`.
    pub fn dirty_ratio(mut self, ratio: f64) -> Self {
        self.dirty.ratio = ratio;
        self
    }

    /// How long data may stay dirty before the flusher writes it out (default 30 s, the
    /// kernel's `dirty_expire_centisecs`; per file, from when it became dirty).
    pub fn dirty_expire(mut self, after: std::time::Duration) -> Self {
        self.dirty.expire = after;
        self
    }

    /// How often the flusher wakes to look for expired and excess dirty data (default 5 s,
    /// the kernel's `dirty_writeback_centisecs`). At least 1 ms.
    pub fn writeback_interval(mut self, every: std::time::Duration) -> Self {
        self.dirty.interval = every;
        self
    }

    /// Write-behind (default 4 MiB; 0 turns it off): once a [`Handle`](crate::Handle) writing
    /// sequentially has this many bytes dirty behind it, the flusher starts writing them, so
    /// that a stream's writeback overlaps its writes instead of waiting for the next sync, the
    /// background threshold or the expiry (the kernel has no such thing: it is off there).
    /// Only 2 MiB units the stream wrote whole are handed off, so the folio being filled is
    /// not; random writes and `File::write_at` never trigger it. Rounded up to 2 MiB; at
    /// most [`MAX_READAHEAD_BYTES`](crate::MAX_READAHEAD_BYTES).
    pub fn write_behind_bytes(mut self, bytes: u64) -> Self {
        self.dirty.write_behind = bytes;
        self
    }

    /// Builds the cache. Errors: a capacity that is zero, not a page multiple or above 16 TiB;
    /// a max order above 9; the arena mapping failing.
    pub fn build(self) -> Result<Cache, Error> {
        let page = PAGE_SIZE as u64;
        let per_page = page + METADATA_BYTES_PER_PAGE as u64;
        let (pages, capacity, charge_index) = match self.arena_pages {
            Some(pages) => {
                if pages == 0 || pages as u64 >= u64::from(u32::MAX) {
                    return Err(Error::InvalidCapacity((pages as u64).saturating_mul(page)));
                }
                (pages, pages as u64 * per_page, false)
            }
            None => {
                if self.capacity < MIN_CAPACITY
                    || !self.capacity.is_multiple_of(page)
                    || self.capacity / page >= u64::from(u32::MAX)
                {
                    return Err(Error::InvalidCapacity(self.capacity));
                }
                let pages = (self.capacity - FIXED_METADATA_BYTES) / per_page;
                (pages as usize, self.capacity, true)
            }
        };
        self.policy.validate()?;
        for (name, ratio) in [
            ("dirty_background_ratio", self.dirty.background_ratio),
            ("dirty_ratio", self.dirty.ratio),
        ] {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return Err(Error::InvalidRatio { name, ratio });
            }
        }
        if self.dirty.interval < std::time::Duration::from_millis(1) {
            return Err(Error::InvalidSetting {
                name: "writeback_interval (ms)",
                value: self.dirty.interval.as_millis() as u64,
                max: u64::MAX,
            });
        }
        let setting = |name: &'static str, value: u64, max: u64| {
            if value > max {
                Err(Error::InvalidSetting { name, value, max })
            } else {
                Ok(())
            }
        };
        setting("readahead_bytes", self.ra_bytes, MAX_READAHEAD_BYTES)?;
        setting("max_io_bytes", self.io_bytes, MAX_READAHEAD_BYTES)?;
        setting(
            "write_behind_bytes",
            self.dirty.write_behind,
            MAX_READAHEAD_BYTES,
        )?;
        let mut dirty = self.dirty;
        dirty.write_behind = dirty
            .write_behind
            .next_multiple_of(crate::dirty::WRITE_BEHIND_ALIGN);
        setting(
            "io_request_bytes",
            self.request_bytes as u64,
            MAX_REQUEST_BYTES,
        )?;
        if self.max_order > MAX_ORDER {
            return Err(Error::OrderTooLarge {
                order: self.max_order,
                max: MAX_ORDER,
            });
        }
        let mem = Memory::new(
            pages,
            self.max_order,
            self.huge_pages,
            self.policy.refcount,
            charge_index,
            self.populate_ahead && !self.prefault,
        )?;
        if self.prefault {
            mem.prefault().map_err(Error::Prefault)?;
        }
        Ok(Cache {
            files: Arc::default(),
            inner: Arc::new(CacheCore {
                mem: Arc::new(mem),
                policy: self.policy,
                capacity,
                reclaim: Reclaim::new(self.policy.reclaim, pages as u64),
                dirty: Dirty::new(dirty, pages as u64),
                engine_kind: self.io_engine,
                engine: OnceLock::new(),
                ra_pages: self.ra_bytes >> PAGE_SHIFT,
                io_pages: (self.io_bytes >> PAGE_SHIFT).max(1),
                request_bytes: (self.request_bytes & !(PAGE_SIZE - 1)).max(PAGE_SIZE),
            }),
        })
    }
}

/// The largest single read request (`io_request_bytes`): 64 MiB.
const MAX_REQUEST_BYTES: u64 = 64 << 20;

/// The smallest budget [`CacheBuilder::capacity`] accepts.
const MIN_CAPACITY: u64 = 64 << 10;

/// What the budget sets aside for metadata that does not grow with the arena (the allocator's
/// per-thread caches and free-list heads, the lists' heads, the reserve's own vector).
const FIXED_METADATA_BYTES: u64 = 16 << 10;

/// Memory statistics of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// The memory budget in bytes (with [`CacheBuilder::arena_pages`]: the arena plus its
    /// per-page metadata).
    pub capacity_bytes: u64,
    /// Pages in the arena.
    pub total_pages: u64,
    /// Pages not allocated to any folio.
    pub free_pages: u64,
    /// Pages freed but waiting for optimistic readers that might still be copying them to
    /// finish (a grace period) before they can be allocated again.
    pub pending_free_pages: u64,
    /// Bytes of folio descriptors (one per page).
    pub folio_table_bytes: u64,
    /// Bytes of the reclaim lists' links and the allocator's per-page words.
    pub list_and_allocator_bytes: u64,
    /// Bytes of index nodes (every mapping's), allocated and not yet freed.
    pub index_node_bytes: u64,
    /// Arena pages set aside (and discarded) to pay for the index nodes; 0 when the cache was
    /// sized with [`CacheBuilder::arena_pages`], which does not charge nodes.
    pub index_reserve_pages: u64,
    /// The largest folio order.
    pub max_order: u8,
    /// Times the allocator's shared free lists were locked (order-0 traffic mostly stays in
    /// per-thread caches and takes it once per batch).
    pub zone_lock_acquisitions: u64,
    /// Bytes of the arena faulted in ahead of the allocator by its populator
    /// ([`CacheBuilder::populate_ahead`]).
    pub populated_ahead_bytes: u64,
    /// Dirty memory: pages dirty and under writeback, the thresholds, pages written back.
    pub dirty: DirtyStats,
}

impl Stats {
    /// The bytes the budget counts: the arena, the per-page metadata, the fixed metadata, and
    /// whatever the index nodes take beyond the arena pages set aside for them. At most
    /// `capacity_bytes` for a cache built with a budget ([`CacheBuilder::capacity`]).
    pub fn accounted_bytes(&self) -> u64 {
        let nodes_unpaid = self
            .index_node_bytes
            .saturating_sub(self.index_reserve_pages * PAGE_SIZE as u64);
        self.total_pages * PAGE_SIZE as u64
            + self.folio_table_bytes
            + self.list_and_allocator_bytes
            + FIXED_METADATA_BYTES
            + nodes_unpaid
    }
}

/// A page cache in user space: a bounded arena of folios and the mappings that index them.
#[derive(Debug, Clone)]
pub struct Cache {
    inner: Arc<CacheCore>,
    /// The files opened from storage, by identity (shared among their openers).
    files: Arc<FileTable>,
}

static NEXT_MAPPING_ID: AtomicU64 = AtomicU64::new(1);

impl Cache {
    /// A builder with the defaults.
    pub fn builder() -> CacheBuilder {
        CacheBuilder::default()
    }

    /// The policies this cache runs with.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// Creates a new, empty mapping (one file's index).
    pub(crate) fn new_mapping(&self) -> Mapping {
        Mapping::new(
            Arc::clone(&self.inner.mem),
            Arc::clone(self.inner.reclaim.shadow_count()),
            Arc::clone(&self.inner.dirty.pages),
            NEXT_MAPPING_ID.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// Creates an empty memory file (data lives only in the cache, like tmpfs) whose folios
    /// are at most `max_order` (0: 4 KiB pages only, like tmpfs `huge=never`; 9: up to 2 MiB,
    /// like `huge=always`).
    pub fn create_memory_file(&self, max_order: u8) -> Result<File, Error> {
        let max = self.inner.mem.max_order;
        if max_order > max {
            return Err(Error::OrderTooLarge {
                order: max_order,
                max,
            });
        }
        let inode = Inode::new_memory(&self.inner, self.new_mapping(), max_order);
        Ok(File::from_opened(Opened::apart(inode)))
    }

    /// Opens a file from storage for reading through this cache, with O_DIRECT (see
    /// [`open_with`](Self::open_with) for the options). The file is read only, and its size is
    /// taken at open: changes made to it by others later are not seen.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<File, Error> {
        self.open_with(path, OpenOptions::new())
    }

    /// Opens a file from storage with options (a buffered fallback for file systems without
    /// direct I/O, a folio order limit, a file of its own).
    ///
    /// A file the cache already has open (the same device and inode) is shared: the same
    /// [`File`] comes back, revalidated unless asked not to ([`OpenOptions::revalidate`]). Its
    /// layout options (`max_order`, `insert_policy`) were fixed when it was first opened;
    /// asking for others is [`Error::OpenConflict`] (open it apart with
    /// [`OpenOptions::shared`]`(false)` to compare layouts on one file).
    pub fn open_with(&self, path: impl AsRef<Path>, options: OpenOptions) -> Result<File, Error> {
        let path = path.as_ref();
        let max_order = self.checked_order(options.max_order)?;
        let mut policy = self.inner.policy;
        if let Some(insert) = options.insert {
            policy.insert = insert;
        }
        if options.create {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|source| Error::Open {
                    path: path.to_owned(),
                    source,
                })?;
        }
        let engine = self.inner.engine()?;
        let open = |shared| -> Result<Arc<Inode>, Error> {
            let direct = Arc::new(DirectFile::open(path, options, Arc::clone(&engine))?);
            Inode::new_disk(
                &self.inner,
                self.new_mapping(),
                max_order,
                policy,
                Arc::clone(&direct) as Arc<dyn Backend>,
                Some(direct),
                shared,
            )
        };
        if !options.shared {
            if options.write {
                return Err(Error::OpenConflict {
                    path: path.to_owned(),
                    reason: "a file opened apart (shared(false)) is read only".to_owned(),
                });
            }
            let inode = open(false)?;
            return Ok(File::from_opened(Opened::apart(inode)));
        }
        let meta = std::fs::metadata(path).map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
        let key = (meta.dev(), meta.ino());
        let (opened, created) = self.files.get_or_open(key, || open(true))?;
        let inode = &opened.inode;
        if !created {
            if inode.max_order != max_order || inode.policy.insert != policy.insert {
                return Err(Error::OpenConflict {
                    path: path.to_owned(),
                    reason: format!(
                        "it is open in this cache with max_order {} and {:?} insertion",
                        inode.max_order, inode.policy.insert
                    ),
                });
            }
            if options.revalidate {
                inode.revalidate()?;
            }
        }
        if options.write {
            let direct = inode
                .disk()
                .and_then(|disk| disk.direct.as_ref())
                .ok_or(Error::ReadOnly)?;
            direct.enable_writes()?;
        }
        let file = File::from_opened(opened);
        if options.truncate {
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Opens a file from a descriptor the caller opened and lends to the cache: the file is read
    /// (and, with [`OpenOptions::write`], written) through it, with O_DIRECT if the descriptor
    /// has it, else buffered with `RWF_DONTCACHE` where the kernel offers it (Linux 6.14; the
    /// kernel then keeps no second copy of the pages). A descriptor opened write-only serves
    /// writes only: a write into part of a page that is not cached goes straight to storage,
    /// since the rest of the page cannot be read.
    ///
    /// The caller decides when the descriptor is closed: [`File::detach_descriptor`] hands it
    /// back (after the transfers in flight), and [`File::attach_descriptor`] lends one again,
    /// keeping the cached pages if storage did not change meanwhile. What closing a descriptor
    /// does to the process (POSIX record locks are dropped when *any* descriptor of the file
    /// closes) is then the caller's to time, which a library living inside another program
    /// needs (the preload library does).
    ///
    /// The file is this cache's one shared file for its device and inode: a file the cache
    /// already has open is [`Error::OpenConflict`]. `buffered_fallback`, `create`, `truncate`
    /// and `revalidate` do not apply. A tmpfs file is [`Error::NoDirectIo`].
    pub fn open_descriptor(
        &self,
        fd: std::os::fd::OwnedFd,
        options: OpenOptions,
    ) -> Result<File, DescriptorRefused> {
        let refuse = |error, fd| DescriptorRefused { error, fd };
        let max_order = match self.checked_order(options.max_order) {
            Ok(order) => order,
            Err(error) => return Err(refuse(error, fd)),
        };
        let mut policy = self.inner.policy;
        if let Some(insert) = options.insert {
            policy.insert = insert;
        }
        let engine = match self.inner.engine() {
            Ok(engine) => engine,
            Err(error) => return Err(refuse(error, fd)),
        };
        let direct = match DirectFile::from_descriptor(fd, options.write, Arc::clone(&engine)) {
            Ok(direct) => Arc::new(direct),
            Err((error, fd)) => return Err(refuse(error, fd)),
        };
        let key = direct.identity();
        let path = direct.path().to_owned();
        let opened = self.files.get_or_open(key, || {
            Inode::new_disk(
                &self.inner,
                self.new_mapping(),
                max_order,
                policy,
                Arc::clone(&direct) as Arc<dyn Backend>,
                Some(Arc::clone(&direct)),
                true,
            )
        });
        let error = match opened {
            Ok((opened, true)) => return Ok(File::from_opened(opened)),
            Ok((opened, false)) => {
                drop(opened);
                Error::OpenConflict {
                    path,
                    reason: "this cache has the file open already".to_owned(),
                }
            }
            Err(error) => error,
        };
        // The descriptor goes back unclosed (nothing used it yet).
        let fd = direct.detach().expect("the descriptor just lent");
        Err(refuse(error, fd))
    }

    /// Opens a file whose bytes come from `backend` (a custom source: a test double, a remote
    /// store). `max_order` limits its folios (default: the cache's). A backend larger than
    /// [`MAX_FILE_SIZE`](crate::MAX_FILE_SIZE) is refused.
    pub fn open_backend(
        &self,
        backend: Arc<dyn Backend>,
        max_order: Option<u8>,
    ) -> Result<File, Error> {
        let max_order = self.checked_order(max_order)?;
        if backend.size() > crate::memfile::MAX_FILE_SIZE {
            return Err(Error::FileTooLarge {
                offset: backend.size(),
            });
        }
        let inode = Inode::new_disk(
            &self.inner,
            self.new_mapping(),
            max_order,
            self.inner.policy,
            backend,
            None,
            false,
        )?;
        Ok(File::from_opened(Opened::apart(inode)))
    }

    fn checked_order(&self, order: Option<u8>) -> Result<u8, Error> {
        let max = self.inner.mem.max_order;
        match order {
            None => Ok(max),
            Some(order) if order <= max => Ok(order),
            Some(order) => Err(Error::OrderTooLarge { order, max }),
        }
    }

    /// The I/O engine reading files from storage ("io_uring" or "threads (preadv)"), once a
    /// file was opened; `None` before.
    pub fn io_engine(&self) -> Option<&'static str> {
        self.inner.engine.get().map(|engine| engine.name())
    }

    /// Eviction counters.
    pub fn reclaim_stats(&self) -> ReclaimStats {
        self.inner.reclaim.stats(&self.inner.mem)
    }

    /// Evicts idle folios read from storage (oldest first) until `pages` pages were freed or
    /// none is left to evict; returns the pages freed.
    pub fn evict(&self, pages: u64) -> u64 {
        self.inner.reclaim.evict(&self.inner.mem, pages)
    }

    pub(crate) fn core(&self) -> &Arc<CacheCore> {
        &self.inner
    }

    /// Memory statistics.
    pub fn stats(&self) -> Stats {
        let mem = &self.inner.mem;
        Stats {
            capacity_bytes: self.inner.capacity,
            total_pages: mem.pages() as u64,
            free_pages: mem.free_pages() as u64,
            pending_free_pages: mem.pending_free_pages() as u64,
            folio_table_bytes: (mem.pages() * std::mem::size_of::<crate::mem::folio::FolioDesc>())
                as u64,
            list_and_allocator_bytes: (mem.pages()
                * (METADATA_BYTES_PER_PAGE - std::mem::size_of::<crate::mem::folio::FolioDesc>()))
                as u64,
            index_node_bytes: mem.nodes.bytes() as u64,
            index_reserve_pages: mem.index_reserve_pages() as u64,
            max_order: mem.max_order,
            zone_lock_acquisitions: mem.zone_lock_count(),
            populated_ahead_bytes: (mem.populated_blocks()
                * crate::mem::populate::BLOCK_PAGES
                * PAGE_SIZE) as u64,
            dirty: self.inner.dirty.stats(),
        }
    }
}
