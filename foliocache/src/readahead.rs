//! Readahead: the kernel's ondemand algorithm (newest form, `docs/KERNEL.md`, "Readahead") and
//! the window fill, batched (seed 000/003) or one folio per lock hold.
//!
//! The decisions are pure functions of a reader's [`RaState`], the request and what the index
//! holds (through `Probe`): `sync_ra` on a miss, `async_ra` on a folio carrying the READAHEAD
//! mark, `force_fill` for `readahead(2)`/`WillNeed`. Each returns a `Fill`: which pages to
//! insert, in which folio orders, and where the next mark goes. `fill` then allocates, inserts
//! and submits the reads.
//!
//! The fill, by `Policy::insert`:
//! - `Batched`: allocate every folio of the window first (outside any lock), then insert each
//!   contiguous run with one hold of the mapping's lock; a folio already present ends the run:
//!   what went in is kept, the present page is skipped, the rest goes on. If the window cannot
//!   be allocated in full, the memory is handed back and the fill continues one by one.
//! - `Single`: the loop before the seed: for each page, check the index, allocate, insert
//!   under its own lock hold.
//!
//! Both insert the same folios at the same indexes and set the same mark, and both hand the
//! backend one batch of requests (one per contiguous run, split at the cache's request size).

use crate::error::Error;
use crate::index::{Entry, RangeStop};
use crate::inode::{DiskSource, Inode};
use crate::io::ReadRequest;
use crate::mapping::Mapping;
use crate::mem::{FolioRef, LockedFolio, NewFolio, PAGE_SHIFT, PAGE_SIZE, flag};
use crate::policy::InsertPolicy;
use crate::stats::RaCounters;
use std::sync::Arc;

/// The largest readahead window (and device request, `max_io_bytes`) a cache accepts: 1 GiB.
/// [`Handle::set_ra_bytes`](crate::Handle::set_ra_bytes) clamps to it.
pub const MAX_READAHEAD_BYTES: u64 = 1 << 30;

/// The kernel's default maximum window (`VM_READAHEAD_PAGES`): 128 KiB.
pub const DEFAULT_RA_PAGES: u64 = 32;
/// The forced path reads in chunks of this many pages (2 MiB).
const FORCE_CHUNK_PAGES: u64 = 512;

/// One reader's readahead state (the kernel's `file_ra_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaState {
    /// First page of the most recent window.
    pub start: u64,
    /// Pages in it.
    pub size: u64,
    /// Its speculative tail; the mark sits on page `start + size - async_size`.
    pub async_size: u64,
    /// Folio order of the most recent window (the async path ramps it by 2).
    pub order: u8,
    /// Maximum window in pages (0 disables readahead).
    pub ra_pages: u64,
    /// The window the file started with (`Advice::Normal` restores it).
    pub default_ra_pages: u64,
    /// Byte position just after the previous read; -1 before any.
    pub prev_pos: i64,
    /// `Advice::Random`: no heuristics, read exactly what is asked.
    pub random: bool,
}

impl RaState {
    /// A fresh state with a maximum window of `ra_pages` pages.
    pub fn new(ra_pages: u64) -> Self {
        Self {
            start: 0,
            size: 0,
            async_size: 0,
            order: 0,
            ra_pages,
            default_ra_pages: ra_pages,
            prev_pos: -1,
            random: false,
        }
    }

    /// The page of the mark the last window set (where the async path expects to be called).
    pub fn mark_index(&self) -> u64 {
        self.start + self.size - self.async_size
    }
}

/// What the decisions need to know about the file and the index.
pub(crate) trait Probe {
    /// The last page index at or before `index` with no folio, scanning at most `max_scan`
    /// (`u64::MAX` if everything back to page 0 is cached).
    fn prev_miss(&self, index: u64, max_scan: u64) -> u64;
    /// The first page index at or after `index` with no folio, scanning at most `max_scan`.
    fn next_miss(&self, index: u64, max_scan: u64) -> u64;
}

impl Probe for Mapping {
    fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        Mapping::prev_miss(self, index, max_scan)
    }
    fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        Mapping::next_miss(self, index, max_scan)
    }
}

/// What the kernel's xarray walk sees of the index: which folio covers a page.
pub(crate) trait Slots {
    /// The first page and the order of the folio covering page `index`, if any.
    fn folio_at(&self, index: u64) -> Option<(u64, u8)>;
    /// Whether a folio covers any page of `first..=last`.
    fn any_folio(&self, first: u64, last: u64) -> bool;
}

impl Slots for Mapping {
    fn folio_at(&self, index: u64) -> Option<(u64, u8)> {
        match self.index().load(index) {
            Some(Entry::Folio { order, .. }) => Some((index & !((1u64 << order) - 1), order)),
            _ => None,
        }
    }

    fn any_folio(&self, first: u64, last: u64) -> bool {
        self.index().next_present(first, last).is_some()
    }
}

/// `page_cache_prev_miss` and `page_cache_next_miss` as the kernel (6.18) computes them, walking
/// its xarray with `xas_prev`/`xas_next` from a fresh state.
///
/// The walk matters because of a quirk with large folios: when the first page looked at lies
/// inside a multi-page folio (not its first page), `xas_load` leaves the walk on the folio's
/// *first* slot while the index stays where it was. The following steps then move slot and
/// index together, so the slot looked at lags the index by the distance into that folio until
/// the walk leaves the 64-slot node, and the index returned is off by as much. Seen on 6.18:
/// two interleaved streams, the second's mark at page 4 (an order-2 folio) starts the next
/// window at 21, not at the first gap, 20; a stride read past 48 pages cached from page 0
/// finds a gap at page 2 and sizes its window from 45 pages of history, not from a whole file
/// cached from its start. Matching the kernel means walking the same way, which
/// [`kernel_walk`]'s model of the xarray (64-slot nodes, a folio of order k stored at level
/// k / 6 in 2^(k mod 6) slots) does from what the index holds.
#[derive(Debug)]
pub(crate) struct XaWalk<'s, S: Slots>(pub(crate) &'s S);

impl<S: Slots> Probe for XaWalk<'_, S> {
    fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        let mut xas = kernel_walk::Xas::new(self.0, index);
        for _ in 0..max_scan {
            if !xas.prev() {
                return xas.index;
            }
            if xas.index == u64::MAX && index != u64::MAX {
                return xas.index;
            }
        }
        xas.index.wrapping_sub(1)
    }

    fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        let mut xas = kernel_walk::Xas::new(self.0, index);
        for _ in 0..max_scan {
            if !xas.next() {
                return xas.index;
            }
            if xas.index == 0 && index != 0 {
                return xas.index;
            }
        }
        xas.index.wrapping_add(1)
    }
}

/// A model of the kernel's xarray walk (`lib/xarray.c`: `xas_load`, `xas_next`, `xas_prev`),
/// enough to find misses the way `page_cache_{prev,next}_miss` do. The tree is derived from
/// the folios: its root is as high as the largest cached page needs, a slot of a node at
/// `shift` holds a folio entry (or a sibling of one) when a folio of order `shift..shift + 6`
/// covers it, a child node when smaller folios lie under it, and nothing otherwise.
mod kernel_walk {
    use super::Slots;

    const CHUNK_SHIFT: u32 = 6;
    const CHUNK_MASK: u64 = 63;

    /// What a slot holds.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Slot {
        Empty,
        Node,
        /// A folio entry or a sibling slot of one; `head` is the slot of the entry itself.
        Folio {
            head: u64,
        },
    }

    /// Where the walk is (`xas->xa_node`).
    #[derive(Debug, Clone, Copy)]
    enum At {
        /// `XAS_RESTART`: not walked yet.
        Restart,
        /// `XAS_BOUNDS`: ran off the tree.
        Bounds,
        /// `NULL`: the tree is one entry at index 0, held in its head.
        Head,
        /// A node: its level and the first index it covers.
        Node { shift: u32, base: u64 },
    }

    /// The tree's shape: empty, a single page at index 0 (held in the head, no node), or a
    /// root node at this level.
    #[derive(Debug, Clone, Copy)]
    enum Tree {
        Empty,
        Single,
        Root(u32),
    }

    /// The level a folio of this order is stored at.
    fn level_of(order: u8) -> u32 {
        u32::from(order) / CHUNK_SHIFT * CHUNK_SHIFT
    }

    /// Indexes covered by one slot of a node at `shift`.
    fn slot_span(shift: u32) -> u64 {
        1u64.checked_shl(shift).unwrap_or(0)
    }

    /// The first index covered by the parent of a node at `shift` that starts at `base`.
    fn parent_base(shift: u32, base: u64) -> u64 {
        match 1u64.checked_shl(shift + 2 * CHUNK_SHIFT) {
            Some(span) => base & !(span - 1),
            None => 0,
        }
    }

    fn tree<S: Slots>(slots: &S) -> Tree {
        if !slots.any_folio(0, u64::MAX) {
            return Tree::Empty;
        }
        if !slots.any_folio(1, u64::MAX) && slots.folio_at(0) == Some((0, 0)) {
            return Tree::Single;
        }
        let mut shift = 0;
        while shift + CHUNK_SHIFT < 64 && slots.any_folio(1u64 << (shift + CHUNK_SHIFT), u64::MAX) {
            shift += CHUNK_SHIFT;
        }
        // A folio as large as the whole range of such a root lives one level up.
        if let Some((_, order)) = slots.folio_at(0) {
            shift = shift.max(level_of(order));
        }
        Tree::Root(shift)
    }

    /// `struct xa_state` for one walk.
    pub(super) struct Xas<'s, S: Slots> {
        slots: &'s S,
        tree: Tree,
        pub(super) index: u64,
        at: At,
        offset: u64,
    }

    impl<'s, S: Slots> Xas<'s, S> {
        /// `XA_STATE(xas, &mapping->i_pages, index)`.
        pub(super) fn new(slots: &'s S, index: u64) -> Self {
            Self {
                slots,
                tree: tree(slots),
                index,
                at: At::Restart,
                offset: 0,
            }
        }

        fn slot(&self, shift: u32, base: u64, offset: u64) -> Slot {
            let first = base + (offset << shift);
            match self.slots.folio_at(first) {
                Some((head, order)) if level_of(order) >= shift => Slot::Folio {
                    head: (head >> shift) & CHUNK_MASK,
                },
                _ if shift == 0 => Slot::Empty,
                _ if self.slots.any_folio(first, first + (slot_span(shift) - 1)) => Slot::Node,
                _ => Slot::Empty,
            }
        }

        /// `xas_load`: from the head down to the entry for `index`; a sibling slot is resolved
        /// to its entry's slot (the quirk's origin). Whether a folio is there.
        fn load(&mut self) -> bool {
            let root = match self.tree {
                Tree::Empty => {
                    self.at = if self.index == 0 {
                        At::Head
                    } else {
                        At::Bounds
                    };
                    return false;
                }
                Tree::Single => {
                    self.at = if self.index == 0 {
                        At::Head
                    } else {
                        At::Bounds
                    };
                    return self.index == 0;
                }
                Tree::Root(shift) => shift,
            };
            if self.index.checked_shr(root).unwrap_or(0) > CHUNK_MASK {
                self.at = At::Bounds;
                return false;
            }
            let (mut shift, mut base) = (root, 0);
            loop {
                let offset = (self.index >> shift) & CHUNK_MASK;
                match self.slot(shift, base, offset) {
                    Slot::Node => {
                        base += offset << shift;
                        shift -= CHUNK_SHIFT;
                    }
                    Slot::Folio { head } => {
                        self.at = At::Node { shift, base };
                        self.offset = head;
                        return true;
                    }
                    Slot::Empty => {
                        self.at = At::Node { shift, base };
                        self.offset = offset;
                        return false;
                    }
                }
            }
        }

        /// The descent that ends `__xas_next`/`__xas_prev`: from `offset` in the node at
        /// `shift`, down through child nodes, each entered at the slot of `index`.
        fn descend(&mut self, mut shift: u32, mut base: u64) -> bool {
            loop {
                match self.slot(shift, base, self.offset) {
                    Slot::Node => {
                        base += self.offset << shift;
                        shift -= CHUNK_SHIFT;
                        self.offset = (self.index >> shift) & CHUNK_MASK;
                    }
                    slot => {
                        self.at = At::Node { shift, base };
                        return slot != Slot::Empty;
                    }
                }
            }
        }

        /// `xas_next`: whether the next slot holds a folio (`self.index` is its index).
        pub(super) fn next(&mut self) -> bool {
            let (mut shift, mut base) = match self.at {
                At::Restart => return self.load(),
                At::Head => {
                    self.index = self.index.wrapping_add(1);
                    self.at = At::Bounds;
                    return false;
                }
                At::Bounds => {
                    self.index = self.index.wrapping_add(1);
                    return self.load();
                }
                At::Node { shift, base } => (shift, base),
            };
            if shift == 0 && self.offset != CHUNK_MASK {
                self.index = self.index.wrapping_add(1);
                self.offset += 1;
                return self.slot(0, base, self.offset) != Slot::Empty;
            }
            self.index = self.index.wrapping_add(1);
            if self.offset != (self.index >> shift) & CHUNK_MASK {
                self.offset += 1;
            }
            while self.offset == CHUNK_MASK + 1 {
                if matches!(self.tree, Tree::Root(root) if root == shift) {
                    self.at = At::Bounds;
                    return false;
                }
                let parent = shift + CHUNK_SHIFT;
                self.offset = ((base >> parent) & CHUNK_MASK) + 1;
                base = parent_base(shift, base);
                shift = parent;
            }
            self.descend(shift, base)
        }

        /// `xas_prev`: whether the previous slot holds a folio (`self.index` is its index).
        pub(super) fn prev(&mut self) -> bool {
            let (mut shift, mut base) = match self.at {
                At::Restart => return self.load(),
                At::Head => {
                    self.index = self.index.wrapping_sub(1);
                    self.at = At::Bounds;
                    return false;
                }
                At::Bounds => {
                    self.index = self.index.wrapping_sub(1);
                    return self.load();
                }
                At::Node { shift, base } => (shift, base),
            };
            if shift == 0 && self.offset != 0 {
                self.index = self.index.wrapping_sub(1);
                self.offset -= 1;
                return self.slot(0, base, self.offset) != Slot::Empty;
            }
            self.index = self.index.wrapping_sub(1);
            // The slot as the kernel's unsigned char: "one before 0" is 255.
            let mut offset = self.offset as i64;
            if self.offset != (self.index >> shift) & CHUNK_MASK {
                offset -= 1;
            }
            while offset < 0 {
                if matches!(self.tree, Tree::Root(root) if root == shift) {
                    self.at = At::Bounds;
                    return false;
                }
                let parent = shift + CHUNK_SHIFT;
                offset = ((base >> parent) & CHUNK_MASK) as i64 - 1;
                base = parent_base(shift, base);
                shift = parent;
            }
            self.offset = offset as u64;
            self.descend(shift, base)
        }
    }
}

/// The fixed facts a fill is planned against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// The file's largest folio order (0: no large folios).
    pub(crate) max_order: u8,
    /// The device's largest I/O in pages (`bdi->io_pages`).
    pub(crate) io_pages: u64,
    /// The file size in bytes.
    pub(crate) file_size: u64,
}

impl Geometry {
    fn last_page(&self) -> Option<u64> {
        self.file_size.checked_sub(1).map(|last| last >> PAGE_SHIFT)
    }
}

impl Inode {
    /// The file's geometry for planning fills.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            max_order: self.max_order,
            io_pages: self.core.io_pages,
            file_size: self.mapping.size(),
        }
    }
}

/// Which decision made a fill (for counters and traces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A miss that starts (or restarts) a sequential stream.
    SyncFresh,
    /// A miss preceded by cached pages: a stream whose state was lost, sized from history.
    SyncContext,
    /// A small random read: only the request is read.
    SyncRandom,
    /// Readahead forced (random mode, `readahead()`, `WillNeed`).
    Forced,
    /// The mark of the last window was hit: the pipelined continuation.
    AsyncPipelined,
    /// A mark not from this reader's last window (interleaved streams): recovered from the index.
    AsyncRecovered,
}

/// Pages to read: either laid out in large folios (`page_cache_ra_order`) or in order-0 pages
/// (`do_page_cache_ra`), with the lookahead that places the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// `page_cache_ra_order` for the window in `ra` (start, size, async_size, order).
    Window,
    /// `do_page_cache_ra(start, count, lookahead)`.
    Pages {
        start: u64,
        count: u64,
        lookahead: u64,
    },
    /// `force_page_cache_ra(start, count)`: 2 MiB chunks of pages, no mark.
    Forced { start: u64, count: u64 },
}

/// `get_init_ra_size`: the first window for a request of `req` pages.
pub fn init_ra_size(req: u64, max: u64) -> u64 {
    // A request too large for a power of two is larger than any window.
    let p = req.max(1).checked_next_power_of_two().unwrap_or(u64::MAX);
    if p <= max / 32 {
        4 * p
    } else if p <= max / 4 {
        2 * p
    } else {
        max
    }
}

/// `get_next_ra_size`: the window after one of `cur` pages.
pub fn next_ra_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}

/// `ractl_max_pages`: the window limit for a request of `req` pages.
fn max_pages(ra: &RaState, req: u64, geometry: &Geometry) -> u64 {
    let mut max = ra.ra_pages;
    if req > max && geometry.io_pages > max {
        max = req.min(geometry.io_pages);
    }
    max
}

/// `page_cache_sync_ra`: a reader needs page `index` (and `req` pages from it) and found
/// nothing cached there.
pub(crate) fn sync_ra(
    ra: &mut RaState,
    index: u64,
    req: u64,
    geometry: &Geometry,
    probe: &impl Probe,
) -> (Trigger, Fill) {
    let mut req = req.max(1);
    let mut forced = ra.random;
    if ra.ra_pages == 0 {
        req = 1;
        forced = true;
    }
    if forced {
        return (Trigger::Forced, force_fill(ra, index, req, geometry));
    }
    let max = max_pages(ra, req, geometry);
    let prev_index = (ra.prev_pos as u64) >> PAGE_SHIFT;
    let trigger = if index == 0 || req > max || index.wrapping_sub(prev_index) <= 1 {
        ra.size = init_ra_size(req, max);
        ra.async_size = if ra.size > req {
            ra.size - req
        } else {
            ra.size / 2
        };
        Trigger::SyncFresh
    } else {
        let miss = probe.prev_miss(index.wrapping_sub(1), max);
        let mut contig = index.wrapping_sub(miss).wrapping_sub(1);
        if contig <= req {
            return (
                Trigger::SyncRandom,
                Fill::Pages {
                    start: index,
                    count: req,
                    lookahead: 0,
                },
            );
        }
        if miss == u64::MAX {
            // Cached all the way back to page 0: a long-running stream.
            contig = contig.saturating_mul(2);
        }
        ra.size = contig.saturating_add(req).min(max);
        ra.async_size = 1;
        Trigger::SyncContext
    };
    ra.start = index;
    ra.order = 0;
    (trigger, Fill::Window)
}

/// `page_cache_async_ra`: a reader found the READAHEAD mark on the folio at `folio_index`
/// (`folio_pages` long) and wants `req` pages from there. The caller has cleared the mark.
/// Returns `None` when nothing is to be read.
pub(crate) fn async_ra(
    ra: &mut RaState,
    folio_index: u64,
    folio_pages: u64,
    req: u64,
    geometry: &Geometry,
    probe: &impl Probe,
) -> Option<(Trigger, Fill)> {
    if ra.ra_pages == 0 {
        return None;
    }
    let max = max_pages(ra, req, geometry);
    let expected = ra.mark_index() & !(folio_pages.max(1) - 1);
    let trigger = if folio_index == expected {
        ra.start += ra.size;
        ra.size = ra.size.max(next_ra_size(ra.size, max));
        Trigger::AsyncPipelined
    } else {
        let start = probe.next_miss(folio_index + 1, max);
        if start == 0 || start - folio_index > max {
            return None;
        }
        ra.start = start;
        ra.size = next_ra_size(start - folio_index + req, max);
        Trigger::AsyncRecovered
    };
    // Ramp the folio order up and end the window on a natural boundary of it.
    ra.order = ra.order.saturating_add(2);
    let align_order = u32::from(ra.order).min(max.trailing_zeros());
    let align = 1u64 << align_order.min(63);
    let end = ra.start + ra.size;
    let aligned_end = end & !(align - 1);
    if aligned_end > ra.start {
        ra.size -= end - aligned_end;
    }
    ra.async_size = ra.size;
    Some((trigger, Fill::Window))
}

/// `force_page_cache_ra`: read `req` pages from `index` with no heuristics and no mark (the
/// request is clamped to the larger of the device's I/O size and the window).
pub(crate) fn force_fill(ra: &RaState, index: u64, req: u64, geometry: &Geometry) -> Fill {
    let max = geometry.io_pages.max(ra.ra_pages).max(1);
    Fill::Forced {
        start: index,
        count: req.min(max),
    }
}

/// One folio of a planned fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) index: u64,
    pub(crate) order: u8,
    pub(crate) mark: bool,
}

/// `page_cache_ra_order`'s layout of the window in `ra`: naturally aligned folios of the
/// window's order (smaller at misaligned starts and near the end), the mark on the folio
/// holding `start + size - async_size`, none when the window reaches end of file. Updates
/// `ra.order` to the order used. `None` for a file without large folios (the caller reads the
/// window in pages).
pub(crate) fn window_layout(ra: &mut RaState, geometry: &Geometry) -> Option<Vec<Slot>> {
    if geometry.max_order == 0 {
        ra.order = 0;
        return None;
    }
    let last = geometry.last_page()?;
    let start = ra.start;
    if start > last || ra.size == 0 {
        return Some(Vec::new());
    }
    let (limit, mark) = if last > start + ra.size - 1 {
        (start + ra.size - 1, Some(start + ra.size - ra.async_size))
    } else {
        (last, None)
    };
    let new_order = ra
        .order
        .min(geometry.max_order)
        .min(ra.size.ilog2().min(63) as u8);
    ra.order = new_order;
    let mut slots = Vec::new();
    let mut index = start;
    while index <= limit {
        let mut order = new_order;
        if index & ((1u64 << order) - 1) != 0 {
            order = index.trailing_zeros() as u8;
        }
        while order > 0 && index + (1u64 << order) - 1 > limit {
            order -= 1;
        }
        let nr = 1u64 << order;
        slots.push(Slot {
            index,
            order,
            mark: mark.is_some_and(|mark| index == mark & !(nr - 1)),
        });
        index += nr;
    }
    Some(slots)
}

/// `do_page_cache_ra`'s layout: `count` order-0 pages from `start`, clipped at end of file
/// (then with no mark), the mark `lookahead` pages before the end.
pub(crate) fn pages_layout(
    start: u64,
    count: u64,
    lookahead: u64,
    geometry: &Geometry,
) -> Vec<Slot> {
    let Some(last) = geometry.last_page() else {
        return Vec::new();
    };
    if start > last || count == 0 {
        return Vec::new();
    }
    let (count, lookahead) = if count > last - start + 1 {
        (last - start + 1, 0)
    } else {
        (count, lookahead)
    };
    let mark = (lookahead > 0 && lookahead <= count).then(|| start + count - lookahead);
    (start..start + count)
        .map(|index| Slot {
            index,
            order: 0,
            mark: Some(index) == mark,
        })
        .collect()
}

impl RaCounters {
    pub(crate) fn count(&self, trigger: Trigger) {
        match trigger {
            Trigger::SyncFresh => &self.sync_fresh,
            Trigger::SyncContext => &self.sync_context,
            Trigger::SyncRandom => &self.sync_random,
            Trigger::Forced => &self.forced,
            Trigger::AsyncPipelined => &self.async_pipelined,
            Trigger::AsyncRecovered => &self.async_recovered,
        }
        .inc();
    }
}

/// Carries out `fill` for `file` (the decision already updated `ra`): allocates, inserts and
/// submits. Returns the number of pages inserted.
pub(crate) fn fill(file: &Arc<Inode>, ra: &mut RaState, what: Fill) -> u64 {
    fill_for(file, ra, what, false)
}

/// [`fill`], for a reader that waits for the fill at once (`waits`: a miss), whose reads the
/// backend may then do in the calling thread (`Backend::read_now`).
fn fill_for(file: &Arc<Inode>, ra: &mut RaState, what: Fill, waits: bool) -> u64 {
    let Some(disk) = file.disk() else { return 0 };
    let geometry = file.geometry();
    let counters = &disk.ra;
    let mut out = Submission::new(file, disk);
    out.waits = waits;
    match what {
        Fill::Window => {
            counters.windows.inc();
            let (start, size, async_size) = (ra.start, ra.size, ra.async_size);
            if geometry.last_page().is_some_and(|last| last < start + size) {
                counters.windows_at_eof.inc();
            }
            match window_layout(ra, &geometry) {
                Some(slots) => {
                    let done = out.insert_slots(&slots, false);
                    if done < slots.len() {
                        // A folio was present or memory ran short: finish the window in pages,
                        // skipping what is there (the kernel's fallback to `do_page_cache_ra`).
                        counters.order_fallbacks.inc();
                        let index = slots[done].index;
                        let left = size - (index - start);
                        let pages = pages_layout(index, left, async_size, &geometry);
                        out.insert_slots(&pages, true);
                    }
                }
                None => {
                    let pages = pages_layout(start, size, async_size, &geometry);
                    out.insert_slots(&pages, true);
                }
            }
        }
        Fill::Pages {
            start,
            count,
            lookahead,
        } => {
            let pages = pages_layout(start, count, lookahead, &geometry);
            out.insert_slots(&pages, true);
        }
        Fill::Forced { start, count } => {
            let mut index = start;
            let end = start.saturating_add(count);
            while index < end {
                let chunk = (end - index).min(FORCE_CHUNK_PAGES);
                let pages = pages_layout(index, chunk, 0, &geometry);
                if pages.is_empty() {
                    break;
                }
                out.insert_slots(&pages, true);
                index += chunk;
            }
        }
    }
    out.submit()
}

/// A reader missed page `index` and wants `req` pages from it: decide (`sync_ra`), count the
/// decision, fill.
pub(crate) fn on_miss(file: &Arc<Inode>, ra: &mut RaState, index: u64, req: u64) {
    let Some(disk) = file.disk() else { return };
    let probe = XaWalk(&file.mapping);
    let (trigger, what) = sync_ra(ra, index, req, &file.geometry(), &probe);
    disk.ra.count(trigger);
    fill_for(file, ra, what, true);
}

/// A reader found `folio` and wants `req` pages from it: if the folio carries the READAHEAD
/// mark, consume it (one reader does) and start the next window (`async_ra`), before anyone
/// waits for this folio's bytes.
pub(crate) fn on_folio(file: &Arc<Inode>, ra: &mut RaState, folio: &FolioRef<'_>, req: u64) {
    let Some(disk) = file.disk() else { return };
    if !(folio.test(flag::READAHEAD) && folio.clear(flag::READAHEAD)) {
        return;
    }
    let (index, pages) = (folio.index(), folio.nr_pages() as u64);
    let probe = XaWalk(&file.mapping);
    match async_ra(ra, index, pages, req, &file.geometry(), &probe) {
        Some((trigger, what)) => {
            disk.ra.count(trigger);
            fill(file, ra, what);
        }
        None => disk.ra.async_skipped.inc(),
    }
}

/// The folios a fill inserted, grouped into read requests, submitted together at the end.
struct Submission<'f> {
    file: &'f Arc<Inode>,
    disk: &'f DiskSource,
    /// The current contiguous run: first byte offset, its locked folios, its bytes.
    run: Option<(u64, Vec<LockedFolio<'f>>, usize)>,
    requests: Vec<ReadRequest>,
    pages: u64,
    /// Folios inserted, and those carrying the READAHEAD mark: added to the file's counters
    /// once at submission (a locked increment of a shared line per folio was most of `push`).
    folios: u64,
    marks: u64,
    /// Each inserted folio's id and the shadow entry it replaced.
    inserted: Vec<(u32, Option<u64>)>,
    /// The caller waits for these reads at once (a miss).
    waits: bool,
}

impl<'f> Submission<'f> {
    fn new(file: &'f Arc<Inode>, disk: &'f DiskSource) -> Self {
        Self {
            file,
            disk,
            run: None,
            requests: Vec::new(),
            pages: 0,
            folios: 0,
            marks: 0,
            inserted: Vec::new(),
            waits: false,
        }
    }

    /// Inserts the planned folios in order, skipping indexes where a folio is present when
    /// `skip_present` (a page fill), stopping there otherwise (a large-folio window). Returns
    /// how many slots were dealt with (inserted or skipped) before a stop.
    fn insert_slots(&mut self, slots: &[Slot], skip_present: bool) -> usize {
        // Pages already cached at the start are passed over before anything is allocated for
        // them (the kernel's `page_cache_ra_unbounded` looks each index up first): a
        // `readahead(2)` over a range the program just read costs one lookup, not a folio, a
        // lock and a free per page.
        debug_assert!(
            !skip_present
                || slots.iter().enumerate().all(|(k, slot)| {
                    slot.order == 0 && slot.index == slots[0].index + k as u64
                }),
            "a layout that skips present pages is consecutive pages"
        );
        let lead = if skip_present {
            self.present_run(slots)
        } else {
            0
        };
        if lead > 0 {
            self.end_run();
            self.count_skips(lead);
        }
        let slots = &slots[lead..];
        if slots.is_empty() {
            return lead;
        }
        self.inserted.reserve(slots.len());
        let policy = self.file.policy.insert;
        if policy == InsertPolicy::Batched {
            match self.preallocate(slots) {
                Some(folios) => return lead + self.insert_batched(slots, folios, skip_present),
                None => self.disk.ra.batch_alloc_fallbacks.inc(),
            }
        }
        lead + self.insert_single(slots, skip_present)
    }

    /// How many of `slots` from the first are cached already, found without the lock (a hint:
    /// a page cached after the look is found again by the insertion). `slots` is a layout of
    /// consecutive pages, as [`pages_layout`] makes for every caller that skips present pages
    /// (checked once, in [`Submission::insert_slots`]).
    fn present_run(&self, slots: &[Slot]) -> usize {
        let Some(first) = slots.first() else {
            return 0;
        };
        let miss = self.file.mapping.next_miss(first.index, slots.len() as u64);
        // `next_miss` returns 0 when the scan ran past the largest index: all of them cached.
        let cached = miss.checked_sub(first.index).unwrap_or(slots.len() as u64);
        cached.min(slots.len() as u64) as usize
    }

    /// Allocates a folio for every slot, or none at all (memory under pressure). A window of
    /// large folios may get folios for its first slots only (the next large folio could not
    /// be had): its caller finishes the window in 4 KiB folios.
    fn preallocate(&self, slots: &[Slot]) -> Option<Vec<NewFolio<'f>>> {
        let cache = &self.file.core;
        let mut folios = Vec::with_capacity(slots.len());
        // A window of 4 KiB folios takes its pages in one go; what that cannot give (memory
        // runs out, large folios) comes one by one, reclaiming as needed.
        let small = slots.iter().all(|slot| slot.order == 0);
        if small && slots.len() <= crate::mem::place::PLACE_MAX_PAGES {
            // A random reader's fill: its pages go to their offsets in the file's regions
            // (`mem::place`), as far as they can.
            for slot in slots {
                let Some(folio) = self.file.mapping.alloc_placed(slot.index) else {
                    break;
                };
                folios.push(folio);
            }
        }
        let placed = folios.len();
        if folios.is_empty() && small {
            cache.alloc_pages_for_readahead(slots.len(), &mut folios);
        }
        let mut rest: u64 = slots[folios.len()..].iter().map(|s| 1u64 << s.order).sum();
        for slot in &slots[folios.len()..] {
            let wanted = rest;
            rest -= 1u64 << slot.order;
            match cache.alloc_for_window(slot.order, wanted) {
                Ok(folio) => folios.push(folio),
                // A large folio that cannot be had (its allocation evicted what it would):
                // the folios so far go in, and the window's caller finishes it in 4 KiB
                // folios, without asking for this one again (another eviction).
                Err(_) if slot.order > 0 => break,
                Err(_) => return None,
            }
        }
        if placed < folios.len() && self.file.mapping.places_held() {
            self.give_up_places(&slots[placed..folios.len()]);
        }
        for (folio, slot) in folios.iter().zip(slots) {
            if slot.mark {
                folio.set(flag::READAHEAD);
            }
        }
        Some(folios)
    }

    /// `slots` were filled outside their regions: the regions give up their places, one call
    /// per run of consecutive pages.
    fn give_up_places(&self, slots: &[Slot]) {
        let mut run: Option<(u64, u64)> = None;
        for slot in slots {
            let pages = 1u64 << slot.order;
            run = match run {
                Some((first, count)) if first + count == slot.index => Some((first, count + pages)),
                Some((first, count)) => {
                    self.file.mapping.filled_elsewhere(first, count);
                    Some((slot.index, pages))
                }
                None => Some((slot.index, pages)),
            };
        }
        if let Some((first, count)) = run {
            self.file.mapping.filled_elsewhere(first, count);
        }
    }

    fn insert_batched(
        &mut self,
        slots: &[Slot],
        mut folios: Vec<NewFolio<'f>>,
        skip_present: bool,
    ) -> usize {
        let mapping = &self.file.mapping;
        let mut k = 0;
        while k < slots.len() && !folios.is_empty() {
            let (inserted, rest, stopped, shadows) =
                match mapping.add_folio_range(slots[k].index, folios) {
                    Ok(add) => (add.inserted, add.rest, add.stopped, add.shadows),
                    // `add_folio_range` fails outright only on a malformed run, which the
                    // layouts never produce; the folios were freed.
                    Err(_) => (
                        Vec::new(),
                        Vec::new(),
                        Some(RangeStop::NoMemory),
                        Vec::new(),
                    ),
                };
            let count = inserted.len();
            for (j, locked) in inserted.into_iter().enumerate() {
                let shadow = shadows.get(j).copied().flatten();
                self.push(locked, slots[k + j], shadow);
            }
            k += count;
            folios = rest;
            match stopped {
                None => {}
                Some(RangeStop::Present(_)) if skip_present && k < slots.len() => {
                    // Submit what went in, skip the cached pages (their folios are freed),
                    // go on after them.
                    self.end_run();
                    let cached = self.present_run(&slots[k..]).max(1);
                    self.count_skips(cached);
                    folios.drain(..cached.min(folios.len()));
                    k += cached;
                }
                Some(_) => break,
            }
        }
        // The folios that did not go in are ours alone: freed as they drop.
        k.min(slots.len())
    }

    fn insert_single(&mut self, slots: &[Slot], skip_present: bool) -> usize {
        let mapping = &self.file.mapping;
        let cache = &self.file.core;
        // Pages the window still needs, this slot's included (eviction frees them at once).
        let mut rest: u64 = slots.iter().map(|s| 1u64 << s.order).sum();
        for (k, slot) in slots.iter().enumerate() {
            let nr = 1u64 << slot.order;
            let wanted = rest;
            rest -= nr;
            if mapping.next_miss(slot.index, nr) != slot.index {
                // Something is cached there (checked without the lock, as the kernel does).
                if !skip_present {
                    return k;
                }
                self.end_run();
                self.count_skips(1);
                continue;
            }
            let Ok(folio) = cache.alloc_for_window(slot.order, wanted) else {
                self.disk.ra.out_of_memory.inc();
                return k;
            };
            if slot.mark {
                folio.set(flag::READAHEAD);
            }
            match mapping.add_folio(folio, slot.index) {
                Ok((locked, shadow)) => self.push(locked, *slot, shadow),
                Err(Error::Exists { .. }) if skip_present => {
                    self.end_run();
                    self.count_skips(1);
                }
                Err(_) => return k,
            }
        }
        slots.len()
    }

    fn count_skips(&self, pages: usize) {
        self.disk.ra.present_skips.add(pages as u64);
    }

    /// Adds an inserted (locked) folio to the current run.
    fn push(&mut self, folio: LockedFolio<'f>, slot: Slot, shadow: Option<u64>) {
        let nr = 1u64 << slot.order;
        let offset = slot.index << PAGE_SHIFT;
        let len = (nr as usize) * PAGE_SIZE;
        let limit = self.file.core.request_bytes;
        let extend = matches!(&self.run, Some((first, folios, bytes))
            if first + *bytes as u64 == offset
                && *bytes + len <= limit
                && folios.len() < crate::io::MAX_IOVECS);
        if !extend {
            self.end_run();
            // Sized for a whole request of folios like this one, so that filling it never
            // reallocates: growing it from empty (eight reallocations and copies for a 512 KiB
            // request of 4 KiB folios) was about 2% of a cold sequential read's CPU.
            let room = (limit / len).clamp(1, crate::io::MAX_IOVECS);
            self.run = Some((offset, Vec::with_capacity(room), 0));
        }
        self.inserted.push((folio.folio().id(), shadow));
        if let Some((_, folios, bytes)) = self.run.as_mut() {
            folios.push(folio);
            *bytes += len;
        }
        self.pages += nr;
        self.folios += 1;
        self.marks += u64::from(slot.mark);
    }

    fn end_run(&mut self) {
        if let Some((offset, folios, _)) = self.run.take() {
            self.requests.push(ReadRequest::new(
                Arc::clone(&self.file.core.mem),
                Arc::clone(&self.disk.io),
                folios,
                offset,
                self.file.read_limit(),
            ));
        }
    }

    /// Hands every request to the backend in one batch; returns the pages inserted.
    fn submit(mut self) -> u64 {
        self.end_run();
        let disk = self.disk;
        disk.ra.pages.add(self.pages);
        disk.ra.folios.add(self.folios);
        if self.marks > 0 {
            disk.ra.marks.add(self.marks);
        }
        // On the reclaim lists while the requests still hold their references (a folio on a
        // list must not be freed without leaving it, and freeing is what takes it off).
        let cache = &self.file.core;
        cache.reclaim.add_inserted(&cache.mem, &self.inserted);
        let requests = std::mem::take(&mut self.requests);
        if !requests.is_empty() {
            crate::inject::kill::point("fill");
            if self.waits {
                disk.backend.read_now(requests);
            } else {
                disk.backend.submit(requests);
            }
        }
        self.pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Folios as (first page, order), for the xarray walk.
    struct Folios(Vec<(u64, u8)>);

    impl Slots for Folios {
        fn folio_at(&self, index: u64) -> Option<(u64, u8)> {
            self.0
                .iter()
                .copied()
                .find(|&(first, order)| index >= first && index < first + (1 << order))
        }
        fn any_folio(&self, first: u64, last: u64) -> bool {
            self.0
                .iter()
                .any(|&(f, order)| f <= last && f + (1 << order) > first)
        }
    }

    /// Order-0 pages `first..end`.
    fn pages(first: u64, end: u64) -> impl Iterator<Item = (u64, u8)> {
        (first..end).map(|i| (i, 0))
    }

    #[test]
    fn the_walk_from_inside_a_large_folio_lags_as_the_kernels_does() {
        // Pages 0-3, then order-2 folios over 4..20 (a 6.18 async window), and far away 2048.
        let mut folios: Vec<(u64, u8)> = pages(0, 4).collect();
        folios.extend((4..20).step_by(4).map(|i| (i, 2)));
        folios.push((2048, 0));
        let walk = XaWalk(&Folios(folios));
        // From page 4 (a folio's first page) the walk is in step: the gap is 20.
        assert_eq!(walk.next_miss(4, 2048), 20);
        // From page 5 (inside the folio at 4) the slot lags the index by 1: 21, as seen on
        // 6.18 (interleaved streams, the window after a mark at 4 starts at 21).
        assert_eq!(walk.next_miss(5, 2048), 21);
        assert_eq!(walk.next_miss(7, 2048), 23);
        // Backwards from page 3 (order-0 pages to 0): the whole file from its start.
        assert_eq!(walk.prev_miss(3, 2048), u64::MAX);
        // From the last page of the folio at 16, back to the head of the tree: the walk
        // runs off the root 3 indexes early and stops at page 2 (not u64::MAX).
        assert_eq!(walk.prev_miss(19, 2048), 2);
        // A scan that ends inside the cached run: one past the range, as before.
        assert_eq!(walk.prev_miss(3, 2), 1);
        assert_eq!(walk.next_miss(0, 2), 2);
    }

    #[test]
    fn the_walk_matches_the_plain_scan_on_order_0_pages() {
        let folios: Vec<(u64, u8)> = pages(0, 100).chain(pages(130, 200)).collect();
        let walk = XaWalk(&Folios(folios));
        for (index, max) in [
            (0, 50),
            (10, 500),
            (99, 5),
            (150, 500),
            (199, 80),
            (120, 30),
        ] {
            let scan_next = (index..index + max)
                .find(|&i| !(i < 100 || (130..200).contains(&i)))
                .unwrap_or(index + max);
            assert_eq!(walk.next_miss(index, max), scan_next, "next {index} {max}");
        }
        assert_eq!(walk.prev_miss(99, 500), u64::MAX);
        assert_eq!(walk.prev_miss(160, 500), 129);
        assert_eq!(walk.prev_miss(160, 10), 150);
        assert_eq!(walk.prev_miss(100, 5), 100);
    }

    #[test]
    fn init_and_next_sizes_match_the_spec_tables() {
        // docs/KERNEL.md, "Window sizes", max = 32 pages.
        let init: Vec<u64> = (1..=10).map(|req| init_ra_size(req, 32)).collect();
        assert_eq!(init, [4, 4, 8, 8, 16, 16, 16, 16, 32, 32]);
        assert_eq!(next_ra_size(1, 32), 4);
        for cur in 2..=16 {
            assert_eq!(next_ra_size(cur, 32), 2 * cur);
        }
        for cur in 17..=32 {
            assert_eq!(next_ra_size(cur, 32), 32);
        }
    }

    #[test]
    fn page_layout_drops_the_mark_when_clipped_at_eof() {
        let geometry = Geometry {
            max_order: 0,
            io_pages: 256,
            file_size: 10 * PAGE_SIZE as u64 + 1,
        };
        let slots = pages_layout(8, 8, 4, &geometry);
        assert_eq!(slots.len(), 3); // pages 8, 9, 10
        assert!(slots.iter().all(|s| !s.mark));
        let slots = pages_layout(0, 8, 3, &geometry);
        assert_eq!(slots.iter().position(|s| s.mark), Some(5));
    }

    #[test]
    fn window_layout_trims_folios_to_alignment_and_limit() {
        let geometry = Geometry {
            max_order: 9,
            io_pages: 256,
            file_size: 1 << 30,
        };
        let mut ra = RaState::new(32);
        ra.start = 12;
        ra.size = 20;
        ra.async_size = 20;
        ra.order = 4;
        let slots = window_layout(&mut ra, &geometry).unwrap();
        let shape: Vec<(u64, u8)> = slots.iter().map(|s| (s.index, s.order)).collect();
        // 12 is aligned to 4 only; 16 takes an order-4 folio (16..32).
        assert_eq!(shape, [(12, 2), (16, 4)]);
        assert!(slots[0].mark);
        assert_eq!(ra.order, 4);
    }
}
