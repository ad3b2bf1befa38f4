//! The buddy allocator: naturally aligned blocks of 2^order pages, order 0..=max_order.
//!
//! One *zone* holds a free list per order, protected by one mutex (the kernel's zone lock).
//! Freeing a block merges it with its buddy (the block it pairs with at the next order) as long
//! as the buddy is free and whole, so the arena always returns to its largest blocks once
//! everything is freed. Allocation splits the smallest large-enough block and never waits: when
//! nothing fits it returns `None` and the caller falls back (a smaller order, one by one, or
//! reclaim).
//!
//! Order-0 pages, the hot case, go through *per-thread caches* first, the analogue of the
//! kernel's per-CPU page lists: each thread is given a cache slot of its own (round robin, so two
//! threads never share one while there are at least as many slots as threads), refilled from and
//! drained to the zone in batches. Two threads allocating and freeing order-0 pages therefore
//! touch the zone lock once per batch, not once per page, and never each other's slot lock.
//! When the zone runs dry the caches are drained back into it before giving up, so every free
//! page can be allocated.

use super::filled;
use crate::error::Error;
use crate::sync::Mutex;
use crate::sync::MutexGuard;
use crate::sync::unmodelled::Counter;
use crossbeam_utils::CachePadded;

const NIL: u32 = u32::MAX;
const NOT_FREE: u8 = u8::MAX;
/// Pages a per-thread cache takes from (or gives back to) the zone at once: one block of
/// order [`CACHE_BATCH_ORDER`] when the zone has one.
const CACHE_BATCH: usize = 1 << CACHE_BATCH_ORDER;
const CACHE_BATCH_ORDER: u8 = 5;
/// A per-thread cache holding more than this gives a batch back.
const CACHE_HIGH: usize = 3 * CACHE_BATCH;

#[derive(Debug)]
struct Zone {
    /// Head of the free list of each order (NIL when empty).
    heads: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// For the first page of a free block: its order; NOT_FREE otherwise.
    free_order: Vec<u8>,
    free_pages: usize,
}

impl Zone {
    fn push(&mut self, pfn: u32, order: u8) {
        let head = self.heads[order as usize];
        self.next[pfn as usize] = head;
        self.prev[pfn as usize] = NIL;
        if head != NIL {
            self.prev[head as usize] = pfn;
        }
        self.heads[order as usize] = pfn;
        self.free_order[pfn as usize] = order;
    }

    fn unlink(&mut self, pfn: u32, order: u8) {
        let (next, prev) = (self.next[pfn as usize], self.prev[pfn as usize]);
        if prev == NIL {
            self.heads[order as usize] = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next != NIL {
            self.prev[next as usize] = prev;
        }
        self.free_order[pfn as usize] = NOT_FREE;
    }

    fn alloc(&mut self, order: u8) -> Option<u32> {
        let found = (order as usize..self.heads.len()).find(|&o| self.heads[o] != NIL)?;
        let pfn = self.heads[found];
        let mut current = found as u8;
        self.unlink(pfn, current);
        // Split: keep the lower half, free the upper half, until the block has the asked order.
        while current > order {
            current -= 1;
            self.push(pfn + (1 << current), current);
        }
        self.free_pages -= 1 << order;
        Some(pfn)
    }

    /// Takes the first free block of `order` as it is (not split); its pages are then not free
    /// blocks of their own, each to be freed later as an order-0 page. The list must not be
    /// empty.
    fn take_block(&mut self, order: u8) -> u32 {
        let pfn = self.heads[order as usize];
        debug_assert_ne!(pfn, NIL);
        self.unlink(pfn, order);
        self.free_pages -= 1 << order;
        pfn
    }

    fn free(&mut self, mut pfn: u32, mut order: u8) {
        debug_assert_eq!(pfn % (1 << order), 0, "free of a misaligned block");
        debug_assert_eq!(
            self.free_order[pfn as usize], NOT_FREE,
            "double free of {pfn}"
        );
        self.free_pages += 1 << order;
        let max_order = (self.heads.len() - 1) as u8;
        while order < max_order {
            let buddy = pfn ^ (1 << order);
            if buddy as usize + (1 << order) > self.free_order.len()
                || self.free_order[buddy as usize] != order
            {
                break;
            }
            self.unlink(buddy, order);
            pfn = pfn.min(buddy);
            order += 1;
        }
        self.push(pfn, order);
    }
}

/// Bytes the allocator keeps per arena page (free-list links and the free-order byte).
pub(crate) const METADATA_BYTES_PER_PAGE: usize = 2 * std::mem::size_of::<u32>() + 1;

/// The allocator of arena pages. Page frame numbers (`pfn`) are page offsets into the arena.
#[derive(Debug)]
pub(crate) struct Buddy {
    zone: Mutex<Zone>,
    caches: Box<[CachePadded<Mutex<Vec<u32>>>]>,
    /// Times the zone lock was taken (statistics: shows the per-thread caches at work).
    zone_locks: Counter,
    max_order: u8,
}

/// The cache slot of the current thread.
fn cache_slot(slots: usize) -> usize {
    crate::sync::thread_slot() % slots
}

impl Buddy {
    /// An allocator over `pages` pages, all free, carved into the largest aligned blocks.
    pub(crate) fn new(pages: usize, max_order: u8) -> Result<Self, Error> {
        if pages >= NIL as usize {
            return Err(Error::InvalidCapacity((pages as u64).saturating_mul(4096)));
        }
        let mut zone = Zone {
            heads: vec![NIL; max_order as usize + 1],
            next: filled(pages, NIL)?,
            prev: filled(pages, NIL)?,
            free_order: filled(pages, NOT_FREE)?,
            free_pages: 0,
        };
        let mut pfn = 0usize;
        while pfn < pages {
            let mut order = max_order;
            while !pfn.is_multiple_of(1 << order) || pfn + (1 << order) > pages {
                order -= 1;
            }
            zone.push(pfn as u32, order);
            zone.free_pages += 1 << order;
            pfn += 1 << order;
        }
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let slots = (2 * threads).clamp(4, 64);
        Ok(Self {
            zone: Mutex::ranked(crate::sync::order::Rank::Zone, zone),
            caches: (0..slots)
                .map(|_| {
                    CachePadded::new(Mutex::ranked(
                        crate::sync::order::Rank::PageCache,
                        Vec::with_capacity(CACHE_HIGH + 1),
                    ))
                })
                .collect(),
            zone_locks: Counter::default(),
            max_order,
        })
    }

    /// An allocator over `pages` pages of which only those `free` says are free (a new owner
    /// taking a shared cache over: the others hold kept folios, nodes or quarantined memory),
    /// carved into the largest aligned blocks of free pages.
    pub(crate) fn with_free(
        pages: usize,
        max_order: u8,
        free: &dyn Fn(u32) -> bool,
    ) -> Result<Self, Error> {
        let buddy = Self::new(pages, max_order)?;
        {
            let mut zone = buddy.zone.lock();
            *zone = Zone {
                heads: vec![NIL; max_order as usize + 1],
                next: filled(pages, NIL)?,
                prev: filled(pages, NIL)?,
                free_order: filled(pages, NOT_FREE)?,
                free_pages: 0,
            };
            // One page at a time: freeing merges buddies into the largest blocks.
            for pfn in (0..pages as u32).filter(|&pfn| free(pfn)) {
                zone.free(pfn, 0);
            }
        }
        Ok(buddy)
    }

    fn zone(&self) -> MutexGuard<'_, Zone> {
        self.zone_locks.inc();
        self.zone.lock()
    }

    /// Times the zone lock was taken.
    pub(crate) fn zone_lock_count(&self) -> u64 {
        self.zone_locks.get()
    }

    /// Allocates a naturally aligned block of 2^order pages; `None` when no block is free.
    pub(crate) fn alloc(&self, order: u8) -> Option<u32> {
        debug_assert!(order <= self.max_order);
        if order == 0
            && let Some(pfn) = self.alloc_cached()
        {
            return Some(pfn);
        }
        if let Some(pfn) = self.zone().alloc(order) {
            return Some(pfn);
        }
        // Nothing in the zone: pages may be idling in per-thread caches. Give them back (they
        // coalesce) and try once more.
        self.drain_caches();
        self.zone().alloc(order)
    }

    fn alloc_cached(&self) -> Option<u32> {
        let mut cache = self.caches[cache_slot(self.caches.len())].lock();
        if cache.is_empty() {
            self.refill(&mut cache);
        }
        cache.pop()
    }

    /// Fills an empty per-thread cache with a batch from the zone: smaller free blocks first,
    /// each taken whole (they go first, which keeps large blocks whole for large folios), else
    /// one block of the batch's size split into its pages. The cache pops from the end,
    /// so the pages go in descending: successive allocations get ascending, mostly contiguous
    /// pages, and a file read or written sequentially is laid out sequentially, which the
    /// CPU's prefetcher rewards.
    fn refill(&self, cache: &mut Vec<u32>) {
        let mut zone = self.zone();
        if self.max_order >= CACHE_BATCH_ORDER
            && zone.heads[..CACHE_BATCH_ORDER as usize]
                .iter()
                .all(|&head| head == NIL)
            && let Some(first) = zone.alloc(CACHE_BATCH_ORDER)
        {
            // The block's pages are not free blocks of their own (`free_order` NOT_FREE), as
            // for pages split off one by one: each is freed later as an order-0 page.
            cache.extend((first..first + CACHE_BATCH as u32).rev());
            return;
        }
        // Small blocks go whole: one unlink for all their pages, where taking them page by page
        // split each block down to order 0 first.
        let small = zone.heads.len().min(CACHE_BATCH_ORDER as usize);
        while cache.len() < CACHE_BATCH {
            let room = CACHE_BATCH - cache.len();
            let whole = (0..small).find(|&order| zone.heads[order] != NIL && 1 << order <= room);
            match whole {
                Some(order) => {
                    let first = zone.take_block(order as u8);
                    cache.extend(first..first + (1 << order));
                }
                None => match zone.alloc(0) {
                    Some(pfn) => cache.push(pfn),
                    None => break,
                },
            }
        }
        cache.reverse();
    }

    /// Allocates up to `n` order-0 pages into `out` (appended, mostly ascending), taking the
    /// per-thread cache's lock once for all of them rather than once per page: a readahead
    /// window's folios at once. Fewer than `n` only when no page is free, even after the
    /// per-thread caches are drained. Returns how many were added.
    pub(crate) fn alloc_pages(&self, n: usize, out: &mut Vec<u32>) -> usize {
        let before = out.len();
        {
            let mut cache = self.caches[cache_slot(self.caches.len())].lock();
            while out.len() - before < n {
                if cache.is_empty() {
                    self.refill(&mut cache);
                    if cache.is_empty() {
                        break;
                    }
                }
                let take = (n - (out.len() - before)).min(cache.len());
                let from = cache.len() - take;
                out.extend(cache.drain(from..).rev());
            }
        }
        // As `alloc`: pages idling in other threads' caches are the last resort.
        while out.len() - before < n {
            match self.alloc(0) {
                Some(pfn) => out.push(pfn),
                None => break,
            }
        }
        out.len() - before
    }

    /// Frees a block previously returned by `alloc(order)`.
    pub(crate) fn free(&self, pfn: u32, order: u8) {
        if order == 0 {
            let mut cache = self.caches[cache_slot(self.caches.len())].lock();
            cache.push(pfn);
            if cache.len() > CACHE_HIGH {
                let keep = cache.len() - CACHE_BATCH;
                let mut zone = self.zone();
                for pfn in cache.drain(keep..) {
                    zone.free(pfn, 0);
                }
            }
            return;
        }
        self.zone().free(pfn, order);
    }

    /// Moves every page held by per-thread caches back to the zone.
    pub(crate) fn drain_caches(&self) {
        for cache in &*self.caches {
            let mut cache = cache.lock();
            if cache.is_empty() {
                continue;
            }
            let mut zone = self.zone();
            for pfn in cache.drain(..) {
                zone.free(pfn, 0);
            }
        }
    }

    /// The first pages of the next `n` blocks the allocator hands out whole or splits: the
    /// head of its largest order's free list (the populator faults them in ahead).
    pub(crate) fn next_max_blocks(&self, n: usize) -> Vec<u32> {
        let zone = self.zone.lock();
        let mut out = Vec::with_capacity(n);
        let mut pfn = zone.heads[self.max_order as usize];
        while pfn != NIL && out.len() < n {
            out.push(pfn);
            pfn = zone.next[pfn as usize];
        }
        out
    }

    /// Free pages, per-thread caches included (statistics: the caches are counted one after
    /// the other, not at one instant). Their count is not kept in one shared atomic, which
    /// every thread's allocation and free would write.
    pub(crate) fn free_pages(&self) -> usize {
        let cached: usize = self.caches.iter().map(|cache| cache.lock().len()).sum();
        self.zone.lock().free_pages + cached
    }

    /// How many free blocks the zone holds of each order (per-thread caches not included).
    pub(crate) fn free_blocks_by_order(&self) -> Vec<usize> {
        let zone = self.zone.lock();
        (0..zone.heads.len())
            .map(|order| {
                let mut count = 0;
                let mut pfn = zone.heads[order];
                while pfn != NIL {
                    count += 1;
                    pfn = zone.next[pfn as usize];
                }
                count
            })
            .collect()
    }
}
