//! What the device can do: sequential O_DIRECT reads at a chosen request size and queue depth
//! through io_uring, with no cache at all (the ceiling the readahead benchmark compares with).
//!
//! Where the bytes land matters as much as the request shape ([`Buffers`]). On this machine's
//! virtual disk, 128 KiB requests at depth 32 (two files at once) got about 1.3 GiB/s into
//! reused buffers of 4 KiB pages (each page a segment), 3.2 GiB/s into reused huge-page
//! buffers (one segment each, and so few bytes that they stay in the CPU caches) and 2.4-2.8 GiB/s
//! into huge-page memory that keeps every byte, which is what a cache must do.

use crate::error::Error;
use crate::mem::arena::Arena;
use crate::mem::{MAX_ORDER, PAGE_SIZE};
use io_uring::{IoUring, opcode, types};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The largest block a probe reads or writes in one request: an io_uring entry carries a
/// 32-bit length, and Linux moves at most 2 GiB less a page in one read or write.
pub const MAX_BLOCK: usize = 1 << 30;

/// Refuses a request shape the probes cannot use: a `block` that is not a positive multiple of
/// 4096 up to [`MAX_BLOCK`], a `depth` outside 1..=4096.
fn check_shape(block: usize, depth: usize) -> Result<(), Error> {
    if block == 0 || !block.is_multiple_of(4096) || block > MAX_BLOCK || depth == 0 || depth > 4096
    {
        return Err(Error::Engine(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "block must be a positive multiple of 4096 up to 1 GiB, and depth 1..=4096",
        )));
    }
    Ok(())
}

/// Opens `path` for reading with O_DIRECT: the file and its size.
fn open_direct(path: &Path) -> Result<(std::fs::File, u64), Error> {
    let open_error = |source| Error::Open {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(open_error)?;
    let size = file.metadata().map_err(open_error)?.len();
    Ok((file, size))
}

/// The result of [`sequential_read`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceRead {
    /// Bytes read.
    pub bytes: u64,
    /// Wall time from the first submission to the last completion.
    pub elapsed: Duration,
}

/// Where [`sequential_read`] puts what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Buffers {
    /// Every byte in its own place: one buffer as large as the files, in huge pages, filled
    /// front to back, as a cache fills the memory that keeps the data. The ceiling for a cache
    /// (the default).
    #[default]
    Keep,
    /// `depth` buffers of `block` bytes in huge pages, each reused as soon as its read
    /// completes: so few bytes that they stay in the CPU caches, which flatters a disk whose
    /// "DMA" is the host copying into guest memory (this VM's). No cache can read that way.
    Reused,
    /// As `Reused`, in plain 4 KiB pages (what fio's `malloc`ed buffers get): a request reaches
    /// the device as one segment per page.
    ReusedSmallPages,
}

/// Reads every file of `paths` once, front to back, with O_DIRECT requests of `block` bytes
/// (a multiple of 4096), keeping `depth` of them in flight through one io_uring; the files are
/// read one after the other into `buffers`. Nothing is cached and nothing is copied. The
/// buffers are faulted in before the clock starts ([`Probe::prepare`] then [`Probe::run`]).
pub fn sequential_read(
    paths: &[&Path],
    block: usize,
    depth: usize,
    buffers: Buffers,
) -> Result<DeviceRead, Error> {
    Probe::prepare(paths, block, depth, buffers)?.run()
}

/// Reads each group of files at once, one thread and ring per group (each as
/// [`sequential_read`] does), every thread's buffers faulted in before they all start. The
/// time is the wall time from the common start to the last thread's end; the bytes are the
/// sum.
pub fn concurrent_read(
    groups: &[Vec<&Path>],
    block: usize,
    depth: usize,
    buffers: Buffers,
) -> Result<DeviceRead, Error> {
    let start_line = std::sync::Barrier::new(groups.len() + 1);
    let (bytes, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = groups
            .iter()
            .map(|paths| {
                let start_line = &start_line;
                s.spawn(move || {
                    let probe = Probe::prepare(paths, block, depth, buffers);
                    // Wait even on failure, so the others are not left at the line.
                    start_line.wait();
                    probe.and_then(Probe::run).map(|read| read.bytes)
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        let bytes = workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(Error::Engine(std::io::Error::other(
                        "a device reader panicked",
                    )))
                })
            })
            .sum::<Result<u64, Error>>();
        (bytes, start.elapsed())
    });
    Ok(DeviceRead {
        bytes: bytes?,
        elapsed,
    })
}

/// A device read made ready (files open, buffers faulted in), so that several threads can
/// prepare theirs and then start together ([`concurrent_read`]).
#[derive(Debug)]
pub struct Probe {
    files: Vec<(std::fs::File, u64)>,
    block: usize,
    depth: usize,
    keep: bool,
    /// The buffers: `chunks` of `block` bytes.
    backing: Arena,
    chunks: usize,
}

impl Probe {
    /// Opens the files with O_DIRECT and maps and faults in the buffers. Errors: a `block`
    /// that is not a positive multiple of 4096 up to [`MAX_BLOCK`], a `depth` outside 1..=4096,
    /// a file that cannot
    /// be opened with O_DIRECT, buffers that cannot be mapped.
    pub fn prepare(
        paths: &[&Path],
        block: usize,
        depth: usize,
        buffers: Buffers,
    ) -> Result<Self, Error> {
        check_shape(block, depth)?;
        let files = paths
            .iter()
            .map(|path| open_direct(path))
            .collect::<Result<Vec<_>, _>>()?;
        // Buffers: page aligned for O_DIRECT, huge-page aligned too. `Keep` gives each
        // request its own `block` bytes (in file order); the others give each slot its own.
        let keep = buffers == Buffers::Keep;
        let chunks = if keep {
            files
                .iter()
                .map(|&(_, size)| size.div_ceil(block as u64) as usize)
                .sum::<usize>()
                .max(1)
        } else {
            depth
        };
        let backing = chunks
            .checked_mul(block)
            .map(|bytes| bytes.div_ceil(PAGE_SIZE))
            .ok_or(Error::InvalidCapacity(u64::MAX))
            .and_then(|pages| {
                Arena::new(
                    pages,
                    PAGE_SIZE << MAX_ORDER,
                    buffers != Buffers::ReusedSmallPages,
                )
            })?;
        backing.prefault().map_err(Error::Prefault)?;
        Ok(Self {
            files,
            block,
            depth,
            keep,
            backing,
            chunks,
        })
    }

    /// Reads the files (timed from the first submission to the last completion). Consumes
    /// the probe: `Keep` buffers hold one pass.
    pub fn run(self) -> Result<DeviceRead, Error> {
        let Self {
            files,
            block,
            depth,
            keep,
            backing,
            chunks,
        } = self;
        let base = backing.page_ptr(0);
        // Made after the buffers, so dropped before them (on an early return with reads in
        // flight).
        let mut ring = IoUring::new((depth as u32).next_power_of_two()).map_err(Error::Engine)?;
        // (file, offset) of the next read to issue.
        let mut next = (0usize, 0u64);
        let take = |next: &mut (usize, u64)| -> Option<(usize, u64)> {
            while next.0 < files.len() {
                let (file, off) = *next;
                if off < files[file].1 {
                    next.1 += block as u64;
                    return Some((file, off));
                }
                *next = (file + 1, 0);
            }
            None
        };
        let mut issued = 0usize;
        let mut bytes = 0u64;
        let mut in_flight = 0usize;
        let start = Instant::now();
        let mut submit_slot = |ring: &mut IoUring, slot: usize, file: usize, offset: u64| {
            let chunk = if keep { issued } else { slot };
            issued += 1;
            debug_assert!(chunk < chunks);
            let entry = opcode::Read::new(
                types::Fd(files[file].0.as_raw_fd()),
                base.wrapping_add(chunk * block),
                block as u32,
            )
            .offset(offset)
            .build()
            .user_data(slot as u64);
            // SAFETY: `chunk < chunks` (with `Keep`, each request has its own chunk: there are
            // as many as the files have blocks, and `take` hands out each block once; otherwise
            // the chunk is the slot's, and `slot < depth = chunks`), so the buffer lies inside
            // `backing`, which outlives the ring. A chunk is used by at most one read at a
            // time: a slot is reissued only after its completion was reaped. The files stay
            // open for the whole function.
            unsafe { ring.submission().push(&entry).is_ok() }
        };
        for slot in 0..depth {
            let Some((file, offset)) = take(&mut next) else {
                break;
            };
            if submit_slot(&mut ring, slot, file, offset) {
                in_flight += 1;
            }
        }
        while in_flight > 0 {
            ring.submit_and_wait(1).map_err(Error::Engine)?;
            let done: Vec<(usize, i32)> = ring
                .completion()
                .map(|cqe| (cqe.user_data() as usize, cqe.result()))
                .collect();
            for (slot, result) in done {
                in_flight -= 1;
                if result < 0 {
                    return Err(Error::Io {
                        offset: 0,
                        len: block as u64,
                        source: std::io::Error::from_raw_os_error(-result),
                    });
                }
                bytes += result as u64;
                if let Some((file, offset)) = take(&mut next)
                    && submit_slot(&mut ring, slot, file, offset)
                {
                    in_flight += 1;
                }
            }
        }
        Ok(DeviceRead {
            bytes,
            elapsed: start.elapsed(),
        })
    }
}

/// One file read front to back by O_DIRECT requests that its reader submits and reaps itself,
/// served out of memory that keeps every byte: a cache with no lookup, no lock and no thread
/// of its own, the least work a cache that copies into the reader's buffer can do. What it
/// adds to [`sequential_read`] is the copy and the reader's waits; readseq compares a cache
/// with it to tell what the device allows a reader from what the cache costs.
///
/// [`read_at`](Self::read_at) waits until every request up to the end of the asked range has
/// completed (reaping completions and issuing the next requests on its own thread), then
/// copies. Each read first reaps whatever has completed, so the queue stays `depth` deep while
/// the reader copies.
///
/// [`prepare_windowed`](Self::prepare_windowed) makes a stream that reads ahead as the kernel's
/// readahead does on a sequential stream instead: in windows, the next one issued when the
/// reader reaches the start of the one before it (the mark at the start of each window, with
/// the whole window asynchronous), so two windows at most are in flight, and none is issued
/// while the reader is still copying out of the one behind them. What the device allows a
/// cache that reads ahead like the kernel, with no cost of its own.
pub struct DirectStream {
    // Dropped first: the ring goes before the memory its reads land in.
    ring: IoUring,
    file: std::fs::File,
    size: u64,
    block: usize,
    depth: usize,
    /// Where block `k` of the file lands: `k * block` bytes in.
    backing: Arena,
    /// The next block to request.
    next: u64,
    /// Which blocks have completed (those at or past `frontier`'s block matter).
    done: Vec<bool>,
    /// Every byte below this has been read.
    frontier: u64,
    in_flight: usize,
    /// The readahead window in bytes (0: none, keep `depth` in flight).
    window: u64,
    /// No request starts at or past this byte yet (the end of the window after the reader's).
    reach: u64,
}

impl std::fmt::Debug for DirectStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectStream")
            .field("size", &self.size)
            .field("block", &self.block)
            .field("depth", &self.depth)
            .field("frontier", &self.frontier)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl DirectStream {
    /// Opens `path` with O_DIRECT and maps and faults in memory for all of it. Errors as
    /// [`Probe::prepare`]'s.
    pub fn prepare(path: &Path, block: usize, depth: usize) -> Result<Self, Error> {
        Self::open(path, block, depth, 0)
    }

    /// Opens `path` as [`prepare`](Self::prepare) does, for reads ahead in windows of `window`
    /// bytes (a positive multiple of `block`) issued as the kernel's readahead issues them: the
    /// window holding the reader's offset and the one after it, never more. Errors as
    /// [`prepare`](Self::prepare)'s, and a window that is not a multiple of the block (or
    /// needs more than 2048 requests).
    pub fn prepare_windowed(path: &Path, block: usize, window: usize) -> Result<Self, Error> {
        let per_window = match (block, window) {
            (0, _) | (_, 0) => 0,
            _ if !window.is_multiple_of(block) => 0,
            _ => window / block,
        };
        if per_window == 0 || per_window > 2048 {
            return Err(Error::Engine(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the window must be a positive multiple of the block, of 2048 blocks at most",
            )));
        }
        Self::open(path, block, 2 * per_window, window as u64)
    }

    fn open(path: &Path, block: usize, depth: usize, window: u64) -> Result<Self, Error> {
        check_shape(block, depth)?;
        let (file, size) = open_direct(path)?;
        let blocks = usize::try_from(size.div_ceil(block as u64))
            .map_err(|_| Error::InvalidCapacity(size))?;
        let backing = blocks
            .max(1)
            .checked_mul(block)
            .map(|bytes| bytes.div_ceil(PAGE_SIZE))
            .ok_or(Error::InvalidCapacity(size))
            .and_then(|pages| Arena::new(pages, PAGE_SIZE << MAX_ORDER, true))?;
        backing.prefault().map_err(Error::Prefault)?;
        let ring = IoUring::new((depth as u32).next_power_of_two()).map_err(Error::Engine)?;
        Ok(Self {
            ring,
            file,
            size,
            block,
            depth,
            backing,
            next: 0,
            done: vec![false; blocks],
            frontier: 0,
            in_flight: 0,
            window,
            reach: u64::MAX,
        })
    }

    /// The file's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How far into the file reads have been issued so far, in bytes.
    pub fn requested(&self) -> u64 {
        self.next.saturating_mul(self.block as u64).min(self.size)
    }

    /// Copies the file's bytes at `offset` into `buf` (fewer at the end of the file, none past
    /// it), once the device has delivered them. Errors: a failed or short device read.
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        if offset >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let end = self.size.min(offset.saturating_add(buf.len() as u64));
        if let Some(reader_window) = offset.checked_div(self.window) {
            // The reader is in window `offset / window`: that one and the next may be in
            // flight (and whatever the read itself needs, should it span more).
            let window_end = reader_window.saturating_add(2).saturating_mul(self.window);
            self.reach = window_end.max(end);
        }
        self.reap(false)?;
        while self.frontier < end {
            self.reap(true)?;
        }
        let len = (end - offset) as usize;
        // SAFETY: `offset + len <= size <= blocks * block`, all inside `backing` (mapped for
        // `blocks * block` bytes and alive while `self` is). Every byte below `frontier` was
        // read by a request whose completion this thread reaped, so no read into them is in
        // flight, and no block is requested twice: nothing writes these bytes any more.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.backing.page_ptr(0).add(offset as usize), len)
        };
        buf[..len].copy_from_slice(bytes);
        Ok(len)
    }

    /// Issues requests up to `depth` in flight, reaps what has completed (waiting for one
    /// completion if `wait`) and moves the frontier over the completed blocks.
    fn reap(&mut self, wait: bool) -> Result<(), Error> {
        let blocks = self.done.len() as u64;
        let mut pushed = false;
        while self.in_flight < self.depth
            && self.next < blocks
            && self.next.saturating_mul(self.block as u64) < self.reach
        {
            let k = self.next;
            let entry = opcode::Read::new(
                types::Fd(self.file.as_raw_fd()),
                self.backing
                    .page_ptr(0)
                    .wrapping_add(k as usize * self.block),
                self.block as u32,
            )
            .offset(k * self.block as u64)
            .build()
            .user_data(k);
            // SAFETY: block `k < blocks` lands in `backing` at `k * block`, inside its
            // `blocks * block` bytes; `backing` outlives the ring (the ring is dropped first),
            // each block is requested once (`next` only grows), and the file stays open.
            if unsafe { self.ring.submission().push(&entry).is_err() } {
                break;
            }
            self.next += 1;
            self.in_flight += 1;
            pushed = true;
        }
        if wait && self.in_flight > 0 {
            self.ring.submit_and_wait(1).map_err(Error::Engine)?;
        } else if pushed {
            self.ring.submit().map_err(Error::Engine)?;
        } else if self.ring.completion().is_empty() {
            return Ok(());
        }
        let completed: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (k, result) in completed {
            self.in_flight -= 1;
            let start = k.saturating_mul(self.block as u64);
            let want = (self.size.saturating_sub(start)).min(self.block as u64);
            let Some(slot) = usize::try_from(k).ok().and_then(|k| self.done.get_mut(k)) else {
                continue;
            };
            if result < 0 || result as u64 != want {
                let errno = if result < 0 { -result } else { libc::EIO };
                return Err(Error::Io {
                    offset: start,
                    len: want,
                    source: std::io::Error::from_raw_os_error(errno),
                });
            }
            *slot = true;
        }
        while self.frontier < self.size
            && self
                .done
                .get((self.frontier / self.block as u64) as usize)
                .copied()
                .unwrap_or(false)
        {
            self.frontier = (self.frontier + self.block as u64).min(self.size);
        }
        if wait && self.in_flight == 0 && self.frontier < self.size && self.next >= blocks {
            // Every block was requested and none is in flight, yet the frontier stopped short:
            // a block failed in an earlier call (which returned its error; a failed block is
            // not read again, and the completions reaped with it were dropped). A stream is not
            // used after an error; should it be, its reader gets this error, not a wait for
            // nothing.
            return Err(Error::Io {
                offset: self.frontier,
                len: 0,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }
}

/// Writes `block` bytes at each of `offsets`, in order, to `path` with O_DIRECT through one
/// io_uring, keeping up to `depth` writes in flight, and `fdatasync`s after every
/// `sync_every` writes (0: only at the end) and at the end: what the device does for a write
/// workload with no cache (the ceiling the write benchmark compares with). The file must exist;
/// it grows as the writes reach past its end. Returns the time from the first submission to the
/// last `fdatasync`'s return. Errors: a `block` that is not a positive multiple of 4096 up to
/// [`MAX_BLOCK`], offsets not multiples of 4096, a `depth` outside 1..=4096, O_DIRECT refused,
/// a failed write.
pub fn write_blocks(
    path: &Path,
    offsets: &[u64],
    block: usize,
    depth: usize,
    sync_every: usize,
) -> Result<Duration, Error> {
    check_shape(block, depth)?;
    if offsets.iter().any(|o| !o.is_multiple_of(4096)) {
        return Err(Error::Engine(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "offsets must be multiples of 4096",
        )));
    }
    let open_error = |source| Error::Open {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(open_error)?;
    // One buffer per slot, filled with a pattern (what is written does not matter).
    let buffers = Arena::new(
        (depth * block).div_ceil(PAGE_SIZE),
        PAGE_SIZE << MAX_ORDER,
        true,
    )?;
    buffers.prefault().map_err(Error::Prefault)?;
    let base = buffers.page_ptr(0);
    let mut ring = IoUring::new((depth as u32).next_power_of_two()).map_err(Error::Engine)?;
    let sync = |file: &std::fs::File| -> Result<(), Error> {
        rustix::fs::fdatasync(file).map_err(|errno| Error::Io {
            offset: 0,
            len: 0,
            source: errno.into(),
        })
    };
    let start = Instant::now();
    let group = if sync_every == 0 {
        offsets.len().max(1)
    } else {
        sync_every
    };
    for chunk in offsets.chunks(group) {
        let mut next = 0usize;
        let mut in_flight = 0usize;
        loop {
            while in_flight < depth && next < chunk.len() {
                let slot = next % depth;
                let entry = opcode::Write::new(
                    types::Fd(file.as_raw_fd()),
                    base.wrapping_add(slot * block),
                    block as u32,
                )
                .offset(chunk[next])
                .build()
                .user_data(slot as u64);
                // SAFETY: the slot's buffer lies inside `buffers` (slot < depth, `depth *
                // block` bytes mapped), which outlives the ring; at most `depth` writes are in
                // flight and writes only read their buffer, so sharing a slot's bytes between
                // a finished and a new write is fine. The file stays open.
                if unsafe { ring.submission().push(&entry).is_err() } {
                    break;
                }
                next += 1;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            ring.submit_and_wait(1).map_err(Error::Engine)?;
            let results: Vec<i32> = ring.completion().map(|cqe| cqe.result()).collect();
            for result in results {
                in_flight -= 1;
                if result < 0 || result as usize != block {
                    // A short O_DIRECT write is an error for a probe (it does not retry).
                    let errno = if result < 0 { -result } else { libc::EIO };
                    return Err(Error::Io {
                        offset: 0,
                        len: block as u64,
                        source: std::io::Error::from_raw_os_error(errno),
                    });
                }
            }
        }
        sync(&file)?;
    }
    Ok(start.elapsed())
}
