//! The cache: the public front. It builds the shared core (`crate::core`) and opens files.

use crate::core::CacheCore;
use crate::dirty::{Dirty, DirtySettings, DirtyStats};
use crate::error::{DescriptorRefused, Error};
use crate::file::File;
use crate::inode::Inode;
use crate::io::{Backend, DirectFile, EngineKind, OpenOptions};
use crate::mapping::Mapping;
#[cfg(not(loom))]
use crate::mem::records::Records;
use crate::mem::{MAX_ORDER, METADATA_BYTES_PER_PAGE, Memory, PAGE_SHIFT, PAGE_SIZE};
use crate::opened::{FileTable, Opened};
use crate::policy::Policy;
use crate::readahead::{DEFAULT_RA_PAGES, MAX_READAHEAD_BYTES};
use crate::reclaim::{Reclaim, ReclaimStats};
/// Under loom there are no shared caches.
#[cfg(loom)]
type Records = ();
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
    place_by_offset: bool,
    policy: Policy,
    io_engine: EngineKind,
    ra_bytes: u64,
    io_bytes: u64,
    request_bytes: usize,
    dirty: DirtySettings,
    /// A shared cache's name (`None`: a private cache).
    shared: Option<String>,
    /// Where the owner program is (shared caches).
    owner_program: Option<std::path::PathBuf>,
    /// How long a shared cache's owner waits for a client after the last one left.
    idle_timeout: std::time::Duration,
}

/// The default time a shared cache stays once its last process has left: 10 minutes.
pub(crate) const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl Default for CacheBuilder {
    fn default() -> Self {
        Self {
            capacity: 256 << 20,
            arena_pages: None,
            max_order: MAX_ORDER,
            huge_pages: true,
            prefault: false,
            populate_ahead: true,
            place_by_offset: false,
            policy: Policy::default(),
            io_engine: EngineKind::Auto,
            ra_bytes: DEFAULT_RA_PAGES << PAGE_SHIFT,
            io_bytes: DEFAULT_IO_BYTES,
            request_bytes: crate::io::DEFAULT_REQUEST_BYTES,
            dirty: DirtySettings::default(),
            shared: None,
            owner_program: None,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
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

    /// Place a random reader's 4 KiB folios by their offset in the file (off by default; a
    /// private cache's files from storage only). Each 64 KiB of a file that small fills reach
    /// gets a block of the arena, and page `i` goes to offset `i % 16` in it; a random read then
    /// asks for its folio's bytes before it walks the index, and a read spanning two pages
    /// finds them side by side. Worth it for a reader that goes on to read most of the file at
    /// random (a database's table files: the cache's serving of db_bench's warm random reads
    /// took about 15% less CPU). It costs memory for a sparse one: the blocks' unused pages
    /// are held until memory runs out ([`Stats::placed_unused_pages`]), and with huge pages
    /// the blocks spread the cache's data over more of the arena, so the process's resident
    /// memory reaches the capacity sooner. See docs/BENCHMARKS.md, "Pages placed by their
    /// offset".
    pub fn place_by_offset(mut self, on: bool) -> Self {
        self.place_by_offset = on;
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
    /// one page; default 512 KiB): a window is split into requests of this size. At most
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

    /// Makes the cache a shared one named `name` (1 to 64 letters, digits, `.`, `_`, `-`):
    /// every process of this user that builds a cache with this name gets the same cache, as
    /// every process gets the kernel's page cache (`docs/SHARED.md`). The first one's settings
    /// make it; later ones attach to it as it is ([`Cache::policy`] and [`Cache::stats`] say
    /// what it is). Its owner process is started if none runs (see
    /// [`owner_program`](Self::owner_program)). Without this, the cache is private to the
    /// process (the default).
    pub fn shared(mut self, name: impl Into<String>) -> Self {
        self.shared = Some(name.into());
        self
    }

    /// The owner program a shared cache starts when none runs (default: `FOLIOCACHE_OWNER`,
    /// else `foliocache-owner` next to this program or on `PATH`).
    pub fn owner_program(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.owner_program = Some(path.into());
        self
    }

    /// How long a shared cache's owner keeps it (and its memory) once the last process has
    /// left, waiting for the next (default 10 minutes; `FOLIOCACHE_IDLE_SECS` in the owner's
    /// environment wins). Dirty data is written back as soon as the last process leaves.
    pub fn idle_timeout(mut self, after: std::time::Duration) -> Self {
        self.idle_timeout = after;
        self
    }

    /// Builds the cache. Errors: a capacity that is zero, not a page multiple or above 16 TiB,
    /// or (a shared cache) below what its mapping's fixed part and 512 pages take
    /// ([`Error::SharedCapacityTooSmall`] names the floor); a max order above 9; the arena
    /// mapping failing.
    pub fn build(self) -> Result<Cache, Error> {
        let checked = self.check()?;
        // The epochs choose their barrier now, before this cache starts threads of its own:
        // registering for `membarrier` costs microseconds in a process with one thread and a
        // grace period of the kernel's (about 12 ms measured) in one with several.
        let _ = crate::mem::epoch::barrier();
        #[cfg(not(loom))]
        if let Some(name) = &self.shared {
            // Refused here, with the floor named, rather than by the owner this may start.
            self.shared_shape()?;
            let settings = self.shared_settings(&checked)?;
            let attachment = crate::shared::client::Attachment::attach(
                name,
                settings,
                self.owner_program.clone(),
                crate::readahead::MAX_READAHEAD_BYTES >> PAGE_SHIFT,
            )?;
            return Ok(Cache {
                repr: Repr::Client(attachment),
            });
        }
        let mem = Memory::new(
            checked.pages,
            self.max_order,
            self.huge_pages,
            self.policy.refcount,
            checked.charge_index,
            self.populate_ahead && !self.prefault,
        )?;
        if self.prefault {
            mem.prefault().map_err(Error::Prefault)?;
        }
        Ok(self.assemble(mem, checked, None))
    }

    /// The cache around `mem`, with the settings `checked` holds.
    fn assemble(&self, mut mem: Memory, checked: Checked, records: Option<Arc<Records>>) -> Cache {
        let pages = mem.pages() as u64;
        mem.set_placing(self.place_by_offset);
        Cache {
            repr: Repr::Local(Local {
                files: Arc::default(),
                records,
                inner: Arc::new(CacheCore {
                    mem: Arc::new(mem),
                    policy: self.policy,
                    capacity: checked.capacity,
                    reclaim: Reclaim::new(self.policy.reclaim, pages),
                    dirty: Dirty::new(checked.dirty, pages),
                    engine_kind: self.io_engine,
                    engine: OnceLock::new(),
                    ra_pages: self.ra_bytes >> PAGE_SHIFT,
                    io_pages: (self.io_bytes >> PAGE_SHIFT).max(1),
                    request_bytes: (self.request_bytes & !(PAGE_SIZE - 1)).max(PAGE_SIZE),
                }),
            }),
        }
    }

    /// Checks every setting; the arena's size and the dirty settings as the cache takes them.
    fn check(&self) -> Result<Checked, Error> {
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
                // A folio table in huge pages of its own is rounded up to whole huge pages:
                // the budget pays for the rounding too. Each pass that does not fit lowers
                // `pages`, and a small enough table has no rounding, so this ends.
                let room = self.capacity - FIXED_METADATA_BYTES;
                let mut pages = room / per_page;
                loop {
                    let rounding =
                        crate::mem::table_rounding_bytes(pages as usize, self.huge_pages) as u64;
                    if pages * per_page + rounding <= room {
                        break;
                    }
                    pages = room.saturating_sub(rounding) / per_page;
                }
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
        Ok(Checked {
            pages,
            capacity,
            charge_index,
            dirty,
        })
    }
}

#[cfg(not(loom))]
impl CacheBuilder {
    /// The settings words a shared cache is created with (`shared::settings`).
    fn shared_settings(
        &self,
        checked: &Checked,
    ) -> Result<[u64; crate::mem::shared::SETTINGS_WORDS], Error> {
        use crate::policy::{InsertPolicy, ReadPolicy, ReclaimPolicy, SmallReadPolicy};
        use crate::policy::{RefcountPolicy, WritebackErrorPolicy};
        use crate::shared::settings as w;
        if self.arena_pages.is_some() {
            return Err(Error::Unsupported {
                what: "arena_pages (size a shared cache with capacity)",
                mode: "shared",
            });
        }
        let p = &self.policy;
        let mut words = [0u64; crate::mem::shared::SETTINGS_WORDS];
        words[w::CAPACITY] = checked.capacity;
        words[w::MAX_ORDER] = u64::from(self.max_order);
        words[w::HUGE_PAGES] = u64::from(self.huge_pages);
        words[w::REFCOUNT] = match p.refcount {
            RefcountPolicy::FrozenBit => 0,
            RefcountPolicy::Cas => 1,
        };
        words[w::READ] = match p.read {
            ReadPolicy::Batched => 0,
            ReadPolicy::PerFolio => 1,
        };
        words[w::SMALL_READ] = match p.small_read {
            SmallReadPolicy::Optimistic => 0,
            SmallReadPolicy::Refcounted => 1,
        };
        words[w::INSERT] = match p.insert {
            InsertPolicy::Batched => 0,
            InsertPolicy::Single => 1,
        };
        words[w::EXEC_ORDER] = u64::from(p.exec_order);
        words[w::RECLAIM] = match p.reclaim {
            ReclaimPolicy::Workingset => 0,
            ReclaimPolicy::TwoLists => 1,
            ReclaimPolicy::Clock => 2,
        };
        words[w::WRITEBACK_ERROR] = match p.writeback_error {
            WritebackErrorPolicy::KeepDirty => 0,
            WritebackErrorPolicy::Discard => 1,
        };
        words[w::ENGINE] = match self.io_engine {
            EngineKind::Auto => 0,
            EngineKind::IoUring => 1,
            EngineKind::Threads => 2,
        };
        words[w::RA_BYTES] = self.ra_bytes;
        words[w::IO_BYTES] = self.io_bytes;
        words[w::REQUEST_BYTES] = self.request_bytes as u64;
        words[w::DIRTY_BACKGROUND] = checked.dirty.background_ratio.to_bits();
        words[w::DIRTY_RATIO] = checked.dirty.ratio.to_bits();
        words[w::DIRTY_EXPIRE_MS] = checked.dirty.expire.as_millis() as u64;
        words[w::WRITEBACK_INTERVAL_MS] = checked.dirty.interval.as_millis() as u64;
        words[w::WRITE_BEHIND] = checked.dirty.write_behind;
        words[w::IDLE_SECS] = self.idle_timeout.as_secs().max(1);
        Ok(words)
    }

    /// The builder a shared cache's settings words describe (its owner builds the cache from
    /// them; a word out of range is an error).
    pub(crate) fn from_shared_settings(
        words: &[u64; crate::mem::shared::SETTINGS_WORDS],
    ) -> Result<Self, Error> {
        use crate::shared::settings as w;
        let bad =
            |what: &str| Error::SharedMapping(format!("settings word {what} is out of range"));
        let pick = |i: usize, n: u64, what: &str| {
            if words[i] < n {
                Ok(words[i])
            } else {
                Err(bad(what))
            }
        };
        let policy = w::policy(words)?;
        let ms = std::time::Duration::from_millis;
        Ok(Self {
            capacity: words[w::CAPACITY],
            max_order: pick(w::MAX_ORDER, u64::from(MAX_ORDER) + 1, "max_order")? as u8,
            huge_pages: words[w::HUGE_PAGES] != 0,
            policy,
            io_engine: [EngineKind::Auto, EngineKind::IoUring, EngineKind::Threads]
                [pick(w::ENGINE, 3, "engine")? as usize],
            ra_bytes: words[w::RA_BYTES],
            io_bytes: words[w::IO_BYTES],
            request_bytes: usize::try_from(words[w::REQUEST_BYTES]).map_err(|_| bad("request"))?,
            dirty: DirtySettings {
                background_ratio: f64::from_bits(words[w::DIRTY_BACKGROUND]),
                ratio: f64::from_bits(words[w::DIRTY_RATIO]),
                expire: ms(words[w::DIRTY_EXPIRE_MS]),
                interval: ms(words[w::WRITEBACK_INTERVAL_MS]),
                write_behind: words[w::WRITE_BEHIND],
            },
            idle_timeout: std::time::Duration::from_secs(words[w::IDLE_SECS]),
            populate_ahead: false,
            ..Self::default()
        })
    }

    /// The shape of the mapping a shared cache of these settings needs: its arena, and room
    /// for processes, threads and files. The mapping (header, slots, records, folio table,
    /// arena) stays within the capacity.
    pub(crate) fn shared_shape(&self) -> Result<crate::mem::shared::Shape, Error> {
        let checked = self.check()?;
        let per_page = (PAGE_SIZE + std::mem::size_of::<crate::mem::folio::FolioDesc>()) as u64;
        let mut shape = crate::mem::shared::Shape {
            pages: 0,
            processes: 256,
            threads: 1024,
            files: 0,
        };
        let guess = checked.capacity / per_page;
        shape.files = ((guess / 64) as usize).clamp(128, 16384);
        // The arena's 2 MiB alignment and the table's rounding: a little slack.
        let fixed = shape.bytes()? + (4 << 20);
        let pages = checked.capacity.saturating_sub(fixed) / per_page;
        if pages < MIN_SHARED_PAGES {
            // The smallest capacity has the fewest file records (`files` is at its floor).
            let minimum = (fixed + MIN_SHARED_PAGES * per_page).next_multiple_of(PAGE_SIZE as u64);
            return Err(Error::SharedCapacityTooSmall {
                capacity: checked.capacity,
                minimum,
                fixed,
            });
        }
        shape.pages = pages as usize;
        Ok(shape)
    }

    /// The cache a shared cache's owner runs over `map`: its memory is the mapping's (every
    /// page free, or, taking a cache over, those `free` names), its files get records.
    pub(crate) fn build_owner(
        &self,
        map: Arc<crate::mem::shared::SharedMap>,
        free: Option<&dyn Fn(u32) -> bool>,
    ) -> Result<Cache, Error> {
        let checked = self.check()?;
        let mem = Memory::new_shared(
            Arc::clone(&map),
            self.max_order,
            self.huge_pages,
            self.policy.refcount,
            free,
        )?;
        let records = Arc::new(Records::new(map));
        Ok(self.assemble(mem, checked, Some(records)))
    }

    /// The policies the builder holds.
    pub(crate) fn policy_value(&self) -> Policy {
        self.policy
    }
}

/// Settings as `CacheBuilder::check` accepted them.
#[derive(Debug, Clone, Copy)]
struct Checked {
    pages: usize,
    capacity: u64,
    charge_index: bool,
    dirty: DirtySettings,
}

/// The largest single read request (`io_request_bytes`): 64 MiB.
const MAX_REQUEST_BYTES: u64 = 64 << 20;

/// The smallest budget [`CacheBuilder::capacity`] accepts.
const MIN_CAPACITY: u64 = 64 << 10;

/// The fewest arena pages a shared cache runs with (2 MiB; its capacity's floor follows from
/// it, [`Error::SharedCapacityTooSmall`]). Of a smaller arena the index nodes' spare pages
/// (32), the staging folios and the dirty pages took so much that with 64 pages four writers
/// were refused for want of memory (their pages all dirty, nothing clean to evict) within
/// seconds of a kill storm; with 508 pages none was, in 46 storms.
const MIN_SHARED_PAGES: u64 = 512;

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
    /// Bytes of the folio table: one descriptor per page, and for a table in huge pages of
    /// its own (a cache of 128 MiB or more that asks for huge pages) the rounding up to whole
    /// huge pages.
    pub folio_table_bytes: u64,
    /// Bytes of the reclaim lists' links and the allocator's per-page words.
    pub list_and_allocator_bytes: u64,
    /// Bytes of index nodes (every mapping's), allocated and not yet freed.
    pub index_node_bytes: u64,
    /// Arena pages set aside (and discarded) to pay for the index nodes; 0 when the cache was
    /// sized with [`CacheBuilder::arena_pages`], which does not charge nodes. In a shared
    /// cache, the arena pages that hold its index nodes or are kept aside for them.
    pub index_reserve_pages: u64,
    /// The largest folio order.
    pub max_order: u8,
    /// Times the allocator's shared free lists were locked (order-0 traffic mostly stays in
    /// per-thread caches and takes it once per batch).
    pub zone_lock_acquisitions: u64,
    /// Bytes of the arena faulted in ahead of the allocator by its populator
    /// ([`CacheBuilder::populate_ahead`]).
    pub populated_ahead_bytes: u64,
    /// Pages a private cache built with [`CacheBuilder::place_by_offset`] set aside for
    /// files' regions and has not used yet: a random reader's 4 KiB folios go to their offsets
    /// in a 64 KiB block per 64 KiB of the file, and the rest of the block waits for that
    /// file's next pages. Not counted in `free_pages`; they come back at once when memory runs
    /// out, and when the file goes. Always 0 without the option.
    pub placed_unused_pages: u64,
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
/// Private to its process, or shared by every process that names it
/// ([`CacheBuilder::shared`]).
#[derive(Debug, Clone)]
pub struct Cache {
    repr: Repr,
}

#[derive(Debug, Clone)]
enum Repr {
    /// A private cache, or the cache a shared cache's owner runs.
    Local(Local),
    /// A process attached to a shared cache.
    #[cfg(not(loom))]
    Client(Arc<crate::shared::client::Attachment>),
}

/// The cache this process runs itself.
#[derive(Debug, Clone)]
pub(crate) struct Local {
    inner: Arc<CacheCore>,
    /// The files opened from storage, by identity (shared among their openers).
    files: Arc<FileTable>,
    /// A shared cache's file records (its owner's cache); `None` for a private cache.
    records: Option<Arc<Records>>,
}

static NEXT_MAPPING_ID: AtomicU64 = AtomicU64::new(1);

impl Cache {
    /// A builder with the defaults.
    pub fn builder() -> CacheBuilder {
        CacheBuilder::default()
    }
}

impl Local {
    /// A shared cache's file records (its owner's cache).
    pub(crate) fn records(&self) -> Option<&Arc<Records>> {
        self.records.as_ref()
    }

    /// The cache's memory.
    pub(crate) fn memory(&self) -> &Arc<Memory> {
        &self.inner.mem
    }

    /// A staging folio for a shared cache's thread slot: of `order` if the arena has one
    /// (evicting idle folios as readahead does), else of the largest order below it that it
    /// has (a full arena of small folios has no large free block; order 0 always comes back
    /// once something is evicted). The folio and its order.
    #[cfg(not(loom))]
    pub(crate) fn alloc_staging(&self, order: u8) -> Result<(u32, u8), Error> {
        let mut last = Error::NoMemory { order };
        for order in (0..=order).rev() {
            for _ in 0..3 {
                match self.inner.alloc_for_readahead(order) {
                    Ok(folio) => return Ok((self.inner.mem.make_staging(folio), order)),
                    Err(e) => last = e,
                }
            }
        }
        Err(last)
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

    /// The mapping of the file `key` (device, inode) found at `path`: in a shared cache's
    /// owner, the one of the file's record (given one if it has none), with the file's
    /// writeback errors in the record too; else a new mapping.
    fn mapping_for(
        &self,
        key: (u64, u64),
        path: &Path,
        max_order: u8,
    ) -> Result<(Mapping, crate::wbstate::WbState), Error> {
        #[cfg(not(loom))]
        if let Some(records) = &self.records {
            let assigned = records.assign(key.0, key.1, max_order, path)?;
            let map = records.map();
            let mapping = Mapping::in_record(
                Arc::clone(&self.inner.mem),
                Arc::clone(self.inner.reclaim.shadow_count()),
                Arc::clone(&self.inner.dirty.pages),
                map,
                assigned.record,
            )?;
            let word = map.word(&map.files()[assigned.record].errseq);
            let wb = crate::wbstate::WbState::with_errors(crate::wbstate::ErrSeq::in_word(word));
            return Ok((mapping, wb));
        }
        let _ = (key, path, max_order);
        Ok((self.new_mapping(), crate::wbstate::WbState::default()))
    }

    /// Creates an empty memory file (data lives only in the cache, like tmpfs) whose folios
    /// are at most `max_order` (0: 4 KiB pages only, like tmpfs `huge=never`; 9: up to 2 MiB,
    /// like `huge=always`).
    pub(crate) fn create_memory_file(&self, max_order: u8) -> Result<File, Error> {
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

    /// Opens a file from storage with options (a buffered fallback for file systems without
    /// direct I/O, a folio order limit, a file of its own).
    ///
    /// A file the cache already has open (the same device and inode) is shared: the same
    /// [`File`] comes back, revalidated unless asked not to ([`OpenOptions::revalidate`]). Its
    /// layout options (`max_order`, `insert_policy`) were fixed when it was first opened;
    /// asking for others is [`Error::OpenConflict`] (open it apart with
    /// [`OpenOptions::shared`]`(false)` to compare layouts on one file).
    pub(crate) fn open_with(
        &self,
        path: impl AsRef<Path>,
        options: OpenOptions,
    ) -> Result<File, Error> {
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
        let open = |shared, key: Option<(u64, u64)>| -> Result<Arc<Inode>, Error> {
            let direct = Arc::new(DirectFile::open(path, options, Arc::clone(&engine))?);
            let (mapping, wb) = match key {
                Some(key) => self.mapping_for(key, path, max_order)?,
                None => (self.new_mapping(), crate::wbstate::WbState::default()),
            };
            Inode::new_disk(
                &self.inner,
                mapping,
                max_order,
                policy,
                Arc::clone(&direct) as Arc<dyn Backend>,
                Some(direct),
                None,
                shared,
                wb,
            )
        };
        if !options.shared {
            if options.write {
                return Err(Error::OpenConflict {
                    path: path.to_owned(),
                    reason: "a file opened apart (shared(false)) is read only".to_owned(),
                });
            }
            let inode = open(false, None)?;
            return Ok(File::from_opened(Opened::apart(inode)));
        }
        let meta = std::fs::metadata(path).map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
        let key = (meta.dev(), meta.ino());
        let (opened, created) = self.files.get_or_open(key, || open(true, Some(key)))?;
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
    pub(crate) fn open_descriptor(
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
            let (mapping, wb) = self.mapping_for(key, &path, max_order)?;
            Inode::new_disk(
                &self.inner,
                mapping,
                max_order,
                policy,
                Arc::clone(&direct) as Arc<dyn Backend>,
                Some(Arc::clone(&direct)),
                None,
                true,
                wb,
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
    pub(crate) fn open_backend(
        &self,
        backend: Arc<dyn Backend>,
        writer: Option<Arc<dyn crate::io::WriteBackend>>,
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
            writer,
            false,
            crate::wbstate::WbState::default(),
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
    pub(crate) fn io_engine(&self) -> Option<&'static str> {
        self.inner.engine.get().map(|engine| engine.name())
    }

    /// Eviction counters.
    pub(crate) fn reclaim_stats(&self) -> ReclaimStats {
        self.inner.reclaim.stats(&self.inner.mem)
    }

    /// Evicts idle folios read from storage (oldest first) until `pages` pages were freed or
    /// none is left to evict; returns the pages freed.
    pub(crate) fn evict(&self, pages: u64) -> u64 {
        self.inner.reclaim.evict(&self.inner.mem, pages)
    }

    /// Memory statistics.
    pub(crate) fn stats(&self) -> Stats {
        let mem = &self.inner.mem;
        Stats {
            capacity_bytes: self.inner.capacity,
            total_pages: mem.pages() as u64,
            free_pages: mem.free_pages() as u64,
            pending_free_pages: mem.pending_free_pages() as u64,
            folio_table_bytes: mem.table_bytes() as u64,
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
            placed_unused_pages: mem.placement_held_pages() as u64,
            dirty: self.inner.dirty.stats(),
        }
    }
}

/// Statistics as the words of a control message (a shared cache's owner to its clients):
/// [`Stats`], then [`ReclaimStats`], in field order, then `Stats::placed_unused_pages` (added
/// last, so that an older reader of the words still finds the others where they were).
#[cfg(not(loom))]
pub(crate) fn stats_words(stats: &Stats, reclaim: &ReclaimStats) -> Vec<u64> {
    let d = &stats.dirty;
    let r = reclaim;
    vec![
        stats.capacity_bytes,
        stats.total_pages,
        stats.free_pages,
        stats.pending_free_pages,
        stats.folio_table_bytes,
        stats.list_and_allocator_bytes,
        stats.index_node_bytes,
        stats.index_reserve_pages,
        u64::from(stats.max_order),
        stats.zone_lock_acquisitions,
        stats.populated_ahead_bytes,
        d.dirty_pages,
        d.writeback_pages,
        d.background_pages,
        d.limit_pages,
        d.written_pages,
        r.evicted_folios,
        r.evicted_pages,
        r.scanned,
        r.busy,
        r.passes,
        r.activations,
        r.deactivations,
        r.refaults,
        r.workingset_activations,
        r.workingset_restores,
        r.shadows_dropped,
        r.shadow_entries,
        r.inactive_pages,
        r.active_pages,
        r.nonresident_age,
        stats.placed_unused_pages,
    ]
}

/// The statistics `stats_words` wrote (missing words read as 0).
#[cfg(not(loom))]
fn stats_from_words(words: &[u64]) -> (Stats, ReclaimStats) {
    let w = |i: usize| words.get(i).copied().unwrap_or(0);
    let stats = Stats {
        capacity_bytes: w(0),
        total_pages: w(1),
        free_pages: w(2),
        pending_free_pages: w(3),
        folio_table_bytes: w(4),
        list_and_allocator_bytes: w(5),
        index_node_bytes: w(6),
        index_reserve_pages: w(7),
        max_order: w(8).min(u64::from(MAX_ORDER)) as u8,
        zone_lock_acquisitions: w(9),
        populated_ahead_bytes: w(10),
        placed_unused_pages: w(31),
        dirty: DirtyStats {
            dirty_pages: w(11),
            writeback_pages: w(12),
            background_pages: w(13),
            limit_pages: w(14),
            written_pages: w(15),
        },
    };
    let reclaim = ReclaimStats {
        evicted_folios: w(16),
        evicted_pages: w(17),
        scanned: w(18),
        busy: w(19),
        passes: w(20),
        activations: w(21),
        deactivations: w(22),
        refaults: w(23),
        workingset_activations: w(24),
        workingset_restores: w(25),
        shadows_dropped: w(26),
        shadow_entries: w(27),
        inactive_pages: w(28),
        active_pages: w(29),
        nonresident_age: w(30),
    };
    (stats, reclaim)
}

/// What a client of a shared cache cannot do.
#[cfg(not(loom))]
fn unsupported(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        mode: "shared",
    }
}

impl Cache {
    /// The cache this process runs (a private cache, or a shared cache's owner's).
    pub(crate) fn local(&self) -> Option<&Local> {
        match &self.repr {
            Repr::Local(local) => Some(local),
            #[cfg(not(loom))]
            Repr::Client(_) => None,
        }
    }

    /// For the internals (`raw`, faults): the cache this process runs. A shared cache's
    /// client has none; asking is a programming error.
    pub(crate) fn local_only(&self, what: &str) -> &Local {
        self.local().unwrap_or_else(|| {
            panic!("{what} needs a cache this process runs (a private cache), not a shared one")
        })
    }

    /// Whether this is a shared cache ([`CacheBuilder::shared`]) seen from a process attached
    /// to it.
    pub fn is_shared(&self) -> bool {
        !matches!(self.repr, Repr::Local(_))
    }

    /// The policies this cache runs with.
    pub fn policy(&self) -> Policy {
        match &self.repr {
            Repr::Local(local) => local.inner.policy,
            #[cfg(not(loom))]
            Repr::Client(attachment) => {
                crate::shared::settings::policy(&attachment.map.fixed().settings)
                    .unwrap_or_default()
            }
        }
    }

    /// Creates an empty memory file (data lives only in the cache, like tmpfs) whose folios
    /// are at most `max_order` (0: 4 KiB pages only, like tmpfs `huge=never`; 9: up to 2 MiB,
    /// like `huge=always`). Not offered by a shared cache ([`Error::Unsupported`]).
    pub fn create_memory_file(&self, max_order: u8) -> Result<File, Error> {
        match &self.repr {
            Repr::Local(local) => local.create_memory_file(max_order),
            #[cfg(not(loom))]
            Repr::Client(_) => Err(unsupported("a memory file")),
        }
    }

    /// Opens a file from storage for reading through this cache, with O_DIRECT (see
    /// [`open_with`](Self::open_with) for the options).
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
    ///
    /// In a shared cache the process opens the file itself (so the kernel checks its
    /// permission), then the owner serves it; every process of the cache shares its pages.
    pub fn open_with(&self, path: impl AsRef<Path>, options: OpenOptions) -> Result<File, Error> {
        match &self.repr {
            Repr::Local(local) => local.open_with(path.as_ref(), options),
            #[cfg(not(loom))]
            Repr::Client(attachment) => {
                let path = path.as_ref();
                if options.max_order.is_some_and(|o| o > MAX_ORDER) {
                    return Err(Error::OrderTooLarge {
                        order: options.max_order.unwrap_or(0),
                        max: MAX_ORDER,
                    });
                }
                let client =
                    attachment.open(path, options.write, options.create, options.max_order)?;
                let file = File::from_client(client);
                if options.truncate {
                    file.set_len(0)?;
                }
                Ok(file)
            }
        }
    }

    /// Opens a file from a descriptor the caller opened and lends to the cache: the file is
    /// read (and, with [`OpenOptions::write`], written) through it, and
    /// [`File::detach_descriptor`] hands it back. Refused with the descriptor when the cache
    /// has the file open already. In a shared cache the descriptor is this process's
    /// permission to the file (the owner opens the file again from it), and reads go through
    /// it while the owner does not serve the file; the pages live in the shared cache, so a
    /// detached file keeps them whatever happens to this process.
    pub fn open_descriptor(
        &self,
        fd: std::os::fd::OwnedFd,
        options: OpenOptions,
    ) -> Result<File, DescriptorRefused> {
        match &self.repr {
            Repr::Local(local) => local.open_descriptor(fd, options),
            #[cfg(not(loom))]
            Repr::Client(attachment) => {
                use std::os::fd::AsRawFd;
                if options.max_order.is_some_and(|o| o > MAX_ORDER) {
                    return Err(DescriptorRefused {
                        error: Error::OrderTooLarge {
                            order: options.max_order.unwrap_or(0),
                            max: MAX_ORDER,
                        },
                        fd,
                    });
                }
                let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                    .unwrap_or_default();
                attachment
                    .open_fd(fd, &path, options.write, options.max_order)
                    .map(File::from_client)
            }
        }
    }

    /// Opens a file whose bytes come from `backend` (a custom source: a test double, a remote
    /// store). `max_order` limits its folios (default: the cache's). A backend larger than
    /// [`MAX_FILE_SIZE`](crate::MAX_FILE_SIZE) is refused. Not offered by a shared cache.
    pub fn open_backend(
        &self,
        backend: Arc<dyn Backend>,
        max_order: Option<u8>,
    ) -> Result<File, Error> {
        match &self.repr {
            Repr::Local(local) => local.open_backend(backend, None, max_order),
            #[cfg(not(loom))]
            Repr::Client(_) => Err(unsupported("a custom backend")),
        }
    }

    /// Opens a file whose bytes come from `backend` and that can be written: writes go into
    /// the cache as dirty folios, and each writeback (a sync, the flusher, the last holder of
    /// the file letting go) commits the whole file to the backend at once
    /// ([`WriteBackend::commit`](crate::WriteBackend::commit)). Write-behind of sequential
    /// writers is off for such a file (each pass is a whole commit). Hole punching and
    /// `fallocate` are [`Error::Unsupported`]. Not offered by a shared cache.
    pub fn open_writable_backend(
        &self,
        backend: Arc<dyn crate::io::WriteBackend>,
        max_order: Option<u8>,
    ) -> Result<File, Error> {
        match &self.repr {
            Repr::Local(local) => {
                let reader: Arc<dyn Backend> = Arc::clone(&backend) as Arc<dyn Backend>;
                local.open_backend(reader, Some(backend), max_order)
            }
            #[cfg(not(loom))]
            Repr::Client(_) => Err(unsupported("a custom backend")),
        }
    }

    /// The I/O engine reading files from storage ("io_uring" or "threads (preadv)"), once a
    /// file was opened; `None` before. A shared cache's client says "owner": its owner does
    /// the I/O.
    pub fn io_engine(&self) -> Option<&'static str> {
        match &self.repr {
            Repr::Local(local) => local.io_engine(),
            #[cfg(not(loom))]
            Repr::Client(_) => Some("owner"),
        }
    }

    /// Eviction counters.
    pub fn reclaim_stats(&self) -> ReclaimStats {
        match &self.repr {
            Repr::Local(local) => local.reclaim_stats(),
            #[cfg(not(loom))]
            Repr::Client(attachment) => self.client_stats(attachment).1,
        }
    }

    /// Evicts idle folios read from storage (oldest first) until `pages` pages were freed or
    /// none is left to evict; returns the pages freed.
    pub fn evict(&self, pages: u64) -> u64 {
        match &self.repr {
            Repr::Local(local) => local.evict(pages),
            #[cfg(not(loom))]
            Repr::Client(attachment) => attachment
                .control(
                    &crate::shared::wire::Msg::new(crate::shared::wire::kind::EVICT, &[pages]),
                    None,
                )
                .ok()
                .and_then(|(answer, _)| answer.words.first().copied())
                .unwrap_or(0),
        }
    }

    pub(crate) fn core(&self) -> &Arc<CacheCore> {
        &self.local_only("foliocache::raw").inner
    }

    /// Memory statistics (of the whole shared cache, for a client: its owner answers).
    pub fn stats(&self) -> Stats {
        match &self.repr {
            Repr::Local(local) => local.stats(),
            #[cfg(not(loom))]
            Repr::Client(attachment) => self.client_stats(attachment).0,
        }
    }

    #[cfg(not(loom))]
    fn client_stats(
        &self,
        attachment: &Arc<crate::shared::client::Attachment>,
    ) -> (Stats, ReclaimStats) {
        let words = attachment
            .control(
                &crate::shared::wire::Msg::new(crate::shared::wire::kind::STATS, &[]),
                None,
            )
            .map(|(answer, _)| answer.words)
            .unwrap_or_default();
        stats_from_words(&words)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    /// `lookup_peeking` finds what `lookup` finds, and gives the next folio's block only when
    /// it asks to peek and the next slot of the same leaf holds a folio.
    #[test]
    fn lookup_peeking_names_the_next_folio_of_the_same_leaf_only() {
        let cache = super::Cache::builder()
            .capacity(16 << 20)
            .build()
            .expect("cache");
        let file = cache.create_memory_file(0).expect("memory file");
        // Pages 0..=2 and 62..=64 written; 3..62 a hole; 63 and 64 in different leaves.
        file.write_at(&[7u8; 3 * 4096], 0).expect("write");
        file.write_at(&[9u8; 3 * 4096], 62 * 4096).expect("write");
        let mapping = file.mapping();
        let id = |index| mapping.lookup(index).map(|folio| folio.id());
        for index in [0, 1, 2, 62, 63, 64] {
            let (found, next) = mapping.lookup_peeking::<true>(index);
            assert_eq!(found.map(|f| f.id()), id(index), "the folio at {index}");
            let expected = match index {
                0 | 1 | 62 => id(index + 1),
                // 2: a hole follows; 63: the next page is in another leaf; 64: nothing after.
                _ => None,
            };
            assert!(index == 2 || index >= 63 || expected.is_some());
            assert_eq!(next, expected, "the hint after {index}");
            assert_eq!(
                mapping.lookup_peeking::<false>(index).1,
                None,
                "no peek asked"
            );
        }
        let (found, next) = mapping.lookup_peeking::<true>(10);
        assert!(found.is_none() && next.is_none(), "a hole names nothing");
    }
}
