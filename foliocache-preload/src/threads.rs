//! The library's own threads start with every signal blocked, so that no handler of the
//! program ever runs on them and no signal meant for the program is taken by them.

/// Spawns `body` on a thread named `name` whose signal mask blocks everything (the calling
/// thread's mask is blocked around the spawn, which the new thread inherits, then restored).
pub(crate) fn spawn_blocking_signals(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all`; pthread_sigmask reads it and writes the old mask
    // into `old`, both valid local buffers.
    unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
    }
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(body);
    // SAFETY: `old` was filled by the call above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    spawned
}
