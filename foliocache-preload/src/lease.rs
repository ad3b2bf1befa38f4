//! File leases: how a process knows that no other process can change a file it caches.
//!
//! A lease (`fcntl(F_SETLEASE)`) is the kernel's exact signal for this, the one Samba's
//! oplocks and NFS servers' delegations are built on. The kernel refuses a read lease while
//! the file is open for writing anywhere (this process included), and a write lease while it
//! is open at all anywhere else; once granted, an `open` by another process that conflicts
//! (for writing against a read lease, any open against a write lease), or a `truncate` by
//! path, *breaks* it: the kernel sends the holder a signal and makes the opener wait until the
//! holder releases the lease (or `lease-break-time`, 45 s by default, passes). So a process
//! that stops serving a file from its cache before it releases the lease never lets another
//! process's write in while it still serves old bytes.
//!
//! # Who hears a break
//! A break is a signal aimed at the descriptor's owner. It goes to the library's own *lease
//! thread* (`F_SETOWN_EX` with `F_OWNER_TID`), which blocks the signal and waits for it with
//! `sigwaitinfo`: no handler ever runs in the program's threads, and a program that blocks the
//! signal everywhere (`signalfd`, `sigwait` servers) or handles it itself does not get in the
//! way. The thread starts, with every signal blocked, at the first lease.
//!
//! `F_SETLEASE` itself sets the owner to the whole process, so a break that lands between it
//! and `F_SETOWN_EX` would be aimed at the process: the signal's disposition is set to ignore
//! (a thread that blocks it still queues it), so such a break is dropped rather than run a
//! handler or kill the program, and [`take`] then sees it with `F_GETLEASE` (the lease reads
//! as being broken) and gives the lease up at once. If the kernel cannot queue another
//! real-time signal (`RLIMIT_SIGPENDING`), it sends `SIGIO` instead, to the same thread, which
//! then looks at every lease it holds.
//!
//! # The signal
//! `FOLIOCACHE_LEASE_SIGNAL` chooses it; by default the highest real-time signal from
//! `SIGRTMAX - 1` down to `SIGRTMIN + 4` that has no handler when the first lease is taken. A
//! program that installs a handler for it later (`sigaction`, `signal`) gets it: the library
//! stops taking new leases (files opened from then on pass through), and breaks of the leases
//! it holds still reach its thread. Before an `exec` the disposition goes back to the default.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// `fcntl` commands and types the libc crate does not name for this target
/// (`<asm-generic/fcntl.h>`).
pub(crate) const F_SETSIG: libc::c_int = 10;
pub(crate) const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct OwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// What a lease is taken for: told when the kernel breaks it (on the lease thread).
pub(crate) trait Holder: Send + Sync {
    /// The lease on `fd` was broken: stop using what it guarded, then [`release`] it.
    fn lease_broken(&self, fd: RawFd);
}

/// Which lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `F_RDLCK`: broken by an open for writing (or a truncate) anywhere.
    Read,
    /// `F_WRLCK`: broken by any other open.
    Write,
}

impl Kind {
    fn arg(self) -> libc::c_int {
        match self {
            Kind::Read => libc::F_RDLCK,
            Kind::Write => libc::F_WRLCK,
        }
    }
}

/// Why a lease could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The file is open elsewhere in a way the lease excludes (`EAGAIN`).
    Busy,
    /// Leases are not to be had here: another user's file without `CAP_LEASE`, a file system
    /// without leases, leases disabled (`fs.leases-enable`).
    Unsupported,
    /// No signal to hear breaks with: the program uses every candidate, or the one chosen.
    NoSignal,
    /// Broken while it was being set up.
    Broken,
}

/// The signal breaks arrive with; 0 before the first lease, -1 when none is usable.
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The program installed a handler for the signal: no new leases.
static SIGNAL_TAKEN: AtomicBool = AtomicBool::new(false);
/// Whether the library set the signal's disposition to ignore (to put back before `exec`).
static IGNORED_BY_US: AtomicBool = AtomicBool::new(false);
/// The lease thread's id (0: not started in this process).
static THREAD: AtomicI32 = AtomicI32::new(0);
/// Serialises the choice of the signal and the start of the thread.
static SETUP: Mutex<()> = Mutex::new(());

/// A lease held: its descriptor, kind, and whom a break is for.
pub(crate) type Held = (RawFd, Kind, Weak<dyn Holder>);

/// The leases held.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

pub(crate) fn held() -> MutexGuard<'static, Vec<Held>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a lease of `kind` on `fd` for `holder`, with breaks aimed at the lease thread.
pub(crate) fn take<H: Holder + 'static>(
    fd: RawFd,
    kind: Kind,
    holder: &Arc<H>,
) -> Result<(), Refused> {
    if SIGNAL_TAKEN.load(Ordering::Acquire) {
        return Err(Refused::NoSignal);
    }
    let (signal, thread) = setup().ok_or(Refused::NoSignal)?;
    // SAFETY: fcntl on a descriptor of this process, integer arguments.
    if unsafe { crate::real::fcntl(fd, F_SETSIG, signal as usize) } != 0 {
        return Err(Refused::Unsupported);
    }
    // SAFETY: as above.
    if unsafe { crate::real::fcntl(fd, libc::F_SETLEASE, kind.arg() as usize) } != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        return Err(match errno {
            Some(libc::EAGAIN) => Refused::Busy,
            _ => Refused::Unsupported,
        });
    }
    // Known before the owner is set: a break from then on finds its inode.
    let holder: Arc<dyn Holder> = Arc::clone(holder) as Arc<dyn Holder>;
    held().push((fd, kind, Arc::downgrade(&holder)));
    let owner = OwnerEx {
        kind: F_OWNER_TID,
        pid: thread,
    };
    // SAFETY: F_SETOWN_EX reads one f_owner_ex from the pointer, valid for the call.
    let owned =
        unsafe { crate::real::fcntl(fd, F_SETOWN_EX, std::ptr::addr_of!(owner) as usize) } == 0;
    // SAFETY: fcntl on a descriptor of this process.
    let now = unsafe { crate::real::fcntl(fd, libc::F_GETLEASE, 0) };
    if !owned || now != kind.arg() {
        // Broken before the owner was set (its signal went to the process and was dropped),
        // or the owner could not be set: give it up.
        release(fd);
        return Err(Refused::Broken);
    }
    Ok(())
}

/// Releases the lease on `fd` (a waiting opener goes on).
pub(crate) fn release(fd: RawFd) {
    held().retain(|(held, _, _)| *held != fd);
    // SAFETY: fcntl on a descriptor of this process, integer arguments.
    unsafe { crate::real::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK as usize) };
}

/// Whether the lease of `kind` on `fd` still stands (not broken, not being broken).
pub(crate) fn stands(fd: RawFd, kind: Kind) -> bool {
    // SAFETY: fcntl on a descriptor of this process.
    unsafe { crate::real::fcntl(fd, libc::F_GETLEASE, 0) == kind.arg() }
}

/// The signal and the lease thread, set up at the first call; `None` if no signal is usable.
fn setup() -> Option<(libc::c_int, libc::pid_t)> {
    let signal = SIGNAL.load(Ordering::Acquire);
    let thread = THREAD.load(Ordering::Acquire);
    if signal > 0 && thread > 0 {
        return Some((signal, thread));
    }
    if signal < 0 {
        return None;
    }
    let _one = SETUP.lock().unwrap_or_else(PoisonError::into_inner);
    let mut signal = SIGNAL.load(Ordering::Acquire);
    if signal == 0 {
        signal = choose_signal().unwrap_or(-1);
        SIGNAL.store(signal, Ordering::Release);
    }
    if signal < 0 {
        return None;
    }
    let mut thread = THREAD.load(Ordering::Acquire);
    if thread == 0 {
        thread = start_thread(signal)?;
    }
    Some((signal, thread))
}

/// The signal's current handler, if it has one (neither default nor ignored).
fn has_handler(signal: libc::c_int) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current one into the valid local buffer.
    let rc = unsafe { crate::real::sigaction(signal, std::ptr::null(), old.as_mut_ptr()) };
    if rc != 0 {
        return true;
    }
    // SAFETY: sigaction succeeded, so it filled the struct.
    let old = unsafe { old.assume_init() };
    old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN
}

/// Chooses the signal (see the module doc) and sets it to be ignored.
fn choose_signal() -> Option<libc::c_int> {
    let (low, high) = (libc::SIGRTMIN() + 4, libc::SIGRTMAX() - 1);
    let chosen = match crate::runtime().and_then(|runtime| runtime.config.lease_signal) {
        Some(wanted) => (!has_handler(wanted)).then_some(wanted),
        None => (low..=high).rev().find(|&signal| !has_handler(signal)),
    }?;
    ignore(chosen);
    Some(chosen)
}

fn ignore(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction is a valid value; SIG_IGN needs no handler function.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = libc::SIG_IGN;
    // SAFETY: valid action, no old action wanted.
    if unsafe { crate::real::sigaction(signal, &action, std::ptr::null_mut()) } == 0 {
        IGNORED_BY_US.store(true, Ordering::Release);
    }
}

/// The program set a disposition for `signal` (its `sigaction` or `signal`): if it is the
/// lease signal and the program gives it a handler or the default action, the signal is the
/// program's from now on and no new lease is taken.
pub(crate) fn program_set(signal: libc::c_int, handler: libc::sighandler_t) {
    if signal == SIGNAL.load(Ordering::Acquire) && handler != libc::SIG_IGN {
        SIGNAL_TAKEN.store(true, Ordering::Release);
        IGNORED_BY_US.store(false, Ordering::Release);
    }
}

/// Whether new leases can be had (the signal is the library's).
pub(crate) fn signal_usable() -> bool {
    !SIGNAL_TAKEN.load(Ordering::Acquire) && SIGNAL.load(Ordering::Acquire) >= 0
}

/// Before an `exec` (every lease was released): the signal's disposition goes back to the
/// default, so the new program does not start with it ignored.
pub(crate) fn before_exec() {
    let signal = SIGNAL.load(Ordering::Acquire);
    if signal > 0 && IGNORED_BY_US.load(Ordering::Acquire) {
        // SAFETY: a zeroed sigaction with SIG_DFL is a valid value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = libc::SIG_DFL;
        // SAFETY: valid action, no old action wanted.
        unsafe { crate::real::sigaction(signal, &action, std::ptr::null_mut()) };
    }
}

/// After an `exec` that failed: ignored again.
pub(crate) fn after_failed_exec() {
    let signal = SIGNAL.load(Ordering::Acquire);
    if signal > 0 && IGNORED_BY_US.load(Ordering::Acquire) {
        ignore(signal);
    }
}

/// In a child after fork: the lease thread stayed in the parent, and so do the leases (the
/// child closes its copies of the library's descriptors, and the forking thread empties the
/// list it holds). A lease taken later starts a thread here.
pub(crate) fn forget_in_child() {
    THREAD.store(0, Ordering::Release);
}

/// Starts the lease thread with every signal blocked; returns its thread id.
fn start_thread(signal: libc::c_int) -> Option<libc::pid_t> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = crate::threads::spawn_blocking_signals("foliocache-lease", move || {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        let _ = tx.send(tid);
        serve(signal);
    });
    let tid = spawned.ok().and_then(|_| rx.recv().ok())?;
    THREAD.store(tid, Ordering::Release);
    Some(tid)
}

/// The lease thread: waits for breaks and has their inodes stop serving from the cache.
fn serve(signal: libc::c_int) {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset adds valid signal numbers.
    let set = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), signal);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGIO);
        set.assume_init()
    };
    loop {
        let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::uninit();
        // SAFETY: a valid set, and room for one siginfo.
        let got = unsafe { libc::sigwaitinfo(&set, info.as_mut_ptr()) };
        if got < 0 {
            continue; // EINTR
        }
        let _entered = crate::guard::enter();
        if got == signal {
            // SAFETY: sigwaitinfo returned a signal, so it filled the siginfo; for a lease
            // break queued with F_SETSIG the kernel puts the descriptor in si_fd.
            let fd = unsafe { sigio_fd(info.as_ptr()) };
            broken(fd);
        } else {
            // The real-time queue was full: look at every lease.
            let all: Vec<(RawFd, Kind)> = held().iter().map(|(fd, kind, _)| (*fd, *kind)).collect();
            for (fd, kind) in all {
                if !stands(fd, kind) {
                    broken(fd);
                }
            }
        }
    }
}

/// `si_fd` of a `SIGIO`-style siginfo (the libc crate does not name the field).
///
/// # Safety
/// `info` points to a siginfo filled by the kernel for a signal sent by `F_SETSIG`.
unsafe fn sigio_fd(info: *const libc::siginfo_t) -> RawFd {
    // The kernel's layout (64-bit): si_signo, si_errno, si_code (3 ints), a 4-byte hole, then
    // the union, whose SIGPOLL member is { long si_band; int si_fd; }.
    #[repr(C)]
    struct SigPoll {
        signo: libc::c_int,
        errno: libc::c_int,
        code: libc::c_int,
        _pad: libc::c_int,
        band: libc::c_long,
        fd: libc::c_int,
    }
    // SAFETY: the caller's promise; siginfo_t is 128 bytes, larger than SigPoll.
    unsafe { (*info.cast::<SigPoll>()).fd }
}

/// A break arrived for `fd`: its holder stops using the file and releases the lease.
fn broken(fd: RawFd) {
    let holder = held()
        .iter()
        .find(|(held, _, _)| *held == fd)
        .and_then(|(_, _, holder)| holder.upgrade());
    if let Some(holder) = holder {
        holder.lease_broken(fd);
    }
}
