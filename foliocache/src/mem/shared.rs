//! The shared mapping of a shared cache: its layout, its header, and the checks every process
//! makes before trusting it (`docs/SHARED.md`, "The mapping").
//!
//! One sealed memfd holds the whole cache:
//!
//! ```text
//! header          fixed part (magic, version, layout hash, sizes, settings, sections, checksum),
//!                 then live words (owner, generation, epoch, counters for status)
//! process slots   ProcessSlot × processes
//! thread slots    ThreadSlot × threads (a client thread's pin and mailbox)
//! file records    FileRecord × files
//! folio table     FolioDesc × pages
//! arena           pages × 4 KiB, 2 MiB aligned (index nodes live here too, in node pages)
//! ```
//!
//! Everything in the mapping is atomics or bytes copied out before use: another process may
//! write any of it at any time (a bug, or a hostile process of the same user), so nothing here
//! hands out a plain reference to memory whose contents a process relies on without checking.
//! The fixed part of the header is read once, by a volatile copy, and checked (magic, version,
//! layout hash, checksum, every section inside the memfd's size); the typed views below are
//! built from that checked copy, never from the live header.
//!
//! Nothing in the mapping is a pointer: folios are page numbers, index nodes are byte offsets
//! in the arena, files are record numbers.

use super::folio::FolioDesc;
use super::{NODE_ROOM, PAGE_SIZE};
use crate::error::Error;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The first bytes of every shared cache.
pub(crate) const MAGIC: [u8; 8] = *b"foliosh1";

/// Bumped whenever the meaning of any byte of the mapping changes.
pub(crate) const LAYOUT_VERSION: u32 = 3;

/// Words of settings the header carries (their meaning is the shared cache's, `crate::shared`).
pub(crate) const SETTINGS_WORDS: usize = 32;

/// Bytes of a file's path kept in its record (longer paths are not kept: a new owner then opens
/// the file only through a client, or its handle).
pub(crate) const PATH_ROOM: usize = 1024;

/// Bytes of a file handle (`name_to_handle_at`) kept in a record.
pub(crate) const HANDLE_ROOM: usize = 128;

/// Words of a mailbox's request and of its answer.
pub(crate) const MAIL_WORDS: usize = 16;

/// The descriptor `mapping` of a client thread's staging folio (`mem::nodes::NODE_PAGE` is
/// the mark of node pages; file ids are below 2^48).
pub(crate) const STAGING: u64 = u64::MAX - 2;

/// The arena's alignment in the mapping (the largest folio).
const ARENA_ALIGN: usize = 2 << 20;

/// A huge page of the memfd (2 MiB, a PMD on x86-64 and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;

/// How long a new cache's creator collapses ranges into huge pages before it reserves the rest
/// in small pages and starts serving (the owner collapses those later, on a thread). A fresh
/// huge page costs about 0.25 ms on bare metal, but up to 4.5 ms in a VM that handed its idle
/// memory back to the host (BENCHMARKS.md, "Baseline: guest memory"): a 4 GiB cache then
/// took 5–14 s to make.
const COLLAPSE_BUDGET: std::time::Duration = std::time::Duration::from_millis(250);

/// Puts one page in each [`HUGE`] range of a new memfd, which `MADV_COLLAPSE` needs to find
/// there before it makes the range one huge page (it fills the rest with zeros). Reserving
/// every page first instead would make the kernel copy them all on collapse, about 25 times
/// slower. Best effort, like the collapse.
fn seed_huge_ranges(fd: &OwnedFd, total: u64) {
    for start in (0..total / HUGE as u64).map(|r| r * HUGE as u64) {
        if rustix::fs::fallocate(
            fd,
            rustix::fs::FallocateFlags::empty(),
            start,
            PAGE_SIZE as u64,
        )
        .is_err()
        {
            return;
        }
    }
}

/// One section of the mapping: where it starts and how many items of what size it holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Section {
    pub(crate) offset: u64,
    pub(crate) count: u64,
    pub(crate) stride: u64,
}

impl Section {
    fn end(&self) -> Option<u64> {
        self.count
            .checked_mul(self.stride)
            .and_then(|bytes| bytes.checked_add(self.offset))
    }
}

/// Where every section lies.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Sections {
    pub(crate) processes: Section,
    pub(crate) threads: Section,
    pub(crate) files: Section,
    pub(crate) table: Section,
    pub(crate) arena: Section,
}

/// The header's fixed part: written once by the creator before anyone else sees the mapping.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fixed {
    pub(crate) magic: [u8; 8],
    pub(crate) version: u32,
    pub(crate) layout_hash: u32,
    /// The memfd's size in bytes.
    pub(crate) total: u64,
    /// A random identity, to tell two caches of one name apart (one that replaced another).
    pub(crate) cache_id: [u8; 16],
    pub(crate) settings: [u64; SETTINGS_WORDS],
    pub(crate) sections: Sections,
    /// FNV-1a of every byte above.
    pub(crate) checksum: u64,
}

/// The header's live words (after the fixed part).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct Live {
    /// The owner's pid (0: none yet).
    pub(crate) owner_pid: AtomicU32,
    /// Bumped by every owner that takes the cache over.
    pub(crate) owner_generation: AtomicU32,
    /// The owner's start time (field 22 of `/proc/PID/stat`), with its pid its identity.
    pub(crate) owner_start: AtomicU64,
    /// The owner's epoch, mirrored for clients to pin with (see `mem::epoch`, external pins).
    pub(crate) epoch: AtomicU64,
    /// Counters the owner publishes for `fcache cache status`: free pages, dirty pages, pages
    /// under writeback, files, attached processes, nanoseconds of the last takeover.
    pub(crate) counters: [AtomicU64; 8],
    /// How many 2 MiB ranges of the memfd its creator had backed by huge pages.
    pub(crate) huge_ranges: AtomicU64,
}

/// The header: the fixed part, then the live words.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Header {
    pub(crate) fixed: Fixed,
    pub(crate) live: Live,
}

/// A process attached to the cache (written by the owner).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct ProcessSlot {
    /// 0: free; otherwise attached.
    pub(crate) state: AtomicU32,
    pub(crate) pid: AtomicU32,
    pub(crate) start: AtomicU64,
    /// The descriptor number of the client's memfd (a new owner opens it again through
    /// `/proc/PID/fd/N`).
    pub(crate) memfd: AtomicU32,
}

/// One client thread's slot: its epoch pin (a line of its own, written on every read) and its
/// mailbox (a request and its answer).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct ThreadSlot {
    /// The thread's pin word: idle (0) or `epoch << 1 | 1` (as `mem::epoch`'s participants).
    pub(crate) pin: AtomicU64,
    _pin_line: [u64; 7],
    /// 0: free; else `CLAIMED | process slot` (one atomic step claims the slot for a process).
    pub(crate) claim: AtomicU32,
    /// The mailbox's state (`crate::shared`'s protocol; a futex word).
    pub(crate) state: AtomicU32,
    /// The staging folio (id), where a write's bytes or a copied read's bytes go.
    pub(crate) staging: AtomicU32,
    /// Its order.
    pub(crate) staging_order: AtomicU32,
    /// Bumped by the client for every request (the owner answers with it).
    pub(crate) seq: AtomicU32,
    _mail_line: [u32; 11],
    pub(crate) request: [AtomicU64; MAIL_WORDS],
    pub(crate) reply: [AtomicU64; MAIL_WORDS],
}

/// One file's record (written by the owner; clients read the root, size and serving state).
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct FileRecord {
    /// 0: free; else live.
    pub(crate) state: AtomicU32,
    /// Bumped each time the record is given to another file.
    pub(crate) generation: AtomicU32,
    /// What the key names (a disk file, an object).
    pub(crate) kind: AtomicU32,
    pub(crate) max_order: AtomicU32,
    pub(crate) dev: AtomicU64,
    pub(crate) ino: AtomicU64,
    /// The id its folios carry in their descriptors.
    pub(crate) mapping_id: AtomicU64,
    /// The index's root word (a node offset in the arena, or 0).
    pub(crate) root: AtomicUsize,
    pub(crate) size: AtomicU64,
    /// Even: served from the cache; odd: passing through (another process writes it).
    pub(crate) serving: AtomicU32,
    /// The file's writeback error sequence (`errseq_t`).
    pub(crate) errseq: AtomicU32,
    /// Which signal tells the owner of writers outside the cache.
    pub(crate) signal: AtomicU32,
    pub(crate) handle_type: AtomicI32,
    /// The stamp: size, modification and change times (nanoseconds, split in two words each).
    pub(crate) stamp: [AtomicU64; 5],
    pub(crate) path_len: AtomicU32,
    pub(crate) handle_len: AtomicU32,
    pub(crate) path: [AtomicU8; PATH_ROOM],
    pub(crate) handle: [AtomicU8; HANDLE_ROOM],
}

const _: () = assert!(std::mem::size_of::<usize>() == 8);
const _: () = assert!(std::mem::size_of::<ThreadSlot>() == 384);

/// A hash of the layout of everything in the mapping: two builds that disagree on any of these
/// sizes refuse each other's mappings.
const fn layout_hash() -> u32 {
    let sizes = [
        std::mem::size_of::<Fixed>(),
        std::mem::size_of::<Live>(),
        std::mem::size_of::<ProcessSlot>(),
        std::mem::size_of::<ThreadSlot>(),
        std::mem::size_of::<FileRecord>(),
        std::mem::size_of::<FolioDesc>(),
        NODE_ROOM,
        PAGE_SIZE,
    ];
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < sizes.len() {
        hash = (hash ^ sizes[i] as u32).wrapping_mul(0x0100_0193);
        i += 1;
    }
    hash
}

/// FNV-1a over bytes.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Fixed {
    /// The bytes the checksum covers.
    fn checksummed(&self) -> Vec<u8> {
        let mut copy = *self;
        copy.checksum = 0;
        // SAFETY: `Fixed` is `repr(C)` plain data; viewing a copy of it as bytes is sound
        // (padding bytes of the copy are whatever the copy holds: the fields leave none here,
        // see the assertion below).
        let bytes = unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(&copy).cast::<u8>(),
                std::mem::size_of::<Fixed>(),
            )
        };
        bytes.to_vec()
    }

    fn with_checksum(mut self) -> Self {
        self.checksum = fnv(&self.checksummed());
        self
    }
}

// No padding in `Fixed`: the checksum covers real bytes only.
const _: () = assert!(
    std::mem::size_of::<Fixed>()
        == 8 + 4 + 4 + 8 + 16 + 8 * SETTINGS_WORDS + std::mem::size_of::<Sections>() + 8
);

/// The sizes a new mapping is built with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) pages: usize,
    pub(crate) processes: usize,
    pub(crate) threads: usize,
    pub(crate) files: usize,
}

impl Shape {
    /// Where each section lies, and the total size.
    fn sections(&self) -> Result<(Sections, u64), Error> {
        let too_big = || Error::InvalidCapacity(u64::MAX);
        let mut at = std::mem::size_of::<Header>().next_multiple_of(PAGE_SIZE) as u64;
        let mut place = |count: usize, stride: usize, align: usize| -> Result<Section, Error> {
            let offset = at.next_multiple_of(align as u64);
            let section = Section {
                offset,
                count: count as u64,
                stride: stride as u64,
            };
            at = section.end().ok_or_else(too_big)?;
            Ok(section)
        };
        let processes = place(self.processes, std::mem::size_of::<ProcessSlot>(), 64)?;
        let threads = place(self.threads, std::mem::size_of::<ThreadSlot>(), 64)?;
        let files = place(self.files, std::mem::size_of::<FileRecord>(), 64)?;
        let table = place(self.pages, std::mem::size_of::<FolioDesc>(), 64)?;
        let arena = place(self.pages, PAGE_SIZE, ARENA_ALIGN)?;
        let sections = Sections {
            processes,
            threads,
            files,
            table,
            arena,
        };
        let total = arena.end().ok_or_else(too_big)?;
        Ok((sections, total))
    }

    /// The bytes a mapping of this shape takes.
    pub(crate) fn bytes(&self) -> Result<u64, Error> {
        Ok(self.sections()?.1)
    }
}

/// A shared cache's mapping in this process (see the module documentation).
#[derive(Debug)]
pub(crate) struct SharedMap {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    /// The checked copy of the fixed header.
    fixed: Fixed,
    /// The first 2 MiB range the creator has not tried to collapse yet (`usize::MAX`: none
    /// left, or huge pages not asked for). Process-local.
    huge_next: AtomicUsize,
    /// How the collapses went in this process (see [`Collapses`]).
    collapses: Collapses,
}

/// What the kernel answered this process's `MADV_COLLAPSE`s (process-local counts).
#[derive(Debug, Default)]
pub(crate) struct Collapses {
    /// The kernel refused the first one outright (`EINVAL`: no `MADV_COLLAPSE` before Linux
    /// 6.1, or huge pages off for shared memory): it gives this mapping no huge pages.
    pub(crate) refused: std::sync::atomic::AtomicBool,
    /// Ranges left in small pages for want of memory: `ENOMEM`, or `EAGAIN` (at creation at
    /// once; in the late collapse, after a second try).
    pub(crate) short_of_memory: AtomicUsize,
}

/// Whether this kernel may collapse pages other processes are using (Linux 6.4 and later).
/// Before 6.4, `MADV_COLLAPSE` of shared memory put the new huge page in place before it
/// had copied the small pages into it (`mm/khugepaged.c`, fixed by "maintain page cache
/// uptodate flag"); a collapse at creation, before anyone maps the memfd, is safe anywhere.
pub(crate) fn late_collapse_safe() -> bool {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(major), Some(minor)) if (major, minor) >= (6, 4))
}

/// Ranges that fail for want of memory one after the other before the late collapse gives up
/// (a machine short of huge pages would only have each try compact memory in vain).
const COLLAPSE_GIVE_UP: usize = 8;

// SAFETY: the mapping is shared memory made of atomics and bytes copied out before use (module
// documentation); the value only hands out references to atomics and checked raw pointers.
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

fn mapping_error(what: impl Into<String>) -> Error {
    Error::SharedMapping(what.into())
}

impl SharedMap {
    /// A word of the mapping (a field of a record or slot this mapping handed out) as a
    /// [`Word`](super::word::Word) that keeps the mapping alive.
    ///
    /// # Panics
    /// If `field` does not lie inside this mapping (a caller's bug, not a corrupted mapping:
    /// the field is a reference this mapping handed out).
    pub(crate) fn word<T: Sync + 'static>(self: &Arc<Self>, field: &T) -> super::word::Word<T> {
        let at = std::ptr::from_ref(field) as usize;
        let base = self.base.as_ptr() as usize;
        assert!(
            at >= base && at + std::mem::size_of::<T>() <= base + self.len,
            "a word outside the shared mapping"
        );
        let keep: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(self) as _;
        // SAFETY: `field` lies inside the mapping (checked), which stays mapped while `keep`
        // (this map) lives; `T` is `Sync` and only ever accessed through shared references,
        // as every word of the mapping is an atomic.
        unsafe { super::word::Word::at(NonNull::from(field), keep) }
    }

    /// Creates a new shared cache's memfd of `shape`, reserves all of its memory (in huge
    /// pages where the kernel can, if `huge`), writes its header and folio table, seals its
    /// size, and maps it.
    pub(crate) fn create(
        name: &str,
        shape: Shape,
        settings: [u64; SETTINGS_WORDS],
        cache_id: [u8; 16],
        policy: super::refcount::RefcountPolicy,
        huge: bool,
    ) -> Result<Self, Error> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let (sections, total) = shape.sections()?;
        let fd = rustix::fs::memfd_create(
            format!("foliocache:{name}"),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| mapping_error(format!("memfd_create: {e}")))?;
        rustix::fs::ftruncate(&fd, total)
            .map_err(|e| mapping_error(format!("cannot size the mapping to {total} bytes: {e}")))?;
        if huge {
            seed_huge_ranges(&fd, total);
        }
        let fixed = Fixed {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            layout_hash: layout_hash(),
            total,
            cache_id,
            settings,
            sections,
            checksum: 0,
        }
        .with_checksum();
        let map = Self::map(fd, total as usize, fixed)?;
        let huge_ranges = if huge {
            map.collapse(0, std::time::Instant::now() + COLLAPSE_BUDGET)
        } else {
            0
        };
        rustix::fs::fallocate(&map.fd, rustix::fs::FallocateFlags::empty(), 0, total).map_err(
            |e| {
                mapping_error(format!(
                    "cannot reserve {} MiB of shared memory: {e}",
                    total >> 20
                ))
            },
        )?;
        // SAFETY: the header lies at the start of the mapping, which is at least a header long
        // (sections start after it); nobody else has the memfd yet.
        unsafe { map.base.as_ptr().cast::<Fixed>().write_volatile(fixed) };
        map.live().huge_ranges.store(huge_ranges, Ordering::Relaxed);
        for desc in map.table() {
            desc.reset(policy);
        }
        // No staging folio yet: a zero would name page 0.
        for t in map.threads() {
            t.staging.store(u32::MAX, Ordering::Relaxed);
        }
        rustix::fs::fcntl_add_seals(
            &map.fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )
        .map_err(|e| mapping_error(format!("cannot seal the mapping: {e}")))?;
        Ok(map)
    }

    /// Maps a shared cache's memfd received from its owner (or a client), after checking its
    /// seals, its size and its header.
    pub(crate) fn attach(fd: OwnedFd) -> Result<Self, Error> {
        use rustix::fs::SealFlags;
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| mapping_error(format!("not a sealed memfd ({e})")))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(mapping_error(
                "the mapping's size is not sealed (another process could shrink it)",
            ));
        }
        let size = rustix::fs::fstat(&fd)
            .map_err(|e| mapping_error(format!("fstat: {e}")))?
            .st_size as u64;
        let header_bytes = std::mem::size_of::<Header>() as u64;
        if size < header_bytes {
            return Err(mapping_error(format!(
                "truncated: {size} bytes, less than a header"
            )));
        }
        // Read the fixed header through a small read-only mapping first, then check it.
        let fixed = {
            let peek = Self::map_raw(&fd, header_bytes as usize, false)?;
            // SAFETY: `peek` maps at least `size_of::<Header>()` bytes; a volatile copy of plain
            // data (any bit pattern is a valid `Fixed`) is sound even if another process writes
            // it meanwhile: what we check is the copy.
            let fixed = unsafe { peek.0.as_ptr().cast::<Fixed>().read_volatile() };
            // SAFETY: unmapping exactly what `map_raw` mapped.
            unsafe { libc::munmap(peek.0.as_ptr().cast(), peek.1) };
            fixed
        };
        Self::check(&fixed, size)?;
        Self::map(fd, size as usize, fixed)
    }

    /// The checks of a fixed header against the memfd's size.
    fn check(fixed: &Fixed, size: u64) -> Result<(), Error> {
        if fixed.magic != MAGIC {
            return Err(mapping_error("not a foliocache mapping (bad magic)"));
        }
        if fixed.version != LAYOUT_VERSION {
            return Err(mapping_error(format!(
                "layout version {} (this build reads version {LAYOUT_VERSION})",
                fixed.version
            )));
        }
        if fixed.layout_hash != layout_hash() {
            return Err(mapping_error(
                "made by a build with another layout (structure sizes differ)",
            ));
        }
        if fnv(&fixed.checksummed()) != fixed.checksum {
            return Err(mapping_error("corrupted header (checksum)"));
        }
        if fixed.total != size {
            return Err(mapping_error(format!(
                "truncated or resized: the header says {} bytes, the memfd has {size}",
                fixed.total
            )));
        }
        let s = fixed.sections;
        let header_end = std::mem::size_of::<Header>() as u64;
        let wanted = [
            (s.processes, std::mem::size_of::<ProcessSlot>(), 64u64),
            (s.threads, std::mem::size_of::<ThreadSlot>(), 64),
            (s.files, std::mem::size_of::<FileRecord>(), 64),
            (s.table, std::mem::size_of::<FolioDesc>(), 64),
            (s.arena, PAGE_SIZE, ARENA_ALIGN as u64),
        ];
        let mut previous_end = header_end;
        for (section, stride, align) in wanted {
            let end = section.end();
            if section.stride != stride as u64
                || section.offset % align != 0
                || section.offset < previous_end
                || end.is_none_or(|end| end > size)
            {
                return Err(mapping_error(format!(
                    "a section lies outside the mapping or is misshapen: {section:?}"
                )));
            }
            previous_end = end.unwrap_or(size);
        }
        if s.table.count != s.arena.count
            || s.arena.count == 0
            || s.arena.count >= u64::from(u32::MAX)
        {
            return Err(mapping_error("the folio table and the arena disagree"));
        }
        Ok(())
    }

    /// Maps `len` bytes of the memfd. A mapping of at least [`HUGE`] bytes starts at a
    /// [`HUGE`]-aligned address, so the memfd's huge pages (file offsets aligned alike) can be
    /// mapped whole, one page-table entry each, in every process.
    fn map_raw(fd: &OwnedFd, len: usize, write: bool) -> Result<(NonNull<u8>, usize), Error> {
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let mmap_error = |bytes: usize| Error::Mmap {
            bytes: bytes as u64,
            source: std::io::Error::last_os_error(),
        };
        let (hint, flags, reserved) = if len >= HUGE {
            // Reserve address space one huge page longer, then map the memfd over its first
            // aligned address and give back what is left on either side.
            let reserve = len + HUGE;
            // SAFETY: a new private, inaccessible, unbacked mapping at an address of the
            // kernel's choosing; no existing memory is affected.
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    reserve,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                return Err(mmap_error(reserve));
            }
            let start = raw as usize;
            let aligned = (start + HUGE - 1) & !(HUGE - 1);
            (aligned, libc::MAP_FIXED, Some((start, reserve)))
        } else {
            (0, 0, None)
        };
        // SAFETY: a new shared mapping of the memfd, either at an address of the kernel's
        // choosing or (MAP_FIXED) over the inaccessible reservation made just above, which
        // holds `hint..hint + len` and which nothing else uses.
        let raw = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                prot,
                libc::MAP_SHARED | flags,
                fd.as_fd().as_raw_fd_i32(),
                0,
            )
        };
        let failed = raw == libc::MAP_FAILED;
        let error = failed.then(|| mmap_error(len));
        if let Some((start, reserve)) = reserved {
            let end = start + reserve;
            let (keep_from, keep_to) = if failed {
                (hint, hint)
            } else {
                (hint, hint + len)
            };
            for (from, to) in [(start, keep_from), (keep_to, end)] {
                if to > from {
                    // SAFETY: unmapping parts of our own reservation that nothing uses (the
                    // memfd's mapping lies between them).
                    unsafe { libc::munmap(from as *mut libc::c_void, to - from) };
                }
            }
        }
        if let Some(error) = error {
            return Err(error);
        }
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| mapping_error("mmap returned a null address"))?;
        Ok((base, len))
    }

    /// Backs the mapping with huge pages where the kernel can, one [`HUGE`] range at a time
    /// from range `first` (`MADV_COLLAPSE`, which works whatever `shmem_enabled` says except
    /// `deny`; a range holding only a seeded page costs a fresh huge page, one whose pages
    /// are all there also costs their copy). Best effort: a range the kernel cannot collapse
    /// (no free huge page, pages pinned by I/O in flight) keeps small pages. Stops at
    /// `deadline`, leaving [`Self::collapse_rest`] the ranges not tried. Returns how many
    /// ranges it collapsed.
    fn collapse(&self, first: usize, deadline: std::time::Instant) -> u64 {
        let mut collapsed = 0;
        for range in first..self.len / HUGE {
            if std::time::Instant::now() >= deadline {
                self.huge_next.store(range, Ordering::Relaxed);
                return collapsed;
            }
            match self.collapse_range(range) {
                Ok(()) => collapsed += 1,
                // The kernel cannot (no MADV_COLLAPSE, or THP off for shared memory): every
                // other range would fail alike.
                Err(e) if collapsed == 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.collapses.refused.store(true, Ordering::Relaxed);
                    break;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EAGAIN)) => {
                    self.collapses
                        .short_of_memory
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {}
            }
        }
        collapsed
    }

    /// `MADV_COLLAPSE` of range `range` (of [`HUGE`] bytes); `EINVAL` for a range past the
    /// mapping's end.
    fn collapse_range(&self, range: usize) -> std::io::Result<()> {
        if range >= self.len / HUGE {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: advising a range inside our own mapping; MADV_COLLAPSE keeps the contents
        // (the kernel copies them into the huge page, holding each small page locked and
        // unmapped meanwhile, as khugepaged does) and only changes the backing.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().add(range * HUGE).cast(),
                HUGE,
                libc::MADV_COLLAPSE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Whether the creator left ranges to collapse (its time at creation ran out).
    pub(crate) fn huge_pending(&self) -> bool {
        self.huge_next.load(Ordering::Relaxed) != usize::MAX
    }

    /// How this process's collapses went.
    pub(crate) fn collapses(&self) -> &Collapses {
        &self.collapses
    }

    /// The bytes of the mapping in huge pages, from the header's count of collapsed ranges
    /// (a word any process attached can write: bounded by the mapping's ranges).
    pub(crate) fn huge_bytes(&self) -> u64 {
        let ranges = self.live().huge_ranges.load(Ordering::Relaxed);
        ranges.min((self.len / HUGE) as u64) * HUGE as u64
    }

    /// Collapses the ranges [`Self::create`] had no time for, counting each in the header
    /// as it goes (so `fcache cache status` stays current). The owner runs it on a thread of
    /// its own, started as it builds its cache (so clients may be using
    /// the pages meanwhile): the memory is reserved already (in small pages there), so this
    /// only changes the backing, and each collapse needs one free huge page more while it
    /// copies. A range that fails for want of memory once (`EAGAIN`) is tried again at the
    /// end; after [`COLLAPSE_GIVE_UP`] ranges in a row short of memory, it stops. A process
    /// that dies halfway leaves a mapping partly in huge pages, which is as valid as any.
    pub(crate) fn collapse_rest(&self) {
        let first = self.huge_next.swap(usize::MAX, Ordering::Relaxed);
        if first != usize::MAX {
            self.collapse_ranges(first, true);
        }
    }

    /// For an owner that took over: collapses every range (one its creator collapsed already
    /// is left as it is, at no cost), as [`Self::collapse_rest`] does, then sets the header's
    /// count to the ranges now in huge pages (the creator may have died before it was done).
    pub(crate) fn collapse_after_takeover(&self) {
        let huge = self.collapse_ranges(0, false);
        self.live().huge_ranges.store(huge, Ordering::Relaxed);
    }

    /// Collapses ranges `first..` as [`Self::collapse_rest`] describes; counts each in the
    /// header as it goes if `count`. Returns how many it collapsed.
    fn collapse_ranges(&self, first: usize, count: bool) -> u64 {
        let mut collapsed = 0;
        let mut done = |map: &Self| {
            collapsed += 1;
            if count {
                map.live().huge_ranges.fetch_add(1, Ordering::Relaxed);
            }
        };
        let mut again = Vec::new();
        let mut short_in_a_row = 0;
        for range in first..self.len / HUGE {
            match self.collapse_range(range) {
                Ok(()) => {
                    short_in_a_row = 0;
                    done(self);
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => again.push(range),
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                    self.collapses
                        .short_of_memory
                        .fetch_add(1, Ordering::Relaxed);
                    short_in_a_row += 1;
                    if short_in_a_row >= COLLAPSE_GIVE_UP {
                        let left = self.len / HUGE - range - 1;
                        self.collapses
                            .short_of_memory
                            .fetch_add(left + again.len(), Ordering::Relaxed);
                        return collapsed;
                    }
                }
                Err(_) => {}
            }
        }
        for range in again {
            match self.collapse_range(range) {
                Ok(()) => done(self),
                Err(_) => {
                    self.collapses
                        .short_of_memory
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        collapsed
    }

    fn map(fd: OwnedFd, len: usize, fixed: Fixed) -> Result<Self, Error> {
        let (base, len) = Self::map_raw(&fd, len, true)?;
        Ok(Self {
            base,
            len,
            fd,
            fixed,
            huge_next: AtomicUsize::new(usize::MAX),
            collapses: Collapses::default(),
        })
    }

    /// The checked copy of the fixed header.
    pub(crate) fn fixed(&self) -> &Fixed {
        &self.fixed
    }

    /// The memfd (to pass on to another process).
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The header's live words.
    pub(crate) fn live(&self) -> &Live {
        // SAFETY: the header lies at the start of the mapping (checked: every section starts
        // after it); `Live` is atomics, valid for any bits, and the mapping lives as long as
        // `self`.
        unsafe { &(*self.base.as_ptr().cast::<Header>()).live }
    }

    /// A section's items as a slice.
    ///
    /// # Safety
    /// `T` must be the section's item type: `repr(C)`, made of atomics (valid for any bits),
    /// of size `section.stride`.
    unsafe fn items<T>(&self, section: Section) -> &[T] {
        debug_assert_eq!(section.stride, std::mem::size_of::<T>() as u64);
        // SAFETY: `check` (or `create`) placed the section inside the mapping, aligned for its
        // items; per the caller, any bits are a valid `T`; the mapping lives as long as `self`.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(section.offset as usize).cast::<T>(),
                section.count as usize,
            )
        }
    }

    pub(crate) fn processes(&self) -> &[ProcessSlot] {
        // SAFETY: the processes section holds `ProcessSlot`s (atomics).
        unsafe { self.items(self.fixed.sections.processes) }
    }

    pub(crate) fn threads(&self) -> &[ThreadSlot] {
        // SAFETY: the threads section holds `ThreadSlot`s (atomics).
        unsafe { self.items(self.fixed.sections.threads) }
    }

    pub(crate) fn files(&self) -> &[FileRecord] {
        // SAFETY: the files section holds `FileRecord`s (atomics).
        unsafe { self.items(self.fixed.sections.files) }
    }

    /// The folio table.
    pub(crate) fn table(&self) -> &[FolioDesc] {
        // SAFETY: the table section holds `FolioDesc`s, `repr(C)` atomics.
        unsafe { self.items(self.fixed.sections.table) }
    }

    /// The arena's first byte and its pages.
    pub(crate) fn arena(&self) -> (NonNull<u8>, usize) {
        let arena = self.fixed.sections.arena;
        // SAFETY: the arena section lies inside the mapping (checked).
        let base = unsafe { self.base.add(arena.offset as usize) };
        (base, arena.count as usize)
    }
}

impl SharedMap {
    /// Where folio `pfn` of `order` lies in this process, if it lies inside the arena.
    fn folio_range(&self, pfn: u32, order: u32) -> Option<(NonNull<u8>, usize)> {
        let (base, pages) = self.arena();
        let count = 1usize.checked_shl(order).filter(|_| order <= 9)?;
        let end = (pfn as usize).checked_add(count)?;
        if end > pages {
            return None;
        }
        // SAFETY: `pfn + count <= pages`, so the range lies inside the arena.
        let start = unsafe { base.add(pfn as usize * PAGE_SIZE) };
        Some((start, count * PAGE_SIZE))
    }

    /// Copies bytes of folio `pfn` (of `order`) from `offset` into `dst`; false, copying
    /// nothing, if the range is not inside the folio and the arena.
    pub(crate) fn copy_out(&self, pfn: u32, order: u32, offset: usize, dst: &mut [u8]) -> bool {
        let Some((start, len)) = self.folio_range(pfn, order) else {
            return false;
        };
        if offset.checked_add(dst.len()).is_none_or(|end| end > len) {
            return false;
        }
        // SAFETY: the source range lies inside the folio, inside the mapping (checked above);
        // `dst` is ours. Another process may write the source meanwhile (it is shared memory):
        // the copy then holds whatever bytes it saw, never anything outside the range.
        unsafe {
            std::ptr::copy_nonoverlapping(start.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
        true
    }

    /// Copies `src` into folio `pfn` (of `order`) at `offset`; false, copying nothing, if the
    /// range is not inside the folio and the arena.
    pub(crate) fn copy_in(&self, pfn: u32, order: u32, offset: usize, src: &[u8]) -> bool {
        let Some((start, len)) = self.folio_range(pfn, order) else {
            return false;
        };
        if offset.checked_add(src.len()).is_none_or(|end| end > len) {
            return false;
        }
        // SAFETY: the destination range lies inside the folio, inside the mapping (checked
        // above). The caller owns these bytes by protocol (a thread slot's staging folio,
        // written only by its client before a request and by the owner while running it).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), start.as_ptr().add(offset), src.len());
        }
        true
    }

    /// Runs `f` on the first `len` bytes of folio `pfn` (of `order`) as a buffer: the owner
    /// running a request reads a write's bytes from, or reads a file's bytes into, the slot's
    /// staging folio this way, with no copy in between. `None` if the range is not inside the
    /// arena.
    pub(crate) fn with_folio_bytes<R>(
        &self,
        pfn: u32,
        order: u32,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let (start, folio_len) = self.folio_range(pfn, order)?;
        if len > folio_len {
            return None;
        }
        // SAFETY: the range lies inside the mapping (checked above), which lives as long as
        // `self`. By the mailbox protocol the staging folio is this thread's while it runs the
        // slot's request: the client writes it only before submitting and reads it only after
        // the answer, and no other owner thread serves the slot. A client that breaks the
        // protocol (writing while the owner runs its request) changes only the bytes of its
        // own request, as a process writing a file it is also writing with `write(2)` can;
        // nothing here is read back and trusted as a size, offset or pointer.
        let bytes = unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), len) };
        Some(f(bytes))
    }
}

impl SharedMap {
    /// The optimistic view of this mapping's folios (a client's hits).
    pub(crate) fn folio_view(
        &self,
        policy: super::refcount::RefcountPolicy,
    ) -> super::optimistic::FolioView<'_> {
        let (base, pages) = self.arena();
        // SAFETY: the arena and the table lie in the mapping, which lives as long as `self`,
        // and `check` made them the same number of pages.
        unsafe { super::optimistic::FolioView::new(self.table(), base, pages, policy) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; every view into it borrows `self` or
        // holds an `Arc` of it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// A raw descriptor number for `mmap` (rustix's `as_raw_fd` under another name, for one call).
trait RawFdI32 {
    fn as_raw_fd_i32(&self) -> i32;
}

impl RawFdI32 for std::os::fd::BorrowedFd<'_> {
    fn as_raw_fd_i32(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.as_raw_fd()
    }
}

impl FileRecord {
    /// The record's path, if it keeps one (bytes copied out; the caller checks what it opens).
    pub(crate) fn path(&self) -> Option<std::path::PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        let len = self.path_len.load(Ordering::Acquire) as usize;
        if len == 0 || len > PATH_ROOM {
            return None;
        }
        let bytes: Vec<u8> = self.path[..len]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        Some(std::ffi::OsString::from_vec(bytes).into())
    }

    /// Keeps `path` in the record (or none, if it is too long).
    pub(crate) fn set_path(&self, path: &std::path::Path) {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() > PATH_ROOM {
            self.path_len.store(0, Ordering::Release);
            return;
        }
        for (slot, &b) in self.path.iter().zip(bytes) {
            slot.store(b, Ordering::Relaxed);
        }
        self.path_len.store(bytes.len() as u32, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::refcount::RefcountPolicy;
    use std::os::unix::fs::FileExt;

    fn small() -> SharedMap {
        let shape = Shape {
            pages: 64,
            processes: 4,
            threads: 8,
            files: 4,
        };
        SharedMap::create(
            "t",
            shape,
            [0; SETTINGS_WORDS],
            [7; 16],
            RefcountPolicy::FrozenBit,
            false,
        )
        .expect("create")
    }

    /// A new memfd of `size` bytes holding `bytes` at its start, sealed or not.
    fn memfd(bytes: &[u8], size: u64, seal: bool) -> OwnedFd {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, size).unwrap();
        let file = std::fs::File::from(fd);
        file.write_all_at(&bytes[..bytes.len().min(size as usize)], 0)
            .unwrap();
        let fd = OwnedFd::from(file);
        if seal {
            rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        }
        fd
    }

    fn header_bytes(map: &SharedMap) -> Vec<u8> {
        let mut bytes = vec![0u8; std::mem::size_of::<Header>()];
        let file = std::fs::File::from(map.fd().try_clone().unwrap());
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    fn refused(fd: OwnedFd) -> String {
        match SharedMap::attach(fd) {
            Ok(_) => panic!("a bad mapping was attached"),
            Err(e) => e.to_string(),
        }
    }

    /// `(bytes in PMD-mapped shared memory, bytes resident)` of this process's mapping that
    /// starts at `base` (`/proc/self/smaps`).
    fn pmd_mapped(base: usize) -> (u64, u64) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let (mut pmd, mut rss) = (0, 0);
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((start, _)) = range.split_once('-')
                && let Ok(start) = usize::from_str_radix(start, 16)
            {
                inside = start == base;
                continue;
            }
            let kb = |field: &str| -> Option<u64> {
                line.strip_prefix(field)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            };
            if inside {
                pmd += kb("ShmemPmdMapped:").unwrap_or(0) << 10;
                rss += kb("Rss:").unwrap_or(0) << 10;
            }
        }
        (pmd, rss)
    }

    #[test]
    fn a_mapping_is_aligned_and_backed_by_huge_pages_where_the_kernel_can() {
        let shape = Shape {
            pages: 4096,
            processes: 4,
            threads: 8,
            files: 4,
        };
        let make = |huge| {
            let settings = [0; SETTINGS_WORDS];
            SharedMap::create(
                "t",
                shape,
                settings,
                [7; 16],
                RefcountPolicy::FrozenBit,
                huge,
            )
            .unwrap()
        };
        let map = make(true);
        // What the creator had no time for (a slow machine), the owner's thread does.
        map.collapse_rest();
        assert_eq!(
            map.base.as_ptr() as usize % HUGE,
            0,
            "the mapping is not aligned"
        );
        let ranges = map.live().huge_ranges.load(Ordering::Relaxed);
        let whole = (map.len / HUGE) as u64;
        if map.collapses().refused.load(Ordering::Relaxed) {
            eprintln!("this kernel gives shared memory no huge pages: only the alignment checked");
            return;
        }
        // Every range collapsed, but on a machine short of free huge pages (then the test
        // checks what it can and says so).
        let short = map.collapses().short_of_memory.load(Ordering::Relaxed) as u64;
        assert_eq!(
            ranges + short,
            whole,
            "huge ranges of {} MiB ({short} short of memory)",
            map.len >> 20
        );
        assert!(ranges > 0, "no range collapsed");
        if short > 0 {
            eprintln!(
                "{short} of {whole} ranges left in small pages: this machine is short of huge pages"
            );
            return;
        }
        // A second process's mapping (here a second map in this one) gets them as huge
        // page-table entries when it touches them.
        let other = SharedMap::attach(map.fd().try_clone().unwrap()).unwrap();
        assert_eq!(other.base.as_ptr() as usize % HUGE, 0);
        let (arena, pages) = other.arena();
        let touch = |p: usize| {
            // SAFETY: page `p < pages` of the arena, which `other` keeps mapped.
            let byte = unsafe { arena.as_ptr().add(p * PAGE_SIZE).read_volatile() };
            u64::from(byte)
        };
        let sum: u64 = (0..pages).map(touch).sum();
        assert_eq!(sum, 0, "a new arena reads as zeros");
        let (pmd, rss) = pmd_mapped(other.base.as_ptr() as usize);
        assert!(
            pmd >= (pages * PAGE_SIZE) as u64,
            "{pmd} bytes PMD-mapped of {rss} resident"
        );
        // Not asked for: small pages.
        let map = make(false);
        assert_eq!(map.live().huge_ranges.load(Ordering::Relaxed), 0);
        // What the owner's thread does with ranges the creator had no time for: their pages
        // are all there (reserved in small pages), and hold data the collapse must keep.
        let (arena, pages) = map.arena();
        let at = |p: usize| {
            // SAFETY: page `p < pages` of the arena, which `map` keeps mapped; nothing else
            // uses this mapping.
            unsafe { arena.as_ptr().add(p * PAGE_SIZE + 7) }
        };
        for p in 0..pages {
            // SAFETY: as above.
            unsafe { at(p).write_volatile(p as u8 ^ 0x5a) };
        }
        // Meanwhile another process (a second mapping here) writes into every page: the
        // collapse must lose none of its writes either.
        let writer = SharedMap::attach(map.fd().try_clone().unwrap()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        map.huge_next.store(0, Ordering::Relaxed);
        assert!(map.huge_pending());
        let last = std::thread::scope(|s| {
            let written = s.spawn(|| {
                let (arena, pages) = writer.arena();
                let mut last = vec![0u64; pages];
                let mut stamp = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for (p, slot) in last.iter_mut().enumerate() {
                        stamp += 1;
                        // SAFETY: page `p < pages` of the arena, which `writer` keeps mapped;
                        // offset 64 is aligned for a u64 and apart from the byte at 7.
                        unsafe {
                            arena
                                .as_ptr()
                                .add(p * PAGE_SIZE + 64)
                                .cast::<u64>()
                                .write_volatile(stamp);
                        }
                        *slot = stamp;
                    }
                }
                last
            });
            map.collapse_rest();
            stop.store(true, Ordering::Relaxed);
            written.join().unwrap()
        });
        assert!(!map.huge_pending());
        let short = map.collapses().short_of_memory.load(Ordering::Relaxed) as u64;
        assert_eq!(
            map.live().huge_ranges.load(Ordering::Relaxed) + short,
            whole
        );
        for (p, &last) in last.iter().enumerate() {
            // SAFETY: as above.
            let byte = unsafe { at(p).read_volatile() };
            assert_eq!(byte, p as u8 ^ 0x5a, "page {p} changed by the collapse");
            // SAFETY: as above, the word the writer stamped.
            let stamp = unsafe {
                arena
                    .as_ptr()
                    .add(p * PAGE_SIZE + 64)
                    .cast::<u64>()
                    .read_volatile()
            };
            assert_eq!(
                stamp, last,
                "page {p} lost a write made during the collapse"
            );
        }
        if short > 0 {
            eprintln!("{short} ranges short of memory in the late collapse");
            return;
        }
        // An owner that takes over collapses every range again: those already huge stay so,
        // and the count is what it found, not what it was plus that.
        map.collapse_after_takeover();
        assert_eq!(map.live().huge_ranges.load(Ordering::Relaxed), whole);
        let (pmd, rss) = pmd_mapped(map.base.as_ptr() as usize);
        assert!(
            pmd >= (pages * PAGE_SIZE) as u64,
            "after the late collapse: {pmd} bytes PMD-mapped of {rss} resident"
        );
        // A creator that died before collapsing anything: the new owner does it all.
        let map = make(false);
        map.collapse_after_takeover();
        let short = map.collapses().short_of_memory.load(Ordering::Relaxed) as u64;
        assert_eq!(
            map.live().huge_ranges.load(Ordering::Relaxed) + short,
            whole
        );
    }

    #[test]
    fn a_good_mapping_attaches() {
        let map = small();
        let fd = map.fd().try_clone().unwrap();
        let other = SharedMap::attach(fd).expect("attach");
        assert_eq!(other.fixed(), map.fixed());
        assert_eq!(other.threads().len(), 8);
        assert_eq!(other.arena().1, 64);
    }

    #[test]
    fn bad_headers_and_sizes_are_refused_with_a_reason() {
        let map = small();
        let total = map.fixed().total;
        let good = header_bytes(&map);
        let offset_of =
            |field: *const u8| field as usize - std::ptr::from_ref(map.fixed()) as usize;
        let fixed = map.fixed();

        let mut bad = good.clone();
        bad[0] ^= 0xff;
        assert!(refused(memfd(&bad, total, true)).contains("bad magic"));

        let mut bad = good.clone();
        let at = offset_of(std::ptr::from_ref(&fixed.version).cast());
        bad[at] = bad[at].wrapping_add(1);
        assert!(refused(memfd(&bad, total, true)).contains("layout version"));

        let mut bad = good.clone();
        let at = offset_of(std::ptr::from_ref(&fixed.settings).cast());
        bad[at] ^= 1;
        assert!(refused(memfd(&bad, total, true)).contains("checksum"));

        assert!(refused(memfd(&good, total - 4096, true)).contains("truncated"));
        assert!(refused(memfd(&good, 16, true)).contains("truncated"));
        assert!(refused(memfd(&good, total, false)).contains("not sealed"));

        // A header whose sections point past the end (checksum made to match).
        let mut fixed = *map.fixed();
        fixed.sections.arena.count += 1;
        fixed.sections.table.count += 1;
        let fixed = fixed.with_checksum();
        let mut bad = good.clone();
        // SAFETY: `Fixed` is plain `repr(C)` data; its bytes are copied into a buffer of at
        // least its size.
        let raw = unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(&fixed).cast::<u8>(),
                std::mem::size_of::<Fixed>(),
            )
        };
        bad[..raw.len()].copy_from_slice(raw);
        assert!(refused(memfd(&bad, total, true)).contains("outside the mapping"));

        // Not a memfd at all.
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(refused(OwnedFd::from(file)).contains("sealed"));
    }
}
