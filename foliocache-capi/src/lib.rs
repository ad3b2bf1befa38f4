//! foliocache's C API. The header is `include/foliocache.h`, generated from this file by
//! cbindgen (`cbindgen.toml`); `tests/c_api.rs` fails when it is stale.
//!
//! # Conventions
//! * Objects are opaque pointers: a [`foliocache_cache`] made by [`foliocache_cache_new`] and
//!   freed by [`foliocache_cache_free`]; a [`foliocache_file`] made by [`foliocache_open`] and
//!   freed by [`foliocache_close`]. A file keeps its cache's memory alive, so the two may be
//!   freed in any order.
//! * Functions return 0 (or a count) on success and a negative errno value on failure;
//!   [`foliocache_last_error`] returns the message of the calling thread's last failure.
//! * Every pointer is checked for null, every length against the buffer; a Rust panic never
//!   crosses into C (it becomes `-EIO`).
//! * A file may be used from several threads at once: reads from different threads do not wait
//!   for each other (each gets its own readahead state when the shared one is busy).
//!
//! # Safety
//! The C caller promises what C cannot check: pointers it passes point to what the signature
//! says (a buffer of `len` bytes, a NUL-terminated string, an object from this library that was
//! not freed). Every `unsafe` block below relies only on such a promise, named in its comment.

#![allow(non_camel_case_types)]

mod error;

pub use error::{Fail, errno_of};

use error::{guard, guard_int};
use foliocache::{Advice, Cache, File, Handle, OpenOptions};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, PoisonError};

/// `foliocache_advise`: the default heuristics.
pub const FOLIOCACHE_ADVICE_NORMAL: c_int = 0;
/// `foliocache_advise`: sequential access (a larger readahead window).
pub const FOLIOCACHE_ADVICE_SEQUENTIAL: c_int = 1;
/// `foliocache_advise`: random access (no readahead).
pub const FOLIOCACHE_ADVICE_RANDOM: c_int = 2;
/// `foliocache_advise`: the range will be needed soon (start reading it now).
pub const FOLIOCACHE_ADVICE_WILLNEED: c_int = 3;
/// `foliocache_advise`: the range is not needed (drop its idle pages).
pub const FOLIOCACHE_ADVICE_DONTNEED: c_int = 4;

/// Settings of a cache. Start from [`foliocache_settings_default`] and change what you need.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct foliocache_settings {
    /// Memory budget in bytes (folios and metadata); a multiple of 4096, at least 64 KiB.
    /// Default 256 MiB.
    pub capacity_bytes: u64,
    /// Largest readahead window in bytes (0 disables readahead). Default 128 KiB.
    pub readahead_bytes: u64,
    /// Largest folio order, 0..=9 (9: 2 MiB folios). Default 9.
    pub max_order: u8,
    /// Back the arena with transparent huge pages. Default true.
    pub huge_pages: bool,
    /// Fault the whole arena in when the cache is made. Default false.
    pub prefault: bool,
    /// Share of the arena dirty data may reach before background writeback starts, in
    /// `(0, 1]`. Default 0.10 (the kernel's `dirty_background_ratio`).
    pub dirty_background_ratio: f64,
    /// Share of the arena dirty data and data under writeback may reach before writers are
    /// throttled, in `(0, 1]`. Default 0.20 (the kernel's `dirty_ratio`).
    pub dirty_ratio: f64,
    /// Milliseconds data may stay dirty before the background flusher writes it. Default
    /// 30000 (the kernel's `dirty_expire_centisecs`).
    pub dirty_expire_ms: u64,
    /// Write-behind: bytes of a sequential writer's data behind it that start its writeback
    /// without waiting for a sync (0: off). Default 4 MiB.
    pub write_behind_bytes: u64,
}

/// Options for [`foliocache_open`]. Start from [`foliocache_open_options_default`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct foliocache_open_options {
    /// Open for writing: [`foliocache_write_at`] puts data in the cache as dirty pages, which
    /// reach the file by writeback ([`foliocache_fsync`]). Default false.
    pub write: bool,
    /// Create the file if it does not exist (mode 0644 before the umask); implies `write`.
    /// Default false.
    pub create: bool,
    /// Truncate the file to 0 bytes when opened; implies `write`. Default false.
    pub truncate: bool,
    /// On a file system without direct I/O (tmpfs, or O_DIRECT refused), read through the
    /// kernel's page cache instead of failing with `-EOPNOTSUPP`. Default false.
    pub buffered_fallback: bool,
    /// Largest folio order for this file, or -1 for the cache's. Default -1.
    pub max_order: i16,
}

/// Memory and eviction counters of a cache ([`foliocache_get_cache_stats`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct foliocache_cache_stats {
    /// The memory budget in bytes.
    pub capacity_bytes: u64,
    /// Pages (4 KiB) in the arena.
    pub total_pages: u64,
    /// Pages not holding any file data.
    pub free_pages: u64,
    /// Folios evicted to make room.
    pub evicted_folios: u64,
    /// Pages evicted to make room.
    pub evicted_pages: u64,
    /// Evicted folios read in again soon after (refaults).
    pub refaults: u64,
    /// Pages dirty now (written, not yet written back).
    pub dirty_pages: u64,
    /// Pages under writeback now.
    pub writeback_pages: u64,
    /// Pages written back to storage, ever.
    pub written_pages: u64,
}

/// Counters of one file ([`foliocache_get_file_stats`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct foliocache_file_stats {
    /// The file size in bytes (as this cache has it: writes and `foliocache_set_len` change
    /// it).
    pub size: u64,
    /// Pages of this file now in the cache.
    pub cached_pages: u64,
    /// Index lookups (reads that looked for cached pages).
    pub lookups: u64,
    /// Reads that missed and started a device read themselves (synchronous readahead).
    pub sync_misses: u64,
    /// Readahead windows filled (synchronous, asynchronous and forced).
    pub readahead_windows: u64,
    /// Pages readahead inserted.
    pub readahead_pages: u64,
    /// Read requests sent to the device and completed.
    pub device_requests: u64,
    /// Bytes read from the device.
    pub device_bytes: u64,
    /// Device reads that failed.
    pub device_errors: u64,
    /// Pages of this file dirty now.
    pub dirty_pages: u64,
    /// Pages of this file under writeback now.
    pub writeback_pages: u64,
}

/// A cache (opaque).
pub struct foliocache_cache {
    cache: Cache,
}

/// An open file (opaque).
pub struct foliocache_file {
    file: File,
    /// The file's readahead state and its place in the writeback error sequence; a reader or
    /// writer that finds it busy uses a fresh one, a sync waits for it (so that each writeback
    /// error is reported once per open file, as the kernel does per `struct file`).
    handle: Mutex<Handle>,
}

impl foliocache_file {
    /// Runs `op` with the file's shared handle, or with a fresh one when another thread is
    /// using it (so readers never wait for each other's I/O).
    fn with_handle<T>(&self, op: impl FnOnce(&mut Handle) -> T) -> T {
        match self.handle.try_lock() {
            Ok(mut handle) => op(&mut handle),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => op(&mut poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => op(&mut self.file.handle()),
        }
    }
}

/// The calling thread's last error message (a NUL-terminated string), or null if no call on
/// this thread failed yet. Valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn foliocache_last_error() -> *const c_char {
    error::last_error_ptr()
}

/// Fills `out` with the default settings. Returns 0, or -EINVAL if `out` is null.
///
/// # Safety
/// `out` is null or points to writable memory for one `foliocache_settings`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_settings_default(out: *mut foliocache_settings) -> c_int {
    guard_int(|| {
        let out = non_null_mut(out, "out")?;
        let defaults = foliocache_settings {
            capacity_bytes: 256 << 20,
            readahead_bytes: 128 << 10,
            max_order: foliocache::MAX_ORDER,
            huge_pages: true,
            prefault: false,
            dirty_background_ratio: 0.10,
            dirty_ratio: 0.20,
            dirty_expire_ms: 30_000,
            write_behind_bytes: 4 << 20,
        };
        // SAFETY: `out` is not null and, by the caller's promise, points to writable memory
        // for one settings struct; `write` does not read the old (possibly uninitialised) value.
        unsafe { out.write(defaults) };
        Ok(0)
    })
}

/// Makes a cache with `settings` (null: the defaults) and stores it in `*out`. Returns 0 or a
/// negative errno (-EINVAL for bad settings, -ENOMEM when the arena cannot be mapped).
///
/// # Safety
/// `settings` is null or points to a valid `foliocache_settings`; `out` is null or points to
/// writable memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_cache_new(
    settings: *const foliocache_settings,
    out: *mut *mut foliocache_cache,
) -> c_int {
    guard_int(|| {
        let out = non_null_mut(out, "out")?;
        let settings = if settings.is_null() {
            let mut defaults = std::mem::MaybeUninit::uninit();
            // SAFETY: a valid, writable local.
            unsafe { foliocache_settings_default(defaults.as_mut_ptr()) };
            // SAFETY: foliocache_settings_default wrote it (it fails only for a null pointer).
            unsafe { defaults.assume_init() }
        } else {
            // SAFETY: not null, and by the caller's promise a valid settings struct.
            unsafe { settings.read() }
        };
        let cache = Cache::builder()
            .capacity(settings.capacity_bytes)
            .readahead_bytes(settings.readahead_bytes)
            .max_order(settings.max_order)
            .huge_pages(settings.huge_pages)
            .prefault(settings.prefault)
            .dirty_background_ratio(settings.dirty_background_ratio)
            .dirty_ratio(settings.dirty_ratio)
            .dirty_expire(std::time::Duration::from_millis(settings.dirty_expire_ms))
            .write_behind_bytes(settings.write_behind_bytes)
            .build()?;
        let boxed = Box::into_raw(Box::new(foliocache_cache { cache }));
        // SAFETY: `out` is not null and by the caller's promise writable.
        unsafe { out.write(boxed) };
        Ok(0)
    })
}

/// Frees a cache made by [`foliocache_cache_new`] (null is ignored). Files still open keep its
/// memory until they are closed.
///
/// # Safety
/// `cache` is null or a cache from `foliocache_cache_new` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_cache_free(cache: *mut foliocache_cache) {
    if cache.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: by the caller's promise, made by Box::into_raw in foliocache_cache_new and
        // not freed before: ownership comes back here once.
        drop(unsafe { Box::from_raw(cache) });
        Ok(0)
    });
}

/// Fills `out` with the default open options. Returns 0, or -EINVAL if `out` is null.
///
/// # Safety
/// `out` is null or points to writable memory for one `foliocache_open_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_open_options_default(
    out: *mut foliocache_open_options,
) -> c_int {
    guard_int(|| {
        let out = non_null_mut(out, "out")?;
        let defaults = foliocache_open_options {
            write: false,
            create: false,
            truncate: false,
            buffered_fallback: false,
            max_order: -1,
        };
        // SAFETY: not null, and by the caller's promise writable.
        unsafe { out.write(defaults) };
        Ok(0)
    })
}

/// Opens the file at `path` (a NUL-terminated string) through `cache`, with `options` (null:
/// the defaults), and stores it in `*out`. The file is read with O_DIRECT; its size is taken
/// now, and the cache keeps it from then on (its own writes change it; a change by another
/// program is seen when the file is opened again). Errors: the open's errno (-ENOENT,
/// -EACCES, ...), -EOPNOTSUPP on a file system without direct I/O (unless
/// `buffered_fallback`), -EBUSY when the cache has the file open with other `max_order` or
/// `buffered_fallback` options.
///
/// # Safety
/// `cache` is a live cache or null; `path` is null or a NUL-terminated string; `options` is
/// null or a valid options struct; `out` is null or writable for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_open(
    cache: *const foliocache_cache,
    path: *const c_char,
    options: *const foliocache_open_options,
    out: *mut *mut foliocache_file,
) -> c_int {
    guard_int(|| {
        // SAFETY: by the caller's promise, null or a live cache.
        let cache = unsafe { cache.as_ref() }.ok_or_else(|| null_arg("cache"))?;
        if path.is_null() {
            return Err(null_arg("path"));
        }
        let out = non_null_mut(out, "out")?;
        // SAFETY: not null, and by the caller's promise a NUL-terminated string that outlives
        // this call.
        let path = unsafe { CStr::from_ptr(path) };
        let path = path_of(path)?;
        let options = if options.is_null() {
            foliocache_open_options {
                write: false,
                create: false,
                truncate: false,
                buffered_fallback: false,
                max_order: -1,
            }
        } else {
            // SAFETY: not null, and by the caller's promise a valid options struct.
            unsafe { options.read() }
        };
        let mut open = OpenOptions::new()
            .buffered_fallback(options.buffered_fallback)
            .write(options.write)
            .create(options.create)
            .truncate(options.truncate);
        if options.max_order >= 0 {
            let order = u8::try_from(options.max_order)
                .map_err(|_| Fail::new(libc::EINVAL, "max_order must be -1 or 0..=9"))?;
            open = open.max_order(order);
        }
        let file = cache.cache.open_with(path, open)?;
        let handle = Mutex::new(file.handle());
        let boxed = Box::into_raw(Box::new(foliocache_file { file, handle }));
        // SAFETY: not null, and by the caller's promise writable.
        unsafe { out.write(boxed) };
        Ok(0)
    })
}

/// A C path as a `Path` (bytes as they are: Linux paths need not be UTF-8).
fn path_of(path: &CStr) -> Result<&std::path::Path, Fail> {
    use std::os::unix::ffi::OsStrExt;
    if path.is_empty() {
        return Err(Fail::new(libc::ENOENT, "empty path"));
    }
    Ok(std::path::Path::new(std::ffi::OsStr::from_bytes(
        path.to_bytes(),
    )))
}

/// Closes a file from [`foliocache_open`] (null is ignored). Its cached pages stay in the cache
/// until evicted; when it was the cache's last open of a written file, its dirty data is
/// written back first (errors of that writeback are not reported: call [`foliocache_fsync`]
/// before closing to see them, as with `close(2)`). Returns 0.
///
/// # Safety
/// `file` is null or a file from `foliocache_open` not closed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_close(file: *mut foliocache_file) -> c_int {
    if file.is_null() {
        return 0;
    }
    guard_int(|| {
        // SAFETY: by the caller's promise, made by Box::into_raw in foliocache_open and not
        // closed before: ownership comes back here once.
        drop(unsafe { Box::from_raw(file) });
        Ok(0)
    })
}

/// Reads up to `len` bytes at `offset` into `buf`. Returns the bytes read (fewer at end of
/// file, 0 at or past it) or a negative errno (-EIO when the device failed).
///
/// # Safety
/// `file` is null or a live file; `buf` is null only if `len` is 0, else it points to `len`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_read_at(
    file: *const foliocache_file,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        let file = file_ref(file)?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err(null_arg("buf"));
        }
        if len > isize::MAX as usize {
            return Err(Fail::new(libc::EINVAL, "len is larger than isize::MAX"));
        }
        // SAFETY: not null, len ≤ isize::MAX, and by the caller's promise `len` writable bytes
        // that nothing else uses during the call.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        let n = file.with_handle(|handle| handle.read_at(buf, offset))?;
        Ok(n as i64)
    })
}

/// Writes the `len` bytes of `buf` at `offset` into the cache (dirty pages, written back
/// later), growing the file if it ends past its size. Returns `len`, or a negative errno:
/// -EBADF for a file not opened for writing, -ENOSPC when the cache cannot make room, -EIO
/// when a page that must be read first (a partial page not cached) cannot be. A sequential
/// writer's data is written back behind it as it goes (write-behind).
///
/// # Safety
/// `file` is null or a live file; `buf` is null only if `len` is 0, else it points to `len`
/// readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_write_at(
    file: *const foliocache_file,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        let file = file_ref(file)?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err(null_arg("buf"));
        }
        if len > isize::MAX as usize {
            return Err(Fail::new(libc::EINVAL, "len is larger than isize::MAX"));
        }
        // SAFETY: not null, len ≤ isize::MAX, and by the caller's promise `len` readable bytes
        // that nothing writes during the call.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        let n = file
            .with_handle(|handle| handle.write_at(data, offset))
            .map_err(write_fail)?;
        Ok(n as i64)
    })
}

/// A write to a file not opened for writing is -EBADF, as `write(2)` on a read-only fd.
fn write_fail(error: foliocache::Error) -> Fail {
    match error {
        foliocache::Error::ReadOnly => {
            Fail::new(libc::EBADF, "the file was not opened for writing")
        }
        other => other.into(),
    }
}

/// Sets the file's size (`ftruncate(2)`): shrinking drops what lies past the new end, growing
/// adds a hole. The size on storage is set at once. Returns 0 or a negative errno (-EBADF for
/// a file not opened for writing).
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_set_len(file: *const foliocache_file, len: u64) -> c_int {
    guard_int(|| {
        let file = file_ref(file)?;
        if i64::try_from(len).is_err() {
            return Err(Fail::new(libc::EFBIG, "len is larger than i64::MAX"));
        }
        file.file.set_len(len).map_err(write_fail)?;
        Ok(0)
    })
}

/// Writes back the file's dirty data, waits for it, and has the file system make the file
/// durable (`fsync(2)`). Returns 0, or the negative errno of a writeback error since this
/// open file last synced (each error reported once to every file open when it happened, the
/// kernel's errseq rules). A failed write's data stays dirty and this call retries it: 0
/// means all data written before the call is on storage. When no open in this cache may
/// write the file, there is nothing to write back and it only reports errors.
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_fsync(file: *const foliocache_file) -> c_int {
    guard_int(|| sync(file, false))
}

/// As [`foliocache_fsync`], with `fdatasync(2)`: timestamps may stay behind, size and data do
/// not.
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_fdatasync(file: *const foliocache_file) -> c_int {
    guard_int(|| sync(file, true))
}

fn sync(file: *const foliocache_file, data_only: bool) -> Result<i64, Fail> {
    let file = file_ref(file)?;
    // The shared handle carries this open file's place in the error sequence: wait for it.
    let mut handle = file.handle.lock().unwrap_or_else(PoisonError::into_inner);
    if data_only {
        handle.sync_data()?;
    } else {
        handle.sync_all()?;
    }
    Ok(0)
}

/// Advice on the access pattern, as `posix_fadvise`: one of the `FOLIOCACHE_ADVICE_*` values.
/// `offset` and `len` are used by WILLNEED and DONTNEED (len 0: to end of file). Returns 0 or
/// -EINVAL for an unknown advice.
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_advise(
    file: *const foliocache_file,
    advice: c_int,
    offset: u64,
    len: u64,
) -> c_int {
    guard_int(|| {
        let file = file_ref(file)?;
        let advice = match advice {
            FOLIOCACHE_ADVICE_NORMAL => Advice::Normal,
            FOLIOCACHE_ADVICE_SEQUENTIAL => Advice::Sequential,
            FOLIOCACHE_ADVICE_RANDOM => Advice::Random,
            FOLIOCACHE_ADVICE_WILLNEED => Advice::WillNeed { offset, len },
            FOLIOCACHE_ADVICE_DONTNEED => Advice::DontNeed { offset, len },
            other => return Err(Fail::new(libc::EINVAL, format!("unknown advice {other}"))),
        };
        // Advice changes the shared readahead state: wait for it if a reader holds it.
        let mut handle = file.handle.lock().unwrap_or_else(PoisonError::into_inner);
        handle.advise(advice)?;
        Ok(0)
    })
}

/// Starts reading `offset..offset + len` into the cache without waiting, as `readahead(2)`.
/// Returns 0 or a negative errno.
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_readahead(
    file: *const foliocache_file,
    offset: u64,
    len: u64,
) -> c_int {
    guard_int(|| {
        let file = file_ref(file)?;
        file.with_handle(|handle| handle.readahead(offset, len))?;
        Ok(0)
    })
}

/// Drops the idle cached pages of `offset..offset + len` (len 0: to end of file). Returns the
/// pages dropped (pages being read or read right now stay).
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_drop_cached(
    file: *const foliocache_file,
    offset: u64,
    len: u64,
) -> i64 {
    guard(|| {
        let file = file_ref(file)?;
        Ok(file.file.drop_cached(offset, len).dropped_pages as i64)
    })
}

/// The file size in bytes (as this cache has it), or a negative errno.
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_size(file: *const foliocache_file) -> i64 {
    guard(|| {
        let file = file_ref(file)?;
        i64::try_from(file.file.size()).map_err(|_| Fail::new(libc::EOVERFLOW, "size"))
    })
}

/// Fills `out` with the file's counters. Returns 0 or -EINVAL.
///
/// # Safety
/// `file` is null or a live file; `out` is null or writable for one struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_get_file_stats(
    file: *const foliocache_file,
    out: *mut foliocache_file_stats,
) -> c_int {
    guard_int(|| {
        let file = file_ref(file)?;
        let out = non_null_mut(out, "out")?;
        let mapping = file.file.mapping_stats();
        let ra = file.file.readahead_stats();
        let io = file.file.io_stats();
        let stats = foliocache_file_stats {
            size: file.file.size(),
            cached_pages: mapping.cached_pages,
            lookups: mapping.lookups,
            sync_misses: ra.sync_fresh + ra.sync_context + ra.sync_random,
            readahead_windows: ra.windows,
            readahead_pages: ra.pages,
            device_requests: io.requests,
            device_bytes: io.bytes,
            device_errors: io.errors,
            dirty_pages: mapping.dirty_pages,
            writeback_pages: mapping.writeback_pages,
        };
        // SAFETY: not null, and by the caller's promise writable.
        unsafe { out.write(stats) };
        Ok(0)
    })
}

/// Fills `out` with the cache's memory and eviction counters. Returns 0 or -EINVAL.
///
/// # Safety
/// `cache` is null or a live cache; `out` is null or writable for one struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_get_cache_stats(
    cache: *const foliocache_cache,
    out: *mut foliocache_cache_stats,
) -> c_int {
    guard_int(|| {
        // SAFETY: by the caller's promise, null or a live cache.
        let cache = unsafe { cache.as_ref() }.ok_or_else(|| null_arg("cache"))?;
        let out = non_null_mut(out, "out")?;
        let stats = cache.cache.stats();
        let reclaim = cache.cache.reclaim_stats();
        let value = foliocache_cache_stats {
            capacity_bytes: stats.capacity_bytes,
            total_pages: stats.total_pages,
            free_pages: stats.free_pages,
            evicted_folios: reclaim.evicted_folios,
            evicted_pages: reclaim.evicted_pages,
            refaults: reclaim.refaults,
            dirty_pages: stats.dirty.dirty_pages,
            writeback_pages: stats.dirty.writeback_pages,
            written_pages: stats.dirty.written_pages,
        };
        // SAFETY: not null, and by the caller's promise writable.
        unsafe { out.write(value) };
        Ok(0)
    })
}

fn null_arg(name: &str) -> Fail {
    Fail::new(libc::EINVAL, format!("{name} is null"))
}

fn non_null_mut<T>(ptr: *mut T, name: &str) -> Result<*mut T, Fail> {
    if ptr.is_null() {
        Err(null_arg(name))
    } else {
        Ok(ptr)
    }
}

fn file_ref<'a>(file: *const foliocache_file) -> Result<&'a foliocache_file, Fail> {
    // SAFETY: every caller passes on its own caller's promise: null or a live file (from
    // foliocache_open, not closed), which stays alive for the duration of the call.
    unsafe { file.as_ref() }.ok_or_else(|| null_arg("file"))
}
