//! Files and handles, and memory files (the tmpfs of this cache).
//!
//! A [`File`] is shared by everyone reading one file: its [`Mapping`] (index, size, counters)
//! and where its bytes come from. A [`Handle`] is one reader's view of it (per-reader state such
//! as the position after the last read, which readahead will use).
//!
//! # Memory files
//! Data lives only in the cache, like tmpfs. Holes allocate nothing and read as zeros;
//! `fallocate` inserts folios that are not uptodate, which also read as zeros; the file's
//! largest folio order is its "huge pages" switch (0 = tmpfs `huge=never`, 9 = `huge=always`).
//!
//! **Uptodate folios are immutable.** A change to bytes that are cached never writes the folio
//! in place: the writer fills a *new* private folio (old bytes plus the change) and swaps it
//! into the index in one store ([`Mapping::replace_folio`]). A reader therefore copies from a
//! folio nobody writes, with no lock: it sees, per folio, either all the old bytes or all the
//! new ones, never a torn mix, and never another file's bytes (the folio cannot be freed or
//! reused while the reader holds its reference).
//!
//! **All or nothing.** A change first works out every folio it needs and allocates them all;
//! only when that succeeded does it touch the file. A change that cannot get memory fails with
//! [`Error::NoSpace`] and leaves the file exactly as it was. Changes to one file are serialised
//! by the file's write lock (the kernel's `i_rwsem`); readers never take it.
//!
//! Bytes of a folio beyond end of file are unspecified: reads never return them, and a change
//! that moves end of file forward over them (a write, `set_len`, `fallocate`) first replaces
//! that folio with one whose tail is zero.

use crate::cache::{Cache, CacheInner, Policy, ReadPolicy, SmallReadPolicy};
use crate::error::Error;
use crate::io::{Backend, IoCounters, IoStats};
use crate::mapping::{Mapping, MappingView};
use crate::mem::{FolioRef, PAGE_SHIFT, PAGE_SIZE};
use crate::read::{self, ReadRun};
use crate::readahead::{self, Geometry, Probe, RaCounters, RaState, RaStats};
use std::sync::{Arc, Mutex, PoisonError};

/// The largest file size: 2^63 - 1 bytes (as the kernel's `MAX_LFS_FILESIZE`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// A file in the cache, shared by all its readers. Cloning it is cheap (a reference count).
#[derive(Debug, Clone)]
pub struct File {
    pub(crate) inner: Arc<FileInner>,
}

#[derive(Debug)]
pub(crate) struct FileInner {
    pub(crate) mapping: Mapping,
    pub(crate) policy: Policy,
    max_order: u8,
    /// Serialises changes (writes, truncation, hole punching, fallocate).
    write_lock: Mutex<()>,
    /// Where the bytes come from: `None` for a memory file.
    source: Option<DiskSource>,
    // Keeps the cache (and so the arena the mapping's folios live in) alive.
    pub(crate) cache_inner: Arc<CacheInner>,
}

impl Drop for FileInner {
    fn drop(&mut self) {
        if self.source.is_some() {
            self.cache_inner.reclaim.unregister(self.mapping.id());
        }
    }
}

/// A file read from storage: its backend and its counters.
#[derive(Debug)]
pub(crate) struct DiskSource {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) io: Arc<IoCounters>,
    pub(crate) ra: RaCounters,
}

impl FileInner {
    pub(crate) fn disk(&self) -> Option<&DiskSource> {
        self.source.as_ref()
    }

    pub(crate) fn cache(&self) -> &CacheInner {
        &self.cache_inner
    }

    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            max_order: self.max_order,
            io_pages: self.cache_inner.io_pages,
            file_size: self.mapping.size(),
        }
    }

    fn writable(&self) -> Result<(), Error> {
        match self.source {
            None => Ok(()),
            Some(_) => Err(Error::ReadOnly),
        }
    }
}

impl Probe for Mapping {
    fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        Mapping::prev_miss(self, index, max_scan)
    }
    fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        Mapping::next_miss(self, index, max_scan)
    }
}

/// The state of the folios of a [`CachedRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Read and valid.
    Uptodate,
    /// A read is in flight.
    Reading,
    /// The last read failed (a later read retries).
    Failed,
}

/// A run of cached pages in one state (see [`File::cached_ranges`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRange {
    /// First page index.
    pub first: u64,
    /// Pages in the run.
    pub pages: u64,
    /// Folios in the run.
    pub folios: u64,
    /// The largest folio order in the run.
    pub largest_order: u8,
    /// Their state.
    pub state: PageState,
    /// First pages of folios carrying the READAHEAD mark.
    pub marks: Vec<u64>,
}

/// Access-pattern advice for a handle ([`Handle::advise`]), as `posix_fadvise(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// The default heuristics, with the file's default maximum window.
    Normal,
    /// Sequential: the maximum window doubles.
    Sequential,
    /// Random: no readahead heuristics; a miss reads exactly what was asked.
    Random,
    /// Read this byte range soon: start reading it now (forced readahead, no marks).
    WillNeed {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// This byte range is not needed: drop its idle folios from the cache.
    DontNeed {
        /// First byte.
        offset: u64,
        /// Bytes (0: to end of file).
        len: u64,
    },
}

/// One reader's view of a [`File`].
#[derive(Debug, Clone)]
pub struct Handle {
    file: File,
    /// This reader's readahead state, including the position after its last read.
    pub(crate) ra: RaState,
    /// This reader's read-side policies (the cache's unless changed).
    policy: Policy,
}

impl File {
    pub(crate) fn new_memory(cache: &Cache, mapping: Mapping, max_order: u8) -> Self {
        Self {
            inner: Arc::new(FileInner {
                mapping,
                policy: cache.policy(),
                max_order,
                write_lock: Mutex::new(()),
                source: None,
                cache_inner: Arc::clone(cache.inner()),
            }),
        }
    }

    pub(crate) fn new_disk(
        cache: &Cache,
        mapping: Mapping,
        max_order: u8,
        policy: Policy,
        backend: Arc<dyn Backend>,
    ) -> Self {
        mapping.set_size(backend.size());
        let inner = Arc::new(FileInner {
            mapping,
            policy,
            max_order,
            write_lock: Mutex::new(()),
            source: Some(DiskSource {
                backend,
                io: Arc::default(),
                ra: RaCounters::default(),
            }),
            cache_inner: Arc::clone(cache.inner()),
        });
        cache.inner().reclaim.register(&inner);
        Self { inner }
    }

    /// A new reader of this file.
    pub fn handle(&self) -> Handle {
        Handle {
            file: self.clone(),
            ra: RaState::new(self.inner.cache_inner.ra_pages),
            policy: self.inner.policy,
        }
    }

    /// Whether the file's bytes come from storage (a backend) rather than only memory.
    pub fn is_disk_file(&self) -> bool {
        self.inner.source.is_some()
    }

    /// The backend's description (engine and mode), for a file read from storage.
    pub fn backend_description(&self) -> Option<String> {
        self.inner.disk().map(|disk| disk.backend.describe())
    }

    /// Readahead counters of this file (all zero for a memory file).
    pub fn readahead_stats(&self) -> RaStats {
        self.inner
            .disk()
            .map_or_else(RaStats::default, |disk| disk.ra.snapshot())
    }

    /// I/O counters of this file (all zero for a memory file).
    pub fn io_stats(&self) -> IoStats {
        self.inner
            .disk()
            .map_or_else(IoStats::default, |disk| disk.io.snapshot())
    }

    /// Waits until no read of this file is in flight (every cached folio unlocked): what
    /// readahead started has then settled, uptodate or failed.
    pub fn wait_for_io(&self) {
        self.inner
            .mapping
            .for_each_cached(0, u64::MAX, |folio| folio.wait_unlocked());
    }

    /// The cached page ranges of the file, in order: runs of folios that are adjacent in the
    /// file and share their state (uptodate, failed, or a read in flight), with the pages that
    /// carry a READAHEAD mark. What `fincore` or `vmtouch` show for the kernel's cache.
    pub fn cached_ranges(&self) -> Vec<CachedRange> {
        let mut out: Vec<CachedRange> = Vec::new();
        self.inner.mapping.for_each_cached(0, u64::MAX, |folio| {
            let state = if folio.is_uptodate() {
                PageState::Uptodate
            } else if folio.test(crate::mem::flag::LOCKED) {
                PageState::Reading
            } else {
                PageState::Failed
            };
            let first = folio.index();
            let pages = folio.nr_pages() as u64;
            match out.last_mut() {
                Some(last) if last.first + last.pages == first && last.state == state => {
                    last.pages += pages;
                    last.folios += 1;
                    last.largest_order = last.largest_order.max(folio.order());
                }
                _ => out.push(CachedRange {
                    first,
                    pages,
                    folios: 1,
                    largest_order: folio.order(),
                    state,
                    marks: Vec::new(),
                }),
            }
            if folio.test(crate::mem::flag::READAHEAD)
                && let Some(last) = out.last_mut()
            {
                last.marks.push(first);
            }
        });
        out
    }

    /// Drops the idle folios of `offset..offset + len` (0: to end of file) from the cache, as
    /// `POSIX_FADV_DONTNEED` does: folios that are locked (a read in flight) or referenced by a
    /// reader stay. Returns the pages dropped. A memory file's folios are its data and stay.
    pub fn drop_cached(&self, offset: u64, len: u64) -> u64 {
        if self.inner.source.is_none() {
            return 0;
        }
        let mapping = &self.inner.mapping;
        let first = offset >> PAGE_SHIFT;
        let end = if len == 0 {
            u64::MAX
        } else {
            offset.saturating_add(len).div_ceil(PAGE_SIZE as u64)
        };
        if end <= first {
            return 0;
        }
        let mut dropped = 0;
        // Like the kernel's invalidation, the range's shadow entries go too: dropping a range
        // on purpose is not a sign of memory pressure, and a later read of it is no refault.
        mapping.drop_shadows_in(first, end - 1);
        mapping.for_each_cached(first, end - 1, |folio| {
            let whole = folio.index() >= first && folio.index() + folio.nr_pages() as u64 <= end;
            if !whole || folio.test(crate::mem::flag::LOCKED) {
                return;
            }
            let pages = folio.nr_pages() as u64;
            if mapping.remove_folio(folio, None).is_ok() {
                dropped += pages;
            }
        });
        dropped
    }

    /// The file size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.mapping.size()
    }

    /// The largest folio order this file uses.
    pub fn max_order(&self) -> u8 {
        self.inner.max_order
    }

    /// The file's mapping (index, counters), read only: changes go through the file.
    pub fn mapping(&self) -> MappingView<'_> {
        MappingView::new(&self.inner.mapping)
    }

    /// Reads at `pos` with a fresh handle (see [`Handle::read_at`]).
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        self.handle().read_at(buf, pos)
    }

    /// Writes all of `data` at `pos`, extending the file if it ends past end of file. All or
    /// nothing: without memory for it, [`Error::NoSpace`] and the file is unchanged.
    pub fn write_at(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        self.inner.writable()?;
        let end = end_of(pos, data.len() as u64)?;
        if data.is_empty() {
            return Ok(0);
        }
        let _changing = self.lock_changes();
        let size = self.size();
        let mut plan = Plan::default();
        self.plan_cover(
            &mut plan,
            pos >> PAGE_SHIFT,
            (end - 1) >> PAGE_SHIFT,
            Cover::Write,
        )?;
        self.apply(plan, size, end, |first_byte, bytes, old| {
            // Old bytes below the old end of file survive, the written range is replaced,
            // everything else is zero.
            fill_from(bytes, first_byte, old, size);
            let lo = pos.max(first_byte);
            let hi = end.min(first_byte + bytes.len() as u64);
            if lo < hi {
                let src = &data[(lo - pos) as usize..(hi - pos) as usize];
                bytes[(lo - first_byte) as usize..(hi - first_byte) as usize].copy_from_slice(src);
            }
        })?;
        Ok(data.len())
    }

    /// Sets the file size. Shrinking drops the folios that lie wholly past the new end;
    /// growing adds a hole (nothing allocated, reads as zeros).
    pub fn set_len(&self, len: u64) -> Result<(), Error> {
        self.inner.writable()?;
        if len > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge { offset: len });
        }
        let _changing = self.lock_changes();
        let size = self.size();
        if len > size {
            self.apply(Plan::default(), size, len, |first_byte, bytes, old| {
                fill_from(bytes, first_byte, old, size);
            })?;
        } else if len < size {
            // Readers check the size before copying: publish it first, then drop the folios.
            self.inner.mapping.set_size(len);
            self.inner
                .mapping
                .truncate(len.div_ceil(PAGE_SIZE as u64)..);
        }
        Ok(())
    }

    /// Allocates folios for every hole in `offset..offset + len` (not uptodate: they read as
    /// zeros) and extends the file to `offset + len` if it is shorter (like `fallocate(2)`
    /// without `FALLOC_FL_KEEP_SIZE`). All or nothing.
    pub fn fallocate(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.inner.writable()?;
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _changing = self.lock_changes();
        let size = self.size();
        let mut plan = Plan::default();
        self.plan_cover(
            &mut plan,
            offset >> PAGE_SHIFT,
            (end - 1) >> PAGE_SHIFT,
            Cover::Allocate,
        )?;
        self.apply(plan, size, end, |first_byte, bytes, old| {
            fill_from(bytes, first_byte, old, size);
        })
    }

    /// Makes `offset..offset + len` read as zeros and frees the folios wholly inside it; folios
    /// partly inside are replaced by copies with that part zeroed. The size does not change.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.inner.writable()?;
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _changing = self.lock_changes();
        let size = self.size();
        let mut plan = Plan::default();
        // Folios that straddle either end of the range keep their other bytes.
        for byte in [offset, end - 1] {
            if let Some(folio) = self.inner.mapping.lookup(byte >> PAGE_SHIFT) {
                let first = folio.index() << PAGE_SHIFT;
                let inside = first >= offset && first + folio.len() as u64 <= end;
                if !inside && folio.is_uptodate() && !plan.replaces(&folio) {
                    let new = self.alloc_or_no_space(folio.order(), &plan)?;
                    plan.cows.push((folio, new));
                }
            }
        }
        plan.fill(|first_byte, bytes, old| {
            fill_from(bytes, first_byte, old, size);
            let lo = offset.max(first_byte);
            let hi = end.min(first_byte + bytes.len() as u64);
            if lo < hi {
                bytes[(lo - first_byte) as usize..(hi - first_byte) as usize].fill(0);
            }
        });
        // Whole folios inside the range go; then the straddlers are swapped for their copies.
        let first_page = offset.div_ceil(PAGE_SIZE as u64);
        let end_page = end >> PAGE_SHIFT;
        if first_page < end_page {
            self.inner.mapping.truncate(first_page..end_page);
        }
        self.publish(plan)
    }

    /// Completes a change that ends at byte `end` of a file of `size` bytes: if it moves the end
    /// of file forward, plans the zero-tailed copy of the folio holding the old end; then fills
    /// every planned folio, puts them into the file, and moves the end of file.
    fn apply<'c>(
        &'c self,
        mut plan: Plan<'c>,
        size: u64,
        end: u64,
        fill: impl FnMut(u64, &mut [u8], Option<&FolioRef<'c>>),
    ) -> Result<(), Error> {
        if end > size {
            self.plan_zero_tail(&mut plan, size)?;
        }
        plan.fill(fill);
        self.publish(plan)?;
        if end > size {
            self.inner.mapping.set_size(end);
        }
        Ok(())
    }

    fn lock_changes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Plans folios for every page of `first..=last`: existing folios are replaced by copies
    /// (`Cover::Write`) or kept (`Cover::Allocate`); holes get new folios, as large as the
    /// file's order allows where the whole aligned block is free, smaller when memory is short.
    fn plan_cover<'c>(
        &'c self,
        plan: &mut Plan<'c>,
        first: u64,
        last: u64,
        cover: Cover,
    ) -> Result<(), Error> {
        let mapping = &self.inner.mapping;
        let mut page = first;
        while page <= last {
            if let Some(folio) = mapping.lookup(page) {
                let next = folio.index() + folio.nr_pages() as u64;
                // Pages are visited in ascending order and each folio once: no need to ask
                // whether it is already planned.
                if cover == Cover::Write {
                    let new = self.alloc_or_no_space(folio.order(), plan)?;
                    plan.cows.push((folio, new));
                }
                page = next;
                continue;
            }
            let (start, folio) = self.alloc_for_hole(page, plan)?;
            page = start + folio.nr_pages() as u64;
            plan.news.push((start, folio, cover == Cover::Write));
            if page == 0 {
                break; // wrapped past the last page index
            }
        }
        Ok(())
    }

    /// Plans a zeroed-tail copy of the folio holding byte `size` (the current end of file), if
    /// that folio has bytes past it that a growing end of file would expose.
    fn plan_zero_tail<'c>(&'c self, plan: &mut Plan<'c>, size: u64) -> Result<(), Error> {
        if size.is_multiple_of(PAGE_SIZE as u64) && self.inner.max_order == 0 {
            return Ok(()); // order-0 folios end at page boundaries: nothing past EOF
        }
        let Some(folio) = self.inner.mapping.lookup(size >> PAGE_SHIFT) else {
            return Ok(());
        };
        let first = folio.index() << PAGE_SHIFT;
        if first < size && folio.is_uptodate() && !plan.replaces(&folio) {
            let new = self.alloc_or_no_space(folio.order(), plan)?;
            plan.cows.push((folio, new));
        }
        Ok(())
    }

    /// A new folio for the hole at `page`: the largest aligned block (up to the file's order)
    /// that holds no folio and no planned one, falling back to smaller orders when the arena
    /// has no block that large.
    fn alloc_for_hole<'c>(
        &'c self,
        page: u64,
        plan: &Plan<'c>,
    ) -> Result<(u64, FolioRef<'c>), Error> {
        let index = self.inner.mapping.index();
        for order in (0..=self.inner.max_order).rev() {
            let start = page & !((1u64 << order) - 1);
            let last = start | ((1u64 << order) - 1);
            if index.next_present(start, last).is_some() || plan.overlaps(start, last) {
                continue;
            }
            if let Ok(folio) = self.inner.mapping.cache().mem.alloc_folio(order) {
                return Ok((start, folio));
            }
        }
        Err(Error::NoSpace {
            pages: plan.pages() + 1,
        })
    }

    fn alloc_or_no_space<'c>(&'c self, order: u8, plan: &Plan<'c>) -> Result<FolioRef<'c>, Error> {
        self.inner
            .mapping
            .cache()
            .mem
            .alloc_folio(order)
            .map_err(|_| Error::NoSpace {
                pages: plan.pages() + (1u64 << order),
            })
    }

    /// Puts a filled plan into the file: new folios inserted, copies swapped in.
    fn publish(&self, plan: Plan<'_>) -> Result<(), Error> {
        let mapping = &self.inner.mapping;
        for (start, folio, filled) in &plan.news {
            if *filled {
                mapping.add_folio(folio, *start)?;
                folio.unlock();
            } else {
                mapping.add_zeroed_folio(folio, *start)?;
            }
        }
        for (old, new) in &plan.cows {
            mapping.replace_folio(old, new)?;
        }
        Ok(())
    }
}

/// What a planned range does with the folios already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cover {
    /// Replace them with filled copies; new folios are filled (uptodate).
    Write,
    /// Keep them; new folios stay not uptodate (they read as zeros).
    Allocate,
}

/// The folios a change needs, all allocated before the file is touched.
#[derive(Default)]
struct Plan<'c> {
    /// (old folio in the file, its private replacement).
    cows: Vec<(FolioRef<'c>, FolioRef<'c>)>,
    /// (first page, private folio for a hole, whether it gets filled).
    news: Vec<(u64, FolioRef<'c>, bool)>,
}

impl<'c> Plan<'c> {
    /// Whether `folio` is already planned for a copy (used for the one or two extra copies a
    /// change may add after covering its range: a scan of the plan is fine there).
    fn replaces(&self, folio: &FolioRef<'_>) -> bool {
        self.cows.iter().any(|(old, _)| old.id() == folio.id())
    }

    /// Whether `start..=last` overlaps a planned new folio. `plan_cover` plans new folios in
    /// ascending page order, so the scan from the end stops at the first one wholly before
    /// `start`: one or two comparisons, not one per planned folio.
    fn overlaps(&self, start: u64, last: u64) -> bool {
        for (s, f, _) in self.news.iter().rev() {
            let end = *s + f.nr_pages() as u64;
            if *s <= last && start < end {
                return true;
            }
            if end <= start {
                return false;
            }
        }
        false
    }

    fn pages(&self) -> u64 {
        let cows: usize = self.cows.iter().map(|(_, n)| n.nr_pages()).sum();
        let news: usize = self.news.iter().map(|(_, n, _)| n.nr_pages()).sum();
        (cows + news) as u64
    }

    /// Fills every private folio: `fill(first byte offset in the file, bytes, old folio)`.
    /// Copies are always filled; new folios only when the change writes them. Filled folios
    /// are marked uptodate.
    fn fill(&mut self, mut fill: impl FnMut(u64, &mut [u8], Option<&FolioRef<'c>>)) {
        for (old, new) in &mut self.cows {
            let first = old.index() << PAGE_SHIFT;
            fill(first, new.private_bytes_mut(), Some(old));
            new.mark_uptodate();
        }
        for (start, new, filled) in &mut self.news {
            if *filled {
                fill(*start << PAGE_SHIFT, new.private_bytes_mut(), None);
                new.mark_uptodate();
            }
        }
    }
}

/// Sets `bytes` (a folio starting at file offset `first`) to the old folio's bytes below
/// `size` (zeros if there was no old folio or it was not uptodate), and zeros elsewhere.
fn fill_from(bytes: &mut [u8], first: u64, old: Option<&FolioRef<'_>>, size: u64) {
    let keep = size.saturating_sub(first).min(bytes.len() as u64) as usize;
    match old.and_then(FolioRef::bytes) {
        Some(old) => bytes[..keep].copy_from_slice(&old[..keep]),
        None => bytes[..keep].fill(0),
    }
    bytes[keep..].fill(0);
}

/// `offset + len`, checked against the largest file size.
fn end_of(offset: u64, len: u64) -> Result<u64, Error> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(end),
        _ => Err(Error::FileTooLarge {
            offset: offset.saturating_add(len),
        }),
    }
}

impl Handle {
    /// The file this handle reads.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reads up to `buf.len()` bytes at `pos`; fewer at end of file, 0 at or past it. Holes
    /// and folios that are not uptodate read as zeros. How the index is walked is the cache's
    /// [`ReadPolicy`] (see [`set_read_policy`](Self::set_read_policy)).
    ///
    /// For a file read from storage, a miss starts readahead (this handle's [`RaState`]) and
    /// waits for the device; a read error is returned as [`Error::Io`] if no byte could be
    /// read (otherwise the read is short), and a later read tries again.
    pub fn read_at(&mut self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        if self.file.inner.source.is_some() {
            return read::read_disk(&self.file.inner, &mut self.ra, buf, pos);
        }
        let n = read::read_at(&self.file.inner, &self.policy, buf, pos)?;
        if n > 0 {
            self.ra.prev_pos = (pos + n as u64) as i64;
        }
        Ok(n)
    }

    /// This handle's readahead state (a copy).
    pub fn ra_state(&self) -> RaState {
        self.ra
    }

    /// Sets this handle's maximum readahead window in bytes (rounded down to pages; 0
    /// disables readahead), and makes it the one `Advice::Normal` restores.
    pub fn set_ra_bytes(&mut self, bytes: u64) {
        self.ra.ra_pages = bytes >> PAGE_SHIFT;
        self.ra.default_ra_pages = self.ra.ra_pages;
    }

    /// Advice on the access pattern (`posix_fadvise`). `WillNeed` starts reads and returns
    /// without waiting; `DontNeed` drops idle folios (see [`File::drop_cached`]).
    pub fn advise(&mut self, advice: Advice) -> Result<(), Error> {
        match advice {
            Advice::Normal => {
                self.ra.random = false;
                self.ra.ra_pages = self.ra.default_ra_pages;
            }
            Advice::Sequential => {
                self.ra.random = false;
                self.ra.ra_pages = self.ra.default_ra_pages * 2;
            }
            Advice::Random => self.ra.random = true,
            Advice::WillNeed { offset, len } => self.readahead(offset, len)?,
            Advice::DontNeed { offset, len } => {
                self.file.drop_cached(offset, len);
            }
        }
        Ok(())
    }

    /// Starts reading `offset..offset + len` into the cache without waiting, as `readahead(2)`:
    /// no heuristics, no marks, at most the larger of the window and the device's largest
    /// request, in 2 MiB chunks. A memory file has nothing to read: [`Error::NotADiskFile`].
    pub fn readahead(&mut self, offset: u64, len: u64) -> Result<(), Error> {
        let inner = &self.file.inner;
        let Some(disk) = inner.disk() else {
            return Err(Error::NotADiskFile);
        };
        if len == 0 {
            return Ok(());
        }
        let first = offset >> PAGE_SHIFT;
        let last = (offset.saturating_add(len) - 1) >> PAGE_SHIFT;
        let geometry = inner.geometry();
        let fill = readahead::force_fill(&self.ra, first, last - first + 1, &geometry);
        disk.ra.count(readahead::Trigger::Forced);
        readahead::fill(inner, &mut self.ra, fill);
        Ok(())
    }

    /// The bytes of `pos..pos + len` (clipped at end of file) without copying them: a run of
    /// slices, each borrowing a referenced folio (or a shared zero buffer for holes). The
    /// folios stay pinned until the run is dropped.
    pub fn read_folios(&mut self, pos: u64, len: usize) -> Result<ReadRun<'_>, Error> {
        if self.file.inner.source.is_some() {
            return read::read_folios_disk(&self.file.inner, &mut self.ra, pos, len);
        }
        read::read_folios(&self.file.inner, pos, len)
    }

    /// Chooses how this handle's reads walk the index (the cache's policy by default): one
    /// binary, and even one file, can measure seed 004's before and after side by side.
    pub fn set_read_policy(&mut self, read: ReadPolicy) {
        self.policy.read = read;
    }

    /// Chooses whether this handle's small reads take a reference (the cache's policy by
    /// default).
    pub fn set_small_read_policy(&mut self, small_read: SmallReadPolicy) {
        self.policy.small_read = small_read;
    }

    /// The byte position just after the last successful read (0 before any).
    pub fn prev_pos(&self) -> u64 {
        self.ra.prev_pos.max(0) as u64
    }
}
