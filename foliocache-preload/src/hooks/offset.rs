//! Offsets, advice, syncs: `lseek` (write-back mode's `SEEK_END` at the cache's size), the
//! access-pattern advice and `readahead(2)` for the cache's readahead states, and `fsync`,
//! `fdatasync`, `sync_file_range`, `sync`, `syncfs` through the description's handle in
//! write-back mode.

use super::{preferred_slot, set_errno, status};
use crate::adapter::SyncKind;
use crate::guard;
use crate::table::{self, Description};
use crate::{real, runtime, stats};
use foliocache::SyncRange;
use libc::{c_int, c_uint, off_t, off64_t, size_t, ssize_t};
use std::sync::atomic::Ordering;

/// Write-back mode's `SEEK_END`: from the cache's size (the kernel's is behind until
/// writeback). `None`: not served that way.
fn seek_end(d: &Description, fd: c_int, offset: off64_t) -> Option<off64_t> {
    let (size, _) = d.inode.back_view()?;
    let Some(target) = i64::try_from(size)
        .ok()
        .and_then(|size| size.checked_add(offset))
    else {
        set_errno(libc::EOVERFLOW);
        return Some(-1);
    };
    if target < 0 {
        set_errno(libc::EINVAL);
        return Some(-1);
    }
    if d.shared.load(Ordering::SeqCst) {
        // SAFETY: integer arguments.
        let result = unsafe { real::lseek64(fd, target, libc::SEEK_SET) };
        if result >= 0 {
            d.offset.store(result as u64, Ordering::SeqCst);
        }
        return Some(result);
    }
    d.offset.store(target as u64, Ordering::SeqCst);
    Some(target)
}

/// # Safety
/// lseek(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, offset: off64_t, whence: c_int) -> off64_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::lseek64(fd, offset, whence) };
    };
    if d.inode.is_back() {
        match whence {
            libc::SEEK_END => {
                if let Some(result) = seek_end(&d, fd, offset) {
                    return result;
                }
            }
            // The kernel looks for data and holes in what it has: give it everything.
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if let Some(_outer) = guard::enter() {
                    d.inode.flush();
                }
            }
            _ => {}
        }
    }
    if d.shared.load(Ordering::SeqCst) {
        // The kernel's offset is the one in use.
        // SAFETY: integer arguments.
        let result = unsafe { real::lseek64(fd, offset, whence) };
        if result >= 0 {
            d.offset.store(result as u64, Ordering::SeqCst);
        }
        return result;
    }
    let current = d.offset.load(Ordering::SeqCst);
    if whence == libc::SEEK_CUR && offset == 0 {
        return current as off64_t; // tell
    }
    // The kernel does the arithmetic and the checks, from the offset this table keeps.
    // SAFETY: integer arguments.
    let result = unsafe {
        if whence == libc::SEEK_CUR {
            real::lseek64(fd, current as off64_t, libc::SEEK_SET);
        }
        real::lseek64(fd, offset, whence)
    };
    if result >= 0 {
        d.offset.store(result as u64, Ordering::SeqCst);
    }
    result
}

/// # Safety
/// lseek(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, offset: off_t, whence: c_int) -> off_t {
    // SAFETY: the same function.
    unsafe { lseek64(fd, offset, whence) }
}

/// # Safety
/// posix_fadvise(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    offset: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::posix_fadvise64(fd, offset, len, advice) };
    };
    if offset < 0 || len < 0 || !(0..=5).contains(&advice) {
        return libc::EINVAL;
    }
    let Some(_outer) = guard::enter() else {
        return 0; // advice is optional
    };
    match advice {
        libc::POSIX_FADV_NORMAL | libc::POSIX_FADV_SEQUENTIAL | libc::POSIX_FADV_RANDOM => {
            d.advice.store(advice, Ordering::Relaxed);
            // Idle readahead states start again with the new pattern.
            for slot in &d.handles {
                if let Some(mut slot) = slot.try_lock() {
                    *slot = None;
                }
            }
        }
        libc::POSIX_FADV_WILLNEED => {
            stats::readahead_call();
            let pattern = d.advice.load(Ordering::Relaxed);
            let (offset, len) = (offset as u64, len as u64);
            d.inode
                .will_need(fd, &d.handles, preferred_slot(), pattern, offset, len);
        }
        libc::POSIX_FADV_DONTNEED => {
            d.inode.dont_need(offset as u64, len as u64);
            // The kernel's copy too (pass-through reads may have filled it).
            // SAFETY: integer arguments.
            unsafe { real::posix_fadvise64(fd, offset, len, advice) };
        }
        _ => {} // NOREUSE: nothing to do
    }
    0
}

/// # Safety
/// posix_fadvise(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    offset: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    // SAFETY: the same function.
    unsafe { posix_fadvise64(fd, offset, len, advice) }
}

/// # Safety
/// readahead(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readahead(fd: c_int, offset: off64_t, count: size_t) -> ssize_t {
    let Some(d) = table::get(fd) else {
        // SAFETY: integer arguments.
        return unsafe { real::readahead(fd, offset, count) };
    };
    if offset < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    if let Some(_outer) = guard::enter()
        && count > 0
    {
        stats::readahead_call();
        let pattern = d.advice.load(Ordering::Relaxed);
        let (offset, count) = (offset as u64, count as u64);
        d.inode
            .will_need(fd, &d.handles, preferred_slot(), pattern, offset, count);
    }
    0
}

/// fsync, fdatasync and sync_file_range. Write-through: the kernel has every byte; these go
/// to it unchanged. Write-back: the description's handle writes the cache's dirty data back
/// and reports each writeback error once to each description (errseq), as the kernel.
/// Nested, they go to the kernel (which syncs only what it has).
fn sync_served(fd: c_int, kind: SyncKind) -> Option<c_int> {
    let d = table::get(fd)?;
    if !d.inode.is_back() {
        return None;
    }
    let _outer = guard::enter()?;
    d.inode.sync(fd, &d.sync, kind).map(status)
}

/// # Safety
/// fsync(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    sync_served(fd, SyncKind::All).unwrap_or_else(|| unsafe { real::fsync(fd) })
}

/// # Safety
/// fdatasync(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: an integer argument.
    sync_served(fd, SyncKind::Data).unwrap_or_else(|| unsafe { real::fdatasync(fd) })
}

/// # Safety
/// sync_file_range(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    offset: off64_t,
    nbytes: off64_t,
    flags: c_uint,
) -> c_int {
    let known = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    if offset >= 0 && nbytes >= 0 && flags & !known == 0 {
        if flags == 0 && table::get(fd).is_some_and(|d| d.inode.is_back()) {
            return 0; // no step asked: nothing done, no error reported (as the kernel)
        }
        let mut steps = SyncRange::default();
        for (flag, step) in [
            (libc::SYNC_FILE_RANGE_WAIT_BEFORE, SyncRange::WAIT_BEFORE),
            (libc::SYNC_FILE_RANGE_WRITE, SyncRange::WRITE),
            (libc::SYNC_FILE_RANGE_WAIT_AFTER, SyncRange::WAIT_AFTER),
        ] {
            if flags & flag != 0 {
                steps = steps | step;
            }
        }
        let kind = SyncKind::Range {
            offset: offset as u64,
            len: nbytes as u64,
            flags: steps,
        };
        if let Some(rc) = sync_served(fd, kind) {
            return rc;
        }
    }
    // SAFETY: integer arguments.
    unsafe { real::sync_file_range(fd, offset, nbytes, flags) }
}

/// Write-back mode: `sync(2)` and `syncfs(2)` make durable what the kernel has: write the
/// cache back first.
fn flush_everything() {
    if let Some(runtime) = runtime()
        && let Some(_outer) = guard::enter()
    {
        runtime.flush_all();
    }
}

/// # Safety
/// sync(2)'s contract (none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync() {
    flush_everything();
    real::sync();
}

/// # Safety
/// syncfs(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    flush_everything();
    // SAFETY: an integer argument.
    unsafe { real::syncfs(fd) }
}
