//! Memory files (the tmpfs of this cache): their changes.
//!
//! Data lives only in the cache. Holes allocate nothing and read as zeros; `fallocate` inserts
//! folios that are not uptodate, which also read as zeros; the file's largest folio order is
//! its "huge pages" switch (0 = tmpfs `huge=never`, 9 = `huge=always`).
//!
//! **Uptodate folios are immutable.** A change to bytes that are cached never writes the folio
//! in place: the writer fills a *new* private folio (old bytes plus the change) and swaps it
//! into the index in one store (`Mapping::replace_folio`). A reader therefore copies from a
//! folio nobody writes, with no lock: it sees, per folio, either all the old bytes or all the
//! new ones, never a torn mix, and never another file's bytes (the folio cannot be freed or
//! reused while the reader holds its reference).
//!
//! **All or nothing.** A change first works out every folio it needs and allocates them all;
//! only when that succeeded does it touch the file. A change that cannot get memory fails with
//! [`Error::NoSpace`] and leaves the file exactly as it was. Changes to one file are serialised
//! by the file's change lock (the kernel's `i_rwsem`); readers never take it.
//!
//! Bytes of a folio beyond end of file are unspecified: reads never return them, and a change
//! that moves end of file forward over them (a write, `set_len`, `fallocate`) first replaces
//! that folio with one whose tail is zero.

use crate::error::Error;
use crate::inode::Inode;
use crate::mem::{FolioRef, NewFolio, PAGE_SHIFT, PAGE_SIZE};

/// The largest file size: 2^63 - 1 bytes (as the kernel's `MAX_LFS_FILESIZE`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

impl Inode {
    /// Writes all of `data` at `pos`, extending the file if it ends past end of file. All or
    /// nothing: without memory for it, [`Error::NoSpace`] and the file is unchanged.
    pub(crate) fn mem_write_at(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        let end = end_of(pos, data.len() as u64)?;
        if data.is_empty() {
            return Ok(0);
        }
        let _changing = self.lock_changes();
        let size = self.mapping.size();
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
    pub(crate) fn mem_set_len(&self, len: u64) -> Result<(), Error> {
        if len > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge { offset: len });
        }
        let _changing = self.lock_changes();
        let size = self.mapping.size();
        if len > size {
            self.apply(Plan::default(), size, len, |first_byte, bytes, old| {
                fill_from(bytes, first_byte, old, size);
            })?;
        } else if len < size {
            // Readers check the size before copying: publish it first, then drop the folios.
            self.mapping.set_size(len);
            self.mapping.truncate(len.div_ceil(PAGE_SIZE as u64)..);
        }
        Ok(())
    }

    /// Allocates folios for every hole in `offset..offset + len` (not uptodate: they read as
    /// zeros) and extends the file to `offset + len` if it is shorter (like `fallocate(2)`
    /// without `FALLOC_FL_KEEP_SIZE`). All or nothing.
    pub(crate) fn mem_fallocate(&self, offset: u64, len: u64) -> Result<(), Error> {
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _changing = self.lock_changes();
        let size = self.mapping.size();
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
    pub(crate) fn mem_punch_hole(&self, offset: u64, len: u64) -> Result<(), Error> {
        let end = end_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _changing = self.lock_changes();
        let size = self.mapping.size();
        let mut plan = Plan::default();
        // Folios that straddle either end of the range keep their other bytes.
        for byte in [offset, end - 1] {
            if let Some(folio) = self.mapping.lookup(byte >> PAGE_SHIFT) {
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
            self.mapping.truncate(first_page..end_page);
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
            self.mapping.set_size(end);
        }
        Ok(())
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
        let mapping = &self.mapping;
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
        if size.is_multiple_of(PAGE_SIZE as u64) && self.max_order == 0 {
            return Ok(()); // order-0 folios end at page boundaries: nothing past EOF
        }
        let Some(folio) = self.mapping.lookup(size >> PAGE_SHIFT) else {
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
    ) -> Result<(u64, NewFolio<'c>), Error> {
        let index = self.mapping.index();
        for order in (0..=self.max_order).rev() {
            let start = page & !((1u64 << order) - 1);
            let last = start | ((1u64 << order) - 1);
            if index.next_present(start, last).is_some() || plan.overlaps(start, last) {
                continue;
            }
            if let Ok(folio) = self.core.mem.alloc_folio(order) {
                return Ok((start, folio));
            }
        }
        Err(Error::NoSpace {
            pages: plan.pages() + 1,
        })
    }

    fn alloc_or_no_space<'c>(&'c self, order: u8, plan: &Plan<'c>) -> Result<NewFolio<'c>, Error> {
        self.core
            .mem
            .alloc_folio(order)
            .map_err(|_| Error::NoSpace {
                pages: plan.pages() + (1u64 << order),
            })
    }

    /// Puts a filled plan into the file: new folios inserted, copies swapped in.
    fn publish(&self, plan: Plan<'_>) -> Result<(), Error> {
        let mapping = &self.mapping;
        for (start, folio, filled) in plan.news {
            if filled {
                let (locked, _) = mapping.add_folio(folio, start)?;
                locked.unlock();
            } else {
                mapping.add_zeroed_folio(folio, start)?;
            }
        }
        for (old, new) in plan.cows {
            mapping.replace_folio(&old, new)?;
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
    cows: Vec<(FolioRef<'c>, NewFolio<'c>)>,
    /// (first page, private folio for a hole, whether it gets filled).
    news: Vec<(u64, NewFolio<'c>, bool)>,
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
            fill(first, new.bytes_mut(), Some(old));
            new.mark_uptodate();
        }
        for (start, new, filled) in &mut self.news {
            if *filled {
                fill(*start << PAGE_SHIFT, new.bytes_mut(), None);
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
pub(crate) fn end_of(offset: u64, len: u64) -> Result<u64, Error> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(end),
        _ => Err(Error::FileTooLarge {
            offset: offset.saturating_add(len),
        }),
    }
}
