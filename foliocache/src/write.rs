//! Writes to files from storage: the kernel's `generic_perform_write` with `write_begin` and
//! `write_end` (`docs/KERNEL.md`, "Writing"), truncation and hole punching ("Truncation and
//! hole punching").
//!
//! # A write
//! A write is cut into pieces, one per folio it touches. For each piece:
//! * **The folio is cached** (and uptodate): it is copied, the copy gets the written bytes and
//!   replaces it in the index, dirty, in one store (`Mapping::replace_dirty`). A reader sees
//!   the whole old folio or the whole new one: **the unit a write is seen in is the folio**
//!   (the kernel's is the folio under its lock). A folio under writeback is waited for first,
//!   so the bytes a write is sending to storage never change under it. A clean large folio
//!   that the write covers only in part is dropped instead (storage has its bytes) and the
//!   piece goes on as for a page not cached, so a small write never copies 2 MiB.
//! * **Nothing is cached there**: a new folio, as large as the file's order allows for an
//!   aligned block the write covers whole and where nothing is cached; a page the write covers
//!   only in part is read first (`write_begin`'s read, at most two per write: its ends), unless
//!   it lies past the end of the file on storage (zeros). The folio goes in dirty.
//! * The size grows (after the folio went in, so a reader that sees the new size sees the
//!   folio).
//!
//! Before each piece the writer is throttled if dirty memory is high (`Dirty::throttle`).
//! Writes to one file are serialised by its change lock (`i_rwsem`); readers never take it.
//! The bytes of a cached folio past the end of the file are always zero, so growing the file
//! over them exposes zeros and a whole-block write of the last page puts zeros on storage
//! (which the pass then cuts off by setting the size).

use crate::error::Error;
use crate::inode::Inode;
use crate::mem::{FolioRef, NewFolio, PAGE_SHIFT, flag};
use crate::memfile::end_of;
use crate::writeback::write_back;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a writer waits for memory (writeback and eviction making room) before it gives up
/// with [`Error::NoSpace`].
const MEMORY_WAIT: Duration = Duration::from_secs(30);

impl Inode {
    /// Writes `data` at `pos` into a file from storage (see the module documentation).
    /// Returns `data.len()`; on an error after part of the data went in, the error, whose
    /// offset (for [`Error::Io`]) is the first byte not written.
    pub(crate) fn disk_write_at(self: &Arc<Self>, data: &[u8], pos: u64) -> Result<usize, Error> {
        let end = end_of(pos, data.len() as u64)?;
        if data.is_empty() {
            return Ok(0);
        }
        let _changing = self.lock_changes();
        let mut at = pos;
        while at < end {
            let page = at >> PAGE_SHIFT;
            self.core.dirty.throttle(1);
            let written = match self.mapping.lookup(page) {
                Some(folio) => self.write_cached(&folio, data, pos, at, end)?,
                None => self.write_uncached(data, pos, at, end)?,
            };
            if let Some(next) = written {
                at = next;
                // Before the next throttle: the flusher must know the file to write it.
                self.note_dirty();
            }
        }
        Ok(data.len())
    }

    /// The piece of the write at byte `at` into the cached `folio`; `None` when it must be
    /// tried again (the folio changed state).
    fn write_cached(
        self: &Arc<Self>,
        folio: &FolioRef<'_>,
        data: &[u8],
        pos: u64,
        at: u64,
        end: u64,
    ) -> Result<Option<u64>, Error> {
        if !folio.is_uptodate() {
            if folio.is_locked() {
                folio.wait_unlocked(); // a read in flight
            } else {
                // A failed read left it: it holds nothing, drop it and write as uncached.
                self.drop_clean(folio);
            }
            return Ok(None);
        }
        if folio.is_writeback() {
            folio.wait_writeback();
            return Ok(None);
        }
        let first = folio.index() << PAGE_SHIFT;
        let folio_end = first + folio.len() as u64;
        let piece_end = end.min(folio_end);
        let whole = at == first && piece_end == folio_end;
        if folio.order() > 0 && !whole && !folio.is_dirty() {
            self.drop_clean(folio);
            return Ok(None);
        }
        let mut new = match self.alloc_waiting(folio.order()) {
            Ok(new) => new,
            Err(Error::NoMemory { .. }) => {
                // No block that large: write the folio back (if dirty) and drop it; the
                // piece then goes in as for pages not cached, in smaller folios.
                self.write_back_and_drop(folio)?;
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        let bytes = new.bytes_mut();
        if !whole {
            let old = folio.bytes().expect("checked uptodate");
            bytes.copy_from_slice(old);
        }
        let lo = (at - first) as usize;
        let hi = (piece_end - first) as usize;
        bytes[lo..hi].copy_from_slice(&data[(at - pos) as usize..(piece_end - pos) as usize]);
        new.mark_uptodate();
        // The folio and the size it needs go in together for a commit (see `lock_size`).
        let _size = self.lock_size();
        match self.mapping.replace_dirty(folio, new) {
            Ok(new) => {
                self.raise_size(piece_end);
                self.core
                    .reclaim
                    .add_inserted(&self.core.mem, &[(new.id(), None)]);
                Ok(Some(piece_end))
            }
            Err(Error::FolioWriteback { .. } | Error::NotCached { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The piece of the write at byte `at` where nothing is cached.
    fn write_uncached(
        &self,
        data: &[u8],
        pos: u64,
        at: u64,
        end: u64,
    ) -> Result<Option<u64>, Error> {
        let page = at >> PAGE_SHIFT;
        if let Some(next) = self.write_around(data, pos, at, end)? {
            return Ok(Some(next));
        }
        let index = self.mapping.index();
        // The largest aligned block the write covers whole, with nothing cached in it.
        let mut order = 0u8;
        for o in (1..=self.max_order).rev() {
            let start = page & !((1u64 << o) - 1);
            let last = start | ((1u64 << o) - 1);
            let (block_first, block_end) = (start << PAGE_SHIFT, (last + 1) << PAGE_SHIFT);
            if block_first == at && block_end <= end && index.next_present(start, last).is_none() {
                order = o;
                break;
            }
        }
        let mut folio = match self.alloc_waiting(order) {
            Ok(folio) => folio,
            Err(_) if order > 0 => self.alloc_waiting(0)?,
            Err(error) => return Err(error),
        };
        let order = folio.order();
        let start = page & !((1u64 << order) - 1);
        let first = start << PAGE_SHIFT;
        let folio_end = first + folio.len() as u64;
        let piece_end = end.min(folio_end);
        let bytes = folio.bytes_mut();
        if at != first || piece_end != folio_end {
            // Part of a page: what the write does not cover comes from storage (zeros past its
            // end), the kernel's read in `write_begin`.
            let disk = self.disk().expect("a file from storage");
            let read = if let Some(writer) = &disk.writer {
                writer.read_sync(first, bytes)
            } else {
                let direct = disk.direct.as_ref().ok_or(Error::ReadOnly)?;
                if first < crate::io::Backend::size(&**direct) {
                    direct.read_sync(first, bytes).map(drop)
                } else {
                    bytes.fill(0);
                    Ok(())
                }
            };
            read.map_err(|source| Error::Io {
                offset: at,
                len: bytes.len() as u64,
                source,
            })?;
            // Past the end of the file (as it will be after this piece) the bytes are zero.
            let size = self.mapping.size().max(piece_end);
            if size < folio_end {
                bytes[(size - first) as usize..].fill(0);
            }
        }
        let lo = (at - first) as usize;
        let hi = (piece_end - first) as usize;
        bytes[lo..hi].copy_from_slice(&data[(at - pos) as usize..(piece_end - pos) as usize]);
        folio.mark_uptodate();
        let _size = self.lock_size();
        match self.mapping.add_dirty_folio(folio, start) {
            Ok((new, shadow)) => {
                self.raise_size(piece_end);
                self.core
                    .reclaim
                    .add_inserted(&self.core.mem, &[(new.id(), shadow)]);
                Ok(Some(piece_end))
            }
            // Someone cached a folio there meanwhile (readahead): try again with it.
            Err(Error::Exists { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// After a piece went in up to `end`: the file is at least that long. A reader that sees
    /// the new size sees the folio (it went in first).
    fn raise_size(&self, end: u64) {
        if end > self.mapping.size() {
            self.mapping.set_size(end);
        }
    }

    /// A file whose descriptor cannot read (lent write-only, see
    /// `DirectFile::from_descriptor`) cannot fill the rest of a page a write covers only in
    /// part: that piece goes straight to storage instead, and the page stays uncached (no
    /// cached copy can go stale: the caller holds the change lock and found nothing cached
    /// there, and nothing can read the file into the cache). `None`: the piece goes into the
    /// cache as usual.
    fn write_around(&self, data: &[u8], pos: u64, at: u64, end: u64) -> Result<Option<u64>, Error> {
        let Some(disk) = self.disk() else {
            return Ok(None);
        };
        let Some(direct) = &disk.direct else {
            return Ok(None);
        };
        let first = (at >> PAGE_SHIFT) << PAGE_SHIFT;
        let page_end = first + crate::mem::PAGE_SIZE as u64;
        let piece_end = end.min(page_end);
        let partial = at != first || piece_end != page_end;
        if !partial || first >= crate::io::Backend::size(&**direct) || direct.readable() {
            return Ok(None);
        }
        let _one_pass = disk.wb.pass_lock();
        let bytes = &data[(at - pos) as usize..(piece_end - pos) as usize];
        self.own_change(|| direct.write_around(at, bytes))
            .map_err(|source| Error::Io {
                offset: at,
                len: bytes.len() as u64,
                source,
            })?;
        self.raise_size(piece_end);
        Ok(Some(piece_end))
    }

    /// Drops a clean folio from the index (truncation style: readers holding it keep it).
    fn drop_clean(&self, folio: &FolioRef<'_>) {
        let first = folio.index();
        let last = first + folio.nr_pages() as u64 - 1;
        self.mapping.truncate_unless(first..=last, |flags| {
            flags & (flag::DIRTY | flag::WRITEBACK | flag::LOCKED) != 0
        });
    }

    /// A new folio of `order` for a write, waiting for memory if there is none: eviction and
    /// writeback make room (a cache full of dirty data throttles writers, it does not fail
    /// them); after [`MEMORY_WAIT`] without any, [`Error::NoSpace`].
    fn alloc_waiting(&self, order: u8) -> Result<NewFolio<'_>, Error> {
        let start = Instant::now();
        loop {
            match self.core.alloc_for_readahead(order) {
                Ok(folio) => return Ok(folio),
                Err(Error::NoMemory { .. }) if order > 0 => {
                    return Err(Error::NoMemory { order });
                }
                Err(Error::NoMemory { .. }) if start.elapsed() < MEMORY_WAIT => {
                    self.core.dirty.kick();
                    self.core.dirty.throttle(1);
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(Error::NoMemory { .. }) => {
                    return Err(Error::NoSpace { pages: 1 << order });
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The file has dirty data: the flusher learns of it when it becomes dirty.
    pub(crate) fn note_dirty(self: &Arc<Self>) {
        if let Some(disk) = self.disk()
            && self.mapping.dirty_pages() > 0
            && disk.wb.note_dirtied()
        {
            let me: Arc<dyn crate::dirty::Flushable> = Arc::clone(self) as _;
            self.core.dirty.add_file(Arc::downgrade(&me));
        }
    }

    /// Sets the size of a file from storage (truncation and extension, `docs/KERNEL.md`,
    /// "Truncation and hole punching"). Shrinking: the folio holding the new end is written
    /// back first if dirty, then (with no writeback pass in flight, and no writer) the size
    /// is published, set on storage (`ftruncate`: storage zeroes past it), and every folio
    /// from the page holding the new end on is dropped, dirty ones with their data as the
    /// kernel's truncation does. Reads of those pages then come from storage; a read issued
    /// meanwhile zeroes what lies past the file's size (see `ReadRequest`). Growing sets the
    /// size on storage (a hole).
    pub(crate) fn disk_set_len(self: &Arc<Self>, len: u64) -> Result<(), Error> {
        if len > crate::memfile::MAX_FILE_SIZE {
            return Err(Error::FileTooLarge { offset: len });
        }
        let disk = self.disk().ok_or(Error::NotADiskFile)?;
        if let Some(writer) = &disk.writer {
            return self.commit_set_len(&**writer, len);
        }
        let direct = disk.direct.as_ref().ok_or(Error::ReadOnly)?;
        let set_storage_size = |len| direct.set_size(len);
        let _changing = self.lock_changes();
        let size = self.mapping.size();
        if len < size
            && let Some(folio) = self.mapping.lookup(len >> PAGE_SHIFT)
            && folio.is_dirty()
            && folio.index() << PAGE_SHIFT < len
        {
            // The folio holding the new end keeps bytes below it: they must reach storage
            // before the folio is dropped.
            let first = folio.index();
            let last = first + folio.nr_pages() as u64 - 1;
            drop(folio);
            write_back(self, first, last, crate::writeback::SyncMode::All)?;
        }
        let _no_pass = disk.wb.pass_lock();
        self.own_change(|| {
            if len < size {
                // Readers check the size before they look at pages: publish it first.
                self.mapping.set_size(len);
                set_storage_size(len)?;
                // The folio holding the new end may start before its page (a large one).
                self.drop_pages(len >> PAGE_SHIFT, len >> PAGE_SHIFT);
                self.mapping.truncate_unless(len >> PAGE_SHIFT.., |_| false);
            } else if len > size {
                set_storage_size(len)?;
                self.mapping.set_size(len);
            }
            Ok(())
        })
    }

    /// [`disk_set_len`](Self::disk_set_len) of a file whose backend takes whole-file commits:
    /// nothing reaches storage before the next commit. Shrinking keeps the folio holding the
    /// new end if it is dirty, as a copy with its bytes past the end zeroed (committing it
    /// first, as a disk file writes it back, would upload an in-between version, and drop it
    /// even if the upload failed); every folio after it is dropped, dirty ones with their data.
    /// Reads past the new end give zeros until the commit (`WriteBackend::set_size`).
    fn commit_set_len(
        self: &Arc<Self>,
        writer: &dyn crate::io::WriteBackend,
        len: u64,
    ) -> Result<(), Error> {
        let disk = self.disk().ok_or(Error::NotADiskFile)?;
        let _changing = self.lock_changes();
        // No commit under way while the size changes: one that took the old size would end
        // by forgetting this change (`WriteBackend::commit` leaves the backend at the version
        // it made). A truncation waits for an upload in flight. Under the pass lock no folio
        // is under writeback, so dirty is dirty.
        let _no_pass = disk.wb.pass_lock();
        let size = self.mapping.size();
        if len >= size {
            if len > size {
                let _sizing = self.lock_size();
                writer.set_size(len);
                self.mapping.set_size(len);
            }
            return Ok(());
        }
        // The dirty folio holding the new end, copied with its bytes past the end zeroed,
        // before anything changes: a copy that cannot be had leaves the file as it was. (It
        // may wait for memory: at most `MEMORY_WAIT` if this file's own dirty data fills the
        // cache, its commit waiting for this pass lock; then `Error::NoSpace`.)
        let mut kept = None;
        if let Some(folio) = self.mapping.lookup(len >> PAGE_SHIFT) {
            let first = folio.index() << PAGE_SHIFT;
            if first < len && folio.is_dirty() {
                let mut copy = self.alloc_waiting(folio.order())?;
                let bytes = copy.bytes_mut();
                bytes.copy_from_slice(folio.bytes().expect("a dirty folio is uptodate"));
                bytes[(len - first) as usize..].fill(0);
                copy.mark_uptodate();
                kept = Some((folio, copy));
            }
        }
        {
            // Readers check the size before they look at pages: published first. A commit
            // sees the size and the backend's limit change together.
            let _sizing = self.lock_size();
            self.mapping.set_size(len);
            writer.set_size(len);
        }
        let keep_from = match kept {
            Some((folio, copy)) => {
                // Neither a writer (change lock) nor a commit (pass lock) can change it now.
                let new = self.mapping.replace_dirty(&folio, copy)?;
                self.core
                    .reclaim
                    .add_inserted(&self.core.mem, &[(new.id(), None)]);
                folio.index() + folio.nr_pages() as u64
            }
            None => {
                // The folio holding the end (clean, or none) goes with the rest; it may start
                // before its page (a large one). A clean one's bytes below the end are the
                // version on storage's, read again from there.
                self.drop_pages(len >> PAGE_SHIFT, len >> PAGE_SHIFT);
                len >> PAGE_SHIFT
            }
        };
        self.mapping.truncate_unless(keep_from.., |_| false);
        Ok(())
    }

    /// Punches a hole: `offset..offset + len` reads as zeros and its blocks are deallocated on
    /// storage; the size does not change. Cached folios overlapping the range are dropped
    /// (dirty ones wholly inside with their data, as the kernel's hole punch does; the dirty
    /// ones at its edges are written back first, for the bytes outside the range), so reads
    /// of the range come from storage again.
    pub(crate) fn disk_punch_hole(self: &Arc<Self>, offset: u64, len: u64) -> Result<(), Error> {
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let disk = self.disk().ok_or(Error::NotADiskFile)?;
        if disk.writer.is_some() {
            return Err(Error::NotOffered {
                what: "hole punching",
            });
        }
        let direct = disk.direct.as_ref().ok_or(Error::ReadOnly)?;
        let _changing = self.lock_changes();
        let (first_page, last_page) = (offset >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT);
        for page in [first_page, last_page] {
            if let Some(folio) = self.mapping.lookup(page)
                && folio.is_dirty()
            {
                let first = folio.index();
                let last = first + folio.nr_pages() as u64 - 1;
                write_back(self, first, last, crate::writeback::SyncMode::All)?;
            }
        }
        let _no_pass = disk.wb.pass_lock();
        self.own_change(|| {
            direct
                .fallocate(offset, len, true)
                .map_err(|source| Error::Io {
                    offset,
                    len,
                    source,
                })
        })?;
        self.drop_pages(first_page, last_page);
        Ok(())
    }

    /// Drops every cached folio overlapping pages `first..=last` (the caller holds the pass
    /// lock, so none is under writeback; the edge folios were written back).
    fn drop_pages(&self, first: u64, last: u64) {
        for page in [first, last] {
            if let Some(folio) = self.mapping.lookup(page) {
                let (a, b) = (folio.index(), folio.index() + folio.nr_pages() as u64 - 1);
                drop(folio);
                self.mapping.truncate_unless(a..=b, |_| false);
            }
        }
        self.mapping.truncate_unless(first..=last, |_| false);
    }

    /// Writes `folio` back if it is dirty, then drops it.
    fn write_back_and_drop(self: &Arc<Self>, folio: &FolioRef<'_>) -> Result<(), Error> {
        let first = folio.index();
        let last = first + folio.nr_pages() as u64 - 1;
        if folio.is_dirty() {
            write_back(self, first, last, crate::writeback::SyncMode::All)?;
        }
        self.drop_clean(folio);
        Ok(())
    }

    /// Allocates `offset..offset + len` on storage (`fallocate(2)` without flags), growing the
    /// file if it ends past its end. Nothing cached changes.
    pub(crate) fn disk_fallocate(self: &Arc<Self>, offset: u64, len: u64) -> Result<(), Error> {
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let disk = self.disk().ok_or(Error::NotADiskFile)?;
        if disk.writer.is_some() {
            return Err(Error::NotOffered { what: "fallocate" });
        }
        let direct = disk.direct.as_ref().ok_or(Error::ReadOnly)?;
        let _changing = self.lock_changes();
        let _no_pass = disk.wb.pass_lock();
        self.own_change(|| {
            direct
                .fallocate(offset, len, false)
                .map_err(|source| Error::Io {
                    offset,
                    len,
                    source,
                })
        })?;
        if end > self.mapping.size() {
            self.mapping.set_size(end);
        }
        Ok(())
    }

    /// Writes back every dirty folio of the file and waits (the last close, and `sync_all`).
    pub(crate) fn write_back_all(self: &Arc<Self>) -> Result<crate::writeback::Outcome, Error> {
        write_back(self, 0, u64::MAX, crate::writeback::SyncMode::All)
    }
}
