//! What the device can do: sequential O_DIRECT reads at a chosen request size and queue depth
//! through io_uring, with no cache at all (the ceiling the readahead benchmark compares with).

use crate::error::Error;
use io_uring::{IoUring, opcode, types};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The result of [`sequential_read`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceRead {
    /// Bytes read.
    pub bytes: u64,
    /// Wall time from the first submission to the last completion.
    pub elapsed: Duration,
}

/// Reads every file of `paths` once, front to back, with O_DIRECT requests of `block` bytes
/// (a multiple of 4096), keeping `depth` of them in flight through one io_uring; the files are
/// read one after the other. Nothing is cached and nothing is copied.
pub fn sequential_read(paths: &[&Path], block: usize, depth: usize) -> Result<DeviceRead, Error> {
    if block == 0 || !block.is_multiple_of(4096) || depth == 0 || depth > 4096 {
        return Err(Error::Engine(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "block must be a positive multiple of 4096 and depth 1..=4096",
        )));
    }
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|source| Error::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let size = file
            .metadata()
            .map_err(|source| Error::Open {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        files.push((file, size));
    }
    let mut ring = IoUring::new((depth as u32).next_power_of_two()).map_err(Error::Engine)?;
    // One buffer per slot, 4 KiB aligned for O_DIRECT.
    let mut backing = vec![0u8; block * depth + 4096];
    let align = backing.as_ptr().align_offset(4096);
    let buffers = &mut backing[align..align + block * depth];
    let base = buffers.as_mut_ptr();

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
    let mut bytes = 0u64;
    let mut in_flight = 0usize;
    let start = Instant::now();
    let submit_slot = |ring: &mut IoUring, slot: usize, file: usize, offset: u64| {
        let entry = opcode::Read::new(
            types::Fd(files[file].0.as_raw_fd()),
            base.wrapping_add(slot * block),
            block as u32,
        )
        .offset(offset)
        .build()
        .user_data(slot as u64);
        // SAFETY: the buffer of `slot` (inside `backing`, which outlives the ring's use below)
        // is used by at most one read at a time: a slot is reissued only after its completion
        // was reaped. The file stays open for the whole function.
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
