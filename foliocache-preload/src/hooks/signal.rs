//! Signal dispositions: the one the library hears lease breaks with becomes the program's if
//! it sets one for it (see `lease`).

use crate::real;
use libc::c_int;

/// # Safety
/// sigaction(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    signum: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if !act.is_null() {
        // SAFETY: sigaction(2)'s contract: a non-null `act` points to a readable sigaction.
        crate::lease::program_set(signum, unsafe { (*act).sa_sigaction });
    }
    // SAFETY: passed on unchanged.
    unsafe { real::sigaction(signum, act, old) }
}

/// # Safety
/// signal(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::signal(signum, handler) }
}

/// # Safety
/// sigset(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigset(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::sigset(signum, handler) }
}

/// # Safety
/// bsd_signal(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bsd_signal(
    signum: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::bsd_signal(signum, handler) }
}

/// # Safety
/// sysv_signal(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sysv_signal(
    signum: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    crate::lease::program_set(signum, handler);
    // SAFETY: passed on unchanged.
    unsafe { real::sysv_signal(signum, handler) }
}
