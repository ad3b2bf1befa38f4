//! Epochs: the crate's RCU. Memory a lockless reader may still be looking at (an unlinked index
//! node, a freed folio an optimistic reader may be copying) is handed back only after every
//! reader that could have reached it has finished.
//!
//! # Why not crossbeam-epoch
//! The crate used it first. Its pin is cheap, but every 128th pin of each thread tries to
//! advance the global epoch: it reads every other thread's epoch word (lines those threads write
//! on every pin) and writes the global epoch (a line every pin reads). On this machine, two
//! threads doing nothing but pin and unpin reached 1.1× one thread's rate; with the scheme below
//! they reach 2.0× (the share-nothing ceiling; measured when the change was made, and
//! `epoch_pin_unpin` in `benches/core.rs` measures this scheme on one and two threads). Seed 002's benchmark is exactly many threads
//! reading one file, so the read side must write only its own cache line, and nothing else.
//!
//! # The protocol
//! * One global epoch (a counter), and one *participant* per thread (registered on first use,
//!   unregistered when the thread exits), each on its own cache line, holding `IDLE` or the
//!   epoch it pinned.
//! * **Pin** (outermost only; nested pins just count): load the global epoch (acquire), store it
//!   in the participant (release), then a barrier, so the loads the reader does next cannot be
//!   satisfied before the store is visible to an advancer. Which barrier depends on the
//!   domain's [`Barrier`], chosen once per process:
//!   - *symmetric*: a `SeqCst` fence, pairing with the advancer's (on x86-64 the store and the
//!     fence are one `xchg`: `publish_pin`);
//!   - *asymmetric* (the default where the kernel offers it): only a compiler fence. The
//!     advancer supplies the hardware barrier instead: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
//!     makes every CPU that runs one of this process's threads execute a full barrier before it
//!     returns, as if a signal handler had run a `SeqCst` fence on each of them. A pin then
//!     executes no barrier instruction; the call costs the advancer a system call, and each
//!     reader running at that moment an interrupt.
//!
//!   **Unpin**: store `IDLE` (release).
//! * **Defer** (a writer that has unlinked something): under the garbage lock, a `SeqCst` fence,
//!   then tag the function with the current epoch and queue it. It may run once the epoch has
//!   advanced twice past its tag.
//! * **Advance** (writers only, serialised by the garbage lock): in asymmetric mode the heavy
//!   barrier first (once per attempt, which makes up to two advances); then, per advance, a
//!   `SeqCst` fence (for readers in other processes, see [`external_pin`], whom `membarrier`
//!   does not reach, and for every reader in symmetric mode) and a scan of the participants;
//!   if each is idle or pinned in the current epoch, an acquire fence and the epoch moves up by
//!   one. Readers never advance, so on a read-only workload the epoch line is never written and
//!   stays shared in every core's cache.
//!
//! The epoch changes only under the garbage lock: by an advance, or by [`add_external`]'s jump,
//! which retags everything queued with the new epoch. So a tag is the epoch when its defer
//! queued it, and every advance that counts for it scanned every reader.
//!
//! Why two advances are enough: a reader that could reach an object unlinked before a defer
//! tagged `t` was pinned before the unlink was visible to it, so in an epoch `≤ t` (a reader
//! whose acquire load read `t + 1` or later reads after the advance that stored it, which came
//! after the tag was read and so after the unlink; or one whose pin the advance to `t + 1` did
//! not see, idle or not yet visible, and then by the barriers its later loads see the unlink:
//! the fences in symmetric mode, the heavy barrier in asymmetric mode, next paragraph).
//! The advance from `t + 1` to `t + 2` requires it idle or pinned at `t + 1`, so by then it has
//! unpinned since; the value that scan read was stored (with release) after those reads, and
//! the scan's acquire fence orders them before the free.
//!
//! Why one heavy barrier serves both advances of an attempt: the argument above needs, for
//! each scan, that a reader the scan does not see pinned is idle or reads after the unlinks.
//! Take the barrier `M`, made with the garbage lock held and before the scans, so every object
//! in the queue was unlinked before `M` began. Each thread of the process executes a full
//! barrier at some point during `M` (one that is not running executes it in the scheduler, on
//! its way off the CPU and back). If a reader's pin store precedes that point in its program
//! order, the store is visible to every scan after `M`, which reads it or a later value of the
//! word. If the point precedes the pin store, it precedes every read the pin protects, and those
//! reads see every unlink made before `M`: the reader can reach nothing in the queue. Both scans
//! of the attempt come after `M`. Symmetric mode is the case where each reader's barrier sits
//! right after its own pin store.
//!
//! If the heavy barrier fails, no advance is made in that attempt (no scan runs), which is
//! safe: deferred memory waits. A failure that will not pass (the call refused, as by a system
//! call filter installed after the domain chose asymmetric mode) stops advances for good and is
//! reported once on standard error; a reader that chose its barrier from the mode cannot be
//! made to see a change of mode without the very barrier that failed. A transient one (the
//! kernel out of memory for the call) only fails that attempt.
//!
//! The heavy barrier is rate-limited: `defer` attempts an advance every [`ADVANCE_EVERY`] defers
//! but, in asymmetric mode, not sooner than [`MIN_HEAVY_INTERVAL`] after the last barrier (an
//! interrupt per busy CPU, about 17 µs of the caller's time on this project's 2-vCPU virtual
//! machines). [`collect`], which callers use when memory runs dry, is not limited; what a burst
//! of defers queued within a millisecond waits for the next defer or collect. No attempt is
//! made when nothing is queued, nor, in asymmetric mode, when a participant is seen pinned in an
//! older epoch (the scan would fail): a reclaimer that collects in a loop while a descheduled
//! reader holds the epoch back does not interrupt the other readers each time.
//!
//! The loom model in `tests/loom_epoch.rs` checks this protocol itself (a reader that finds an
//! object never sees it freed), and the folio models in `tests/loom_optimistic.rs` and
//! `tests/loom_reclaim.rs` run on top of it: under `--cfg loom` the very same code runs, with
//! the global state in a `loom::lazy_static` and the participants in `loom::thread_local`.
//! loom drops its statics when the model's closure returns, so a model must join every thread
//! that may still pin, defer or collect before returning. loom cannot issue `membarrier`:
//! under loom the call is a model of it (`loom_heavy`), and a model picks the mode
//! (`model_barrier`, symmetric by default). `tests/loom_epoch.rs` runs its local models in
//! both modes and, as a negative control, asymmetric pins with the call left out, which it must
//! catch. `tests/epoch_stress.rs` runs real threads against an oracle in both modes; it cannot
//! catch a missing heavy barrier (the window is a store buffer draining), loom does.

use crate::sync::unmodelled::{AtomicUsize as PlainUsize, Ordering as PlainOrdering};
use crate::sync::{AtomicU64, Mutex, Ordering, fence};
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

/// A participant's word when it is not pinned.
const IDLE: u64 = 0;

/// A participant's word when pinned in `epoch`.
fn pinned(epoch: u64) -> u64 {
    (epoch << 1) | 1
}

/// How many defers may queue before one of them tries to advance the epoch. Each attempt scans
/// every participant's line (lines their owners write on every pin), so it is amortised; memory
/// that cannot wait (an allocation that finds the arena dry) calls [`collect`] itself. Under
/// loom every defer tries, so the models see memory reused as soon as the protocol allows.
#[cfg(not(loom))]
const ADVANCE_EVERY: usize = 16;
#[cfg(loom)]
const ADVANCE_EVERY: usize = 1;

/// In asymmetric mode, the least time between two heavy barriers that `defer` asks for: at
/// most a thousand a second, some 2% of one CPU at 17 µs each. Memory freed meanwhile waits
/// that much longer; an allocation that finds the arena dry calls [`collect`], which does not
/// wait.
#[cfg(not(loom))]
const MIN_HEAVY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// How a pin orders its store before the reads it protects (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// Each pin executes a full barrier.
    Symmetric,
    /// A pin executes a compiler fence only; an advance asks the kernel for a full barrier on
    /// every CPU running one of the process's threads (`membarrier(2)`).
    Asymmetric,
}

impl Barrier {
    /// The name `FOLIOCACHE_EPOCH_BARRIER` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Symmetric => "symmetric",
            Self::Asymmetric => "asymmetric",
        }
    }
}

/// The environment variable that chooses the mode: `symmetric`, or `asymmetric` (the default,
/// which falls back to symmetric when the kernel refuses `membarrier`).
pub const BARRIER_VAR: &str = "FOLIOCACHE_EPOCH_BARRIER";

/// The mode this process runs in: asymmetric unless [`BARRIER_VAR`] says `symmetric` or the
/// kernel does not let the process register for `membarrier`'s private expedited command.
#[cfg(not(loom))]
fn choose_barrier() -> Barrier {
    let wanted = match std::env::var(BARRIER_VAR) {
        Ok(v) if v == "symmetric" => Barrier::Symmetric,
        Ok(v) if v == "asymmetric" || v.is_empty() => Barrier::Asymmetric,
        Ok(v) => {
            eprintln!(
                "foliocache: {BARRIER_VAR}={v:?} is neither \"symmetric\" nor \"asymmetric\"; \
                 using the default (asymmetric where the kernel allows it)"
            );
            Barrier::Asymmetric
        }
        Err(_) => Barrier::Asymmetric,
    };
    if wanted == Barrier::Asymmetric && membarrier::register().is_ok() {
        Barrier::Asymmetric
    } else {
        Barrier::Symmetric
    }
}

/// The kernel's process-wide barrier, `membarrier(2)`.
#[cfg(not(loom))]
mod membarrier {
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (linux/membarrier.h).
    const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    fn call(cmd: libc::c_int) -> std::io::Result<()> {
        // SAFETY: membarrier takes a command and two integer arguments (flags 0, cpu id
        // unused); it reads and writes no memory of this process.
        let r = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Registers the process for [`heavy`] (once is enough; a forked child inherits it).
    pub(super) fn register() -> std::io::Result<()> {
        call(REGISTER_PRIVATE_EXPEDITED)
    }

    /// Returns once every CPU running a thread of this process has executed a full memory
    /// barrier (a CPU that switches to one of them later does so on the way in). Registers
    /// again if the kernel says the process is not registered.
    pub(super) fn heavy() -> std::io::Result<()> {
        match call(PRIVATE_EXPEDITED) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                register()?;
                call(PRIVATE_EXPEDITED)
            }
            other => other,
        }
    }
}

type Deferred = Box<dyn FnOnce() + Send>;

struct Participant {
    state: CachePadded<AtomicU64>,
    /// Under loom, this thread's side of the heavy barrier's model.
    #[cfg(loom)]
    model: loom_heavy::Side,
}

#[derive(Default)]
struct Garbage {
    /// Deferred functions with their tags, oldest (lowest tag) first.
    queue: VecDeque<(u64, Deferred)>,
    /// Defers since the last advance attempt.
    since_advance: usize,
    /// When the last heavy barrier was made (asymmetric mode).
    #[cfg(not(loom))]
    last_heavy: Option<std::time::Instant>,
    /// The heavy barrier failed: no advance is made any more (see the module comment).
    #[cfg(not(loom))]
    stuck: bool,
    /// Under loom: the number of the last heavy barrier requested.
    #[cfg(loom)]
    heavy_generation: usize,
}

/// Readers outside this process whose pins count too: a shared cache's client threads (see
/// [`add_external`]).
pub trait External: Send + Sync {
    /// Whether every pin of these readers is idle or taken in `epoch` (read after the advance's
    /// `SeqCst` fence, with relaxed loads, as the participants are).
    fn caught_up(&self, epoch: u64) -> bool;

    /// The epoch moved to `epoch`: the readers pin with this value from now on.
    fn advanced(&self, epoch: u64);
}

/// What every pin reads: the epoch and the mode, on one line that only advances write.
struct Head {
    epoch: AtomicU64,
    /// Set once, before any pin: the pins' barrier is a compiler fence ([`Barrier`]).
    #[cfg(not(loom))]
    asymmetric: bool,
    /// Under loom a model chooses the mode ([`model_barrier`]) before its threads pin.
    #[cfg(loom)]
    asymmetric: std::sync::atomic::AtomicBool,
    /// Under loom: the flawed variant that skips the heavy barrier ([`model_without_heavy_barrier`]).
    #[cfg(loom)]
    skip_heavy: std::sync::atomic::AtomicBool,
}

impl Head {
    #[inline]
    fn asymmetric(&self) -> bool {
        #[cfg(not(loom))]
        return self.asymmetric;
        #[cfg(loom)]
        return self.asymmetric.load(std::sync::atomic::Ordering::Relaxed);
    }
}

/// The global state: the epoch, the participants, the queue of deferred functions.
struct Domain {
    head: CachePadded<Head>,
    participants: Mutex<Vec<Arc<Participant>>>,
    /// Readers in other processes (a shared cache's owner has its clients here).
    externals: Mutex<Vec<Arc<dyn External>>>,
    garbage: Mutex<Garbage>,
    /// Deferred functions not yet run (statistics and tests).
    pending: PlainUsize,
}

impl Domain {
    fn new() -> Self {
        #[cfg(not(loom))]
        let asymmetric = choose_barrier() == Barrier::Asymmetric;
        #[cfg(loom)]
        let asymmetric = std::sync::atomic::AtomicBool::new(false);
        Self {
            head: CachePadded::new(Head {
                epoch: AtomicU64::new(1),
                asymmetric,
                #[cfg(loom)]
                skip_heavy: std::sync::atomic::AtomicBool::new(false),
            }),
            participants: Mutex::ranked(crate::sync::order::Rank::EpochParticipants, Vec::new()),
            externals: Mutex::ranked(crate::sync::order::Rank::EpochParticipants, Vec::new()),
            garbage: Mutex::ranked(crate::sync::order::Rank::EpochGarbage, Garbage::default()),
            pending: PlainUsize::new(0),
        }
    }

    /// Moves the epoch up by one if every participant is idle or pinned in the current epoch.
    /// Called with the garbage lock held (advances are serialised by it). Returns the epoch.
    fn try_advance(&self, _serialised: &mut Garbage) -> u64 {
        let epoch = self.head.epoch.load(Ordering::Relaxed);
        // Pairs with the fence after a symmetric or external pin: a participant this scan sees
        // idle pins later, and its loads then see every unlink made before this point. (In
        // asymmetric mode the heavy barrier made before the scans does this for local pins.)
        fence(Ordering::SeqCst);
        let all_caught_up = self
            .participants
            .lock()
            .iter()
            .all(|p| pin_caught_up(p.state.load(Ordering::Relaxed), epoch));
        if !all_caught_up {
            return epoch;
        }
        let externals = self.externals.lock().clone();
        if !externals.iter().all(|e| e.caught_up(epoch)) {
            return epoch;
        }
        // Pairs with the unpins (release) read above: the reads their readers made while pinned
        // happen before anything freed after this advance.
        fence(Ordering::Acquire);
        self.head.epoch.store(epoch + 1, Ordering::Release);
        // After the store: a reader elsewhere that reads the old value pins an epoch that is
        // already behind, which only holds the next advance back (see `external_pin`).
        for external in &externals {
            external.advanced(epoch + 1);
        }
        epoch + 1
    }

    /// Takes out of the queue the functions whose grace period is over.
    fn expired(&self, garbage: &mut Garbage, epoch: u64) -> Vec<Deferred> {
        let expired = garbage
            .queue
            .iter()
            .take_while(|&&(tag, _)| tag + 2 <= epoch)
            .count();
        garbage.queue.drain(..expired).map(|(_, f)| f).collect()
    }

    /// Up to two advances (each needs every participant caught up), then the expired functions.
    fn advance_and_take(&self, garbage: &mut Garbage) -> Vec<Deferred> {
        garbage.since_advance = 0;
        let mut epoch = self.head.epoch.load(Ordering::Relaxed);
        // Skipping an attempt only makes frees wait (see the module comment).
        if garbage.queue.is_empty() || self.visibly_held_back(epoch) || !self.heavy_barrier(garbage)
        {
            return self.expired(garbage, epoch);
        }
        for _ in 0..2 {
            let next = self.try_advance(garbage);
            if next == epoch {
                break;
            }
            epoch = next;
        }
        self.expired(garbage, epoch)
    }

    /// In asymmetric mode, whether a participant is seen pinned in an epoch other than `epoch`,
    /// so that an advance now would fail (and its heavy barrier would interrupt the readers for
    /// nothing). Relaxed loads: a stale answer only skips or makes an attempt.
    #[cfg(not(loom))]
    fn visibly_held_back(&self, epoch: u64) -> bool {
        self.head.asymmetric()
            && self
                .participants
                .lock()
                .iter()
                .any(|p| !pin_caught_up(p.state.load(Ordering::Relaxed), epoch))
    }

    #[cfg(loom)]
    fn visibly_held_back(&self, _epoch: u64) -> bool {
        false
    }

    /// In asymmetric mode, the barrier every local reader executes on the advancer's behalf
    /// (once per attempt, see the module comment). Returns whether advances may be made.
    #[cfg(not(loom))]
    fn heavy_barrier(&self, garbage: &mut Garbage) -> bool {
        if !self.head.asymmetric() {
            return true;
        }
        if garbage.stuck {
            return false;
        }
        match membarrier::heavy() {
            Ok(()) => {
                garbage.last_heavy = Some(std::time::Instant::now());
                true
            }
            // Out of memory for the call's CPU mask: this attempt only.
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => false,
            Err(e) => {
                garbage.stuck = true;
                eprintln!(
                    "foliocache: membarrier failed ({e}); memory deferred for lockless readers \
                     is no longer freed in this process (set {BARRIER_VAR}=symmetric to avoid this)"
                );
                false
            }
        }
    }

    /// Under loom: every other registered thread executes a `SeqCst` fence at one of its
    /// barrier points, or is parked, or has gone (see [`loom_heavy`]).
    #[cfg(loom)]
    fn heavy_barrier(&self, garbage: &mut Garbage) -> bool {
        if !self.head.asymmetric()
            || self
                .head
                .skip_heavy
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return true;
        }
        let me = LOCAL.try_with(|l| Arc::clone(&l.participant)).ok();
        let others: Vec<Arc<Participant>> = self
            .participants
            .lock()
            .iter()
            .filter(|p| !me.as_ref().is_some_and(|me| Arc::ptr_eq(p, me)))
            .cloned()
            .collect();
        loom_heavy::barrier(
            &mut garbage.heavy_generation,
            others.iter().map(|p| &p.model),
        );
        true
    }

    /// Whether `defer` may attempt an advance now (the heavy barrier's rate limit).
    fn may_attempt(&self, garbage: &Garbage) -> bool {
        if garbage.since_advance < ADVANCE_EVERY {
            return false;
        }
        #[cfg(not(loom))]
        if self.head.asymmetric()
            && garbage
                .last_heavy
                .is_some_and(|t| t.elapsed() < MIN_HEAVY_INTERVAL)
        {
            return false;
        }
        true
    }

    fn run(&self, ready: Vec<Deferred>) {
        // Counted out before running: were one to panic, the rest would be dropped unrun (their
        // memory leaked) and the count would still be right.
        self.pending.fetch_sub(ready.len(), PlainOrdering::Relaxed);
        for f in ready {
            f();
        }
    }

    /// Takes the garbage lock. Under loom a thread blocked here counts as having executed the
    /// heavy barrier (a thread asleep in the kernel has, on the way in and out).
    fn lock_garbage(&self) -> crate::sync::MutexGuard<'_, Garbage> {
        #[cfg(loom)]
        if self.head.asymmetric() {
            let me = LOCAL.with(|l| Arc::clone(&l.participant));
            me.model.park();
            let garbage = self.garbage.lock();
            me.model.unpark();
            return garbage;
        }
        self.garbage.lock()
    }

    fn defer(&self, f: Deferred) {
        let ready = {
            let mut garbage = self.lock_garbage();
            // Orders the caller's unlink before the tag is read (see the module comment).
            fence(Ordering::SeqCst);
            let tag = self.head.epoch.load(Ordering::Relaxed);
            garbage.queue.push_back((tag, f));
            self.pending.fetch_add(1, PlainOrdering::Relaxed);
            garbage.since_advance += 1;
            if self.may_attempt(&garbage) {
                self.advance_and_take(&mut garbage)
            } else {
                Vec::new()
            }
        };
        // Outside the lock: the functions may free memory to allocators with locks of their own,
        // or defer again.
        self.run(ready);
    }

    fn collect(&self) {
        let ready = {
            let mut garbage = self.lock_garbage();
            self.advance_and_take(&mut garbage)
        };
        self.run(ready);
    }

    fn register(&self) -> Arc<Participant> {
        let participant = Arc::new(Participant {
            state: CachePadded::new(AtomicU64::new(IDLE)),
            #[cfg(loom)]
            model: loom_heavy::Side::new(),
        });
        self.participants.lock().push(Arc::clone(&participant));
        participant
    }

    fn unregister(&self, participant: &Arc<Participant>) {
        self.participants
            .lock()
            .retain(|p| !Arc::ptr_eq(p, participant));
    }
}

#[cfg(loom)]
impl Drop for Domain {
    /// End of a loom execution: no reader is left, everything deferred can run.
    fn drop(&mut self) {
        let queue = std::mem::take(&mut self.garbage.lock().queue);
        for (_, f) in queue {
            f();
        }
    }
}

#[cfg(not(loom))]
fn domain() -> &'static Domain {
    static DOMAIN: std::sync::OnceLock<Domain> = std::sync::OnceLock::new();
    DOMAIN.get_or_init(Domain::new)
}

/// Under loom the domain is a per-execution static, dropped when the model's closure returns,
/// before the model thread's own thread-locals: so each `Local` keeps it alive with an `Arc`.
#[cfg(loom)]
fn domain() -> Arc<Domain> {
    loom::lazy_static! {
        static ref DOMAIN: Arc<Domain> = Arc::new(Domain::new());
    }
    Arc::clone(&DOMAIN)
}

#[cfg(not(loom))]
type DomainRef = &'static Domain;
#[cfg(loom)]
type DomainRef = Arc<Domain>;

/// A thread's membership: its participant and how deeply it is pinned.
struct Local {
    domain: DomainRef,
    participant: Arc<Participant>,
    depth: Cell<usize>,
    /// The thread's [`thread_slot`](crate::sync::thread_slot), kept here so a reader that
    /// pinned has it without a second thread-local access.
    slot: usize,
}

impl Local {
    fn new() -> Self {
        let domain = domain();
        let participant = domain.register();
        Self {
            domain,
            participant,
            depth: Cell::new(0),
            slot: crate::sync::thread_slot(),
        }
    }

    #[inline]
    fn pin(&self) {
        let depth = self.depth.get();
        self.depth.set(depth + 1);
        if depth == 0 {
            self.barrier_point();
            // Acquire: a reader that reads an epoch reads after the unlinks made before the
            // advance that stored it.
            let epoch = self.domain.head.epoch.load(Ordering::Acquire);
            if self.domain.head.asymmetric() {
                self.barrier_point();
                self.participant
                    .state
                    .store(pinned(epoch), Ordering::Release);
                // The compiler keeps the reads after the store; the CPU's ordering comes from
                // the advancer's heavy barrier. This steps outside the language's memory model:
                // the kernel's call acts as a signal handler running a `SeqCst` fence on each
                // thread, and a compiler fence (C++'s signal fence) is what pairs with that, the
                // scheme of asymmetric fences in folly and in C++ proposal P1202.
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                self.barrier_point();
            } else {
                publish_pin(&self.participant.state, pinned(epoch));
            }
        }
    }

    #[inline]
    fn unpin(&self) {
        let depth = self.depth.get() - 1;
        self.depth.set(depth);
        if depth == 0 {
            self.barrier_point();
            // Release: everything read while pinned happens before a free that follows an
            // advance which saw this store.
            self.participant.state.store(IDLE, Ordering::Release);
            self.barrier_point();
        }
    }

    /// Where, under loom, this thread may execute a heavy barrier an advancer asked for.
    #[inline(always)]
    fn barrier_point(&self) {
        #[cfg(loom)]
        if self.domain.head.asymmetric() {
            self.participant.model.serve();
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.barrier_point();
        self.participant.state.store(IDLE, Ordering::Release);
        #[cfg(loom)]
        self.participant.model.leave();
        self.domain.unregister(&self.participant);
    }
}

// Shared by the thread-local slot and every guard the thread holds (an `Rc`): a guard kept in
// another thread-local that is destroyed after this one still unpins the right participant,
// and the participant leaves the registry only when the last of them is gone.
#[cfg(not(loom))]
std::thread_local! {
    static LOCAL: Rc<Local> = Rc::new(Local::new());
}

#[cfg(loom)]
loom::thread_local! {
    static LOCAL: Rc<Local> = Rc::new(Local::new());
}

/// An epoch pin: while it lives, nothing reachable when it was taken is freed. Not `Send` (it
/// holds an `Rc`): the pin belongs to the thread that took it. A guard that is leaked
/// (`mem::forget`) holds every later grace period back for the whole process.
#[must_use]
pub struct Guard {
    local: Rc<Local>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

/// Stores a pin word so that the loads the reader does next cannot be satisfied before an
/// advancer can see it: a release store, then a `SeqCst` fence (pairing with the fence in
/// `try_advance`). Release: see the module comment (a re-pin must carry this thread's earlier
/// reads).
///
/// On x86-64 the store and the fence are one `xchg`. A locked instruction is a full barrier in
/// the hardware (no later load is performed before it is globally visible), and as an
/// acquire-release operation the compiler moves no later load above it either. On this
/// project's AMD hosts an `mfence` after a plain store costs several times as much (timed in
/// docs/BENCHMARKS.md, "Where the cycles go"). Elsewhere,
/// and under loom (which models the language's rules, where only the fence gives the ordering
/// with the advancer's fence), the store and the fence as written.
#[inline]
fn publish_pin(word: &AtomicU64, value: u64) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    word.swap(value, Ordering::SeqCst);
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    {
        word.store(value, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

/// Pins the current thread (nested pins are a counter increment).
#[inline]
pub fn pin() -> Guard {
    // While the thread's thread-locals are being destroyed the slot is gone: such a late pin
    // gets a participant of its own, registered for this guard alone.
    let local = LOCAL
        .try_with(Rc::clone)
        .unwrap_or_else(|_| Rc::new(Local::new()));
    local.pin();
    Guard { local }
}

impl Guard {
    /// The pinning thread's [`thread_slot`](crate::sync::thread_slot).
    #[inline]
    pub(crate) fn thread_slot(&self) -> usize {
        self.local.slot
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        self.local.unpin();
    }
}

/// Whether the current thread holds a pin (it then holds the epoch back itself: waiting for a
/// grace period would wait for itself). A pin taken while the thread's thread-locals are being
/// destroyed is not seen here.
pub fn is_pinned() -> bool {
    LOCAL.try_with(|l| l.depth.get() > 0).unwrap_or(false)
}

/// Counts `external`'s readers in every grace period from now on, starting the epoch at
/// `at_least` if it is below (a shared cache's new owner starts above every epoch its clients
/// may still hold pins of, see `docs/SHARED.md`), and tells it the current epoch.
pub fn add_external(external: Arc<dyn External>, at_least: u64) {
    let domain = domain();
    let mut garbage = domain.garbage.lock();
    let before = domain.head.epoch.fetch_max(at_least, Ordering::AcqRel);
    if at_least > before {
        // A jump is not an advance: nothing was scanned. What is queued still waits for two
        // advances that scan every reader, counted from the new epoch.
        for (tag, _) in &mut garbage.queue {
            *tag = at_least;
        }
    }
    domain.externals.lock().push(Arc::clone(&external));
    external.advanced(domain.head.epoch.load(Ordering::Acquire));
    drop(garbage);
}

/// Stops counting `external`'s readers (its readers are gone, or it stops being served).
pub fn remove_external(external: &Arc<dyn External>) {
    domain()
        .externals
        .lock()
        .retain(|e| !Arc::ptr_eq(e, external));
}

/// A pin of a reader in another process, released when dropped (see [`external_pin`]).
#[cfg(not(loom))]
#[must_use]
pub(crate) struct ExternalGuard<'a> {
    pin: &'a AtomicU64,
}

#[cfg(not(loom))]
impl<'a> ExternalGuard<'a> {
    /// Pins `pin` with the epoch `mirror` holds (see [`external_pin`]).
    pub(crate) fn new(pin: &'a AtomicU64, mirror: &AtomicU64) -> Self {
        external_pin(pin, mirror);
        Self { pin }
    }
}

#[cfg(not(loom))]
impl Drop for ExternalGuard<'_> {
    fn drop(&mut self) {
        external_unpin(self.pin);
    }
}

/// A reader in another process pins: `pin` is its own word, `mirror` the epoch its cache's
/// owner publishes (`External::advanced`). As a local pin: store (release), then a `SeqCst`
/// fence before the reads it protects. The mirror may lag the owner's epoch (it is written
/// after each advance): the pin then holds a value already behind, which only holds the next
/// advance back until the reader unpins, never lets one through early.
pub fn external_pin(pin: &AtomicU64, mirror: &AtomicU64) {
    let epoch = mirror.load(Ordering::Acquire);
    publish_pin(pin, pinned(epoch));
}

/// A reader in another process unpins (release: its reads happen before a free that follows
/// an advance which saw this).
pub fn external_unpin(pin: &AtomicU64) {
    pin.store(IDLE, Ordering::Release);
}

/// Whether a pin word read by an owner is idle or pinned in `epoch`.
pub fn pin_caught_up(word: u64, epoch: u64) -> bool {
    word == IDLE || word == pinned(epoch)
}

/// Runs `f` once every thread pinned now has unpinned. The caller must have made what `f` frees
/// unreachable for readers that pin from now on before calling.
///
/// `f` runs inline, inside some later `defer` or [`collect`] on whatever thread makes that call,
/// which may hold locks of its own (an index's writer lock, say): it must not block, and must
/// take no lock such a caller could hold. In this crate the functions free index nodes and
/// return blocks to the allocator.
pub fn defer(f: impl FnOnce() + Send + 'static) {
    domain().defer(Box::new(f));
}

/// Tries to end grace periods now (advancing the epoch as far as pinned readers allow, at most
/// twice) and runs the deferred functions whose grace period is over.
pub fn collect() {
    domain().collect();
}

/// Deferred functions not yet run (across the process; under loom, the execution).
pub fn pending() -> usize {
    domain().pending.load(PlainOrdering::Relaxed)
}

/// The global epoch (tests and diagnostics).
pub fn epoch() -> u64 {
    domain().head.epoch.load(Ordering::Relaxed)
}

/// Under loom: the mode this execution's pins use, chosen by the model before any thread pins
/// (the default is symmetric).
#[cfg(loom)]
pub fn model_barrier(barrier: Barrier) {
    domain().head.asymmetric.store(
        barrier == Barrier::Asymmetric,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Under loom: asymmetric pins with advances that skip the heavy barrier, a flawed protocol a
/// model must catch.
#[cfg(loom)]
pub fn model_without_heavy_barrier() {
    model_barrier(Barrier::Asymmetric);
    domain()
        .head
        .skip_heavy
        .store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Under loom: a point in a model's reader where it may execute a heavy barrier an advancer
/// asked for (a real thread may execute it anywhere; the pin and unpin have such points too).
#[cfg(loom)]
pub fn barrier_point() {
    LOCAL.with(|l| l.barrier_point());
}

/// The model of `membarrier` under loom. An advancer numbers its request, posts the number to
/// every other registered thread and waits until each has served it (a `SeqCst` fence at one of
/// its barrier points, then an acknowledgement), is parked on the garbage lock, or has gone.
/// The posting and the acknowledgement carry happens-before both ways, as the real call does:
/// what the advancer did before it is visible to the thread after its barrier, and what the
/// thread did before its barrier is visible to the advancer after the call returns. Where the
/// thread serves the request is left to loom's scheduler, as the kernel leaves it to timing.
#[cfg(loom)]
mod loom_heavy {
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

    pub(super) struct Side {
        request: AtomicUsize,
        served: AtomicUsize,
        parked: AtomicBool,
        gone: AtomicBool,
    }

    impl Side {
        pub(super) fn new() -> Self {
            Self {
                request: AtomicUsize::new(0),
                served: AtomicUsize::new(0),
                parked: AtomicBool::new(false),
                gone: AtomicBool::new(false),
            }
        }

        /// On the thread itself: executes the barrier if one was asked for.
        pub(super) fn serve(&self) {
            let request = self.request.load(Ordering::Acquire);
            if request > self.served.load(Ordering::Relaxed) {
                fence(Ordering::SeqCst);
                self.served.store(request, Ordering::Release);
            }
        }

        /// About to block on the garbage lock (a sleeping thread needs no interrupt).
        pub(super) fn park(&self) {
            self.parked.store(true, Ordering::Release);
        }

        /// Woken with the lock: the way back from the kernel is a barrier too.
        pub(super) fn unpark(&self) {
            self.parked.store(false, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }

        /// The thread is exiting (after its last unpin).
        pub(super) fn leave(&self) {
            self.gone.store(true, Ordering::Release);
        }
    }

    /// The advancer's call (with the garbage lock held).
    pub(super) fn barrier<'a>(generation: &mut usize, others: impl Iterator<Item = &'a Side>) {
        *generation += 1;
        let request = *generation;
        fence(Ordering::SeqCst);
        let others: Vec<&Side> = others.collect();
        for side in &others {
            side.request.store(request, Ordering::Release);
        }
        for side in &others {
            while side.served.load(Ordering::Acquire) < request
                && !side.parked.load(Ordering::Acquire)
                && !side.gone.load(Ordering::Acquire)
            {
                loom::thread::yield_now();
            }
        }
        fence(Ordering::SeqCst);
    }
}

/// The barrier this process's pins use, chosen when the process first uses the epochs (a pin, a
/// defer, building a cache, or this call).
pub fn barrier() -> Barrier {
    if domain().head.asymmetric() {
        Barrier::Asymmetric
    } else {
        Barrier::Symmetric
    }
}

/// The epoch's locks, held by a thread that is about to fork (see [`crate::fork`]).
#[cfg(not(loom))]
pub(crate) struct ForkHold {
    me: Option<Arc<Participant>>,
    garbage: crate::sync::MutexGuard<'static, Garbage>,
    participants: crate::sync::MutexGuard<'static, Vec<Arc<Participant>>>,
}

/// Takes the epoch's locks (garbage, then participants: the order `try_advance` takes them in),
/// so no other thread holds one when the process forks.
#[cfg(not(loom))]
pub(crate) fn hold_for_fork() -> ForkHold {
    // Registers this thread first, if it never pinned (that takes the participants' lock).
    let me = LOCAL.try_with(|l| Arc::clone(&l.participant)).ok();
    let domain = domain();
    let garbage = domain.garbage.lock();
    let participants = domain.participants.lock();
    ForkHold {
        me,
        garbage,
        participants,
    }
}

#[cfg(not(loom))]
impl ForkHold {
    /// In the child: only the forking thread came along. The other threads' participants (some
    /// may have been pinned, which would hold every grace period back forever) are dropped,
    /// and the deferred functions are forgotten: they free memory of caches the child must not
    /// use (their threads did not come along either), whose locks a vanished thread may hold.
    pub(crate) fn child(mut self) {
        let me = self.me.take();
        self.participants
            .retain(|p| me.as_ref().is_some_and(|me| Arc::ptr_eq(p, me)));
        let queue = std::mem::take(&mut self.garbage.queue);
        self.garbage.since_advance = 0;
        std::mem::forget(queue);
        domain().pending.store(0, PlainOrdering::Relaxed);
    }
}

/// For loom models of code that frees what readers use: stands for an object's memory and
/// records reads and writes of it with loom's causality checker, which reports a read and a
/// write not ordered by happens-before. It holds no data.
#[cfg(loom)]
#[derive(Debug, Default)]
pub struct AccessTracker(loom::cell::UnsafeCell<()>);

// SAFETY: the cell holds `()` and is never dereferenced (only `with`/`with_mut` with closures
// that ignore the pointer), so sharing it between threads shares no data.
#[cfg(loom)]
unsafe impl Sync for AccessTracker {}

#[cfg(loom)]
impl AccessTracker {
    /// Records a read of the object.
    pub fn read(&self) {
        self.0.with(|_| ());
    }
    /// Records a write of the object (its free).
    pub fn write(&self) {
        self.0.with_mut(|_| ());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn runs_only_after_every_earlier_pin_is_gone() {
        let ran = Arc::new(AtomicBool::new(false));
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let guard = pin();
            pinned_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        pinned_rx.recv().unwrap();
        let flag = Arc::clone(&ran);
        defer(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
        for _ in 0..10 {
            collect();
        }
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "ran while a reader pinned before the defer was still pinned"
        );
        release_tx.send(()).unwrap();
        reader.join().unwrap();
        // Other tests of this binary pin too (briefly): collect until they let go.
        let start = std::time::Instant::now();
        while !ran.load(std::sync::atomic::Ordering::SeqCst) {
            collect();
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never ran after the reader unpinned"
            );
            std::thread::yield_now();
        }
    }

    /// Readers elsewhere that are always caught up.
    struct NoReaders;
    impl External for NoReaders {
        fn caught_up(&self, _epoch: u64) -> bool {
            true
        }
        fn advanced(&self, _epoch: u64) {}
    }

    #[test]
    fn an_epoch_raised_by_a_new_external_still_waits_for_pinned_readers() {
        let ran = Arc::new(AtomicBool::new(false));
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let guard = pin();
            pinned_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        pinned_rx.recv().unwrap();
        let flag = Arc::clone(&ran);
        defer(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
        // A shared cache's new owner starts the epoch far above the one the reader pinned.
        let external: Arc<dyn External> = Arc::new(NoReaders);
        add_external(Arc::clone(&external), epoch() + 10);
        for _ in 0..10 {
            collect();
        }
        let early = ran.load(std::sync::atomic::Ordering::SeqCst);
        release_tx.send(()).unwrap();
        reader.join().unwrap();
        remove_external(&external);
        assert!(
            !early,
            "ran while a reader pinned before the defer (and before the jump) was still pinned"
        );
        let start = std::time::Instant::now();
        while !ran.load(std::sync::atomic::Ordering::SeqCst) {
            collect();
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never ran after the reader unpinned"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_barrier_is_asymmetric_where_the_kernel_allows_it() {
        let wanted = std::env::var(BARRIER_VAR).ok();
        if wanted.as_deref() == Some("symmetric") {
            assert_eq!(barrier(), Barrier::Symmetric);
        } else if membarrier::register().is_ok() {
            assert_eq!(barrier(), Barrier::Asymmetric);
        }
    }

    #[test]
    fn nested_pins_unpin_once() {
        let outer = pin();
        let inner = pin();
        assert!(is_pinned());
        drop(inner);
        assert!(is_pinned());
        drop(outer);
        assert!(!is_pinned());
    }

    #[test]
    fn a_pin_taken_after_the_defer_does_not_hold_it_back() {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        defer(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
        // Other tests' threads may be pinned briefly; keep collecting until they let go.
        let start = std::time::Instant::now();
        while !ran.load(std::sync::atomic::Ordering::SeqCst) {
            let _late = pin();
            drop(_late);
            collect();
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "a deferred function never ran"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn exited_threads_leave_no_participant_behind() {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    drop(pin());
                    LOCAL.with(|l| Arc::downgrade(&l.participant))
                })
            })
            .collect();
        for t in threads {
            let participant = t.join().unwrap();
            // Held by the thread's `Local` and by the registry: both must be gone.
            assert_eq!(
                participant.strong_count(),
                0,
                "participant still registered"
            );
        }
    }
}
