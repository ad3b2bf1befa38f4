//! The cache's own threads (I/O completions, the I/O workers, the populator, the flusher) are
//! started with every signal blocked, but those the thread's own faults raise.
//!
//! A signal sent to the process goes to any one thread that does not block it. Were it one of
//! these, the program's handler would run on a thread the program does not know, in the middle
//! of the cache's work: a handler that reads a served file (through the preload library) would
//! enter the cache again from a thread that may hold the cache's locks or be inside the
//! allocator, and wait for itself. Blocked here, such signals go to the program's threads,
//! where the library can tell a nested call from a first one. The new thread inherits the mask
//! it is created with, so there is no moment at which it accepts signals. (glibc keeps its own
//! internal signals, used for `setuid` and cancellation, out of any mask.)

use std::thread::{Builder, JoinHandle};

/// Spawns a thread named `name` running `f`, with every signal blocked in it.
pub(crate) fn spawn<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: an all-zero sigset_t is a valid value for sigfillset and pthread_sigmask to
    // overwrite.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a valid, writable sigset_t.
    unsafe { libc::sigfillset(&mut all) };
    // Signals a fault of the thread itself raises stay deliverable: blocked, the kernel would
    // kill the process without running the program's handler (or Rust's stack-overflow one).
    for fault in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
    ] {
        // SAFETY: `all` is a valid sigset_t and `fault` a valid signal number.
        unsafe { libc::sigdelset(&mut all, fault) };
    }
    // SAFETY: both pointers are to valid sigset_t values of this frame; this changes only the
    // calling thread's mask, restored below.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) } == 0;
    let spawned = Builder::new().name(name.to_owned()).spawn(f);
    if blocked {
        // SAFETY: `old` holds the mask pthread_sigmask returned above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    spawned
}

#[cfg(test)]
mod tests {
    use super::spawn;

    /// This thread's blocked signals (`SigBlk` in /proc/thread-self/status).
    fn blocked_mask() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    #[test]
    fn the_new_thread_blocks_signals_and_the_caller_keeps_its_mask() {
        let before = blocked_mask();
        let inside = spawn("masked", blocked_mask).unwrap().join().unwrap();
        assert_eq!(blocked_mask(), before, "the caller's mask changed");
        let alarm = 1u64 << (libc::SIGALRM - 1);
        let term = 1u64 << (libc::SIGTERM - 1);
        assert_eq!(before & alarm, 0, "the test thread blocked SIGALRM already");
        assert_eq!(inside & (alarm | term), alarm | term, "mask {inside:x}");
        let segv = 1u64 << (libc::SIGSEGV - 1);
        assert_eq!(inside & segv, 0, "a fault's signal is blocked: {inside:x}");
        let plain = std::thread::spawn(blocked_mask).join().unwrap();
        assert_eq!(
            plain & alarm,
            0,
            "a plain thread blocks SIGALRM: the check is void"
        );
    }
}
