//! foliocache's C API. The header is `include/foliocache.h`, generated from this file by
//! cbindgen (`cbindgen.toml`); `tests/header.rs` fails when it is stale.
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
}

/// Options for [`foliocache_open`]. Start from [`foliocache_open_options_default`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct foliocache_open_options {
    /// Open for writing. Not supported yet (the library's write path is not merged): opening
    /// with `write` set fails with `-EROFS`.
    pub write: bool,
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
}

/// Counters of one file ([`foliocache_get_file_stats`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct foliocache_file_stats {
    /// The file size in bytes (taken when it was opened).
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
}

/// A cache (opaque).
pub struct foliocache_cache {
    cache: Cache,
}

/// An open file (opaque).
pub struct foliocache_file {
    file: File,
    /// The file's readahead state; a reader that finds it busy uses a fresh one.
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
/// now. Errors: the open's errno (-ENOENT, -EACCES, ...), -EOPNOTSUPP on a file system without
/// direct I/O (unless `buffered_fallback`), -EROFS when `write` is asked (not supported yet).
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
                buffered_fallback: false,
                max_order: -1,
            }
        } else {
            // SAFETY: not null, and by the caller's promise a valid options struct.
            unsafe { options.read() }
        };
        if options.write {
            return Err(Fail::new(
                libc::EROFS,
                "writable files need foliocache's write path, which is not available yet",
            ));
        }
        let mut open = OpenOptions::new().buffered_fallback(options.buffered_fallback);
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
/// until evicted. Returns 0.
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

/// Writes `len` bytes of `buf` at `offset`. Not supported yet (files are read only until the
/// library's write path is merged): returns -EROFS.
///
/// # Safety
/// `file` is null or a live file; `buf` is null only if `len` is 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_write_at(
    file: *const foliocache_file,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        file_ref(file)?;
        if buf.is_null() && len > 0 {
            return Err(null_arg("buf"));
        }
        let _ = offset;
        Err(Fail::new(
            libc::EROFS,
            "files are read only until foliocache's write path is available",
        ))
    })
}

/// Flushes the file's written data and metadata to the device. Files are read only for now,
/// so there is nothing to write back: returns 0 (or -EINVAL for a null file).
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_fsync(file: *const foliocache_file) -> c_int {
    guard_int(|| file_ref(file).map(|_| 0))
}

/// As [`foliocache_fsync`], data only. Returns 0 (nothing is written back yet).
///
/// # Safety
/// `file` is null or a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn foliocache_fdatasync(file: *const foliocache_file) -> c_int {
    guard_int(|| file_ref(file).map(|_| 0))
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

/// The file size in bytes (as taken when it was opened), or a negative errno.
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
