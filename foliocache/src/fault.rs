//! Mapped (fault-style) access: the kernel's `filemap_fault` and its readahead
//! (`docs/KERNEL.md`, "Page faults: read-around and the exec folio order"), including seed
//! 001's exec folio order.
//!
//! A [`Region`] is the analogue of a VMA: a page range of a file plus a [`RegionHint`]. A caller
//! faults pages by index ([`Region::fault`]) and gets the folio back referenced and uptodate.
//!
//! On a miss (`do_sync_mmap_readahead`):
//! - `Random`: no readahead, only the page.
//! - `Sequential`: the read path's sync readahead with the whole window as the request.
//! - `Normal` (and `Exec` with `exec_order` 0, the behaviour before seed 001): the `mmap_miss`
//!   count goes up (saturating at 1000); past 100 misses net of hits, no readahead ("we miss
//!   much more than we hit"); else **read-around**: a window of `ra_pages` centred on the
//!   fault (`start = index - ra_pages/2`), a quarter of it speculative, order 0.
//! - `Exec` with `exec_order` > 0 (seed 001): the window starts at the fault rounded down to
//!   the exec folio size (raised to the region's first page), ends at `start + ra_pages`
//!   rounded up to it (lowered to the region's end), has no speculative part (no mark) and
//!   is laid out in folios of the exec order, smaller only at the region's edges. No
//!   `mmap_miss` accounting.
//!
//! On a hit (`do_async_mmap_readahead`): no readahead for `Random`; for `Normal` an unlocked
//! folio counts down `mmap_miss`; a folio carrying the READAHEAD mark starts the next window
//! (the read path's async readahead).
//!
//! Not modelled: the THP-forcing branch for `VM_HUGEPAGE` and fault-around (there are no page
//! tables here to map neighbours into).

use crate::error::Error;
use crate::file::File;
use crate::inode::Inode;
use crate::mem::{FolioRef, PAGE_SHIFT, flag};
use crate::read;
use crate::readahead::{self, Fill, RaState};
use std::sync::Arc;

/// `MMAP_LOTSAMISS`: past this many misses (net of hits) a region stops reading around.
pub const MMAP_LOTSAMISS: u16 = 100;

/// How a region is accessed (the VMA flags the fault path looks at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionHint {
    /// Read-around on a miss, with miss accounting (the default).
    Normal,
    /// `MADV_RANDOM`: only the faulting page.
    Random,
    /// `MADV_SEQUENTIAL`: a stream, as `read` would.
    Sequential,
    /// Executable text (`VM_EXEC`): the exec folio order (seed 001).
    Exec,
}

/// A range of a file faulted page by page (the analogue of a VMA).
#[derive(Debug)]
pub struct Region {
    file: File,
    first: u64,
    end: u64,
    hint: RegionHint,
    ra: RaState,
    /// Misses minus hits (the kernel's `ra->mmap_miss`).
    mmap_miss: u16,
}

/// A faulted page: its folio, referenced and uptodate, and whether the fault missed the cache
/// (a major fault).
#[derive(Debug)]
pub struct Fault<'r> {
    /// The folio holding the page.
    pub folio: FolioRef<'r>,
    /// The page was not cached (its read was waited for).
    pub major: bool,
}

impl File {
    /// A region of this file, `offset..offset + len` in bytes (the offset rounded down and the
    /// end rounded up to pages), accessed as `hint` says. The region may extend past end of
    /// file (faults there fail, as SIGBUS would).
    pub fn region(&self, offset: u64, len: u64, hint: RegionHint) -> Result<Region, Error> {
        let end = offset
            .checked_add(len)
            .ok_or(Error::FileTooLarge { offset })?;
        if len == 0 {
            return Err(Error::EmptyRegion);
        }
        Ok(Region {
            file: self.clone(),
            first: offset >> PAGE_SHIFT,
            end: end.div_ceil(1 << PAGE_SHIFT),
            hint,
            ra: RaState::new(
                self.local()
                    .ok_or(Error::Unsupported {
                        what: "a mapped region",
                        mode: "shared",
                    })?
                    .core
                    .ra_pages,
            ),
            mmap_miss: 0,
        })
    }
}

impl Region {
    /// The region's first page and its end (exclusive), as page indexes of the file.
    pub fn pages(&self) -> (u64, u64) {
        (self.first, self.end)
    }

    /// The hint.
    pub fn hint(&self) -> RegionHint {
        self.hint
    }

    /// The readahead state the region's faults use (a copy).
    pub fn ra_state(&self) -> RaState {
        self.ra
    }

    /// The miss count (misses minus hits, 0..=1000).
    pub fn mmap_miss(&self) -> u16 {
        self.mmap_miss
    }

    /// Sets the maximum window in bytes (clamped to
    /// [`MAX_READAHEAD_BYTES`](crate::MAX_READAHEAD_BYTES); 0 disables readahead for this
    /// region).
    pub fn set_ra_bytes(&mut self, bytes: u64) {
        self.ra.ra_pages = bytes.min(crate::readahead::MAX_READAHEAD_BYTES) >> PAGE_SHIFT;
    }

    /// Faults page `index` of the file (`filemap_fault`): returns its folio, uptodate and
    /// referenced. Errors: a page outside the region or past end of file
    /// ([`Error::FaultOutOfRange`]), an I/O error ([`Error::Io`]), a memory file
    /// ([`Error::NotADiskFile`]: its pages are read with `read_at`).
    pub fn fault(&mut self, index: u64) -> Result<Fault<'_>, Error> {
        let Region {
            file,
            first,
            end,
            hint,
            ra,
            mmap_miss,
        } = self;
        let file = file.inode();
        let size = file.mapping.size();
        if index < *first || index >= *end || index >= size.div_ceil(1 << PAGE_SHIFT) {
            return Err(Error::FaultOutOfRange { index });
        }
        if file.disk().is_none() {
            return Err(Error::NotADiskFile);
        }
        let mut state = FaultState {
            hint: *hint,
            first: *first,
            end: *end,
            ra,
            mmap_miss,
        };
        let mut major = false;
        loop {
            let folio = if let Some(folio) = file.mapping.lookup(index) {
                state.async_readahead(file, &folio);
                folio
            } else {
                major = true;
                state.sync_readahead(file, index);
                match file.mapping.lookup(index) {
                    Some(folio) => folio,
                    None => match read::create_folio(file, index)? {
                        Some(folio) => folio,
                        None => continue,
                    },
                }
            };
            if folio.is_uptodate() {
                // A fault is an access (what the accessed bit of a page table entry records).
                crate::reclaim::mark_accessed(&folio);
                return Ok(Fault { folio, major });
            }
            major = true;
            if read::update_page(file, state.ra, &folio)? {
                crate::reclaim::mark_accessed(&folio);
                return Ok(Fault { folio, major });
            }
        }
    }
}

/// The region's fields one fault works with (borrowed apart from its file).
struct FaultState<'a> {
    hint: RegionHint,
    first: u64,
    end: u64,
    ra: &'a mut RaState,
    mmap_miss: &'a mut u16,
}

impl FaultState<'_> {
    /// Whether misses read exec windows (seed 001) rather than around the fault.
    fn exec_window(&self, file: &Inode) -> bool {
        self.hint == RegionHint::Exec && file.policy.exec_order > 0
    }

    /// `do_sync_mmap_readahead` (see the module comment).
    fn sync_readahead(&mut self, file: &Arc<Inode>, index: u64) {
        let Some(disk) = file.disk() else { return };
        let ra_pages = self.ra.ra_pages;
        let exec_order = file.policy.exec_order;
        let exec = self.exec_window(file);
        if self.hint == RegionHint::Random || ra_pages == 0 {
            return;
        }
        if self.hint == RegionHint::Sequential {
            readahead::on_miss(file, self.ra, index, ra_pages);
            return;
        }
        if !exec {
            *self.mmap_miss = (*self.mmap_miss + 1).min(10 * MMAP_LOTSAMISS);
            if *self.mmap_miss > MMAP_LOTSAMISS {
                disk.ra.mmap_gave_up.inc();
                return;
            }
        }
        if exec {
            let nr = 1u64 << exec_order;
            let start = (index & !(nr - 1)).max(self.first);
            let end = (start + ra_pages).next_multiple_of(nr).min(self.end);
            self.ra.start = start;
            self.ra.size = end - start;
            self.ra.async_size = 0;
            self.ra.order = exec_order;
            disk.ra.exec_windows.inc();
        } else {
            self.ra.start = index.saturating_sub(ra_pages / 2);
            self.ra.size = ra_pages;
            self.ra.async_size = ra_pages / 4;
            self.ra.order = 0;
            disk.ra.read_around.inc();
        }
        readahead::fill(file, self.ra, Fill::Window);
    }

    /// `do_async_mmap_readahead` (see the module comment).
    fn async_readahead(&mut self, file: &Arc<Inode>, folio: &FolioRef<'_>) {
        if self.hint == RegionHint::Random || self.ra.ra_pages == 0 {
            return;
        }
        let counts_misses =
            matches!(self.hint, RegionHint::Normal | RegionHint::Exec) && !self.exec_window(file);
        if counts_misses && !folio.test(flag::LOCKED) {
            *self.mmap_miss = self.mmap_miss.saturating_sub(1);
        }
        let ra_pages = self.ra.ra_pages;
        readahead::on_folio(file, self.ra, folio, ra_pages);
    }
}
