//! Placement of a file's 4 KiB folios by their offset in the file.
//!
//! A random reader's folios are filled one or two at a time, and the allocator hands each fill
//! whatever pages its per-thread list holds: page 7 of a file and page 8 end up anywhere in
//! the arena. A read then learns where its folio is only from the index's leaf, and the misses
//! on the leaf, the descriptor and the bytes follow one another. A private cache built with
//! `CacheBuilder::place_by_offset` instead sets aside a 64 KiB block of the arena (a *region*)
//! for each 64 KiB of a file that small fills reach, and puts page `i` at offset `i % 16` of
//! its region's block. So:
//! * the read can ask for the bytes and the descriptor *before* walking the index: the
//!   block's first page is in the mapping's hint table ([`crate::mapping::Mapping`]), a small
//!   array of one word per region that stays in the CPU's caches. The three misses overlap.
//!   The hint is only a prefetch: the read still finds and validates the folio by the index
//!   and its descriptor, so a stale hint costs a wasted prefetch, never a wrong byte;
//! * a block that spans two pages (a RocksDB block of 4 KiB and its trailer) lies in one
//!   run of memory, and its two descriptors are neighbours in the folio table.
//!
//! Measured in docs/BENCHMARKS.md ("Pages placed by their offset", and "..., and their
//! memory", and "Free pages that lie apart"). A set filled in a random order and placed by
//! offset has its neighbours in memory far apart on the LRU list, so under pressure its
//! evictions free lone pages; a readahead window takes those in 4 KiB folios rather than
//! evicting for a block (`CacheCore::alloc_for_window`), so they no longer cost hits. Off by
//! default: in the one `fcache bench dbbench` run that measured it, placement made warm random
//! reads 1.29× as fast and cold ones 0.93× as fast.
//!
//! # Which fills, and how much memory
//! Only fills of at most [`PLACE_MAX_PAGES`] 4 KiB folios (a random reader's; readahead
//! windows of a stream are in order in the arena already) of a private cache's files from
//! storage. A new region is set aside only while at least a quarter of the arena is free. The
//! pages of a block not handed out yet are the region's: not free, not cached. When an
//! allocation finds no free memory, every region gives its unused pages back at once
//! ([`Placement::release_all`]) and takes no more pages (its hint stays right for the pages
//! it did place), before anything is evicted. If the regions had used less than a quarter of
//! their pages, the reader is too sparse for placement to pay, and no new region is set aside
//! for a while (as many tries as the arena has pages): a block for each page or two would
//! otherwise be set aside and given back again and again. A file's regions give their unused
//! pages back when its mapping goes ([`Placement::forget`]).
//!
//! A page that a fill puts outside its region (a window of large folios, or of more pages
//! than are placed, from a reader whose random reads met cached neighbours and became a
//! stream) would leave its place in the region unused for good: the region gives that place
//! back to the allocator when the fill allocates ([`Placement::filled_elsewhere`]). Without
//! this, a dense random reader's data took 1.3× the memory (docs/BENCHMARKS.md, "Pages placed
//! by their offset, and their memory").
//!
//! # Pages handed out
//! A page handed out is an ordinary order-0 folio: it is freed, when its life ends, page by
//! page, as a block taken whole may be (see `buddy`). The region remembers it was handed out
//! and never hands it out again: a page evicted and read again goes wherever the allocator
//! puts it, and the region's hint is then wrong for it (a wasted prefetch per read of it).
//!
//! All state is under one lock ([`Rank::Placement`](crate::sync::order::Rank)), taken only by
//! fills that place pages, by the release under pressure and by a mapping's teardown: never
//! by a read. A process that dies loses the private cache with it.

use super::buddy::Buddy;
use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A region's order: 64 KiB of file, one block of the arena. (2 MiB regions cost a sparse
/// reader a 2 MiB block per page it read, and made `fcache bench multiproc`'s cold random
/// reads 8–18% slower.)
pub(crate) const REGION_ORDER: u8 = 4;
/// Pages per region.
pub(crate) const REGION_PAGES: u64 = 1 << REGION_ORDER;
/// Words of a region's bitmap of pages handed out.
const GIVEN_WORDS: usize = REGION_PAGES.div_ceil(64) as usize;
/// The largest fill whose folios are placed (in 4 KiB folios).
pub(crate) const PLACE_MAX_PAGES: usize = 4;

/// One region: the arena block set aside for 64 KiB of a file.
#[derive(Debug)]
struct Region {
    /// The block's first page.
    base: u32,
    /// Pages of the block handed out (bit `k`: page `base + k`).
    given: [u64; GIVEN_WORDS],
    /// Whether the pages not handed out are still the region's (false after a release: the
    /// region hands out nothing more).
    open: bool,
}

impl Region {
    fn is_given(&self, k: usize) -> bool {
        self.given[k / 64] & (1 << (k % 64)) != 0
    }

    /// Marks page `k` as gone from the region (handed out, or given up).
    fn mark_given(&mut self, k: usize) {
        self.given[k / 64] |= 1 << (k % 64);
    }

    /// Page `k` leaves the region without being handed out: marked, and freed to `buddy`.
    /// False if it had left already.
    fn give_up(&mut self, k: usize, buddy: &Buddy) -> bool {
        if self.is_given(k) {
            return false;
        }
        self.mark_given(k);
        buddy.free(self.base + k as u32, 0);
        true
    }

    /// Gives the pages not handed out back to `buddy` and closes the region; returns how
    /// many.
    fn give_back(&mut self, buddy: &Buddy) -> usize {
        if !self.open {
            return 0;
        }
        self.open = false;
        (0..REGION_PAGES as usize)
            .filter(|&k| self.give_up(k, buddy))
            .count()
    }
}

/// The regions of a private cache's arena, by (mapping id, region number).
#[derive(Debug)]
pub(crate) struct Placement {
    state: Mutex<State>,
    /// Pages set aside and not handed out (changed under the lock; read without it, so that
    /// an allocation that fails does not take the lock when no region holds any).
    held: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    regions: HashMap<(u64, u64), Region>,
    /// New regions refused for this many more tries (after a release found the regions
    /// mostly unused: a reader too sparse for placement to pay).
    refuse: usize,
}

impl Placement {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::ranked(crate::sync::order::Rank::Placement, State::default()),
            held: AtomicUsize::new(0),
        }
    }

    /// A page for page `index` of mapping `mapping`: its place in the region's block, with
    /// the block's first page, `(pfn, base)`. A region without a block takes one now if
    /// `buddy`, an arena of `pages` pages, has at least a quarter of them free, and no
    /// back-off is running (see [`Placement::release_all`]). `None`: no block to be had, the
    /// region was released, or that page was handed out before.
    pub(crate) fn take(
        &self,
        buddy: &Buddy,
        pages: usize,
        mapping: u64,
        index: u64,
    ) -> Option<(u32, u32)> {
        let mut state = self.state.lock();
        let State { regions, refuse } = &mut *state;
        let key = (mapping, index >> REGION_ORDER);
        let region = match regions.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                if *refuse > 0 {
                    *refuse -= 1;
                    return None;
                }
                if buddy.free_pages() < pages / 4 {
                    return None;
                }
                let base = buddy.alloc(REGION_ORDER)?;
                self.held
                    .fetch_add(REGION_PAGES as usize, Ordering::Relaxed);
                entry.insert(Region {
                    base,
                    given: [0; GIVEN_WORDS],
                    open: true,
                })
            }
        };
        let k = (index % REGION_PAGES) as usize;
        if !region.open || region.is_given(k) {
            return None;
        }
        region.mark_given(k);
        self.held.fetch_sub(1, Ordering::Relaxed);
        Some((region.base + k as u32, region.base))
    }

    /// Every region gives its pages not handed out back (memory ran out). Returns how many.
    ///
    /// If the regions had handed out less than a quarter of their pages, the reader is too
    /// sparse for placement to pay (each region costs a block for a page or two, and the
    /// blocks would be set aside and given back again and again): new regions are refused
    /// for the next `pages` tries, as many as the arena has pages.
    pub(crate) fn release_all(&self, buddy: &Buddy, pages: usize) -> usize {
        if self.held.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut state = self.state.lock();
        let open = state.regions.values().filter(|region| region.open).count();
        let freed: usize = state
            .regions
            .values_mut()
            .map(|region| region.give_back(buddy))
            .sum();
        self.held.fetch_sub(freed, Ordering::Relaxed);
        if freed > open * REGION_PAGES as usize * 3 / 4 {
            state.refuse = pages;
        }
        freed
    }

    /// Pages `first..first + count` of mapping `mapping` were filled outside their regions (a
    /// window of large folios, or of more pages than are placed): their places in the regions
    /// would stay unused for good, so they go back to `buddy` now. Otherwise each such page
    /// takes two pages of the arena, and the data more of the arena's huge pages (see
    /// docs/BENCHMARKS.md, "Pages placed by their offset, and their memory"). Returns how
    /// many came back.
    pub(crate) fn filled_elsewhere(
        &self,
        buddy: &Buddy,
        mapping: u64,
        first: u64,
        count: u64,
    ) -> usize {
        if self.held.load(Ordering::Relaxed) == 0 || count == 0 {
            return 0;
        }
        let mut state = self.state.lock();
        let end = first.saturating_add(count);
        let mut freed = 0;
        let mut index = first;
        while index < end {
            let region_end = ((index >> REGION_ORDER) + 1) << REGION_ORDER;
            let stop = region_end.min(end);
            if let Some(region) = state.regions.get_mut(&(mapping, index >> REGION_ORDER))
                && region.open
            {
                freed += (index..stop)
                    .filter(|&page| region.give_up((page % REGION_PAGES) as usize, buddy))
                    .count();
            }
            index = stop;
        }
        self.held.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// Mapping `mapping` goes: its regions give their pages not handed out back and are
    /// forgotten. Returns how many pages came back.
    pub(crate) fn forget(&self, buddy: &Buddy, mapping: u64) -> usize {
        let mut state = self.state.lock();
        let mut freed = 0;
        state.regions.retain(|&(owner, _), region| {
            if owner != mapping {
                return true;
            }
            freed += region.give_back(buddy);
            false
        });
        self.held.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// Pages set aside and not handed out.
    pub(crate) fn held_pages(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Pages land at their offset in their region's block, once each; a release gives back
    /// exactly the pages not handed out and stops the region; forgetting a mapping gives back
    /// its regions' pages, and with every page handed out freed the arena is whole again.
    #[test]
    fn pages_go_to_their_offset_and_come_back() {
        let pages = 4 << REGION_ORDER;
        let buddy = Buddy::new(pages, REGION_ORDER).unwrap();
        let place = Placement::new();
        let (p7, base) = place.take(&buddy, pages, 1, 7).unwrap();
        assert_eq!(p7, base + 7);
        assert_eq!(base % REGION_PAGES as u32, 0, "a naturally aligned block");
        let (p8, base8) = place.take(&buddy, pages, 1, 8).unwrap();
        assert_eq!((p8, base8), (base + 8, base));
        assert_eq!(place.take(&buddy, pages, 1, 7), None, "handed out once");
        let (q, other) = place.take(&buddy, pages, 1, REGION_PAGES + 3).unwrap();
        assert_ne!(other, base, "another region, another block");
        assert_eq!(q, other + 3);
        // Well-used regions: more than a quarter of their pages handed out.
        let mut given = vec![p7, p8, q];
        let rp = REGION_PAGES;
        for index in (9..rp).chain(rp + 4..rp + 12) {
            given.push(place.take(&buddy, pages, 1, index).unwrap().0);
        }
        let unused = 2 * rp as usize - given.len();
        assert_eq!(place.held_pages(), unused);
        assert_eq!(buddy.free_pages(), pages - 2 * rp as usize);

        // Memory runs out: the unused pages come back, and the regions place no more.
        assert_eq!(place.release_all(&buddy, pages), unused);
        assert_eq!(place.held_pages(), 0);
        assert_eq!(place.take(&buddy, pages, 1, 5), None, "released");
        assert_eq!(place.release_all(&buddy, pages), 0, "given back once");

        // The regions were used enough: a new one may be set aside at once, and a mapping
        // that goes gives its regions' pages back.
        let (again, theirs) = place.take(&buddy, pages, 2, 7).unwrap();
        assert_eq!(again, theirs + 7);
        given.push(again);
        assert_eq!(place.forget(&buddy, 2), REGION_PAGES as usize - 1);
        assert_eq!(place.forget(&buddy, 1), 0, "released already");
        assert_eq!(place.held_pages(), 0);
        for pfn in given {
            buddy.free(pfn, 0);
        }
        buddy.drain_caches();
        assert_eq!(buddy.free_pages(), pages);
        assert_eq!(
            buddy.free_blocks_by_order()[REGION_ORDER as usize],
            4,
            "the pages merged back into whole blocks"
        );
    }

    /// Pages filled outside their regions give their places back at once, across a region
    /// boundary, never a place already handed out, and nothing of a region released or of
    /// another mapping; such a place is not handed out afterwards.
    #[test]
    fn places_of_pages_filled_elsewhere_come_back() {
        let pages = 4 << REGION_ORDER;
        let buddy = Buddy::new(pages, REGION_ORDER).unwrap();
        let place = Placement::new();
        let rp = REGION_PAGES;
        let (p2, _) = place.take(&buddy, pages, 1, 2).unwrap();
        let (q, _) = place.take(&buddy, pages, 1, rp).unwrap();
        let (other, _) = place.take(&buddy, pages, 2, 5).unwrap();
        let free = buddy.free_pages();
        assert_eq!(place.held_pages(), 3 * rp as usize - 3);
        // Pages 0..4 and rp..rp + 2 of mapping 1: 2 and rp were placed, 0, 1, 3 and rp + 1
        // come back (the window crosses into the second region).
        assert_eq!(place.filled_elsewhere(&buddy, 1, 0, 4), 3);
        assert_eq!(place.filled_elsewhere(&buddy, 1, rp, 2), 1);
        assert_eq!(buddy.free_pages(), free + 4);
        assert_eq!(place.held_pages(), 3 * rp as usize - 7);
        assert_eq!(
            place.take(&buddy, pages, 1, 0),
            None,
            "its place was given back"
        );
        assert!(
            place.take(&buddy, pages, 1, 4).is_some(),
            "others stay placed"
        );
        // A mapping without regions there, and pages beyond any region: nothing.
        assert_eq!(place.filled_elsewhere(&buddy, 3, 0, 4 * rp), 0);
        assert_eq!(place.filled_elsewhere(&buddy, 1, 2 * rp, 2 * rp), 0);
        // A released region gives nothing more.
        place.release_all(&buddy, pages);
        assert_eq!(place.held_pages(), 0);
        assert_eq!(place.filled_elsewhere(&buddy, 2, 0, rp), 0);
        let _ = (p2, q, other);
    }

    /// Regions given back while mostly unused (a sparse reader) stop new ones for as many
    /// tries as the arena has pages; pages of a region that still holds some are placed on.
    #[test]
    fn a_sparse_reader_backs_off() {
        let pages = 4 << REGION_ORDER;
        let buddy = Buddy::new(pages, REGION_ORDER).unwrap();
        let place = Placement::new();
        let (first, _) = place.take(&buddy, pages, 1, 0).unwrap();
        let (second, _) = place.take(&buddy, pages, 1, REGION_PAGES).unwrap();
        assert_eq!(
            place.release_all(&buddy, pages),
            2 * REGION_PAGES as usize - 2
        );
        for k in 0..pages as u64 {
            assert_eq!(
                place.take(&buddy, pages, 2, k * REGION_PAGES),
                None,
                "try {k}"
            );
        }
        assert!(
            place.take(&buddy, pages, 2, 0).is_some(),
            "the back-off ends"
        );
        let _ = (first, second);
    }

    /// No region is set aside while less than a quarter of the arena is free.
    #[test]
    fn no_region_when_memory_is_short() {
        let pages = 4 << REGION_ORDER;
        let buddy = Buddy::new(pages, REGION_ORDER).unwrap();
        let place = Placement::new();
        let mut used = Vec::new();
        while buddy.free_pages() >= pages / 4 {
            used.push(buddy.alloc(0).unwrap());
        }
        let free = buddy.free_pages();
        assert_eq!(place.take(&buddy, pages, 1, 0), None);
        assert_eq!(buddy.free_pages(), free, "nothing taken");
        buddy.free(used.pop().unwrap(), 0);
        assert!(place.take(&buddy, pages, 1, 0).is_some());
    }
}
