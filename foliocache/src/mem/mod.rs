//! Memory: the arena, the buddy allocator, the folio table and the reference-count protocol.
//!
//! `Memory` ties them together. A folio's life:
//! 1. `alloc_folio(order)`: the buddy allocator hands out a naturally aligned block; its head
//!    descriptor gets its order and its first reference (`init`), and the caller gets a
//!    [`FolioRef`]. The folio is private: no index holds it, no reader can reach it.
//! 2. A mapping inserts it (and takes the page cache's own reference); from then on lockless
//!    readers can find it and take speculative references.
//! 3. It leaves the mapping either by removal (freeze at the expected count, unhook, free: no
//!    reader can hold it) or by truncation (unhook, drop the cache's reference: readers that
//!    still hold references keep it alive).
//! 4. Whoever drops the last reference frees it: the free path reads the order from the
//!    descriptor itself, never from the caller.

pub(crate) mod arena;
pub(crate) mod buddy;
pub(crate) mod epoch;
pub(crate) mod folio;
pub(crate) mod grace;
pub(crate) mod lru;
pub(crate) mod nodes;
pub(crate) mod optimistic;
pub(crate) mod place;
pub(crate) mod populate;
#[cfg(not(loom))]
pub(crate) mod records;
pub(crate) mod refcount;
#[cfg(not(loom))]
pub(crate) mod shared;
pub(crate) mod threads;
pub(crate) mod wait;
pub(crate) mod word;

use crate::error::Error;
use crate::inject::Inject;
use arena::Arena;
use buddy::Buddy;
use folio::FolioDesc;
pub use folio::{FolioRef, LockedFolio, NewFolio, flag};
use grace::Grace;
pub(crate) use grace::ReadGuard;
use refcount::RefcountPolicy;

use crate::sync::unmodelled::AtomicUsize as StatUsize;
use crate::sync::{Mutex, Ordering, fence};
use lru::Lru;
use std::sync::Arc;
use std::time::Duration;

/// Counts the bytes of index nodes allocated and not yet freed by every index sharing it (a
/// cache's mappings share one, so the cache's memory budget can charge them). A node an index
/// unlinked still counts until the readers that might see it are gone and it is really freed.
/// Here, below the index, so that the memory the budget charges is all the memory layer's.
#[derive(Debug, Default)]
pub struct NodeMeter {
    bytes: StatUsize,
}

impl NodeMeter {
    /// Bytes of nodes allocated and not yet freed.
    pub fn bytes(&self) -> usize {
        self.bytes.load(crate::sync::unmodelled::Ordering::Relaxed)
    }

    /// A node of `bytes` was allocated.
    pub(crate) fn charge(&self, bytes: usize) {
        self.bytes
            .fetch_add(bytes, crate::sync::unmodelled::Ordering::Relaxed);
    }

    /// Nodes of `bytes` in all were freed.
    pub(crate) fn credit(&self, bytes: usize) {
        self.bytes
            .fetch_sub(bytes, crate::sync::unmodelled::Ordering::Relaxed);
    }
}

/// Size of a page, the unit of the arena and of page indexes.
pub const PAGE_SIZE: usize = 4096;
/// log2 of [`PAGE_SIZE`].
pub(crate) const PAGE_SHIFT: u32 = 12;
/// The largest folio order (2 MiB folios), as the kernel's PMD order on x86-64.
pub const MAX_ORDER: u8 = 9;

/// Bytes of room one index node takes in a shared cache's arena page (`nodes`; the index checks
/// that its node fits). Part of the shared mapping's layout.
pub(crate) const NODE_ROOM: usize = 576;

/// The memory of one cache: arena, allocator and descriptors.
#[derive(Debug)]
pub(crate) struct Memory {
    /// Faults the arena in ahead of the allocator (`None`: off). Declared before the arena,
    /// so it is dropped (and its thread joined) before the arena is unmapped.
    populator: Option<populate::Populator>,
    arena: Arena,
    /// The allocator, behind the grace-period keeper that defers returns of published folios.
    grace: Grace,
    table: Table,
    lru: Lru,
    /// Index nodes of every mapping of this cache.
    pub(crate) nodes: Arc<NodeMeter>,
    reserve: IndexReserve,
    pub(crate) policy: RefcountPolicy,
    pub(crate) max_order: u8,
    /// Faults armed by tests (`raw::Injector`), shared with the I/O engine.
    pub(crate) inject: Arc<Inject>,
    /// A shared cache's mapping and the room its index nodes take in the arena (`None`: a
    /// private cache, whose nodes are on the heap).
    #[cfg(not(loom))]
    pub(crate) shared: Option<(Arc<shared::SharedMap>, Arc<nodes::ArenaNodes>)>,
    /// Blocks of the arena set aside for files' regions (a private cache's; see `place`).
    placement: place::Placement,
    /// Whether small fills are placed by offset (`CacheBuilder::place_by_offset`).
    placing: bool,
}

/// The folio table: on the heap (a small private cache), in huge pages of its own (a private
/// cache whose arena asks for them), or in a shared cache's mapping.
#[derive(Debug)]
enum Table {
    Heap(Box<[FolioDesc]>),
    /// `len` descriptors at the start of `memory`, which is aligned to a huge page and asked to
    /// be backed by them: a random read's descriptor load then finds its translation among a
    /// few TLB entries (`docs/BENCHMARKS.md`, "Where a random read's time goes").
    #[cfg(not(loom))]
    Huge {
        memory: Arena,
        len: usize,
    },
    #[cfg(not(loom))]
    Shared(Arc<shared::SharedMap>),
}

/// The smallest folio table put in huge pages of its own (a cache of 128 MiB and more): its
/// memory is rounded up to whole huge pages, so the rounding costs less than the table.
#[cfg(not(loom))]
const HUGE_TABLE_MIN_BYTES: usize = 1 << 20;

/// How long [`Memory::alloc_folio`] waits for memory in a grace period when the arena is dry
/// (a reader descheduled while pinned holds it back until it runs again).
const GRACE_PATIENCE: Duration = Duration::from_millis(20);

#[cfg(not(loom))]
const HUGE_PAGE_BYTES: usize = PAGE_SIZE << MAX_ORDER;

/// The bytes a folio table of `pages` descriptors is mapped with when it gets huge pages of its
/// own (a cache that asks for huge pages, a table of at least [`HUGE_TABLE_MIN_BYTES`]): the
/// descriptors rounded up to whole huge pages. `None`: the table goes on the heap.
#[cfg(not(loom))]
fn huge_table_bytes(pages: usize, huge_pages: bool) -> Option<usize> {
    let bytes = pages.checked_mul(std::mem::size_of::<FolioDesc>())?;
    if !huge_pages || bytes < HUGE_TABLE_MIN_BYTES {
        return None;
    }
    bytes.checked_next_multiple_of(HUGE_PAGE_BYTES)
}

/// The bytes a folio table of `pages` descriptors takes beyond the descriptors themselves: the
/// rounding of a table in huge pages of its own ([`huge_table_bytes`]), else 0. A budget pays
/// for it.
pub(crate) fn table_rounding_bytes(pages: usize, huge_pages: bool) -> usize {
    #[cfg(not(loom))]
    if let Some(mapped) = huge_table_bytes(pages, huge_pages) {
        return mapped - pages * std::mem::size_of::<FolioDesc>();
    }
    let _ = (pages, huge_pages);
    0
}

impl Table {
    fn descs(&self) -> &[FolioDesc] {
        match self {
            Self::Heap(table) => table,
            #[cfg(not(loom))]
            // SAFETY: `huge` wrote `len` descriptors from the start of `memory`, which is
            // aligned to a huge page (so to a descriptor) and lives as long as `self`;
            // descriptors are only changed through their atomics.
            Self::Huge { memory, len } => unsafe {
                std::slice::from_raw_parts(memory.base().as_ptr().cast::<FolioDesc>(), *len)
            },
            #[cfg(not(loom))]
            Self::Shared(map) => map.table(),
        }
    }

    /// A table of `pages` free descriptors in huge pages of its own, or `None` when it goes
    /// on the heap ([`huge_table_bytes`]) or the memory cannot be mapped (the caller then puts
    /// it on the heap).
    #[cfg(not(loom))]
    fn huge(pages: usize, huge_pages: bool, policy: RefcountPolicy) -> Option<Self> {
        let mapped = huge_table_bytes(pages, huge_pages)?;
        let memory = Arena::new(mapped / PAGE_SIZE, HUGE_PAGE_BYTES, true).ok()?;
        let first = memory.base().as_ptr().cast::<FolioDesc>();
        for pfn in 0..pages {
            // SAFETY: descriptor `pfn` lies inside the mapping (`mapped` bytes hold `pages`
            // descriptors), aligned (the mapping is aligned to a huge page and descriptors are
            // packed), and nothing else refers to this fresh memory yet.
            unsafe { first.add(pfn).write(FolioDesc::new(policy)) };
        }
        Some(Self::Huge { memory, len: pages })
    }
}

/// Arena pages set aside to pay for index nodes, which live on the heap: while the reserve
/// covers the nodes' bytes, folios plus nodes never exceed the arena. The pages are discarded
/// (`MADV_DONTNEED`), so they cost no resident memory while set aside.
///
/// On an arena backed by huge pages the reserve grows and shrinks by whole 2 MiB blocks
/// ([`RESERVE_HUGE_ORDER`]). Taking single pages there (one every few hundred folio
/// allocations as the index grows) discarded a page inside nearly every huge page: each
/// discard splits the huge page's mapping and the page comes back later from anywhere in
/// physical memory, so O_DIRECT reads into the arena needed more segments, and on this VM's disk
/// every segment costs (readseq went from about 2.2 to 2.5 GiB/s with blocks).
#[derive(Debug)]
struct IndexReserve {
    /// Blocks held: first page and order.
    blocks: Mutex<Vec<(u32, u8)>>,
    /// Pages held (the blocks' total), readable without the lock.
    count: StatUsize,
    /// Spare pages kept beyond the nodes' bytes, so that an insertion (which allocates its
    /// folios first, then its nodes) finds its nodes paid for.
    headroom: usize,
    /// Whether nodes are charged at all (a cache sized by arena pages does not charge them).
    charged: bool,
    /// The order of the blocks the reserve takes: 0, or [`RESERVE_HUGE_ORDER`] on a large
    /// arena backed by huge pages.
    block_order: u8,
}

/// The reserve's block order on an arena backed by huge pages (2 MiB blocks).
const RESERVE_HUGE_ORDER: u8 = 9;

/// Reserve pages held beyond `need + headroom` before some go back to the allocator.
const RESERVE_SLACK: usize = 4;

/// A vector of `len` copies of `value`, or an error if the memory cannot be had (cache
/// metadata is sized by the capacity: failing to get it must be an error, not an abort).
pub(crate) fn filled<T: Copy>(len: usize, value: T) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::MetadataAlloc {
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// Bytes of metadata per arena page: its descriptor, its list links and the allocator's
/// per-page words.
pub(crate) const METADATA_BYTES_PER_PAGE: usize =
    std::mem::size_of::<FolioDesc>() + lru::LINK_BYTES_PER_PAGE + buddy::METADATA_BYTES_PER_PAGE;

impl Memory {
    pub(crate) fn new(
        pages: usize,
        max_order: u8,
        huge_pages: bool,
        policy: RefcountPolicy,
        charge_index: bool,
        populate_ahead: bool,
    ) -> Result<Self, Error> {
        let align = PAGE_SIZE << MAX_ORDER;
        let arena = Arena::new(pages, align, huge_pages)?;
        #[cfg(not(loom))]
        let huge_table = Table::huge(pages, huge_pages, policy);
        #[cfg(loom)]
        let huge_table = None;
        let table = match huge_table {
            Some(table) => table,
            None => {
                let mut table = Vec::new();
                table
                    .try_reserve_exact(pages)
                    .map_err(|_| Error::MetadataAlloc {
                        bytes: (pages * std::mem::size_of::<FolioDesc>()) as u64,
                    })?;
                table.extend((0..pages).map(|_| FolioDesc::new(policy)));
                Table::Heap(table.into_boxed_slice())
            }
        };
        let buddy = std::sync::Arc::new(Buddy::new(pages, max_order)?);
        // No background thread under loom (its models run the memory on their own threads).
        let populator = (populate_ahead && cfg!(not(loom))).then(|| {
            populate::Populator::new(arena.page_ptr(0), pages, std::sync::Arc::clone(&buddy))
        });
        Ok(Self {
            populator,
            grace: Grace::new(buddy),
            table,
            lru: Lru::new(pages)?,
            nodes: Arc::default(),
            reserve: IndexReserve {
                blocks: Mutex::ranked(crate::sync::order::Rank::IndexReserve, Vec::new()),
                count: StatUsize::new(0),
                headroom: (pages / 64).clamp(1, 8),
                charged: charge_index,
                // Whole huge pages only where one is at most 1/32 of the arena, so the pages a
                // block holds beyond the need stay a small share of the capacity.
                block_order: if huge_pages
                    && max_order >= RESERVE_HUGE_ORDER
                    && pages >= 32 << RESERVE_HUGE_ORDER
                {
                    RESERVE_HUGE_ORDER
                } else {
                    0
                },
            },
            arena,
            policy,
            max_order,
            inject: Arc::default(),
            #[cfg(not(loom))]
            shared: None,
            placement: place::Placement::new(),
            placing: false,
        })
    }

    /// The memory of a shared cache's owner: the arena and folio table of `map` (every page
    /// free, or, for a new owner taking over, the pages `free` says are), index nodes in the
    /// arena. No populator (the memfd's memory was reserved at creation) and no node reserve
    /// (nodes take arena pages themselves).
    #[cfg(not(loom))]
    pub(crate) fn new_shared(
        map: Arc<shared::SharedMap>,
        max_order: u8,
        huge_pages: bool,
        policy: RefcountPolicy,
        free: Option<&dyn Fn(u32) -> bool>,
    ) -> Result<Self, Error> {
        let arena = Arena::in_shared(Arc::clone(&map), huge_pages);
        let pages = arena.pages();
        let buddy = Arc::new(match free {
            None => Buddy::new(pages, max_order)?,
            Some(free) => Buddy::with_free(pages, max_order, free)?,
        });
        let nodes = Arc::new(nodes::ArenaNodes::new(Arc::clone(&map), Arc::clone(&buddy)));
        Ok(Self {
            populator: None,
            grace: Grace::new(buddy),
            table: Table::Shared(Arc::clone(&map)),
            lru: Lru::new(pages)?,
            nodes: Arc::default(),
            reserve: IndexReserve {
                blocks: Mutex::ranked(crate::sync::order::Rank::IndexReserve, Vec::new()),
                count: StatUsize::new(0),
                headroom: 0,
                charged: false,
                block_order: 0,
            },
            arena,
            policy,
            max_order,
            inject: Arc::default(),
            shared: Some((map, nodes)),
            placement: place::Placement::new(),
            placing: false,
        })
    }

    /// Where this cache's index nodes go: `None` for the heap (a private cache).
    #[cfg(not(loom))]
    pub(crate) fn node_space(&self) -> Option<Arc<dyn nodes::NodeSpace>> {
        self.shared
            .as_ref()
            .map(|(_, nodes)| Arc::clone(nodes) as Arc<dyn nodes::NodeSpace>)
    }

    /// Tops the index reserve up to the nodes' bytes plus headroom from free pages, or gives
    /// back what it holds beyond that (plus some slack). Called before every allocation, so
    /// index nodes take their memory before folios do.
    fn settle_index_reserve(&self) {
        let reserve = &self.reserve;
        if !reserve.charged {
            return;
        }
        let need = self.nodes.bytes().div_ceil(PAGE_SIZE) + reserve.headroom;
        let block = 1usize << reserve.block_order;
        // Hold at least `need`, and give a block back only when what remains still covers
        // `need` with some slack (so the reserve does not take and give back one block over
        // and over at a boundary).
        let too_much = |have: usize, last: usize| have - last >= need + RESERVE_SLACK;
        let have = reserve.count.load(std::sync::atomic::Ordering::Relaxed);
        if have >= need && (have < block || !too_much(have, block)) {
            return;
        }
        let mut blocks = reserve.blocks.lock();
        let buddy = self.grace.buddy();
        let mut have: usize = blocks.iter().map(|&(_, order)| 1usize << order).sum();
        while have < need {
            // A whole block, else (the arena is fragmented or nearly full) single pages.
            let Some((pfn, order)) = buddy
                .alloc(reserve.block_order)
                .map(|pfn| (pfn, reserve.block_order))
                .or_else(|| buddy.alloc(0).map(|pfn| (pfn, 0)))
            else {
                break;
            };
            self.arena.discard(pfn as usize, 1 << order);
            if let Some(populator) = &self.populator {
                populator.discarded(pfn as usize, 1 << order);
            }
            blocks.push((pfn, order));
            have += 1 << order;
        }
        while let Some(&(pfn, order)) = blocks.last()
            && too_much(have, 1 << order)
        {
            blocks.pop();
            buddy.free(pfn, order);
            have -= 1 << order;
        }
        reserve
            .count
            .store(have, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pages set aside for index nodes: in a shared cache, the arena pages that hold its nodes
    /// or are kept aside for them.
    pub(crate) fn index_reserve_pages(&self) -> usize {
        #[cfg(not(loom))]
        if let Some((_, nodes)) = &self.shared {
            return nodes.held_pages();
        }
        self.reserve
            .count
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn prefault(&self) -> std::io::Result<()> {
        self.arena.prefault()
    }

    /// 2 MiB blocks the populator faulted in ahead of the allocator.
    pub(crate) fn populated_blocks(&self) -> usize {
        self.populator
            .as_ref()
            .map_or(0, populate::Populator::populated_blocks)
    }

    /// Bytes the folio table takes: its descriptors, and the rounding of a table in huge pages
    /// of its own ([`table_rounding_bytes`]).
    pub(crate) fn table_bytes(&self) -> usize {
        match &self.table {
            #[cfg(not(loom))]
            Table::Huge { memory, .. } => memory.pages() * PAGE_SIZE,
            _ => std::mem::size_of_val(self.table.descs()),
        }
    }

    pub(crate) fn desc(&self, pfn: u32) -> &FolioDesc {
        &self.table.descs()[pfn as usize]
    }

    pub(crate) fn page_ptr(&self, pfn: u32) -> *mut u8 {
        self.arena.page_ptr(pfn as usize)
    }

    pub(crate) fn pages(&self) -> usize {
        self.arena.pages()
    }

    /// Allocates a private folio of `2^order` pages with one reference (the caller's). When
    /// the arena is dry but memory waits for a grace period, waits for it (at most
    /// [`GRACE_PATIENCE`]).
    pub(crate) fn alloc_folio(&self, order: u8) -> Result<NewFolio<'_>, Error> {
        self.alloc_folio_within(order, GRACE_PATIENCE)
    }

    /// As [`alloc_folio`](Self::alloc_folio), but ends grace periods once at most instead of
    /// waiting: for a caller that evicts when this fails. Waiting would take the memory other
    /// threads' evictions freed (and leave them to evict again), and every attempt to end a
    /// grace period may be a process-wide barrier (`membarrier`, see [`epoch`]).
    pub(crate) fn alloc_folio_now(&self, order: u8) -> Result<NewFolio<'_>, Error> {
        self.alloc_folio_within(order, Duration::ZERO)
    }

    fn alloc_folio_within(&self, order: u8, patience: Duration) -> Result<NewFolio<'_>, Error> {
        if order > self.max_order {
            return Err(Error::OrderTooLarge {
                order,
                max: self.max_order,
            });
        }
        if self.inject.take(&self.inject.alloc_failures) {
            return Err(Error::NoMemory { order });
        }
        self.settle_index_reserve();
        #[cfg(not(loom))]
        if let Some((_, nodes)) = &self.shared {
            nodes.top_up();
        }
        // Pages regions hold unused come back before anything else is tried.
        let first = self.grace.buddy().alloc(order).or_else(|| {
            (self.release_placement() > 0)
                .then(|| self.grace.buddy().alloc(order))
                .flatten()
        });
        let pfn = match first {
            Some(pfn) => pfn,
            // Memory may be waiting for optimistic readers to finish with it (a grace period):
            // wait for them a little, then try again whatever came back.
            None if self.grace.pending_pages() > 0 => {
                let mut got = None;
                self.grace.reclaim_until(patience, || {
                    got = self.grace.buddy().alloc(order);
                    got.is_some()
                });
                got.ok_or(Error::NoMemory { order })?
            }
            None => return Err(Error::NoMemory { order }),
        };
        Ok(self.new_life(pfn, order))
    }

    /// Up to `n` order-0 folios at once into `out` (a readahead window of 4 KiB folios): the
    /// allocator's per-thread cache is locked once for all of them. Fewer than `n` (perhaps
    /// none) when memory runs out; the caller reclaims and asks again for the rest. Returns how
    /// many were added. While a test has faults armed it adds none, so that the caller's
    /// one-by-one path meets armed allocation failures one folio at a time.
    pub(crate) fn alloc_folios<'m>(&'m self, n: usize, out: &mut Vec<NewFolio<'m>>) -> usize {
        if self.inject.armed() {
            return 0;
        }
        self.settle_index_reserve();
        #[cfg(not(loom))]
        if let Some((_, nodes)) = &self.shared {
            nodes.top_up();
        }
        let mut pfns = Vec::with_capacity(n);
        self.grace.buddy().alloc_pages(n, &mut pfns);
        if pfns.len() < n && self.release_placement() > 0 {
            let more = n - pfns.len();
            self.grace.buddy().alloc_pages(more, &mut pfns);
        }
        if pfns.len() < n && self.grace.pending_pages() > 0 {
            // As `alloc_folio_now`: memory may be waiting for optimistic readers to finish
            // with it; the caller evicts for what this does not give.
            self.grace.reclaim_until(Duration::ZERO, || {
                let more = n - pfns.len();
                self.grace.buddy().alloc_pages(more, &mut pfns);
                pfns.len() == n
            });
        }
        out.reserve(pfns.len());
        out.extend(pfns.iter().map(|&pfn| self.new_life(pfn, 0)));
        pfns.len()
    }

    /// An order-0 folio for page `index` of mapping `mapping`, placed at the page's offset
    /// in the arena block of its region (see [`place`]), with the block's first page: `None`
    /// where the page cannot be placed (placement off, a shared cache, no block to be had,
    /// or the page was placed before). The caller then allocates as usual.
    pub(crate) fn alloc_placed(&self, mapping: u64, index: u64) -> Option<(NewFolio<'_>, u32)> {
        #[cfg(not(loom))]
        if self.shared.is_some() {
            return None;
        }
        if !self.placing || self.max_order < place::REGION_ORDER || self.inject.armed() {
            return None;
        }
        let (pfn, base) = self
            .placement
            .take(self.grace.buddy(), self.pages(), mapping, index)?;
        Some((self.new_life(pfn, 0), base))
    }

    /// Places small fills by offset from now on, or not (a cache being built).
    pub(crate) fn set_placing(&mut self, on: bool) {
        self.placing = on;
    }

    /// Regions give back the pages they hold unused (memory ran out). Returns how many.
    fn release_placement(&self) -> usize {
        self.placement.release_all(self.grace.buddy(), self.pages())
    }

    /// Pages `first..first + count` of mapping `mapping` were filled outside their regions:
    /// the regions give those pages' places back (see [`place`]).
    pub(crate) fn filled_elsewhere(&self, mapping: u64, first: u64, count: u64) {
        if self.placing {
            self.placement
                .filled_elsewhere(self.grace.buddy(), mapping, first, count);
        }
    }

    /// Whether any region holds places not handed out (one atomic load): a fill that went
    /// elsewhere has no place to give back otherwise.
    pub(crate) fn places_held(&self) -> bool {
        self.placing && self.placement.held_pages() > 0
    }

    /// Mapping `mapping` is gone: its regions give their unused pages back.
    pub(crate) fn forget_placement(&self, mapping: u64) {
        self.placement.forget(self.grace.buddy(), mapping);
    }

    /// Pages regions hold unused (statistics).
    pub(crate) fn placement_held_pages(&self) -> usize {
        self.placement.held_pages()
    }

    /// The first steps of a block's life as a folio, just taken from the free lists: a new
    /// sequence number and clean fields, one reference (the allocator's caller's).
    #[inline]
    fn new_life(&self, pfn: u32, order: u8) -> NewFolio<'_> {
        if let Some(populator) = &self.populator {
            populator.allocated(pfn);
        }
        let desc = self.desc(pfn);
        // A new life begins: optimistic readers still looking at the old one must see the
        // bump before any byte the new owner writes (the fence orders the bump before them).
        // A load and a store, not a locked increment: a free block's descriptor is written by
        // its allocator alone (readers only load `seq`), so no bump can be lost, and a plain
        // store lets the CPU overlap the misses of a batch's descriptors.
        let seq = desc.seq.load(Ordering::Relaxed);
        desc.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        desc.order.store(order, Ordering::Relaxed);
        desc.flags.store(0, Ordering::Relaxed);
        desc.mapping.store(0, Ordering::Relaxed);
        desc.index.store(0, Ordering::Relaxed);
        // Release: a speculative getter whose increment lands after this sees the fields above
        // and everything that happened before the block was freed.
        desc.refcount.init();
        NewFolio {
            folio: FolioRef { mem: self, pfn },
        }
    }

    /// Makes a folio just allocated the staging folio of a client thread's slot (a shared
    /// cache): its descriptor says so, and its reference lives on in the slot.
    #[cfg(not(loom))]
    pub(crate) fn make_staging(&self, folio: NewFolio<'_>) -> u32 {
        let pfn = folio.folio.pfn;
        self.desc(pfn)
            .mapping
            .store(shared::STAGING, Ordering::Release);
        // The reference lives on in the slot that names the folio.
        std::mem::forget(folio);
        pfn
    }

    /// Frees a staging folio (`make_staging`, or one a new owner adopted).
    #[cfg(not(loom))]
    pub(crate) fn free_staging(&self, pfn: u32) {
        let desc = self.desc(pfn);
        if desc.mapping.load(Ordering::Acquire) != shared::STAGING {
            debug_assert!(false, "free of {pfn}, not a staging folio");
            return;
        }
        desc.mapping.store(0, Ordering::Release);
        self.put(pfn);
    }

    /// A new owner keeps a staging folio the previous one left (a request in its slot may
    /// still need its bytes): one reference again, the previous owner's gone.
    #[cfg(not(loom))]
    pub(crate) fn adopt_staging(&self, pfn: u32) {
        self.desc(pfn).refcount.init();
    }

    /// A folio a new owner kept from a dead owner's mapping (clean, uptodate, no longer in any
    /// index, and left out of this memory's free lists): a new life for it, as
    /// [`Self::alloc_folio`] gives a block it takes from the free lists, with its bytes as
    /// they are. The caller inserts it into its file again or drops it (which frees it).
    #[cfg(not(loom))]
    pub(crate) fn adopt_folio(&self, pfn: u32, order: u8) -> NewFolio<'_> {
        let desc = self.desc(pfn);
        desc.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        desc.order.store(order, Ordering::Relaxed);
        desc.flags.store(0, Ordering::Relaxed);
        desc.mapping.store(0, Ordering::Relaxed);
        desc.index.store(0, Ordering::Relaxed);
        desc.refcount.init();
        NewFolio {
            folio: FolioRef { mem: self, pfn },
        }
    }

    /// Takes a speculative reference on folio `pfn` unless it is free or frozen. The caller
    /// must then validate the folio's identity (re-check the index slot it came from).
    pub(crate) fn try_get(&self, pfn: u32) -> Option<FolioRef<'_>> {
        // Build the guard only on success: its drop is a `put`.
        if self.desc(pfn).refcount.try_get(self.policy) {
            Some(FolioRef { mem: self, pfn })
        } else {
            None
        }
    }

    /// Drops one reference; frees the folio if it was the last.
    pub(crate) fn put(&self, pfn: u32) {
        if self.desc(pfn).refcount.put(self.policy) {
            self.free_frozen(pfn);
        }
    }

    /// Returns a folio whose count is frozen (last put, or a successful freeze) to the
    /// allocator. What to free is read from the descriptor itself.
    pub(crate) fn free_frozen(&self, pfn: u32) {
        let desc = self.desc(pfn);
        debug_assert!(desc.refcount.is_frozen(self.policy));
        let order = desc.order.load(Ordering::Relaxed);
        desc.mapping.store(0, Ordering::Relaxed);
        // Off the reclaim lists before the flags (and the LRU bit) are wiped.
        self.lru_del(pfn);
        let flags = desc.flags.swap(0, Ordering::Relaxed);
        if flags & flag::PUBLISHED == 0 {
            // Never in an index: no optimistic reader can know it.
            self.grace.buddy().free(pfn, order);
        } else {
            self.grace.free_after_grace(pfn, order);
        }
    }

    pub(crate) fn free_pages(&self) -> usize {
        self.grace.buddy().free_pages()
    }

    pub(crate) fn zone_lock_count(&self) -> u64 {
        self.grace.buddy().zone_lock_count()
    }

    /// Completes pending grace periods (as far as readers allow) and returns the pages idling
    /// in per-thread caches to the shared free lists.
    pub(crate) fn drain_caches(&self) {
        self.grace.reclaim_deferred(Duration::from_secs(1));
        self.grace.buddy().drain_caches();
    }

    pub(crate) fn pending_free_pages(&self) -> usize {
        self.grace.pending_pages()
    }

    /// See [`grace::Grace::read_guard`].
    #[inline]
    pub(crate) fn read_guard(&self) -> ReadGuard<'_> {
        self.grace.read_guard()
    }

    pub(crate) fn free_blocks_by_order(&self) -> Vec<usize> {
        self.grace.buddy().free_blocks_by_order()
    }
}

impl Drop for Memory {
    /// Frees deferred for this cache's folios keep its allocator's free lists alive until they
    /// run: complete them now rather than at some later, unrelated free.
    fn drop(&mut self) {
        // Readers pin briefly; one still pinned when this runs holds the frees back, so wait a
        // little for it (frees that still wait after that run at some later collect).
        self.grace.reclaim_deferred(Duration::from_millis(100));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn metadata_that_cannot_be_had_is_an_error() {
        // More than the address space: refused before any memory is touched.
        let err = filled(usize::MAX / 2, 0u32).unwrap_err();
        assert!(matches!(err, Error::MetadataAlloc { .. }), "{err}");
        assert_eq!(filled(3, 7u8).unwrap(), vec![7, 7, 7]);
    }

    /// The fields of every descriptor of `mem`, as plain values.
    fn fields(mem: &Memory) -> Vec<(u32, u32, u32, u8, u64, u64)> {
        mem.table
            .descs()
            .iter()
            .map(|d| {
                (
                    d.refcount.raw(),
                    d.flags.load(Ordering::Relaxed),
                    d.seq.load(Ordering::Relaxed),
                    d.order.load(Ordering::Relaxed),
                    d.mapping.load(Ordering::Relaxed),
                    d.index.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// A table of at least `HUGE_TABLE_MIN_BYTES` on a cache asking for huge pages gets memory
    /// of its own, aligned to a huge page, holding the same free descriptors a heap table
    /// starts with; a smaller one, or one of a cache without huge pages, stays on the heap.
    #[test]
    fn a_large_table_of_a_huge_page_cache_lives_in_huge_pages_of_its_own() {
        let pages = HUGE_TABLE_MIN_BYTES / std::mem::size_of::<FolioDesc>();
        for policy in [RefcountPolicy::FrozenBit, RefcountPolicy::Cas] {
            let huge = Memory::new(pages, MAX_ORDER, true, policy, false, false).unwrap();
            assert!(matches!(huge.table, Table::Huge { .. }));
            assert_eq!(huge.table.descs().len(), pages);
            let at = huge.table.descs().as_ptr() as usize;
            assert_eq!(at % HUGE_PAGE_BYTES, 0, "aligned to a huge page");
            let heap = Memory::new(pages, MAX_ORDER, false, policy, false, false).unwrap();
            assert!(matches!(heap.table, Table::Heap(_)));
            assert_eq!(fields(&huge), fields(&heap), "the same free descriptors");
            assert_eq!(
                huge.table_bytes(),
                HUGE_PAGE_BYTES,
                "rounded up to a huge page"
            );
            assert_eq!(
                table_rounding_bytes(pages, true),
                HUGE_PAGE_BYTES - HUGE_TABLE_MIN_BYTES
            );
            assert_eq!(table_rounding_bytes(pages, false), 0);
            let small = Memory::new(pages - 1, MAX_ORDER, true, policy, false, false).unwrap();
            assert!(matches!(small.table, Table::Heap(_)));
            assert_eq!(table_rounding_bytes(pages - 1, true), 0);
        }
    }
}
