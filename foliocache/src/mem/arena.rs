//! The arena: one anonymous mapping holding every folio's bytes.
//!
//! The mapping is aligned to the largest folio size so that a naturally aligned folio (aligned
//! to its own size within the arena) is also aligned in the address space, which lets the
//! kernel back order-9 folios with transparent huge pages when `MADV_HUGEPAGE` is asked for.

use crate::error::Error;
use crate::mem::PAGE_SIZE;
use std::io;
use std::ptr::NonNull;

/// One anonymous, private, read-write mapping of `pages` pages (or a shared cache's arena).
#[derive(Debug)]
pub(crate) struct Arena {
    base: NonNull<u8>,
    pages: usize,
    /// What was actually mapped (alignment slack included), for `munmap`; `None` for a shared
    /// cache's arena, which its mapping unmaps.
    mapped: Option<(NonNull<u8>, usize)>,
    /// The shared mapping holding the arena, kept mapped while the arena lives.
    #[cfg(not(loom))]
    _shared: Option<std::sync::Arc<super::shared::SharedMap>>,
}

// SAFETY: the arena is plain memory owned by this value; which thread may touch which bytes is
// governed by the folio protocol (a folio's bytes are only accessed through a reference on it).
unsafe impl Send for Arena {}
// SAFETY: as above; `Arena` itself only hands out raw pointers.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `pages` pages aligned to `align_bytes` (a power of two, a multiple of the page size).
    pub(crate) fn new(pages: usize, align_bytes: usize, huge_pages: bool) -> Result<Self, Error> {
        debug_assert!(pages > 0 && align_bytes.is_power_of_two() && align_bytes >= PAGE_SIZE);
        let bytes = pages
            .checked_mul(PAGE_SIZE)
            .and_then(|b| b.checked_add(align_bytes - PAGE_SIZE))
            .ok_or(Error::InvalidCapacity(u64::MAX))?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::Mmap {
                bytes: bytes as u64,
                source: io::Error::last_os_error(),
            });
        }
        let mapped = NonNull::new(raw.cast::<u8>()).ok_or(Error::Mmap {
            bytes: bytes as u64,
            source: io::Error::other("mmap returned a null address"),
        })?;
        let misalignment = (mapped.as_ptr() as usize) & (align_bytes - 1);
        let skip = if misalignment == 0 {
            0
        } else {
            align_bytes - misalignment
        };
        // SAFETY: `skip < align_bytes` and the mapping is `pages * PAGE_SIZE + align_bytes -
        // PAGE_SIZE` long; `skip` is a page multiple, so `base + pages * PAGE_SIZE` stays inside.
        let base = unsafe { mapped.add(skip) };
        let arena = Self {
            base,
            pages,
            mapped: Some((mapped, bytes)),
            #[cfg(not(loom))]
            _shared: None,
        };
        if huge_pages {
            // Best effort: a kernel without THP simply keeps small pages.
            // SAFETY: advising a range that lies inside our own mapping.
            unsafe {
                libc::madvise(
                    arena.base.as_ptr().cast(),
                    pages * PAGE_SIZE,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
        Ok(arena)
    }

    /// The arena of a shared cache's mapping (its memory is the memfd's: the owner reserved it
    /// all at creation).
    #[cfg(not(loom))]
    pub(crate) fn in_shared(
        map: std::sync::Arc<super::shared::SharedMap>,
        huge_pages: bool,
    ) -> Self {
        let (base, pages) = map.arena();
        if huge_pages {
            // Best effort, as for a private arena: shmem backs it with huge pages only where
            // `shmem_enabled` allows (`advise`, `always`, `within_size`).
            // SAFETY: advising a range inside the shared mapping, which `map` keeps mapped.
            unsafe {
                libc::madvise(base.as_ptr().cast(), pages * PAGE_SIZE, libc::MADV_HUGEPAGE);
            }
        }
        Self {
            base,
            pages,
            mapped: None,
            _shared: Some(map),
        }
    }

    /// The address of the arena's first byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Faults every page in now (`MADV_POPULATE_WRITE`), so first touches are not timed later.
    pub(crate) fn prefault(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our own read-write mapping.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().cast(),
                self.pages * PAGE_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The address of page `pfn`.
    pub(crate) fn page_ptr(&self, pfn: usize) -> *mut u8 {
        assert!(pfn < self.pages, "page {pfn} outside the arena");
        // SAFETY: `pfn < pages`, so the offset stays inside the mapping.
        unsafe { self.base.as_ptr().add(pfn * PAGE_SIZE) }
    }

    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Gives the memory of pages `pfn..pfn + count` back to the kernel (`MADV_DONTNEED`): they
    /// read as zeros and cost no resident memory until touched again. Best effort.
    pub(crate) fn discard(&self, pfn: usize, count: usize) {
        if self.mapped.is_none() {
            // A shared arena's memory is the memfd's: it is not given back page by page.
            return;
        }
        assert!(
            count > 0 && pfn.checked_add(count).is_some_and(|end| end <= self.pages),
            "pages {pfn}+{count} outside the arena"
        );
        let page = self.page_ptr(pfn);
        // SAFETY: the range lies inside our own private anonymous mapping (checked above), and
        // the caller owns its pages (allocated, referenced by no folio), so no one reads or
        // writes them meanwhile.
        unsafe {
            libc::madvise(page.cast(), count * PAGE_SIZE, libc::MADV_DONTNEED);
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some((mapped, bytes)) = self.mapped {
            // SAFETY: unmapping exactly what `new` mapped; no folio reference can outlive the
            // cache that owns this arena (references borrow it).
            unsafe {
                libc::munmap(mapped.as_ptr().cast(), bytes);
            }
        }
    }
}
