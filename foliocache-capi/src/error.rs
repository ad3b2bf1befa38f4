//! Errors across the C boundary: negative errno values, the last error's message per thread,
//! and the guard that keeps panics on the Rust side.
//!
//! Every exported function runs its body inside [`guard`]: a `Result` becomes a value or a
//! negative errno (the message is kept for `foliocache_last_error`), and a panic is caught and
//! becomes `-EIO` with the panic's message. Nothing unwinds into C.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A failure to report to C: an errno (positive) and a message.
#[derive(Debug)]
pub struct Fail {
    /// The errno value (positive; the C function returns its negation).
    pub errno: i32,
    /// What went wrong, for `foliocache_last_error`.
    pub message: String,
}

impl Fail {
    /// A failure with an errno and a message.
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }
}

impl From<foliocache::Error> for Fail {
    fn from(error: foliocache::Error) -> Self {
        Self {
            errno: errno_of(&error),
            message: error.to_string(),
        }
    }
}

/// The errno that describes a library error best. The one place that maps error variants to
/// errno values (for the C API and the preload library), until the library has its own.
pub fn errno_of(error: &foliocache::Error) -> i32 {
    use foliocache::Error as E;
    let os = |source: &std::io::Error| source.raw_os_error().unwrap_or(libc::EIO);
    match error {
        E::InvalidCapacity(_)
        | E::SharedCapacityTooSmall { .. }
        | E::OrderTooLarge { .. }
        | E::Misaligned { .. }
        | E::IndexOverflow { .. }
        | E::ValueTooLarge { .. }
        | E::EmptyRegion
        | E::OrderMismatch { .. }
        | E::ForeignFolio
        | E::FolioInUse { .. }
        | E::FolioWasCached
        | E::FolioUptodate
        | E::InvalidRatio { .. }
        | E::InvalidSetting { .. } => libc::EINVAL,
        E::NoMemory { .. } | E::IndexNoMemory | E::MetadataAlloc { .. } => libc::ENOMEM,
        E::Mmap { source, .. } => source.raw_os_error().unwrap_or(libc::ENOMEM),
        E::Prefault(source) => source.raw_os_error().unwrap_or(libc::ENOMEM),
        E::NoSpace { .. } => libc::ENOSPC,
        E::Exists { .. } => libc::EEXIST,
        E::NotCached { .. } => libc::ENOENT,
        E::FolioLocked | E::OpenConflict { .. } | E::FolioWriteback { .. } => libc::EBUSY,
        E::FileTooLarge { .. } => libc::EFBIG,
        E::Open { source, .. }
        | E::Io { source, .. }
        | E::Engine(source)
        | E::Writeback { source } => os(source),
        E::NoDirectIo { .. } | E::NotADiskFile | E::NotOffered { .. } => libc::EOPNOTSUPP,
        E::ReadOnly => libc::EROFS,
        E::FaultOutOfRange { .. } => libc::EFAULT,
        E::Detached => libc::EBADF,
        E::StillDirty { .. } => libc::EBUSY,
        _ => libc::EIO,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Keeps `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // Interior NUL bytes cannot cross into C: they are replaced.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = Some(text));
}

/// This thread's last error message, or null if there was none. The pointer stays valid until
/// the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|last| {
            last.borrow()
                .as_ref()
                .map_or(std::ptr::null(), |text| text.as_ptr())
        })
        .unwrap_or(std::ptr::null())
}

/// Runs an exported function's body: `Ok(v)` returns `v`, `Err(fail)` returns `-errno` and
/// keeps the message, a panic returns `-EIO` and keeps the panic's message.
pub(crate) fn guard(body: impl FnOnce() -> Result<i64, Fail>) -> i64 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(fail)) => {
            set_last_error(&fail.message);
            -i64::from(fail.errno.max(1))
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            set_last_error(&format!("internal error (a bug in foliocache): {what}"));
            -i64::from(libc::EIO)
        }
    }
}

/// [`guard`] for functions returning `int`: values that do not fit are reported as `-EOVERFLOW`.
pub(crate) fn guard_int(body: impl FnOnce() -> Result<i64, Fail>) -> i32 {
    let value = guard(body);
    i32::try_from(value).unwrap_or_else(|_| {
        set_last_error("result does not fit in an int");
        -libc::EOVERFLOW
    })
}
