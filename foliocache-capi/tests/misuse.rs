//! The C functions called the wrong way (null pointers, bad values, missing files) return
//! negative errno values with a message, and never crash.

use foliocache_capi::*;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

fn last_error() -> String {
    let message = foliocache_last_error();
    assert!(!message.is_null(), "a failure must leave a message");
    // SAFETY: a non-null pointer from foliocache_last_error is a NUL-terminated string that
    // stays valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_and_bad_arguments_are_errors() {
    // SAFETY: every call below passes pointers that are null, or point to live locals and objects
    // made by the library, as the functions' contracts allow.
    unsafe {
        assert_eq!(foliocache_settings_default(null_mut()), -libc::EINVAL);
        assert!(last_error().contains("out"));
        assert_eq!(foliocache_cache_new(null(), null_mut()), -libc::EINVAL);

        let mut settings = std::mem::zeroed::<foliocache_settings>();
        assert_eq!(foliocache_settings_default(&mut settings), 0);
        settings.capacity_bytes = 12345; // not a page multiple
        let mut cache = null_mut();
        assert_eq!(foliocache_cache_new(&settings, &mut cache), -libc::EINVAL);
        assert!(cache.is_null());
        assert!(last_error().contains("capacity"));

        settings.capacity_bytes = 8 << 20;
        assert_eq!(foliocache_cache_new(&settings, &mut cache), 0);
        assert!(!cache.is_null());

        let mut file = null_mut();
        let missing = CString::new("/definitely/not/here").unwrap();
        assert_eq!(
            foliocache_open(cache, missing.as_ptr(), null(), &mut file),
            -libc::ENOENT
        );
        assert_eq!(
            foliocache_open(cache, null(), null(), &mut file),
            -libc::EINVAL
        );
        assert_eq!(
            foliocache_open(null(), missing.as_ptr(), null(), &mut file),
            -libc::EINVAL
        );
        let mut options = std::mem::zeroed::<foliocache_open_options>();
        assert_eq!(foliocache_open_options_default(&mut options), 0);
        let this = CString::new(env!("CARGO_MANIFEST_DIR").to_owned() + "/Cargo.toml").unwrap();
        options.max_order = 42;
        assert_eq!(
            foliocache_open(cache, this.as_ptr(), &options, &mut file),
            -libc::EINVAL
        );

        let mut buf = [0u8; 16];
        assert_eq!(
            foliocache_read_at(null(), buf.as_mut_ptr().cast(), 16, 0),
            -i64::from(libc::EINVAL)
        );
        assert_eq!(foliocache_size(null()), -i64::from(libc::EINVAL));
        assert_eq!(foliocache_fsync(null()), -libc::EINVAL);
        assert_eq!(foliocache_fdatasync(null()), -libc::EINVAL);
        assert_eq!(
            foliocache_write_at(null(), buf.as_ptr().cast(), 16, 0),
            -i64::from(libc::EINVAL)
        );
        assert_eq!(foliocache_set_len(null(), 0), -libc::EINVAL);
        assert_eq!(foliocache_advise(null(), 0, 0, 0), -libc::EINVAL);
        assert_eq!(foliocache_close(null_mut()), 0);
        let mut stats = std::mem::zeroed::<foliocache_cache_stats>();
        assert_eq!(foliocache_get_cache_stats(cache, &mut stats), 0);
        assert_eq!(stats.capacity_bytes, 8 << 20);
        assert_eq!(foliocache_get_cache_stats(cache, null_mut()), -libc::EINVAL);
        foliocache_cache_free(cache);
        foliocache_cache_free(null_mut());
    }
}
