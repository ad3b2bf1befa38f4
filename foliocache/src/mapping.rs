//! A mapping: one file's index of cached folios, its size, its writer lock and its counters
//! (the kernel's `address_space`).
//!
//! # Speculative lookup (the kernel's `filemap_get_entry` protocol)
//! Readers take no lock. To return a folio they:
//! 1. load its entry from the index (lock-free, under an epoch pin);
//! 2. take a reference with `try_get`, which fails if the folio is free or frozen;
//! 3. re-read the same slot (`reload`); if it no longer holds this folio, drop the reference
//!    and start over.
//!
//! Removers do the mirror image under the writer lock: freeze the folio's count at exactly the
//! expected value (the cache's reference plus the remover's own), then unhook it from the index,
//! then free it. Either a reader's `try_get` came first (the freeze fails: the folio stays) or
//! the freeze came first (`try_get` fails: the reader retries and finds the slot's new
//! content). A folio reused for another file or index after being freed can be *referenced* by
//! a late reader, but never *returned*: the re-read slot no longer holds it, and the reader's
//! stray reference merely delays the folio's next free (its `put` may be the last one and then
//! frees it; the free path reads what to free from the descriptor).
//!
//! Truncation does not freeze: it unhooks folios and drops the cache's reference; readers that
//! already hold a reference keep the folio (and its bytes) alive until they drop it.

use crate::error::Error;
use crate::index::{Entry, Index, IndexView, IndexWriter, MAX_VALUE, Mark, RangeStop};
use crate::mem::optimistic::{FolioView, Peek};
use crate::mem::{FolioRef, LockedFolio, Memory, NewFolio, PAGE_SHIFT, flag};
use crate::sync::Ordering;
use crate::sync::unmodelled::{
    AtomicU64 as StatU64, Counter, Ordering as StatOrdering, ShardedCounter,
};
use std::ops::RangeBounds;
use std::sync::Arc;

/// Folios `tag_towrite` tags per hold of the writer lock (the kernel's `XA_CHECK_SCHED`
/// drops its lock every 4096; a smaller chunk keeps readahead's insertions waiting less).
const TAG_CHUNK: usize = 1024;

/// Folios one index walk can return at most (the kernel's `PAGEVEC_SIZE`).
pub const BATCH_SIZE: usize = 31;

/// A batch of referenced folios returned by one index walk (the kernel's `folio_batch`).
/// Dropping or clearing it releases the references.
/// It lives on the stack: taking a batch allocates nothing.
#[derive(Debug)]
pub struct FolioBatch<'m> {
    folios: arrayvec::ArrayVec<FolioRef<'m>, BATCH_SIZE>,
    /// For a batch that came back empty: where the gap at its start ends.
    gap_end: Option<u64>,
}

impl Default for FolioBatch<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'m> FolioBatch<'m> {
    /// An empty batch with room for [`BATCH_SIZE`] folios.
    pub fn new() -> Self {
        Self {
            folios: arrayvec::ArrayVec::new(),
            gap_end: None,
        }
    }

    /// Number of folios.
    pub fn len(&self) -> usize {
        self.folios.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.folios.is_empty()
    }

    /// Releases every reference.
    pub fn clear(&mut self) {
        self.folios.clear();
        self.gap_end = None;
    }

    /// After [`Mapping::get_read_batch`] returned no folio: where the gap at the start of the
    /// requested range ends, i.e. its first page holding a folio with data (`None`: the gap
    /// runs to the end of the range). Holes and folios that read as zeros are both gap. The
    /// gap was measured in the same index walk.
    pub fn gap_end(&self) -> Option<u64> {
        self.gap_end
    }

    /// The folios, in index order.
    pub fn folios(&self) -> &[FolioRef<'m>] {
        &self.folios
    }

    /// Adds a folio (a reader's own, outside an index walk).
    pub(crate) fn push(&mut self, folio: FolioRef<'m>) {
        self.folios.push(folio);
    }

    /// Removes the last folio (and drops its reference).
    pub(crate) fn pop(&mut self) {
        self.folios.pop();
    }

    /// Takes the folios out of the batch.
    pub fn drain(&mut self) -> arrayvec::Drain<'_, FolioRef<'m>, BATCH_SIZE> {
        self.folios.drain(..)
    }
}

/// The largest read the optimistic path copies (through a buffer on the stack).
pub const OPTIMISTIC_MAX: usize = 256;

/// Tries of the optimistic copy on one folio before a caller takes the referenced path.
pub(crate) const HIT_TRIES: usize = 3;

/// The folio a reader's last optimistic read copied from, found then in the index: its next
/// small read in the same folio starts from the folio itself rather than the index walk (see
/// [`crate::mem::optimistic`], "A reader's recent folio"). A hint: a folio that changed since
/// is found out, and the read walks the index as any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recent {
    pfn: u32,
    /// The folio's life when it was found.
    seq: u32,
    /// Its first page in the file.
    first: u64,
    /// Its length in pages.
    pages: u64,
}

impl Recent {
    /// Folio `pfn`, first page `first`, copied from under `peek`.
    #[inline]
    fn found(pfn: u32, peek: &Peek, first: u64) -> Self {
        Self {
            pfn,
            seq: peek.seq(),
            first,
            pages: (peek.len() >> PAGE_SHIFT) as u64,
        }
    }

    /// Whether page `page` lies in this folio.
    #[inline]
    fn covers(&self, page: u64) -> bool {
        page.wrapping_sub(self.first) < self.pages
    }

    /// Copies `dst.len()` bytes at byte `pos` (inside this folio) out of it, if it is still
    /// at its page of mapping `mapping` in the same life, does not carry any of `refuse`'s
    /// flags, and stays so through the copy (see [`crate::mem::optimistic`], "A reader's
    /// recent folio"). Returns the read's [`Peek`] when the bytes are good.
    #[inline]
    fn copy<P: crate::mem::optimistic::Pinned>(
        &self,
        (view, pin): (&FolioView<'_>, &P),
        mapping: u64,
        refuse: u32,
        pos: u64,
        dst: &mut [u8],
    ) -> Option<Peek> {
        let peek = view.peek_again(self.pfn, self.seq, (mapping, self.first))?;
        let offset = (pos - (self.first << PAGE_SHIFT)) as usize;
        (peek.len() as u64 == self.pages << PAGE_SHIFT
            && peek.flags() & refuse == 0
            && view.peek_copy(pin, &peek, offset, dst)
            && view.peek_valid_in(&peek, mapping))
        .then_some(peek)
    }
}

/// Copies the cached bytes of `pos..pos + dst.len()` into `dst` from `pos` on, folio after
/// folio, without taking a reference, up to the first page it cannot serve this way: one not
/// cached, not uptodate, carrying the READAHEAD mark (the referenced path must see that read
/// to start the next window), or changing under the copy more than [`HIT_TRIES`] times.
/// Returns the bytes copied, the folios they came from, the index walks it took and the last
/// folio it copied from (a reader's next recent folio, see [`Recent`]). Each
/// folio copied is validated (its sequence word and its slot, as
/// [`Mapping::read_optimistic`]) and then marked accessed for reclaim, except the first when
/// it covers byte `unmarked` (a read that continues in the folio the previous one ended in,
/// which the kernel does not count again).
///
/// Before copying to a folio's end it prefetches the next folio when the read goes on into
/// it, or, with `ahead` (a sequential reader), when the next read will: 4 KiB folios are
/// seldom adjacent in the arena, and a copy that starts on a cold page waits for it. A
/// sequential reader's read that ends inside its folio prefetches what follows it there. A
/// sequential reader prefetches nothing where [`sequential_prefetch`] is off (the copies of
/// a stream then run faster alone).
///
/// [`sequential_prefetch`]: crate::mem::folio::sequential_prefetch
///
/// The hit path of a file from storage: a private cache's read (`read::read_disk_with`) and a
/// shared cache's client. `pin` must keep `index`'s nodes and `view`'s folios from reuse, and
/// be taken before the call (see [`crate::mem::optimistic`]).
pub(crate) fn copy_hits<P: crate::mem::optimistic::Pinned>(
    index: &Index,
    view: &crate::mem::optimistic::FolioView<'_>,
    pin: &P,
    pos: u64,
    dst: &mut [u8],
    unmarked: Option<u64>,
    ahead: bool,
) -> (usize, u64, u64, Option<Recent>) {
    // A sequential reader prefetches only where the CPU gains by it (`sequential_prefetch`).
    let prefetching = !ahead || crate::mem::folio::sequential_prefetch();
    let mut cursor = index.cursor_under(pin);
    let mut done = 0usize;
    let mut folios = 0;
    let mut last = None;
    let mut entry = cursor.load(pos >> PAGE_SHIFT);
    while done < dst.len() {
        let at = pos + done as u64;
        let Some(Entry::Folio {
            id,
            order,
            zeros: false,
        }) = entry
        else {
            break;
        };
        let first = cursor.first() << PAGE_SHIFT;
        let len = (crate::mem::PAGE_SIZE as u64) << order;
        let offset = (at - first) as usize;
        let n = (len as usize).saturating_sub(offset).min(dst.len() - done);
        if n == 0 {
            break;
        }
        if done == 0 && prefetching {
            // Ask for the bytes before the descriptor is loaded: on a random read both miss
            // the CPU's caches, and the two misses then overlap instead of following each
            // other (a later folio of the read was asked for while the one before it was
            // copied, below).
            view.prefetch(id, offset, n);
        }
        if prefetching && offset + n == len as usize && (done + n < dst.len() || ahead) {
            // The copy runs to this folio's end and the read (or, for a sequential reader,
            // the next one) goes on into the next folio: start bringing that one in now.
            if let Some(Entry::Folio {
                id: next,
                zeros: false,
                ..
            }) = cursor.peek_next()
            {
                let want = if done + n < dst.len() {
                    dst.len() - done - n
                } else {
                    dst.len()
                };
                view.prefetch(next, 0, want);
            }
        } else if prefetching && ahead && done + n == dst.len() && offset + n < len as usize {
            // A sequential reader's read ends inside this folio: the next read starts right
            // after it, on a page the CPU's prefetchers will not have fetched (they stop at
            // page boundaries).
            view.prefetch(id, offset + n, dst.len().min(len as usize - offset - n));
        }
        let mut copied = false;
        for _ in 0..HIT_TRIES {
            let Some(peek) = view.peek_begin(id) else {
                break;
            };
            if peek.flags() & flag::READAHEAD != 0 {
                break;
            }
            if view.peek_copy(pin, &peek, offset, &mut dst[done..done + n])
                && cursor.reload() == entry
                && view.peek_valid(&peek)
            {
                if done > 0 || !unmarked.is_some_and(|byte| byte >= first && byte < first + len) {
                    view.mark_accessed(&peek);
                }
                last = Some(Recent::found(id, &peek, cursor.first()));
                copied = true;
                break;
            }
        }
        if !copied {
            break;
        }
        done += n;
        folios += 1;
        if done < dst.len() {
            entry = cursor.load_next();
        }
    }
    (done, folios, cursor.walks(), last)
}

/// The outcome of [`Mapping::read_optimistic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Optimistic {
    /// The bytes were copied and validated.
    Data,
    /// No folio with data there (a hole, a value entry, or a folio that reads as zeros).
    Gap,
    /// Could not validate (a concurrent change, or a folio not uptodate): take a reference.
    Fallback,
}

/// Where a read batch ends besides a gap (a hole, or a folio whose entry says it reads as
/// zeros), the batch size and the requested range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Only at a gap (memory files: a folio that is not uptodate reads as zeros).
    AtGap,
    /// Also right after a folio that is not uptodate or carries the READAHEAD mark.
    AtNotReady,
}

/// Whether a loaded entry is a folio with data (not a hole, a value, or a zeros folio).
fn holds_data(entry: Option<Entry>) -> bool {
    matches!(entry, Some(Entry::Folio { zeros: false, .. }))
}

/// Why a folio could not be removed; the caller gets its reference back.
#[derive(Debug)]
pub enum RemoveError<'m> {
    /// Someone else holds a reference (the freeze failed): try again later or skip it.
    Busy(FolioRef<'m>),
    /// The folio is not in this mapping.
    NotInMapping(FolioRef<'m>),
    /// The shadow value is larger than an index value entry can hold ([`MAX_VALUE`]).
    ShadowTooLarge(FolioRef<'m>),
    /// The folio is dirty or under writeback: its data is not on storage yet.
    Dirty(FolioRef<'m>),
}

/// The result of [`Mapping::add_folio_range`].
#[derive(Debug)]
pub struct RangeAdd<'f> {
    /// The folios that went in (a prefix of the run), locked: their guards.
    pub inserted: Vec<LockedFolio<'f>>,
    /// The folios that did not go in, still private.
    pub rest: Vec<NewFolio<'f>>,
    /// What stopped the run early, if anything.
    pub stopped: Option<RangeStop>,
    /// The shadow value each inserted folio replaced, if any.
    pub shadows: Vec<Option<u64>>,
}

/// Counters of one mapping (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MappingStats {
    /// Lookups (`lookup` calls and `get_batch` calls).
    pub lookups: u64,
    /// Top-down index walks done by lookups.
    pub index_walks: u64,
    /// Times the writer lock was taken.
    pub lock_acquisitions: u64,
    /// Folios inserted.
    pub insertions: u64,
    /// Folios removed or truncated.
    pub removals: u64,
    /// Pages currently cached.
    pub cached_pages: u64,
    /// Index nodes currently allocated.
    pub index_nodes: u64,
    /// Bytes of index metadata.
    pub index_bytes: u64,
    /// Optimistic small reads that had to try again (a concurrent change was detected).
    pub optimistic_retries: u64,
    /// Pages of folios that are dirty now.
    pub dirty_pages: u64,
    /// Pages of folios under writeback now.
    pub writeback_pages: u64,
    /// Folios that reads of a file from storage copied without taking a reference (reads of
    /// at most [`HIT_READ_MAX`](crate::HIT_READ_MAX) bytes, under
    /// [`SmallReadPolicy::Optimistic`](crate::SmallReadPolicy::Optimistic)).
    pub unreferenced_hits: u64,
    /// Optimistic small reads served from the folio the same handle's last one copied from,
    /// without an index walk (not counted in `lookups`; for a file from storage, counted in
    /// `unreferenced_hits` too).
    pub recent_hits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    // Bumped by readers: sharded, so readers on several cores share no written line.
    lookups: ShardedCounter,
    index_walks: ShardedCounter,
    optimistic_retries: ShardedCounter,
    unreferenced_hits: ShardedCounter,
    recent_hits: ShardedCounter,
    // Bumped by writers, under the writer lock or close to it.
    lock_acquisitions: Counter,
    insertions: Counter,
    removals: Counter,
}

/// One file's cache: an index of folios plus size, writer lock and counters.
#[derive(Debug)]
pub struct Mapping {
    id: u64,
    index: Index,
    /// In a shared cache, the file record's size word (clients read it).
    size: crate::mem::word::Word<StatU64>,
    cached_pages: StatU64,
    counters: Counters,
    mem: Arc<Memory>,
    /// The cache's count of shadow entries (reclaim's), kept in step as this index drops them.
    shadows: Arc<ShadowCount>,
    /// The cache's dirty and writeback page counts, and this mapping's own.
    pages: Arc<PageCounts>,
    own: PageCounts,
    /// Per 64 KiB region of the file, the first page of the arena block its small fills were
    /// placed in ([`NO_BLOCK`]: none), made at the first placement (see `mem::place`). Only a
    /// hint for a read's prefetch: it may be stale or wrong, never trusted.
    placed: std::sync::OnceLock<Box<[std::sync::atomic::AtomicU32]>>,
}

/// A region without a block, in [`Mapping`]'s hint table.
const NO_BLOCK: u32 = u32::MAX;

/// The most regions a mapping's hint table has (64 GiB of file in 64 KiB regions, a table of
/// 4 MiB; reads beyond go without).
const MAX_HINTED_REGIONS: u64 = 1 << 20;

/// Pages dirty and under writeback, in all of a cache's mappings (what throttling looks at),
/// kept by the mappings as their folios change state (always under a mapping's writer lock).
#[derive(Debug, Default)]
pub(crate) struct PageCounts {
    pub(crate) dirty: StatU64,
    pub(crate) writeback: StatU64,
}

impl PageCounts {
    fn add(counter: &StatU64, pages: u64) {
        counter.fetch_add(pages, StatOrdering::Relaxed);
    }

    fn sub(counter: &StatU64, pages: u64) {
        let _ = counter.fetch_update(StatOrdering::Relaxed, StatOrdering::Relaxed, |n| {
            Some(n.saturating_sub(pages))
        });
    }
}

/// How many shadow entries a cache's indexes hold (approximately: see `ReclaimStats`). Owned by
/// reclaim, which adds to it; mappings subtract as shadows leave their index.
#[derive(Debug, Default)]
pub(crate) struct ShadowCount(StatU64);

impl ShadowCount {
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, StatOrdering::Relaxed);
    }

    /// Shadow entries left an index (consumed by a refault, or removed with their range).
    pub(crate) fn gone(&self, n: u64) {
        let _ = self
            .0
            .fetch_update(StatOrdering::Relaxed, StatOrdering::Relaxed, |s| {
                Some(s.saturating_sub(n))
            });
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(StatOrdering::Relaxed)
    }

    pub(crate) fn set(&self, n: u64) {
        self.0.store(n, StatOrdering::Relaxed);
    }
}

impl Mapping {
    pub(crate) fn new(
        mem: Arc<Memory>,
        shadows: Arc<ShadowCount>,
        pages: Arc<PageCounts>,
        id: u64,
    ) -> Self {
        Self {
            id,
            index: Index::with_meter(usize::MAX, Arc::clone(&mem.nodes)),
            size: crate::mem::word::Word::Own(StatU64::new(0)),
            cached_pages: StatU64::new(0),
            counters: Counters::default(),
            mem,
            shadows,
            pages,
            own: PageCounts::default(),
            placed: std::sync::OnceLock::new(),
        }
    }

    /// The mapping of a shared cache's file record `record` (the owner's): its index root and
    /// size are the record's words, its nodes live in the arena, and its id is the record's.
    /// A tree the record already holds is this mapping's.
    #[cfg(not(loom))]
    pub(crate) fn in_record(
        mem: Arc<Memory>,
        shadows: Arc<ShadowCount>,
        pages: Arc<PageCounts>,
        map: &Arc<crate::mem::shared::SharedMap>,
        record: usize,
    ) -> Result<Self, crate::error::Error> {
        let space = mem
            .node_space()
            .expect("a shared cache's memory has a node space");
        let rec = &map.files()[record];
        let index = Index::of_record(map, record, space, Arc::clone(&mem.nodes), true)?;
        let size = map.word(&rec.size);
        Ok(Self {
            id: rec.mapping_id.load(StatOrdering::Acquire),
            index,
            size,
            cached_pages: StatU64::new(0),
            counters: Counters::default(),
            mem,
            shadows,
            pages,
            own: PageCounts::default(),
            placed: std::sync::OnceLock::new(),
        })
    }

    /// Pages of this mapping's folios that are dirty.
    pub(crate) fn dirty_pages(&self) -> u64 {
        self.own.dirty.load(StatOrdering::Relaxed)
    }

    /// Pages of this mapping's folios under writeback.
    pub(crate) fn writeback_pages(&self) -> u64 {
        self.own.writeback.load(StatOrdering::Relaxed)
    }

    fn count_dirty(&self, pages: u64, on: bool) {
        for counter in [&self.pages.dirty, &self.own.dirty] {
            if on {
                PageCounts::add(counter, pages);
            } else {
                PageCounts::sub(counter, pages);
            }
        }
    }

    fn count_writeback(&self, pages: u64, on: bool) {
        for counter in [&self.pages.writeback, &self.own.writeback] {
            if on {
                PageCounts::add(counter, pages);
            } else {
                PageCounts::sub(counter, pages);
            }
        }
    }

    pub(crate) fn mem(&self) -> &Memory {
        &self.mem
    }

    /// This mapping's id (unique within the process, never 0).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The file size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(StatOrdering::Acquire)
    }

    /// Sets the file size in bytes (cached pages are not touched: see [`truncate`](Self::truncate)).
    pub fn set_size(&self, bytes: u64) {
        self.size.store(bytes, StatOrdering::Release);
    }

    /// Read-only access to the index (its writers go through the mapping, which keeps the
    /// folios' references and descriptors in step with it).
    pub fn index(&self) -> IndexView<'_> {
        IndexView::new(&self.index)
    }

    /// Takes the writer lock (counted).
    fn lock(&self) -> IndexWriter<'_> {
        self.counters.lock_acquisitions.inc();
        let writer = self.index.lock();
        crate::inject::kill::point("index-lock");
        writer
    }

    /// Returns the folio covering page `index`, referenced, or `None` if none is cached there.
    /// Never returns a folio that was removed or reused concurrently (see the module docs).
    pub fn lookup(&self, index: u64) -> Option<FolioRef<'_>> {
        self.lookup_peeking::<false>(index).0
    }

    /// [`Mapping::lookup`], and with `PEEK` the arena block of the folio right after the one
    /// found when the index's leaf tells it at no extra walk ([`Cursor::peek_next`]): a hint
    /// for a prefetch, from which nothing else may be concluded.
    ///
    /// [`Cursor::peek_next`]: crate::index::Cursor::peek_next
    #[inline]
    pub(crate) fn lookup_peeking<const PEEK: bool>(
        &self,
        index: u64,
    ) -> (Option<FolioRef<'_>>, Option<u32>) {
        self.counters.lookups.inc();
        let mut cursor = self.index.cursor();
        let found = loop {
            let Some(entry @ Entry::Folio { id, .. }) = cursor.load(index) else {
                break None;
            };
            let Some(folio) = self.mem().try_get(id) else {
                crate::sync::spin_hint();
                continue;
            };
            if cursor.reload() == Some(entry) {
                crate::inject::kill::point("get-put");
                break Some(folio);
            }
            drop(folio);
        };
        let next = if PEEK && found.is_some() {
            match cursor.peek_next() {
                Some(Entry::Folio {
                    id, zeros: false, ..
                }) => Some(id),
                _ => None,
            }
        } else {
            None
        };
        self.counters.index_walks.add(cursor.walks());
        (found, next)
    }

    /// Starts bringing `len` bytes (at most a page) of the arena block `pfn` into the CPU's
    /// cache, for a copy that follows soon: a hint from [`Mapping::lookup_peeking`]; a block
    /// outside the arena is ignored.
    pub(crate) fn prefetch_block(&self, pfn: u32, len: usize) {
        self.mem().view().prefetch(pfn, 0, len);
    }

    /// Copies `dst.len()` bytes at byte `pos` (all within one page, at most
    /// [`OPTIMISTIC_MAX`] bytes) without taking a reference: see [`crate::mem::optimistic`].
    /// Tries a few times, then says [`Optimistic::Fallback`] so the caller takes the
    /// referenced path.
    ///
    /// `recent` is the folio the reader's last such read copied from: a read inside it starts
    /// there, without walking the index. It is set to the folio this read copied from, or
    /// cleared.
    #[inline]
    pub(crate) fn read_optimistic(
        &self,
        pos: u64,
        dst: &mut [u8],
        recent: &mut Option<Recent>,
    ) -> Optimistic {
        debug_assert!(dst.len() <= OPTIMISTIC_MAX);
        debug_assert_eq!(
            pos >> PAGE_SHIFT,
            (pos + dst.len().max(1) as u64 - 1) >> PAGE_SHIFT
        );
        let page = pos >> PAGE_SHIFT;
        let mem = self.mem();
        let view = mem.view();
        // Taken before the lookup: a folio found from here on is not reused until it is dropped.
        let grace = mem.read_guard();
        if let Some(hint) = *recent
            && hint.covers(page)
        {
            if hint.copy((&view, &grace), self.id, 0, pos, dst).is_some() {
                let shard = grace.thread_slot();
                drop(grace);
                self.counters.recent_hits.add_in(shard, 1);
                return Optimistic::Data;
            }
            *recent = None;
        }
        let mut outcome = Optimistic::Fallback;
        let mut walks = 0;
        for _ in 0..HIT_TRIES {
            walks += 1;
            let Some(found) = self.index.find(page, &grace) else {
                outcome = Optimistic::Gap;
                break;
            };
            let Entry::Folio {
                id, zeros: false, ..
            } = found.entry
            else {
                outcome = Optimistic::Gap;
                break;
            };
            let Some(peek) = view.peek_begin(id) else {
                break;
            };
            let offset = (pos - (found.first << PAGE_SHIFT)) as usize;
            // The copy goes straight into `dst`: if validation fails we copy again or fall back,
            // and either overwrites it; the caller only sees it after `Data`.
            if view.peek_copy(&grace, &peek, offset, dst)
                && found.still_there()
                && view.peek_valid(&peek)
            {
                outcome = Optimistic::Data;
                *recent = Some(Recent::found(id, &peek, found.first));
                break;
            }
            self.counters.optimistic_retries.inc();
        }
        let shard = grace.thread_slot();
        drop(grace);
        self.counters.lookups.add_in(shard, 1);
        self.counters.index_walks.add_in(shard, walks);
        outcome
    }

    /// [`copy_hits`] on this mapping, under a read guard of its cache's memory: what a read of
    /// a file from storage copies before it needs a reference.
    ///
    /// `recent` is the folio the reader's last such read copied from last: a read that starts
    /// and ends inside it (before its end, where the walk would prefetch the next folio) is
    /// copied from it without walking the index, as [`Mapping::read_optimistic`] does. It is
    /// set to the last folio this read copied from, or cleared.
    pub(crate) fn copy_hits(
        &self,
        pos: u64,
        dst: &mut [u8],
        (unmarked, ahead): (Option<u64>, bool),
        recent: &mut Option<Recent>,
    ) -> usize {
        let mem = self.mem();
        let view = mem.view();
        let grace = mem.read_guard();
        if let Some(hint) = *recent
            && hint.covers(pos >> PAGE_SHIFT)
        {
            let first = hint.first << PAGE_SHIFT;
            let len = hint.pages << PAGE_SHIFT;
            let offset = (pos - first) as usize;
            let n = dst.len();
            if (offset + n) as u64 >= len {
                // The read reaches the folio's end: the walk goes on or prefetches the next one.
            } else if let Some(peek) =
                hint.copy((&view, &grace), self.id, flag::READAHEAD, pos, dst)
            {
                if !unmarked.is_some_and(|byte| byte >= first && byte < first + len) {
                    view.mark_accessed(&peek);
                }
                if ahead && crate::mem::folio::sequential_prefetch() {
                    // As the walk does for a sequential reader whose read ends in its folio.
                    view.prefetch(hint.pfn, offset + n, n.min(len as usize - offset - n));
                }
                let shard = grace.thread_slot();
                drop(grace);
                self.counters.recent_hits.add_in(shard, 1);
                self.counters.unreferenced_hits.add_in(shard, 1);
                return n;
            } else {
                *recent = None;
            }
        }
        if !ahead && let Some(pfn) = self.placed_at(pos >> PAGE_SHIFT) {
            // The folio was likely placed by its offset: ask for its bytes and descriptor now,
            // so that their misses overlap the index walk's (see `mem::place`).
            let offset = (pos as usize) & (crate::mem::PAGE_SIZE - 1);
            view.prefetch(pfn, offset, dst.len().min(crate::mem::PAGE_SIZE - offset));
            view.prefetch_desc(pfn);
        }
        let (done, folios, walks, last) =
            copy_hits(&self.index, &view, &grace, pos, dst, unmarked, ahead);
        let shard = grace.thread_slot();
        drop(grace);
        *recent = last;
        self.counters.lookups.add_in(shard, 1);
        self.counters.index_walks.add_in(shard, walks);
        self.counters.unreferenced_hits.add_in(shard, folios);
        done
    }

    /// Where page `index`'s folio is if it was placed by its offset (a hint, see `placed`).
    #[inline]
    fn placed_at(&self, index: u64) -> Option<u32> {
        let hints = self.placed.get()?;
        let base = hints
            .get((index >> crate::mem::place::REGION_ORDER) as usize)?
            .load(std::sync::atomic::Ordering::Relaxed);
        (base != NO_BLOCK)
            .then(|| base.wrapping_add((index % crate::mem::place::REGION_PAGES) as u32))
    }

    /// Whether the cache's regions hold any place not handed out (see `mem::place`).
    pub(crate) fn places_held(&self) -> bool {
        self.mem.places_held()
    }

    /// Pages `first..first + count` were filled outside their regions (see `mem::place`).
    pub(crate) fn filled_elsewhere(&self, first: u64, count: u64) {
        self.mem.filled_elsewhere(self.id, first, count);
    }

    /// A folio for page `index`, placed by its offset where the arena allows (a small fill's,
    /// see `mem::place`); its region's block goes into the hint table. `None`: allocate as
    /// usual.
    pub(crate) fn alloc_placed(&self, index: u64) -> Option<NewFolio<'_>> {
        let region = index >> crate::mem::place::REGION_ORDER;
        if region >= MAX_HINTED_REGIONS {
            return None;
        }
        let (folio, base) = self.mem.alloc_placed(self.id, index)?;
        let hints = self.placed.get_or_init(|| {
            let regions = (self.size()
                >> (PAGE_SHIFT + u32::from(crate::mem::place::REGION_ORDER)))
            .saturating_add(1)
            .clamp(region + 1, MAX_HINTED_REGIONS);
            (0..regions)
                .map(|_| std::sync::atomic::AtomicU32::new(NO_BLOCK))
                .collect()
        });
        if let Some(hint) = hints.get(region as usize) {
            hint.store(base, std::sync::atomic::Ordering::Relaxed);
        }
        Some(folio)
    }

    /// Fills `batch` with up to `max` (at most [`BATCH_SIZE`]) referenced folios that are
    /// contiguous from page `start`, in one index walk (plus one per node boundary). Stops at
    /// the first index that holds no folio.
    pub fn get_batch<'m>(&'m self, start: u64, max: usize, batch: &mut FolioBatch<'m>) {
        self.fill_batch(start, u64::MAX, max, BatchEnd::AtGap, batch);
    }

    /// The batch a read of pages `start..=last` takes (the kernel's `filemap_get_read_batch`,
    /// newest form): contiguous folios from the one covering `start`, at most [`BATCH_SIZE`],
    /// ending after the folio that covers `last` (the bound is checked after adding a folio,
    /// so a small read costs one load). With `BatchEnd::AtNotReady` it also ends after a folio
    /// that is not uptodate or carries the READAHEAD mark, so the caller can act on it.
    pub fn get_read_batch<'m>(
        &'m self,
        start: u64,
        last: u64,
        end: BatchEnd,
        batch: &mut FolioBatch<'m>,
    ) {
        if start > last {
            batch.clear();
            return;
        }
        self.fill_batch(start, last, BATCH_SIZE, end, batch);
    }

    fn fill_batch<'m>(
        &'m self,
        start: u64,
        last: u64,
        max: usize,
        end: BatchEnd,
        batch: &mut FolioBatch<'m>,
    ) {
        self.counters.lookups.inc();
        batch.clear();
        let max = max.min(BATCH_SIZE);
        let mut cursor = self.index.cursor();
        let mut want = start;
        let mut entry = cursor.load(want);
        while batch.len() < max {
            let Some(
                found @ Entry::Folio {
                    id, zeros: false, ..
                },
            ) = entry
            else {
                if batch.is_empty() {
                    // A gap at the start, found by the first load or by a retry after the
                    // folio there was removed: measure it in this same walk, so the caller
                    // skips exactly the gap (and not the data after it).
                    // A memory file's fallocated range is a run of zeros folios, one entry per
                    // folio: `seek` scans each leaf in place rather than loading entry by entry.
                    batch.gap_end = cursor
                        .seek(last, |entry| holds_data(Some(entry)))
                        .map(|first| first.max(start));
                }
                break;
            };
            if !batch.is_empty() && cursor.first() != want {
                // After a retry (or a concurrent change) the folio covering `want` starts before
                // it: it would overlap the batch. Stop; the caller looks up again from `want`.
                break;
            }
            let Some(folio) = self.mem().try_get(id) else {
                crate::sync::spin_hint();
                entry = cursor.load(want);
                continue;
            };
            if cursor.reload() != Some(found) {
                drop(folio);
                entry = cursor.load(want);
                continue;
            }
            let stop = end == BatchEnd::AtNotReady
                && (!folio.is_uptodate() || folio.test(flag::READAHEAD));
            batch.folios.push(folio);
            match cursor.next_pos() {
                Some(next) if next <= last && !stop => want = next,
                _ => break,
            }
            entry = cursor.load_next();
        }
        self.counters.index_walks.add(cursor.walks());
    }

    /// Prepares a private folio's descriptor for insertion at `index` (outside the lock):
    /// claims it for this mapping, takes its lock and the page cache's own reference.
    fn prepare(&self, folio: &NewFolio<'_>, index: u64, zeros: Zeros) -> Result<Entry, Error> {
        let folio = folio.as_ref();
        if !std::ptr::eq(folio.mem, self.mem()) {
            return Err(Error::ForeignFolio);
        }
        let order = folio.order();
        if index & ((1u64 << order) - 1) != 0 {
            return Err(Error::Misaligned { index, order });
        }
        let desc = folio.desc();
        // A `NewFolio` is private (fresh from the allocator, never in an index), so no other
        // thread holds this folio legitimately, and nobody else writes its mapping, flags or
        // index (a stale speculative reader may bump and drop the count, but only reads the
        // rest and then fails validation: no index slot holds the folio yet). Plain stores
        // then, as the kernel's `__folio_set_locked`; only the count needs an atomic add.
        debug_assert_eq!(desc.mapping.load(Ordering::Relaxed), 0);
        desc.index.store(index, Ordering::Relaxed);
        // Release: a reader that finds this id in the descriptor without the index (a reader's
        // recent folio, `FolioView::peek_again`) sees the index stored with it.
        desc.mapping.store(self.id, Ordering::Release);
        let flags = desc.flags.load(Ordering::Relaxed);
        debug_assert_eq!(flags & (flag::PUBLISHED | flag::LOCKED), 0);
        // Release: whoever finds the folio through the index (acquire) sees the fields.
        desc.flags
            .store(flags | flag::LOCKED | flag::PUBLISHED, Ordering::Release);
        desc.refcount.get();
        Ok(Entry::Folio {
            id: folio.pfn,
            order,
            zeros: zeros == Zeros::Yes,
        })
    }

    /// Undoes `prepare` for a folio that did not go in: it is private again.
    fn unprepare(&self, folio: &NewFolio<'_>) {
        let desc = folio.as_ref().desc();
        desc.mapping.store(0, Ordering::Release);
        // It never reached the index: no optimistic reader can know it.
        desc.flags.fetch_and(!flag::PUBLISHED, Ordering::Relaxed);
        // Not the last reference: the caller still holds its own.
        let last = desc.refcount.put(self.mem().policy);
        debug_assert!(!last);
        desc.unlock_with(0);
    }

    /// Inserts a private folio at page `index`. On success the folio is in the cache, LOCKED,
    /// and the caller gets the lock's guard (to fill the folio, then `end_read` or `unlock`);
    /// the cache holds its own reference besides the guard's. Returns the shadow value the
    /// folio replaced, if any. On failure the folio is freed.
    pub fn add_folio<'f>(
        &self,
        folio: NewFolio<'f>,
        index: u64,
    ) -> Result<(LockedFolio<'f>, Option<u64>), Error> {
        let shadow = self.insert_one(&folio, index, Zeros::No)?;
        Ok((LockedFolio::from_locked(folio.folio), shadow))
    }

    /// Inserts a private folio that reads as zeros for as long as it is in the index (a memory
    /// file's fallocated range): the entry carries that fact, so readers zero-fill without
    /// touching the folio, and no one ever fills it. The folio must not be uptodate; it is
    /// inserted unlocked and the caller's reference is dropped. Returns the shadow value it
    /// replaced, if any.
    pub fn add_zeroed_folio(&self, folio: NewFolio<'_>, index: u64) -> Result<Option<u64>, Error> {
        if folio.is_uptodate() {
            return Err(Error::FolioUptodate);
        }
        let shadow = self.insert_one(&folio, index, Zeros::Yes)?;
        folio.folio.desc().unlock_with(0);
        Ok(shadow)
    }

    /// Inserts one prepared folio under one hold of the writer lock (it stays LOCKED).
    fn insert_one(
        &self,
        folio: &NewFolio<'_>,
        index: u64,
        zeros: Zeros,
    ) -> Result<Option<u64>, Error> {
        let entry = self.prepare(folio, index, zeros)?;
        crate::inject::kill::point("insert");
        let result = self.lock().insert(index, entry);
        match result {
            Ok(shadow) => {
                self.counters.insertions.inc();
                self.cached_pages
                    .fetch_add(folio.nr_pages() as u64, StatOrdering::Relaxed);
                Ok(shadow)
            }
            Err(error) => {
                self.unprepare(folio);
                Err(error)
            }
        }
    }

    /// Inserts a run of private folios at consecutive positions from page `start`, all under
    /// one hold of the writer lock. Stops at the first position where a folio is already
    /// present, or when the index cannot grow; the folios that went in stay in (LOCKED: their
    /// guards are returned, as with [`add_folio`](Self::add_folio)), the others are handed
    /// back untouched. A malformed run (a foreign or misaligned folio, one past the largest
    /// index) is an error and nothing goes in.
    ///
    /// Only the folios before the first one already present, as a lockless look at the index
    /// sees it, are prepared: a window that meets cached pages (two readers on one stream)
    /// does not claim and then release every folio after them, which cost five atomic
    /// operations per folio on descriptors no one else was touching. A folio seen present
    /// was present at that moment, so the run stops there just as it would under the lock.
    pub fn add_folio_range<'f>(
        &self,
        start: u64,
        mut folios: Vec<NewFolio<'f>>,
    ) -> Result<RangeAdd<'f>, Error> {
        let mut entries = Vec::with_capacity(folios.len());
        for folio in &folios {
            let folio = folio.as_ref();
            if !std::ptr::eq(folio.mem, self.mem()) {
                return Err(Error::ForeignFolio);
            }
            entries.push(Entry::Folio {
                id: folio.pfn,
                order: folio.order(),
                zeros: false,
            });
        }
        crate::index::check_run(start, &entries)?;
        let pages: u64 = folios.iter().map(|f| f.nr_pages() as u64).sum();
        let seen = match pages {
            0 => None,
            _ => self
                .index
                .next_present(start, start.saturating_add(pages - 1)),
        };
        // How many folios lie wholly before the folio seen present.
        let mut wanted = folios.len();
        if let Some(present) = seen {
            let mut end = start;
            wanted = folios
                .iter()
                .take_while(|folio| {
                    end = end.saturating_add(folio.nr_pages() as u64);
                    end <= present
                })
                .count();
        }
        entries.truncate(wanted);
        let mut index = start;
        for (k, folio) in folios[..wanted].iter().enumerate() {
            if let Err(error) = self.prepare(folio, index, Zeros::No) {
                for done in &folios[..k] {
                    self.unprepare(done);
                }
                return Err(error);
            }
            index = index.wrapping_add(folio.nr_pages() as u64);
        }
        let result = match wanted {
            0 => Ok(crate::index::RangeInsert {
                inserted: 0,
                stopped: None,
                shadows: Vec::new(),
            }),
            _ => {
                crate::inject::kill::point("insert");
                self.lock().insert_range(start, &entries)
            }
        };
        let inserted = result.as_ref().map_or(0, |r| r.inserted);
        for folio in &folios[inserted..wanted] {
            self.unprepare(folio);
        }
        let result = result?;
        let rest = folios.split_off(inserted);
        let pages: usize = folios.iter().map(NewFolio::nr_pages).sum();
        self.counters.insertions.add(inserted as u64);
        self.cached_pages
            .fetch_add(pages as u64, StatOrdering::Relaxed);
        let stopped = match (result.stopped, seen) {
            (None, Some(present)) => Some(RangeStop::Present(present)),
            (stopped, _) => stopped,
        };
        Ok(RangeAdd {
            inserted: folios
                .into_iter()
                .map(|folio| LockedFolio::from_locked(folio.folio))
                .collect(),
            rest,
            stopped,
            shadows: result.shadows,
        })
    }

    /// Removes `folio` from the mapping and frees it, leaving `shadow` (a value entry) in its
    /// place if given. Succeeds only if nobody but the cache and the caller holds a reference:
    /// the count is frozen at exactly 2 first, so no reader can take a new one.
    pub fn remove_folio<'m>(
        &'m self,
        folio: FolioRef<'m>,
        shadow: Option<u64>,
    ) -> Result<(), RemoveError<'m>> {
        if !std::ptr::eq(folio.mem, self.mem()) {
            return Err(RemoveError::NotInMapping(folio));
        }
        if shadow.is_some_and(|value| value > MAX_VALUE) {
            return Err(RemoveError::ShadowTooLarge(folio));
        }
        let index = folio.index();
        let policy = self.mem().policy;
        {
            let mut writer = self.lock();
            let Some(entry) = entry_of(&writer, &folio) else {
                return Err(RemoveError::NotInMapping(folio));
            };
            // Only while the index holds the folio is the cache's reference outstanding (no one
            // else can unhook it: that takes this lock). So a count of 2 then means exactly the
            // cache and the caller; a folio truncated meanwhile must not be frozen at all, or a
            // concurrent `put` of the cache's reference would land on the frozen count.
            if folio.mapping_id() != self.id {
                return Err(RemoveError::NotInMapping(folio));
            }
            // Dirty or written back folios hold data storage does not have yet: never dropped
            // (the write path changes these flags under this lock, so the check is final).
            if folio.desc().flags.load(Ordering::Acquire) & (flag::DIRTY | flag::WRITEBACK) != 0 {
                return Err(RemoveError::Dirty(folio));
            }
            if !folio.desc().refcount.freeze(2, policy) {
                return Err(RemoveError::Busy(folio));
            }
            let removed = writer.remove(index, Some(entry), shadow);
            debug_assert!(matches!(removed, Ok(Some(_))), "{removed:?}");
            folio.desc().mapping.store(0, Ordering::Release);
        }
        self.counters.removals.inc();
        self.cached_pages
            .fetch_sub(folio.nr_pages() as u64, StatOrdering::Relaxed);
        let pfn = folio.pfn;
        // Both references were consumed by the freeze: the folio must not be put again.
        std::mem::forget(folio);
        self.mem().free_frozen(pfn);
        Ok(())
    }

    /// Swaps `new` (a private, filled folio of the same order) into the place of `old` in one
    /// index store: a lockless reader sees the old folio or the new one, never a hole. This is
    /// how a memory file changes bytes: uptodate folios are never written in place. The cache's
    /// reference moves to `new`; `old` leaves the mapping and is freed when its last holder
    /// lets go. `new` is inserted unlocked.
    pub fn replace_folio(&self, old: &FolioRef<'_>, new: NewFolio<'_>) -> Result<(), Error> {
        if !std::ptr::eq(old.mem, self.mem()) {
            return Err(Error::ForeignFolio);
        }
        let index = old.index();
        let new_entry = self.prepare(&new, index, Zeros::No)?;
        let replaced = {
            let mut writer = self.lock();
            let replaced = match entry_of(&writer, old) {
                Some(old_entry) if old.mapping_id() == self.id => {
                    writer.replace(index, old_entry, new_entry)
                }
                _ => Ok(false),
            };
            if let Ok(true) = replaced {
                old.desc().mapping.store(0, Ordering::Release);
            }
            replaced
        };
        match replaced {
            Ok(true) => {
                new.folio.desc().unlock_with(0);
                // The cache's reference on the old folio.
                self.mem().put(old.pfn);
                self.counters.insertions.inc();
                self.counters.removals.inc();
                Ok(())
            }
            Ok(false) => {
                self.unprepare(&new);
                Err(Error::NotCached { index })
            }
            Err(error) => {
                self.unprepare(&new);
                Err(error)
            }
        }
    }

    /// Inserts a private, uptodate folio at page `index` as dirty (a write of bytes that were
    /// not cached): it goes in unlocked with DIRTY set and the Dirty mark on its entry, in one
    /// hold of the writer lock, so the flag and the mark agree whenever the lock is free.
    /// Returns the shadow value the folio replaced, if any; on failure the folio is freed.
    pub fn add_dirty_folio<'f>(
        &self,
        folio: NewFolio<'f>,
        index: u64,
    ) -> Result<(FolioRef<'f>, Option<u64>), Error> {
        debug_assert!(folio.is_uptodate());
        folio.set_internal(flag::DIRTY);
        let entry = self.prepare(&folio, index, Zeros::No)?;
        let pages = folio.nr_pages() as u64;
        let result = {
            let mut writer = self.lock();
            let result = writer.insert(index, entry);
            if result.is_ok() {
                writer.set_mark(index, Mark::Dirty);
                self.count_dirty(pages, true);
            }
            result
        };
        match result {
            Ok(shadow) => {
                folio.folio.desc().unlock_with(0);
                self.counters.insertions.inc();
                self.cached_pages.fetch_add(pages, StatOrdering::Relaxed);
                Ok((folio.folio, shadow))
            }
            Err(error) => {
                self.unprepare(&folio);
                Err(error)
            }
        }
    }

    /// Swaps `new` (a private, uptodate folio of the same order, holding `old`'s bytes with a
    /// write applied) in for `old`, dirty: the write path's copy on write. One index store, so
    /// a lockless reader sees all of the old folio or all of the new one. The slot's marks stay
    /// (an integrity sync that tagged the old folio writes the new one) and it is marked
    /// Dirty. Fails with [`Error::FolioWriteback`] while `old` is being written back (its bytes
    /// are on their way to storage: the caller waits and tries again), and with
    /// [`Error::NotCached`] if `old` left the mapping.
    pub fn replace_dirty<'f>(
        &self,
        old: &FolioRef<'_>,
        new: NewFolio<'f>,
    ) -> Result<FolioRef<'f>, Error> {
        if !std::ptr::eq(old.mem, self.mem()) {
            return Err(Error::ForeignFolio);
        }
        debug_assert!(new.is_uptodate());
        let index = old.index();
        new.set_internal(flag::DIRTY);
        let new_entry = self.prepare(&new, index, Zeros::No)?;
        let outcome = {
            let mut writer = self.lock();
            match entry_of(&writer, old) {
                Some(old_entry) if old.mapping_id() == self.id => {
                    let flags = old.desc().flags.load(Ordering::Acquire);
                    if flags & flag::WRITEBACK != 0 {
                        Err(Error::FolioWriteback { index })
                    } else {
                        match writer.replace(index, old_entry, new_entry) {
                            Ok(true) => {
                                writer.set_mark(index, Mark::Dirty);
                                old.desc().mapping.store(0, Ordering::Release);
                                // The old folio leaves clean: its bytes live on in `new`.
                                let was_dirty =
                                    old.desc().flags.fetch_and(!flag::DIRTY, Ordering::AcqRel)
                                        & flag::DIRTY
                                        != 0;
                                if was_dirty {
                                    self.count_dirty(old.nr_pages() as u64, false);
                                }
                                self.count_dirty(new.nr_pages() as u64, true);
                                Ok(())
                            }
                            Ok(false) => Err(Error::NotCached { index }),
                            Err(error) => Err(error),
                        }
                    }
                }
                _ => Err(Error::NotCached { index }),
            }
        };
        match outcome {
            Ok(()) => {
                new.folio.desc().unlock_with(0);
                // The cache's reference on the old folio.
                self.mem().put(old.pfn);
                self.counters.insertions.inc();
                self.counters.removals.inc();
                Ok(new.folio)
            }
            Err(error) => {
                self.unprepare(&new);
                Err(error)
            }
        }
    }

    /// Whether the entry covering page `index` carries `mark` (takes the writer lock).
    pub fn has_mark(&self, index: u64, mark: Mark) -> bool {
        self.lock().get_mark(index, mark)
    }

    /// The first page of the first folio carrying `mark` that covers a page in
    /// `first..=last`.
    pub(crate) fn next_marked(&self, first: u64, last: u64, mark: Mark) -> Option<u64> {
        self.lock()
            .next_marked(first, last, mark)
            .map(|(index, _)| index)
    }

    /// Marks Dirty → ToWrite over pages `first..=last` (the kernel's
    /// `tag_pages_for_writeback`): an integrity sync then writes exactly the folios dirty when
    /// it began, however fast writers dirty new ones (no livelock). Returns the folios tagged.
    pub fn tag_towrite(&self, first: u64, last: u64) -> u64 {
        let mut tagged = 0;
        let mut from = first;
        loop {
            // Chunks of the range, the lock released between them.
            let mut writer = self.lock();
            for _ in 0..TAG_CHUNK {
                let Some((at, entry)) = writer.next_marked(from, last, Mark::Dirty) else {
                    return tagged;
                };
                writer.set_mark(at, Mark::ToWrite);
                tagged += 1;
                match at.checked_add(1u64 << entry.order()) {
                    Some(next) => from = next,
                    None => return tagged,
                }
            }
        }
    }

    /// Starts writeback of up to `max_pages` pages of folios carrying `mark` (Dirty, or
    /// ToWrite for an integrity sync) in pages `from..=last`, in index order, under one hold
    /// of the writer lock (the kernel's `folio_clear_dirty_for_io` + `folio_start_writeback`
    /// for a batch): each folio loses DIRTY and its Dirty and ToWrite marks and gains WRITEBACK
    /// and the Writeback mark. Folios already under writeback are skipped (they keep their
    /// ToWrite mark). Returns the folios, referenced, and where a next call goes on from.
    pub fn start_writeback(
        &self,
        from: u64,
        last: u64,
        mark: Mark,
        max_pages: u64,
    ) -> (Vec<FolioRef<'_>>, Option<u64>) {
        let mut out = Vec::new();
        let mut pages = 0;
        let mut at_index = from;
        let mut writer = self.lock();
        while pages < max_pages {
            let Some((at, entry)) = writer.next_marked(at_index, last, mark) else {
                return (out, None);
            };
            let next = at.checked_add(1u64 << entry.order());
            if let Entry::Folio { id, .. } = entry {
                let desc = self.mem().desc(id);
                let flags = desc.flags.load(Ordering::Acquire);
                if flags & flag::WRITEBACK == 0 {
                    let nr = 1u64 << entry.order();
                    if flags & flag::DIRTY != 0 {
                        self.count_dirty(nr, false);
                    }
                    desc.flags.fetch_and(!flag::DIRTY, Ordering::AcqRel);
                    desc.flags.fetch_or(flag::WRITEBACK, Ordering::AcqRel);
                    writer.clear_mark(at, Mark::Dirty);
                    writer.clear_mark(at, Mark::ToWrite);
                    writer.set_mark(at, Mark::Writeback);
                    self.count_writeback(nr, true);
                    // The index holds a reference (its entry): taking another is safe here.
                    desc.refcount.get();
                    out.push(FolioRef {
                        mem: self.mem(),
                        pfn: id,
                    });
                    pages += nr;
                }
            }
            match next {
                Some(next) => at_index = next,
                None => return (out, None),
            }
        }
        (out, Some(at_index))
    }

    /// Ends writeback of `folio` (started by `start_writeback`): WRITEBACK and its mark go;
    /// with `redirty` (the write failed and the data must be kept) DIRTY and the Dirty mark
    /// come back. Waiters for the writeback are woken.
    pub fn end_writeback(&self, folio: &FolioRef<'_>, redirty: bool) {
        let nr = folio.nr_pages() as u64;
        {
            let mut writer = self.lock();
            let in_index = entry_of(&writer, folio).is_some() && folio.mapping_id() == self.id;
            debug_assert!(in_index, "a folio under writeback left its mapping");
            if in_index {
                writer.clear_mark(folio.index(), Mark::Writeback);
                if redirty {
                    writer.set_mark(folio.index(), Mark::Dirty);
                    self.count_dirty(nr, true);
                }
            }
            self.count_writeback(nr, false);
            let set = if redirty && in_index { flag::DIRTY } else { 0 };
            folio.desc().clear_and_wake(flag::WRITEBACK, set);
        }
    }

    /// Removes every folio and value lying entirely inside the page range, dropping the cache's
    /// references (folios still referenced elsewhere are freed when their last holder lets go).
    /// Returns the number of pages of the folios removed.
    pub fn truncate(&self, pages: impl RangeBounds<u64>) -> u64 {
        self.truncate_unless(pages, |_| false)
    }

    /// Removes, like [`truncate`](Self::truncate), every value and every folio lying entirely
    /// inside the page range, except folios for which `keep(flags)` says true (asked under the
    /// writer lock, which is where the write path changes DIRTY and WRITEBACK). A dirty folio
    /// removed is dropped with its data, as truncation does (`folio_cancel_dirty`). Returns
    /// the pages of the folios removed.
    pub fn truncate_unless(
        &self,
        pages: impl RangeBounds<u64>,
        mut keep: impl FnMut(u32) -> bool,
    ) -> u64 {
        let removed = {
            let mut writer = self.lock();
            let mut removed = Vec::new();
            writer.truncate_where(pages, |first, entry| {
                let go = match entry {
                    Entry::Folio { id, order, .. } => {
                        let desc = self.mem().desc(id);
                        let flags = desc.flags.load(Ordering::Acquire);
                        let go = !keep(flags);
                        if go && flags & flag::DIRTY != 0 {
                            desc.flags.fetch_and(!flag::DIRTY, Ordering::AcqRel);
                            self.count_dirty(1u64 << order, false);
                        }
                        debug_assert!(
                            !go || flags & flag::WRITEBACK == 0,
                            "a folio under writeback removed"
                        );
                        go
                    }
                    Entry::Value { .. } => true,
                };
                if go {
                    removed.push((first, entry));
                }
                go
            });
            for (_, entry) in &removed {
                if let Entry::Folio { id, .. } = entry {
                    self.mem().desc(*id).mapping.store(0, Ordering::Release);
                }
            }
            removed
        };
        let mut total = 0;
        let mut shadows = 0;
        for (_, entry) in removed {
            match entry {
                Entry::Folio { id, order, .. } => {
                    total += 1u64 << order;
                    self.counters.removals.inc();
                    self.mem().put(id);
                }
                Entry::Value { .. } => shadows += 1,
            }
        }
        if shadows > 0 {
            self.shadows.gone(shadows);
        }
        self.cached_pages.fetch_sub(total, StatOrdering::Relaxed);
        total
    }

    /// Removes the shadow (value) entries for which `stale(value)` says true; returns how many.
    pub(crate) fn drop_shadows_where(&self, mut stale: impl FnMut(u64) -> bool) -> usize {
        self.lock().truncate_where(.., |_, entry| match entry {
            Entry::Value { value, .. } => stale(value),
            Entry::Folio { .. } => false,
        })
    }

    /// Removes the shadow entries lying inside pages `first..=last`; returns how many.
    pub(crate) fn drop_shadows_in(&self, first: u64, last: u64) -> usize {
        let dropped = self.lock().truncate_where(first..=last, |_, entry| {
            matches!(entry, Entry::Value { .. })
        });
        self.shadows.gone(dropped as u64);
        dropped
    }

    /// Calls `f` with each folio cached in pages `first..=last`, in order, referenced: one
    /// index walk to the next cached page, then a lookup there. A folio is visited once even
    /// if large, and may start before `first`.
    pub(crate) fn for_each_cached<'m>(
        &'m self,
        first: u64,
        last: u64,
        mut f: impl FnMut(FolioRef<'m>),
    ) {
        let mut index = first;
        while let Some(next) = self.index().next_present(index, last) {
            let Some(folio) = self.lookup(next) else {
                // Removed meanwhile: go on after it.
                match next.checked_add(1) {
                    Some(after) => index = after,
                    None => return,
                }
                continue;
            };
            let after = folio.index().checked_add(folio.nr_pages() as u64);
            f(folio);
            match after {
                Some(after) if after <= last => index = after,
                _ => return,
            }
        }
    }

    /// The first page index at or after `index` with no folio, scanning at most `max_scan`
    /// (see [`Index::next_miss`]).
    pub fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.index.next_miss(index, max_scan)
    }

    /// The last page index at or before `index` with no folio, scanning at most `max_scan`
    /// (see [`Index::prev_miss`]).
    pub fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.index.prev_miss(index, max_scan)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MappingStats {
        MappingStats {
            lookups: self.counters.lookups.get(),
            index_walks: self.counters.index_walks.get(),
            lock_acquisitions: self.counters.lock_acquisitions.get(),
            insertions: self.counters.insertions.get(),
            removals: self.counters.removals.get(),
            cached_pages: self.cached_pages.load(StatOrdering::Relaxed),
            index_nodes: self.index.node_count() as u64,
            index_bytes: self.index.memory_bytes() as u64,
            optimistic_retries: self.counters.optimistic_retries.get(),
            unreferenced_hits: self.counters.unreferenced_hits.get(),
            recent_hits: self.counters.recent_hits.get(),
            dirty_pages: self.dirty_pages(),
            writeback_pages: self.writeback_pages(),
        }
    }
}

/// Read-only access to a [`Mapping`]: what a [`File`](crate::File) hands out, because the
/// file's changes must go through the file (its write lock, its all-or-nothing plans).
#[derive(Debug, Clone, Copy)]
pub struct MappingView<'a>(&'a Mapping);

impl<'a> MappingView<'a> {
    pub(crate) fn new(mapping: &'a Mapping) -> Self {
        Self(mapping)
    }

    /// See [`Mapping::id`].
    pub fn id(&self) -> u64 {
        self.0.id()
    }

    /// See [`Mapping::size`].
    pub fn size(&self) -> u64 {
        self.0.size()
    }

    /// See [`Mapping::lookup`].
    pub fn lookup(&self, index: u64) -> Option<FolioRef<'a>> {
        self.0.lookup(index)
    }

    /// See [`Mapping::get_batch`].
    pub fn get_batch(&self, start: u64, max: usize, batch: &mut FolioBatch<'a>) {
        self.0.get_batch(start, max, batch);
    }

    /// See [`Mapping::next_miss`].
    pub fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.0.next_miss(index, max_scan)
    }

    /// See [`Mapping::prev_miss`].
    pub fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.0.prev_miss(index, max_scan)
    }

    /// See [`Mapping::index`].
    pub fn index(&self) -> IndexView<'a> {
        self.0.index()
    }

    /// See [`Mapping::stats`].
    pub fn stats(&self) -> MappingStats {
        self.0.stats()
    }
}

/// Whether a folio inserted into the index reads as zeros (see [`Entry::Folio`]'s `zeros`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zeros {
    Yes,
    No,
}

/// The index entry of `folio` at its index, if the index holds exactly this folio there.
fn entry_of(writer: &IndexWriter<'_>, folio: &FolioRef<'_>) -> Option<Entry> {
    match writer.load(folio.index()) {
        Some(entry @ Entry::Folio { id, order, .. })
            if id == folio.pfn && order == folio.order() =>
        {
            Some(entry)
        }
        _ => None,
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.truncate(..);
        if self.placed.get().is_some() {
            self.mem.forget_placement(self.id);
        }
    }
}
