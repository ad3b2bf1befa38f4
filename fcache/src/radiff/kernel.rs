//! The kernel's side of `ra-diff`: a trace replayed with buffered `pread`s on a fresh file
//! descriptor, and after each operation the pages the kernel's page cache holds, read with
//! `mincore(2)` on a mapping of the file that is never touched.
//!
//! `mincore` reports a page only once it is uptodate; a readahead the read started may still be
//! in flight when `pread` returns. `cachestat(2)` (Linux 6.5) counts the pages in the cache
//! whatever their state, so a step has settled when the two agree: every page readahead
//! inserted has arrived. Without `cachestat` a step settles when `mincore` stops changing.
//!
//! Errors that mean "this cannot be compared here" (no block device under the file, tmpfs,
//! mincore not allowed) start with `unavailable: `, so a test can tell them from failures.
//!
//! The only `unsafe` here is the raw system calls with no safe wrapper in our dependencies:
//! `mmap`/`munmap`, `mincore` and `cachestat`.

use super::pages::PageSet;
use crate::trace::Op;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// `cachestat(2)`'s number: the same on every architecture (the unified syscall table).
const SYS_CACHESTAT: libc::c_long = 451;
/// How long a step may take to settle before its result is taken as it is.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// The block device a file lives on, and its readahead settings (the kernel's `bdi`).
#[derive(Debug, Clone)]
pub(crate) struct Device {
    /// The disk's name (`vda`, `loop0`).
    pub(crate) name: String,
    /// `queue/read_ahead_kb`: the maximum window (`bdi->ra_pages`).
    pub(crate) read_ahead_kb: u64,
    /// `queue/max_sectors_kb`: the largest request (`bdi->io_pages`).
    pub(crate) max_sectors_kb: u64,
}

/// What the kernel side compares under: the device, the file system and the kernel.
#[derive(Debug, Clone)]
pub(crate) struct Setting {
    pub(crate) kernel: String,
    pub(crate) fs: String,
    pub(crate) device: Device,
}

fn read_number(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: {:?} is not a number", path.display(), text.trim()))
}

/// The file system's name from its `statfs` magic number.
fn fs_name(magic: u64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0xF2F5_2010 => "f2fs",
        _ => "other",
    }
}

impl Setting {
    /// Finds the device under `path` and its readahead settings in sysfs. Fails clearly for a
    /// file with no block device under it (tmpfs, overlay, network file systems): there the
    /// page cache is not a cache of a disk, or its window is not the device's.
    pub(crate) fn of(path: &Path) -> Result<Self, String> {
        let meta =
            std::fs::metadata(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let fs = rustix::fs::fstatfs(&file)
            .map_err(|e| format!("cannot statfs {}: {e}", path.display()))?;
        #[allow(clippy::useless_conversion)] // f_type's type differs between libcs
        let fs = fs_name(u64::try_from(fs.f_type).unwrap_or(0)).to_string();
        if fs == "tmpfs" {
            return Err(format!(
                "unavailable: {} is on tmpfs: its pages are its data, not a cache of a disk (put it on a disk \
                 file system)",
                path.display()
            ));
        }
        let dev = meta.dev();
        let (major, minor) = (
            ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            (dev & 0xff) | ((dev >> 12) & !0xff),
        );
        let link = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let dir = std::fs::canonicalize(&link).map_err(|_| {
            format!(
                "unavailable: {} is on device {major}:{minor} ({fs}), which is not a block device: the kernel's \
                 readahead window cannot be found (a file on a disk file system is needed)",
                path.display()
            )
        })?;
        // A partition has no queue of its own: its disk's is one level up.
        let disk = if dir.join("queue").is_dir() {
            dir
        } else {
            dir.parent().map(Path::to_path_buf).unwrap_or(dir)
        };
        let queue = disk.join("queue");
        let device = Device {
            name: disk
                .file_name()
                .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned()),
            read_ahead_kb: read_number(&queue.join("read_ahead_kb"))?,
            max_sectors_kb: read_number(&queue.join("max_sectors_kb"))?,
        };
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Ok(Self { kernel, fs, device })
    }
}

/// The pages of `path` in the kernel's page cache: those `mincore` shows uptodate, and all of
/// them whatever their state (`cachestat`, `None` where the kernel has none). For callers that
/// must know a file is cold (the readseq benchmark).
pub(crate) fn cached_pages(path: &Path) -> Result<(u64, Option<u64>), String> {
    let residency = Residency::new(path)?;
    Ok((residency.resident()?.len(), residency.cached()))
}

/// A read-only mapping of a file, never touched, for `mincore`.
struct Residency {
    file: File,
    map: *mut libc::c_void,
    len: usize,
    pages: u64,
}

impl Residency {
    fn new(path: &Path) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
        // mincore reports the page cache of a file only to its owner or a writer (or root);
        // to anyone else only pages mapped in their own page tables: always none here.
        let euid = rustix::process::geteuid().as_raw();
        let writable = rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok();
        if euid != 0 && meta.uid() != euid && !writable {
            return Err(format!(
                "unavailable: mincore shows the page cache of {} only to its owner, a writer or \
                 root",
                path.display()
            ));
        }
        let size = meta.len();
        let len = usize::try_from(size.div_ceil(PAGE) * PAGE)
            .map_err(|_| format!("{} is too large to map", path.display()))?;
        let map = if len == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: a new shared read-only mapping of a file we opened for reading, at an
            // address the kernel chooses; it aliases nothing of ours. Nothing ever reads
            // through it (it exists for mincore only), and it is unmapped once, in Drop.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if map == libc::MAP_FAILED {
                return Err(format!(
                    "cannot map {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
            map
        };
        Ok(Self {
            file,
            map,
            len,
            pages: size.div_ceil(PAGE),
        })
    }

    /// The pages the page cache holds uptodate.
    fn resident(&self) -> Result<PageSet, String> {
        if self.len == 0 {
            return Ok(PageSet::new());
        }
        let mut vec = vec![0u8; self.pages as usize];
        // SAFETY: `map` is our live mapping of `len` bytes (page aligned, from mmap), and
        // `vec` has one byte per page of it, as mincore writes.
        let rc = unsafe { libc::mincore(self.map, self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(format!("mincore: {}", std::io::Error::last_os_error()));
        }
        Ok(PageSet::from_fn(self.pages, |k| vec[k as usize] & 1 != 0))
    }

    /// Pages in the page cache whatever their state (`cachestat`), or `None` where the kernel
    /// has no `cachestat`.
    fn cached(&self) -> Option<u64> {
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let range = Range { off: 0, len: 0 };
        let mut stat = Stat::default();
        // SAFETY: cachestat reads one `struct cachestat_range` and writes one `struct
        // cachestat`, both laid out as the kernel's UAPI (#[repr(C)], u64 fields), which live
        // on our stack for the call; the descriptor is ours and open.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                self.file.as_raw_fd(),
                &raw const range,
                &raw mut stat,
                0,
            )
        };
        (rc == 0).then_some(stat.nr_cache)
    }

    /// Waits until what the last operation started has arrived, and returns the pages.
    /// `settled` is false if that took longer than [`SETTLE_LIMIT`].
    fn settle(&self) -> Result<(PageSet, bool), String> {
        let start = Instant::now();
        let mut last = self.resident()?;
        let mut stable = 0;
        loop {
            if let Some(cached) = self.cached()
                && cached == last.len()
            {
                return Ok((last, true));
            }
            if start.elapsed() > SETTLE_LIMIT {
                return Ok((last, false));
            }
            std::thread::sleep(Duration::from_millis(1));
            let now = self.resident()?;
            if now == last {
                stable += 1;
                // Without cachestat: unchanged for 10 ms.
                if self.cached().is_none() && stable >= 10 {
                    return Ok((now, true));
                }
            } else {
                stable = 0;
            }
            last = now;
        }
    }

    /// Drops every page of the file from the page cache and checks none is left.
    fn drop_all(&self) -> Result<(), String> {
        let _ = self.file.sync_data();
        for attempt in 0..20 {
            rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)
                .map_err(|e| format!("posix_fadvise(DONTNEED): {e}"))?;
            let left = self.resident()?.len();
            let cached = self.cached().unwrap_or(0);
            if left == 0 && cached == 0 {
                return Ok(());
            }
            if attempt == 19 {
                return Err(format!(
                    "{left} pages ({cached} cached) of the data file stay in the page cache after \
                     POSIX_FADV_DONTNEED (mapped or locked by another process?)"
                ));
            }
            std::thread::sleep(Duration::from_millis(5 * (attempt + 1)));
        }
        Ok(())
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        if !self.map.is_null() {
            // SAFETY: `map`/`len` are the mapping made in `new`, unmapped only here; nothing
            // refers into it.
            unsafe {
                libc::munmap(self.map, self.len);
            }
        }
    }
}

/// One kernel run of a trace: the pages after each operation, and whether every step settled.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) steps: Vec<PageSet>,
    pub(crate) unsettled: usize,
}

/// Replays `ops` through the kernel's page cache on `path`: its pages dropped first, then a
/// fresh descriptor (its own readahead state, the device's window), one `pread` per read and
/// `posix_fadvise` per advice, the pages taken after each.
pub(crate) fn run(path: &Path, ops: &[Op]) -> Result<Run, String> {
    let residency = Residency::new(path)?;
    residency.drop_all()?;
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    let mut run = Run {
        steps: Vec::with_capacity(ops.len()),
        unsettled: 0,
    };
    for op in ops {
        match *op {
            Op::Read { offset, len } => {
                buf.resize(len as usize, 0);
                // A short read or an error is the kernel's answer; the page set is what counts.
                let _ = file.read_at(&mut buf, offset);
            }
            Op::WillNeed { offset, len } => {
                let _ = rustix::fs::fadvise(
                    &file,
                    offset,
                    std::num::NonZeroU64::new(len),
                    rustix::fs::Advice::WillNeed,
                );
            }
            Op::DontNeed { offset, len } => {
                let _ = rustix::fs::fadvise(
                    &file,
                    offset,
                    std::num::NonZeroU64::new(len),
                    rustix::fs::Advice::DontNeed,
                );
            }
        }
        let (pages, settled) = residency.settle()?;
        if !settled {
            run.unsettled += 1;
        }
        run.steps.push(pages);
    }
    // Leave nothing behind for the next run (or the machine).
    drop(file);
    residency.drop_all()?;
    Ok(run)
}
