//! A process attached to a shared cache: its attachment (the mapping, the control connection,
//! its threads' slots) and its files. Hits are served here alone: pin the thread's slot, walk
//! the file's index (the speculative lookup, every node offset checked), copy optimistically.
//! Everything else is a request to the owner (`docs/SHARED.md`, "What each process does").
//!
//! A client holds nothing an owner would need back if it died: its slots, which the owner
//! clears when its connection closes. When the owner dies, the first thread to notice starts
//! or finds the next owner (handing it this process's memfd, so the cache's pages are kept),
//! claims this process's slots and opens its files again; requests in flight are run again by
//! the new owner, since they are still in the slots.

use super::mailbox::{self, CLAIMED, DONE, FREE, SUBMITTED, at, op};
use super::runtime::{self, Paths, shared_error};
use super::wire::{self, Conn, Msg, kind};
use crate::error::Error;
use crate::index::{Entry, Index};
use crate::mem::epoch::ExternalGuard;
use crate::mem::nodes::{NodeSpace, ViewOnly};
use crate::mem::optimistic::FolioView;
use crate::mem::shared::{MAIL_WORDS, SETTINGS_WORDS, SharedMap, ThreadSlot};
use crate::mem::{PAGE_SHIFT, flag};
use crate::policy::RefcountPolicy;
use crate::readahead::RaState;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

/// How long a client sleeps on its mailbox before checking that the owner is alive.
const OWNER_CHECK: Duration = Duration::from_millis(50);

/// How long a request may wait before the client says so on standard error.
const SLOW_REQUEST: Duration = Duration::from_secs(10);

/// Why one try at attaching to a new owner failed.
enum Reattach {
    /// The new owner went away too (its connection closed): the next one is tried.
    OwnerGone(Error),
    /// Anything else: the recovery fails with it.
    Failed(Error),
}

static NEXT_ATTACHMENT: AtomicU64 = AtomicU64::new(1);

/// A process's attachment to one shared cache (see the module documentation).
pub(crate) struct Attachment {
    id: u64,
    /// The process that attached. A forked child has a copy of this attachment but not the
    /// parent's connection or thread slots: it must attach anew, and this one refuses it
    /// (and never releases the parent's slots from there).
    /// (The process is told by its fork generation, `io::forks`: no system call per read.)
    forks: u64,
    paths: Paths,
    settings: [u64; SETTINGS_WORDS],
    owner_program: Option<PathBuf>,
    pub(crate) map: Arc<SharedMap>,
    /// A read-only view of each file record's index (built once: a file's record can change
    /// after an owner's takeover, and its view is then simply another one of these).
    views: Box<[Index]>,
    pub(crate) policy: RefcountPolicy,
    conn: Mutex<Option<Conn>>,
    /// Bumped at each connection to an owner (the first, and each after a takeover).
    generation: AtomicU64,
    process_slot: AtomicU32,
    recovering: Mutex<()>,
    /// Thread slots this process claimed.
    claimed: Mutex<Vec<u32>>,
    /// Files open here, to open again with a new owner.
    files: Mutex<Vec<Weak<ClientFile>>>,
    /// The largest readahead window (pages), to bound what a mailbox answer carries.
    pub(crate) max_ra_pages: u64,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("name", &self.paths.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

fn io_error(name: &str, what: &str, e: std::io::Error) -> Error {
    shared_error(name, format!("{what}: {e}"))
}

impl Attachment {
    /// Attaches to shared cache `name`, starting its owner if none runs (with `settings`,
    /// which only a new cache takes).
    pub(crate) fn attach(
        name: &str,
        settings: [u64; SETTINGS_WORDS],
        owner_program: Option<PathBuf>,
        max_ra_pages: u64,
    ) -> Result<Arc<Self>, Error> {
        crate::inject::kill::arm_client_points_from_env();
        let paths = Paths::of(name)?;
        let (conn, welcome, memfd) =
            connect_or_start(&paths, &settings, owner_program.as_deref(), None, None)?;
        let memfd = memfd.ok_or_else(|| shared_error(name, "the owner sent no mapping"))?;
        // Where this process holds the mapping: a new owner started by a process that holds
        // none finds it here (`NAME.clients`), if this owner dies before this process makes
        // a request. A failure only loses that.
        let _ = conn.call(&Msg::new(kind::MEMFD, &[memfd.as_raw_fd() as u64]), None);
        let map = Arc::new(SharedMap::attach(memfd)?);
        let policy = match map.fixed().settings[super::settings::REFCOUNT] {
            1 => RefcountPolicy::Cas,
            _ => RefcountPolicy::FrozenBit,
        };
        let (base, pages) = map.arena();
        let space: Arc<dyn NodeSpace> = Arc::new(ViewOnly {
            base: base.as_ptr() as usize,
            len: pages * crate::mem::PAGE_SIZE,
        });
        let meter = Arc::new(crate::mem::NodeMeter::default());
        let views = (0..map.files().len())
            .map(|record| {
                Index::of_record(&map, record, Arc::clone(&space), Arc::clone(&meter), false)
            })
            .collect::<Result<Box<[Index]>, Error>>()?;
        let attachment = Arc::new(Self {
            id: NEXT_ATTACHMENT.fetch_add(1, Ordering::Relaxed),
            forks: crate::io::forks::generation(),
            paths,
            settings,
            owner_program,
            map,
            views,
            policy,
            conn: Mutex::new(Some(conn)),
            generation: AtomicU64::new(1),
            process_slot: AtomicU32::new(welcome.word(0).unwrap_or(0) as u32),
            recovering: Mutex::new(()),
            claimed: Mutex::new(Vec::new()),
            files: Mutex::new(Vec::new()),
            max_ra_pages,
        });
        Ok(attachment)
    }

    pub(crate) fn name(&self) -> &str {
        &self.paths.name
    }

    /// A control request and its answer, going to a new owner if the current one died.
    pub(crate) fn control(
        self: &Arc<Self>,
        msg: &Msg,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(Msg, Option<OwnedFd>), Error> {
        self.check_process()?;
        for _ in 0..3 {
            let generation = self.generation.load(Ordering::Acquire);
            let result = {
                let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
                match conn.as_ref() {
                    Some(conn) => conn.call(msg, fd),
                    None => Err(std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "not connected",
                    )),
                }
            };
            match result {
                Ok(answer) => return Ok(answer),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::NotConnected
                    ) =>
                {
                    self.recover(generation)?;
                }
                Err(e) => return Err(io_error(self.name(), "the owner refused the request", e)),
            }
        }
        Err(shared_error(
            self.name(),
            "the owner kept dying while answering a request",
        ))
    }

    /// Whether the owner this process is connected to has gone.
    fn owner_gone(&self) -> bool {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_none_or(Conn::closed)
    }

    /// After the owner died: connects to (or starts) the next one, handing it this process's
    /// memfd, claims this process's slots again and opens its files again. Nothing to do if
    /// another thread already did it since `seen` (a generation).
    fn recover(self: &Arc<Self>, seen: u64) -> Result<(), Error> {
        // A request made while this thread recovers this attachment (a program's hook reached
        // from inside the recovery) would wait for the lock this thread holds: refuse it.
        if RECOVERING.get() == self.id {
            return Err(shared_error(
                self.name(),
                "the owner is gone and this thread is starting the next one",
            ));
        }
        let _one = self
            .recovering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let _recovering = Mark::set(&RECOVERING, self.id);
        // Every call the recovery makes is the library's own (reading an owner's start time
        // in /proc, the owner's log and spawn), whatever called the cache: see
        // `starting_owner`.
        let _starting = Starting::set();
        self.recover_locked(seen)
    }

    /// [`Self::recover`] with its lock held.
    fn recover_locked(self: &Arc<Self>, seen: u64) -> Result<(), Error> {
        if self.generation.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        // The new owner can die too before this process is attached to it again (a kill
        // storm kills every owner in turn): then the next one is started, until the time a
        // start may take has passed.
        let deadline = Instant::now() + runtime::START_TIMEOUT;
        loop {
            match self.reattach() {
                Ok(()) => return Ok(()),
                Err(Reattach::OwnerGone(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(Reattach::OwnerGone(e) | Reattach::Failed(e)) => return Err(e),
            }
        }
    }

    /// One try of [`Self::recover`]: connects to (or starts) an owner, then attaches again.
    fn reattach(self: &Arc<Self>) -> Result<(), Reattach> {
        let (conn, welcome, memfd) = connect_or_start(
            &self.paths,
            &self.settings,
            self.owner_program.as_deref(),
            Some(self.map.fd()),
            Some(self.process_slot.load(Ordering::Acquire)),
        )
        .map_err(Reattach::Failed)?;
        if let Some(memfd) = memfd {
            let theirs = SharedMap::attach(memfd).map_err(Reattach::Failed)?;
            if theirs.fixed().cache_id != self.map.fixed().cache_id {
                return Err(Reattach::Failed(shared_error(
                    self.name(),
                    "the cache this process attached to was replaced by another (destroyed, or \
                     its owner and every process holding it died): attach again",
                )));
            }
        }
        let process = welcome.word(0).unwrap_or(0) as u32;
        self.process_slot.store(process, Ordering::Release);
        let claimed = self
            .claimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for slot in claimed {
            self.map.threads()[slot as usize]
                .claim
                .store(CLAIMED | process, Ordering::Release);
            conn.call(&Msg::new(kind::CLAIM, &[u64::from(slot)]), None)
                .map_err(|e| {
                    Reattach::OwnerGone(io_error(
                        self.name(),
                        "claiming a slot from the new owner",
                        e,
                    ))
                })?;
        }
        let files: Vec<Arc<ClientFile>> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for file in files {
            let fd = file.fd.read().unwrap_or_else(PoisonError::into_inner);
            let Some(fd) = fd.as_ref() else {
                continue; // detached: its next attach opens it with this owner
            };
            let (answer, _) = conn
                .call(&file.open_message(), Some(fd.as_fd()))
                .map_err(|e| {
                    Reattach::OwnerGone(io_error(
                        self.name(),
                        "opening a file with the new owner",
                        e,
                    ))
                })?;
            file.bind(&answer).map_err(Reattach::Failed)?;
        }
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// This thread's slot (claimed on first use).
    pub(crate) fn slot(self: &Arc<Self>) -> Result<u32, Error> {
        self.check_process()?;
        if let Some(slot) = thread_claim(self.id) {
            return Ok(slot);
        }
        let process = self.process_slot.load(Ordering::Acquire);
        let threads = self.map.threads();
        let slot = threads
            .iter()
            .position(|t| {
                t.claim
                    .compare_exchange(0, CLAIMED | process, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| {
                shared_error(
                    self.name(),
                    format!(
                        "all {} thread slots are in use (too many threads using the cache)",
                        threads.len()
                    ),
                )
            })? as u32;
        self.claimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(slot);
        crate::inject::kill::point("client-claimed");
        if let Err(e) = self.control(&Msg::new(kind::CLAIM, &[u64::from(slot)]), None) {
            self.forget_slot(slot, process);
            return Err(e);
        }
        // Given back when this thread ends, by a pthread key's destructor: those run after
        // the thread-locals' destructors, so also for a slot claimed from a C program's key
        // destructor (see `thread_exit`). A thread that ends the process never gets there: the
        // process's detach (or death) frees its slots with the others in `claimed`.
        thread_record(self.id, slot);
        let (id, attachment) = (self.id, Arc::downgrade(self));
        // Not registered (the process used up every pthread key): the slot stays claimed until
        // the process detaches.
        let _ = crate::io::thread_exit::later(Box::new(move || {
            if thread_forget(id, slot)
                && let Some(attachment) = attachment.upgrade()
            {
                attachment.release_slot(slot);
            }
        }));
        Ok(slot)
    }

    /// A claim the owner did not take: the slot goes back, if its claim word is still this
    /// process's (else whoever holds it now keeps it).
    fn forget_slot(&self, slot: u32, process: u32) {
        self.claimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&s| s != slot);
        let t = &self.map.threads()[slot as usize];
        if t.claim.load(Ordering::Acquire) == CLAIMED | process {
            t.state.store(FREE, Ordering::Release);
            t.pin.store(0, Ordering::Release);
            let _ =
                t.claim
                    .compare_exchange(CLAIMED | process, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Whether this process is the one that attached (not a forked child of it).
    fn in_attaching_process(&self) -> bool {
        self.forks == crate::io::forks::generation()
    }

    /// Refuses a forked child's use of its parent's attachment.
    fn check_process(&self) -> Result<(), Error> {
        if self.in_attaching_process() {
            Ok(())
        } else {
            Err(shared_error(
                self.name(),
                "this cache was attached by the parent process; a forked child attaches anew \
                 (Cache::builder().shared(..).build() in the child)",
            ))
        }
    }

    /// A thread is gone: its slot goes back.
    fn release_slot(self: &Arc<Self>, slot: u32) {
        if !self.in_attaching_process() {
            return; // the parent's slot, copied into a forked child's thread
        }
        // Forgotten here first, and the claim word left to the owner: once the owner has
        // freed the slot another process may claim it at once, and a store here after that
        // would wipe that process's claim (its CLAIM then refused: "a claim of a slot this
        // process did not take"). Were the release lost, the owner frees the slot when this
        // process detaches.
        self.claimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&s| s != slot);
        let _ = self.control(&Msg::new(kind::RELEASE, &[u64::from(slot)]), None);
    }

    /// Sends a request through this thread's mailbox and waits for the answer.
    pub(crate) fn call(
        self: &Arc<Self>,
        request: &[u64; MAIL_WORDS],
    ) -> Result<[u64; MAIL_WORDS], Error> {
        self.call_with(request, None)
    }

    /// [`Self::call`], with `payload` copied into the thread's staging folio first (a write's
    /// bytes). If an owner takes the slot away while the request waits (it freed the slot of
    /// a process it took for dead: the request is gone, and the slot may be another's now),
    /// the request is made again in a new slot, payload included; requests are idempotent.
    pub(crate) fn call_with(
        self: &Arc<Self>,
        request: &[u64; MAIL_WORDS],
        payload: Option<&[u8]>,
    ) -> Result<[u64; MAIL_WORDS], Error> {
        loop {
            let slot = self.slot()?;
            if let Some(data) = payload {
                let (pfn, order, _) = self.staging()?;
                if !self.map.copy_in(pfn, order, 0, data) {
                    return Err(Error::SharedMapping(
                        "the thread's staging folio lies outside the arena".to_owned(),
                    ));
                }
            }
            if let Some(reply) = self.submit(slot, request)? {
                return Ok(reply);
            }
            self.lose_slot(slot);
        }
    }

    /// A slot an owner took away: this thread and this process forget it, touching none of
    /// its words (another process may hold it now).
    fn lose_slot(&self, slot: u32) {
        self.claimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&s| s != slot);
        thread_forget(self.id, slot);
    }

    /// Submits `request` in `slot` and waits: the answer, or `None` if the slot was taken
    /// away meanwhile.
    fn submit(
        self: &Arc<Self>,
        slot: u32,
        request: &[u64; MAIL_WORDS],
    ) -> Result<Option<[u64; MAIL_WORDS]>, Error> {
        let t = &self.map.threads()[slot as usize];
        let mut generation = self.generation.load(Ordering::Acquire);
        mailbox::write_request(t, request);
        t.seq.fetch_add(1, Ordering::Relaxed);
        t.state.store(SUBMITTED, Ordering::Release);
        mailbox::wake(&t.state);
        let asked = Instant::now();
        let mut said = false;
        loop {
            let state = t.state.load(Ordering::Acquire);
            if !said && asked.elapsed() > SLOW_REQUEST {
                // Not an error (a large write-back can take this long), but a hang must be
                // diagnosable: say where the request stands.
                said = true;
                eprintln!(
                    "foliocache: shared cache {}: request {} in thread slot {slot} waiting {:?}: \
                     state {state}, claim {:#x}, staging {}, owner pid {}",
                    self.name(),
                    request[at::OP],
                    asked.elapsed(),
                    t.claim.load(Ordering::Relaxed),
                    t.staging.load(Ordering::Relaxed),
                    self.map.live().owner_pid.load(Ordering::Relaxed)
                );
            }
            if state == DONE {
                let reply = mailbox::read_reply(t);
                t.state.store(FREE, Ordering::Release);
                return Ok(Some(reply));
            }
            if state == FREE
                || t.claim.load(Ordering::Acquire)
                    != CLAIMED | self.process_slot.load(Ordering::Acquire)
            {
                // Only an owner frees a slot whose request waits: it is gone.
                if self.generation.load(Ordering::Acquire) == generation && !self.owner_gone() {
                    return Ok(None);
                }
            }
            // A write's answer comes without the device (the owner copies, and writes through
            // to the kernel's page cache): poll for it first, while a server has it. A read may
            // wait for the device: sleep at once.
            let soon = request[at::OP] == op::WRITE;
            if !(soon && mailbox::spin_for_answer(&t.state, state)) {
                mailbox::wait(&t.state, state, OWNER_CHECK);
            }
            if t.state.load(Ordering::Acquire) == state && self.owner_gone() {
                // The request stays in the slot: the next owner runs it (again, if the dead
                // one had started it).
                self.recover(generation)?;
                generation = self.generation.load(Ordering::Acquire);
            }
        }
    }

    /// The staging folio of this thread's slot: its id and order.
    pub(crate) fn staging(self: &Arc<Self>) -> Result<(u32, u32, usize), Error> {
        let slot = self.slot()?;
        let t: &ThreadSlot = &self.map.threads()[slot as usize];
        let pfn = t.staging.load(Ordering::Acquire);
        let order = t.staging_order.load(Ordering::Acquire).min(9);
        Ok((pfn, order, crate::mem::PAGE_SIZE << order))
    }

    fn folio_view(&self) -> FolioView<'_> {
        self.map.folio_view(self.policy)
    }

    /// Opens `path` (the client opens it itself: the kernel checks its permission), then has
    /// the owner serve it.
    pub(crate) fn open(
        self: &Arc<Self>,
        path: &Path,
        write: bool,
        create: bool,
        max_order: Option<u8>,
    ) -> Result<Arc<ClientFile>, Error> {
        let fd: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(create && write)
            .truncate(false)
            .open(path)
            .map_err(|source| Error::Open {
                path: path.to_owned(),
                source,
            })?
            .into();
        self.open_fd(fd, path, write, max_order)
            .map_err(|refused| refused.error)
    }

    /// Has the owner serve the file of `fd`, a descriptor this process opened (the kernel
    /// checked its permission): `Cache::open_descriptor`. A refusal hands the descriptor
    /// back, unclosed.
    pub(crate) fn open_fd(
        self: &Arc<Self>,
        fd: OwnedFd,
        path: &Path,
        write: bool,
        max_order: Option<u8>,
    ) -> Result<Arc<ClientFile>, crate::error::DescriptorRefused> {
        let file = Arc::new(ClientFile {
            attachment: Arc::clone(self),
            fd: RwLock::new(Some(fd)),
            path: path.to_owned(),
            record: AtomicU32::new(u32::MAX),
            generation: AtomicU32::new(0),
            max_order: AtomicU32::new(0),
            write: AtomicBool::new(write),
            want_order: max_order,
            asked: AtomicU64::new(0),
        });
        let opened = file
            .open_with_owner()
            .map_err(|e| match e {
                Error::Shared { reason, .. } => Error::Open {
                    path: path.to_owned(),
                    source: std::io::Error::other(reason),
                },
                other => other,
            })
            .and_then(|answer| file.bind(&answer));
        if let Err(error) = opened {
            let fd = file
                .fd
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            return Err(crate::error::DescriptorRefused {
                error,
                fd: fd.expect("the descriptor was attached above"),
            });
        }
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&file));
        Ok(file)
    }
}

/// How many attachments' slots one thread keeps at once. A thread using more shared caches
/// than this gives up the oldest's record; that slot then stays claimed until the process
/// detaches, and the next use of that cache by the thread claims another.
const THREAD_CLAIMS: usize = 16;

/// This thread's slot of attachment `id`, if it holds one (on every hit: no copy of the
/// records, and usually one look).
fn thread_claim(id: u64) -> Option<u32> {
    THREAD_SLOTS.with(|claims| {
        claims.iter().find_map(|claim| {
            let (attachment, slot) = claim.get();
            (attachment == id).then_some(slot)
        })
    })
}

/// Records that this thread holds `slot` of attachment `id` (with every record taken, the
/// oldest goes).
fn thread_record(id: u64, slot: u32) {
    THREAD_SLOTS.with(|claims| {
        let free = claims.iter().find(|claim| claim.get().0 == 0);
        match free {
            Some(free) => free.set((id, slot)),
            None => {
                for k in 1..THREAD_CLAIMS {
                    claims[k - 1].set(claims[k].get());
                }
                claims[THREAD_CLAIMS - 1].set((id, slot));
            }
        }
    });
}

/// Forgets this thread's record of `slot` of attachment `id`: whether it had one.
fn thread_forget(id: u64, slot: u32) -> bool {
    THREAD_SLOTS.with(|claims| {
        claims
            .iter()
            .find(|claim| claim.get() == (id, slot))
            .map(|claim| claim.set((0, 0)))
            .is_some()
    })
}

std::thread_local! {
    /// The slots this thread holds: (attachment id, slot), id 0 for none. Without a
    /// destructor, so never destroyed: a C program's key destructors and `atexit` handlers,
    /// which run after the thread-locals' destructors, still find it (and a lazily set up
    /// thread-local first touched there would register a destructor that never runs).
    static THREAD_SLOTS: [std::cell::Cell<(u64, u32)>; THREAD_CLAIMS] =
        const { [const { std::cell::Cell::new((0, 0)) }; THREAD_CLAIMS] };
    /// The attachment this thread is recovering from a dead owner (0: none).
    static RECOVERING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether this thread is starting an owner ([`starting_owner`]).
    static STARTING_OWNER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is starting a shared cache's owner, or recovering from an owner's
/// death. The calls it makes meanwhile (reading an owner's start time in `/proc`, opening the
/// owner's log, spawning the owner) are the library's own, and it may be doing so from inside
/// a request (a process whose owner died starts the next one): a program that
/// interposes those calls, as the preload library does, must pass them straight through, and
/// not flush or ask the cache anything, which would wait for this very start.
#[inline]
pub fn starting_owner() -> bool {
    // Most calls come while no thread is starting one: a plain load, and no thread-local
    // lookup (in a shared library each is a call). A thread that marks itself counts first,
    // so it sees its own count.
    STARTERS.load(Ordering::Relaxed) != 0 && marked_starting()
}

/// This thread's mark. Not inlined: the compiler would otherwise look the thread-local up
/// before the count's test, on every call.
#[inline(never)]
fn marked_starting() -> bool {
    STARTING_OWNER.get()
}

/// How many threads are marked as starting an owner (see [`starting_owner`]).
static STARTERS: AtomicUsize = AtomicUsize::new(0);

/// Marks this thread as starting an owner for a scope ([`starting_owner`]); the mark before
/// is put back when dropped (also when a panic unwinds through the scope).
struct Starting {
    outer: bool,
}

impl Starting {
    fn set() -> Self {
        STARTERS.fetch_add(1, Ordering::Relaxed);
        Self {
            outer: STARTING_OWNER.replace(true),
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        STARTING_OWNER.set(self.outer);
        STARTERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A file opened through a shared cache in this process.
pub(crate) struct ClientFile {
    attachment: Arc<Attachment>,
    /// The client's own descriptor (its open is the permission check; the owner opens the
    /// file again from it; reads pass through it while the owner does not serve the file).
    /// `None` while detached (`File::detach_descriptor`).
    fd: RwLock<Option<OwnedFd>>,
    path: PathBuf,
    record: AtomicU32,
    generation: AtomicU32,
    max_order: AtomicU32,
    write: AtomicBool,
    want_order: Option<u8>,
    /// Reads from this process that asked the owner (misses here), for the counters.
    pub(crate) asked: AtomicU64,
}

impl std::fmt::Debug for ClientFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFile")
            .field("path", &self.path)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

/// What a read found for one stretch of the file.
enum Hit {
    /// Bytes copied.
    Copied(usize),
    /// The owner must be asked (a miss, a folio not uptodate or marked for readahead).
    Miss,
}

impl ClientFile {
    fn open_message(&self) -> Msg {
        Msg::new(
            kind::OPEN,
            &[
                u64::from(self.is_writable()),
                self.want_order.map_or(0, |o| u64::from(o) + 1),
                0,
            ],
        )
    }

    /// Takes the owner's answer to an open: the file's record and generation.
    fn bind(&self, answer: &Msg) -> Result<(), Error> {
        let name = self.attachment.name();
        let bad = || shared_error(name, "the owner's answer to an open is malformed");
        let record = answer.word(0).map_err(|_| bad())?;
        if record >= self.attachment.map.files().len() as u64 {
            return Err(bad());
        }
        self.record.store(record as u32, Ordering::Release);
        self.generation
            .store(answer.word(1).map_err(|_| bad())? as u32, Ordering::Release);
        self.max_order.store(
            answer.word(2).map_err(|_| bad())?.min(9) as u32,
            Ordering::Release,
        );
        Ok(())
    }

    pub(crate) fn is_writable(&self) -> bool {
        self.write.load(Ordering::Acquire)
    }

    /// Sends the open of the attached descriptor to the owner; its answer.
    fn open_with_owner(&self) -> Result<Msg, Error> {
        let fd = self.fd.read().unwrap_or_else(PoisonError::into_inner);
        let fd = fd.as_ref().ok_or(Error::Detached)?;
        let (answer, _) = self
            .attachment
            .control(&self.open_message(), Some(fd.as_fd()))?;
        Ok(answer)
    }

    /// Hands the descriptor back (`File::detach_descriptor`): the owner counts one open
    /// fewer; the cached pages stay in the shared cache.
    pub(crate) fn detach_descriptor(&self) -> Result<OwnedFd, Error> {
        // Taken out first and the lock let go: the request may recover from a dead owner,
        // which opens every attached file again, under this lock (and skips this one now).
        let fd = self
            .fd
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or(Error::Detached)?;
        let (record, generation) = self.ids();
        let _ = self.attachment.control(
            &Msg::new(kind::CLOSE, &[record as u64, u64::from(generation)]),
            None,
        );
        Ok(fd)
    }

    /// Takes a descriptor of the same file again (`File::attach_descriptor`) and opens it
    /// with the owner (which revalidates the file).
    pub(crate) fn attach_descriptor(
        &self,
        fd: OwnedFd,
        write: bool,
    ) -> Result<(), crate::error::DescriptorRefused> {
        let refuse = |error, fd| crate::error::DescriptorRefused { error, fd };
        let same = {
            let slot = self.fd.read().unwrap_or_else(PoisonError::into_inner);
            if slot.is_some() {
                return Err(refuse(
                    Error::OpenConflict {
                        path: self.path.clone(),
                        reason: "a descriptor is attached already".to_owned(),
                    },
                    fd,
                ));
            }
            let (record, _) = self.ids();
            let rec = &self.attachment.map.files()[record];
            rustix::fs::fstat(&fd).is_ok_and(|st| {
                (st.st_dev, st.st_ino)
                    == (
                        rec.dev.load(Ordering::Acquire),
                        rec.ino.load(Ordering::Acquire),
                    )
            })
        };
        if !same {
            return Err(refuse(
                Error::OpenConflict {
                    path: self.path.clone(),
                    reason: "the descriptor is of another file".to_owned(),
                },
                fd,
            ));
        }
        self.write.store(write, Ordering::Release);
        let opened = self
            .attachment
            .control(&self.open_message(), Some(fd.as_fd()))
            .and_then(|(answer, _)| self.bind(&answer));
        if let Err(error) = opened {
            return Err(refuse(error, fd));
        }
        let mut slot = self.fd.write().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            // Another thread attached one meanwhile: this one comes back unused.
            return Err(refuse(
                Error::OpenConflict {
                    path: self.path.clone(),
                    reason: "a descriptor is attached already".to_owned(),
                },
                fd,
            ));
        }
        *slot = Some(fd);
        Ok(())
    }

    pub(crate) fn max_order(&self) -> u8 {
        self.max_order.load(Ordering::Relaxed) as u8
    }

    pub(crate) fn attachment(&self) -> &Arc<Attachment> {
        &self.attachment
    }

    /// Where a new handle starts in the file's writeback errors (the kernel's
    /// `errseq_sample`: 0 while the current error is unseen, so the handle reports it).
    pub(crate) fn errseq_now(&self) -> u32 {
        let (record, _) = self.ids();
        let now = self.attachment.map.files()[record]
            .errseq
            .load(Ordering::Acquire);
        if now & crate::wbstate::ERRSEQ_SEEN == 0 {
            0
        } else {
            now
        }
    }

    /// A change with no data (set_len, fallocate, punch_hole).
    pub(crate) fn change(&self, op: u64, a: u64, b: u64) -> Result<(), Error> {
        if self.passing_through() {
            return self.change_through(op, a, b);
        }
        let mut request = self.request(op);
        request[at::A] = a;
        request[at::B] = b;
        let reply = self.attachment.call_with(&request, None)?;
        if refused_passing_through(&reply) {
            return self.change_through(op, a, b);
        }
        check(&reply, a, b).map(|_| ())
    }

    fn ids(&self) -> (usize, u32) {
        (
            self.record.load(Ordering::Acquire) as usize,
            self.generation.load(Ordering::Acquire),
        )
    }

    /// Whether the owner has stopped serving the file (`docs/SHARED.md`, "Writers outside the
    /// cache"): its read lease broke (another process opens the file for writing), or an
    /// outside process opened a file clients hold writable (`owner/held.rs`). This handle then
    /// reads and changes storage through its own descriptor until the owner serves the file
    /// again; before the switch the owner wrote the cache's dirty pages back, and from it on
    /// it refuses changes ([`error_kind::PASSING_THROUGH`]).
    fn passing_through(&self) -> bool {
        let (record, _) = self.ids();
        self.attachment.map.files()[record]
            .serving
            .load(Ordering::Acquire)
            & 1
            == 1
    }

    /// Writes all of `data` at `pos` to storage through this process's descriptor.
    fn write_through(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        let fd = self.fd.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fd) = fd.as_ref() else {
            return Err(Error::Detached);
        };
        let mut done = 0;
        while done < data.len() {
            let at_byte = pos + done as u64;
            match rustix::io::pwrite(fd, &data[done..], at_byte) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(Error::Io {
                        offset: at_byte,
                        len: (data.len() - done) as u64,
                        source: e.into(),
                    });
                }
            }
        }
        Ok(done)
    }

    /// A size or allocation change made on storage through this process's descriptor.
    fn change_through(&self, op: u64, a: u64, b: u64) -> Result<(), Error> {
        use rustix::fs::FallocateFlags;
        let fd = self.fd.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fd) = fd.as_ref() else {
            return Err(Error::Detached);
        };
        let result = match op {
            op::SET_LEN => rustix::fs::ftruncate(fd, a),
            op::FALLOCATE => rustix::fs::fallocate(fd, FallocateFlags::empty(), a, b),
            op::PUNCH_HOLE => rustix::fs::fallocate(
                fd,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                a,
                b,
            ),
            _ => return Err(Error::ReadOnly),
        };
        result.map_err(|e| Error::Io {
            offset: a,
            len: b,
            source: e.into(),
        })
    }

    /// Reads `buf.len()` bytes at `pos` from storage, through this process's descriptor.
    fn read_through(&self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        let mut done = 0;
        while done < buf.len() {
            let at_byte = pos + done as u64;
            let fd = self.fd.read().unwrap_or_else(PoisonError::into_inner);
            let Some(fd) = fd.as_ref() else {
                return Err(Error::Detached);
            };
            match rustix::io::pread(fd, &mut buf[done..], at_byte) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(Error::Io {
                        offset: at_byte,
                        len: (buf.len() - done) as u64,
                        source: e.into(),
                    });
                }
            }
        }
        Ok(done)
    }

    /// The file's size: from its record, or from storage while passing through.
    pub(crate) fn size(&self) -> u64 {
        if self.passing_through()
            && let Some(fd) = self
                .fd
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
            && let Ok(stat) = rustix::fs::fstat(fd)
        {
            return stat.st_size as u64;
        }
        self.record_size()
    }

    /// The file's size in its record (the owner's).
    fn record_size(&self) -> u64 {
        let (record, _) = self.ids();
        self.attachment.map.files()[record]
            .size
            .load(Ordering::Acquire)
    }

    fn request(&self, op: u64) -> [u64; MAIL_WORDS] {
        let (record, generation) = self.ids();
        let mut words = [0u64; MAIL_WORDS];
        words[at::OP] = op;
        words[at::RECORD] = record as u64;
        words[at::GENERATION] = u64::from(generation);
        words
    }

    /// A request's answer, or its error.
    fn call(&self, request: &[u64; MAIL_WORDS]) -> Result<[u64; MAIL_WORDS], Error> {
        self.call_with(request, None)
    }

    /// [`Self::call`] with a write's bytes (see [`Attachment::call_with`]).
    fn call_with(
        &self,
        request: &[u64; MAIL_WORDS],
        payload: Option<&[u8]>,
    ) -> Result<[u64; MAIL_WORDS], Error> {
        let reply = self.attachment.call_with(request, payload)?;
        check(&reply, request[at::A], request[at::B])
    }

    /// Copies what the cache holds of `pos..pos + dst.len()` into `dst`, from `pos` on, until
    /// the first page it cannot serve alone; `ahead` for a sequential reader (see
    /// [`crate::mapping::copy_hits`]).
    fn copy_hits(&self, pos: u64, dst: &mut [u8], ahead: bool) -> Result<Hit, Error> {
        let attachment = &self.attachment;
        let slot = attachment.slot()?;
        let t = &attachment.map.threads()[slot as usize];
        let (record, _) = self.ids();
        let index = &attachment.views[record];
        let view = attachment.folio_view();
        // Taken before the lookup: nothing found from here on is reused until it is dropped.
        let pin = ExternalGuard::new(&t.pin, &attachment.map.live().epoch);
        let (done, ..) = crate::mapping::copy_hits(index, &view, &pin, pos, dst, None, ahead);
        drop(pin);
        Ok(if done == 0 {
            Hit::Miss
        } else {
            Hit::Copied(done)
        })
    }

    /// Whether every page of `pos..end` is cached and up to date, with no readahead mark on
    /// it (a mark asks for the next window), as one look at the index: a hint, which may be
    /// stale as soon as it is answered.
    fn all_cached(&self, pos: u64, end: u64) -> Result<bool, Error> {
        if pos >= end {
            return Ok(true);
        }
        let attachment = &self.attachment;
        let slot = attachment.slot()?;
        let t = &attachment.map.threads()[slot as usize];
        let (record, _) = self.ids();
        let index = &attachment.views[record];
        let view = attachment.folio_view();
        let pin = ExternalGuard::new(&t.pin, &attachment.map.live().epoch);
        let mut cursor = index.cursor_under(&pin);
        let last = (end - 1) >> PAGE_SHIFT;
        let mut entry = cursor.load(pos >> PAGE_SHIFT);
        let cached = loop {
            let Some(Entry::Folio { id, .. }) = entry else {
                break false;
            };
            match view.peek_begin(id) {
                Some(peek) if peek.flags() & flag::READAHEAD == 0 => {}
                _ => break false,
            }
            if cursor.first() + (1u64 << entry_order(entry)) > last {
                break true;
            }
            entry = cursor.load_next();
        };
        drop(cursor);
        drop(pin);
        Ok(cached)
    }

    /// Reads up to `buf.len()` bytes at `pos` with the handle's readahead state `ra`.
    pub(crate) fn read_at(
        &self,
        ra: &mut RaState,
        buf: &mut [u8],
        pos: u64,
    ) -> Result<usize, Error> {
        if self.passing_through() {
            return self.read_through(buf, pos);
        }
        // (Served: the record's size, without asking `passing_through` again.)
        let size = self.record_size();
        if buf.is_empty() || pos >= size {
            return Ok(0);
        }
        let len = (size - pos).min(buf.len() as u64) as usize;
        let sequential = ra.prev_pos == pos as i64;
        let mut done = 0;
        while done < len {
            let at_byte = pos + done as u64;
            match self.copy_hits(at_byte, &mut buf[done..len], sequential)? {
                Hit::Copied(n) => {
                    done += n;
                    continue;
                }
                Hit::Miss => {}
            }
            let (_, _, room) = self.attachment.staging()?;
            let want = (len - done).min(room);
            self.asked.fetch_add(1, Ordering::Relaxed);
            let mut request = self.request(op::READ);
            request[at::A] = at_byte;
            request[at::B] = want as u64;
            mailbox::put_ra(&mut request, ra);
            let reply = match self.call(&request) {
                Ok(reply) => reply,
                Err(Error::Io { len, source, .. }) if done > 0 => {
                    // Bytes before the failure were read: report them as the private path
                    // does (the error's offset is the first byte not read).
                    return Err(Error::Io {
                        offset: at_byte,
                        len,
                        source,
                    });
                }
                Err(e) => return Err(e),
            };
            *ra = mailbox::get_ra(&reply, self.attachment.max_ra_pages);
            let got = (reply[at::RESULT] as usize).min(want);
            if got == 0 {
                break; // end of file (the file shrank meanwhile)
            }
            // The slot's staging folio now: the request may have been made again in a new
            // slot (`Attachment::call_with`).
            let (pfn, order, _) = self.attachment.staging()?;
            if !self
                .attachment
                .map
                .copy_out(pfn, order, 0, &mut buf[done..done + got])
            {
                return Err(Error::SharedMapping(
                    "the thread's staging folio lies outside the arena".to_owned(),
                ));
            }
            done += got;
        }
        if done > 0 {
            ra.prev_pos = (pos + done as u64) as i64;
        }
        Ok(done)
    }

    /// Writes all of `data` at `pos` through the owner.
    pub(crate) fn write_at(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        self.write_at_to(data, pos, false)
    }

    /// [`write_at`](Self::write_at), and with `to_kernel` each piece also handed to the
    /// kernel's page cache by the owner before it answers (`SyncRange::KERNEL`), in the same
    /// request.
    pub(crate) fn write_at_to(
        &self,
        data: &[u8],
        pos: u64,
        to_kernel: bool,
    ) -> Result<usize, Error> {
        if !self.is_writable() {
            return Err(Error::ReadOnly);
        }
        let mut done = 0;
        while done < data.len() {
            if self.passing_through() {
                return Ok(done + self.write_through(&data[done..], pos + done as u64)?);
            }
            let (_, _, room) = self.attachment.staging()?;
            let n = (data.len() - done).min(room);
            let mut request = self.request(op::WRITE);
            request[at::A] = pos + done as u64;
            request[at::B] = n as u64;
            request[at::C] = u64::from(to_kernel);
            let reply = self
                .attachment
                .call_with(&request, Some(&data[done..done + n]))?;
            if refused_passing_through(&reply) {
                continue; // the owner stopped serving the file meanwhile
            }
            let reply = check(&reply, request[at::A], request[at::B])?;
            let wrote = (reply[at::RESULT] as usize).min(n);
            done += wrote;
            if wrote < n {
                break;
            }
        }
        Ok(done)
    }

    /// Forced readahead of `offset..offset + len` with the handle's state. Nothing to ask the
    /// owner when every page of the range is cached already (the kernel's `readahead(2)` also
    /// does nothing then; a storage engine's iterator calls it for data it just read).
    pub(crate) fn readahead(&self, ra: &mut RaState, offset: u64, len: u64) -> Result<(), Error> {
        if self.passing_through() {
            return Ok(());
        }
        let end = offset.saturating_add(len).min(self.record_size());
        if self.all_cached(offset, end)? {
            return Ok(());
        }
        let mut request = self.request(op::READAHEAD);
        request[at::A] = offset;
        request[at::B] = len;
        mailbox::put_ra(&mut request, ra);
        let reply = self.call(&request)?;
        *ra = mailbox::get_ra(&reply, self.attachment.max_ra_pages);
        Ok(())
    }

    /// A sync (`mode`: 0 all, 1 data, 2 + flags a range) from the handle's errseq cursor.
    pub(crate) fn sync(
        &self,
        mode: u64,
        offset: u64,
        len: u64,
        since: &mut u32,
    ) -> Result<(), Error> {
        let mut request = self.request(op::SYNC);
        request[at::A] = mode;
        request[at::B] = offset;
        request[at::C] = len;
        request[at::C + 1] = u64::from(*since);
        let reply = self.attachment.call(&request)?;
        *since = reply[at::VALUE] as u32;
        let result = reply[at::RESULT] as i64;
        if result < 0 {
            return Err(mailbox::decode_error(
                (-result) as i32,
                reply[at::ERROR_KIND],
                offset,
                len,
            ));
        }
        Ok(())
    }

    /// A file operation through the control connection: `[op, a, b]`, answered with words and
    /// a text.
    pub(crate) fn file_op(&self, op: u64, a: u64, b: u64) -> Result<Msg, Error> {
        let (record, generation) = self.ids();
        let (answer, _) = self.attachment.control(
            &Msg::new(
                kind::FILE_OP,
                &[record as u64, u64::from(generation), op, a, b],
            ),
            None,
        )?;
        Ok(answer)
    }
}

impl Drop for ClientFile {
    fn drop(&mut self) {
        let (record, generation) = self.ids();
        let attached = self
            .fd
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        if record != u32::MAX as usize && attached {
            let _ = self.attachment.control(
                &Msg::new(kind::CLOSE, &[record as u64, u64::from(generation)]),
                None,
            );
        }
    }
}

/// Whether the owner refused a change because the file passes through now.
fn refused_passing_through(reply: &[u64; MAIL_WORDS]) -> bool {
    (reply[at::RESULT] as i64) < 0 && reply[at::ERROR_KIND] == mailbox::error_kind::PASSING_THROUGH
}

/// An answer, or its error (for the request's `offset` and `len`).
fn check(reply: &[u64; MAIL_WORDS], offset: u64, len: u64) -> Result<[u64; MAIL_WORDS], Error> {
    let result = reply[at::RESULT] as i64;
    if result < 0 {
        return Err(mailbox::decode_error(
            (-result) as i32,
            reply[at::ERROR_KIND],
            offset,
            len,
        ));
    }
    Ok(*reply)
}

fn entry_order(entry: Option<Entry>) -> u8 {
    entry.map_or(0, Entry::order)
}

/// Connects to the owner of `paths`' cache, starting one if none answers: the hello and its
/// welcome, and the memfd the owner sends. `previous`: the process slot this attachment held
/// under an owner that died (a reattach), which the new owner gives back to it.
fn connect_or_start(
    paths: &Paths,
    settings: &[u64; SETTINGS_WORDS],
    program: Option<&Path>,
    memfd: Option<&OwnedFd>,
    previous: Option<u32>,
) -> Result<(Conn, Msg, Option<OwnedFd>), Error> {
    let name = &paths.name;
    let deadline = Instant::now() + runtime::START_TIMEOUT;
    let mut starts = 0u32;
    let mut last_error: String;
    loop {
        match Conn::connect(&paths.sock) {
            Ok(conn) => {
                let pid = std::process::id();
                let hello = Msg::new(
                    kind::HELLO,
                    &[
                        wire::PROTOCOL,
                        u64::from(pid),
                        runtime::start_time(pid).unwrap_or(0),
                        memfd.map_or(u64::MAX, |fd| fd.as_raw_fd() as u64),
                        // The process slot this attachment had under a dead owner: its thread
                        // slots' claim words still name it (see `Control::hello`).
                        previous.map_or(u64::MAX, u64::from),
                    ],
                );
                match conn.call(&hello, None) {
                    Ok((welcome, fd)) if welcome.kind == kind::WELCOME => {
                        return Ok((conn, welcome, fd));
                    }
                    Ok((other, _)) => {
                        return Err(shared_error(
                            name,
                            format!("the owner answered a hello with message {}", other.kind),
                        ));
                    }
                    Err(e) => last_error = e.to_string(),
                }
            }
            Err(e) => {
                last_error = e.to_string();
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) {
                    // Nobody listens: no owner was started yet, or the one that was has died
                    // since, whether before it was ready (killed while it took over a dead
                    // one's mapping) or after it said so (to this process, or to another
                    // starter whose owner then stepped aside for it). Start one again each
                    // time. An owner steps aside at once for one that listens, and waits
                    // (2 s at most) for one that holds the lock while it starts; an owner
                    // that keeps dying before it is ready is started again after this loop's
                    // 20 ms sleep. All of it ends at the deadline.
                    starts += 1;
                    let ready = start_owner(paths, settings, program, memfd)?;
                    if ready && starts == 1 {
                        continue;
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return Err(shared_error(
                name,
                format!(
                    "no owner answered within {} s (last: {last_error}; see {})",
                    runtime::START_TIMEOUT.as_secs(),
                    paths.log.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts an owner for `paths`' cache: the owner program, told the settings, handed `memfd`
/// if this process holds the cache already (a takeover), and waited for until it says it is
/// ready (or that another owner already runs, or why it failed). `Ok(false)`: it ended before
/// it was ready (killed while it took over), and another may be started.
fn start_owner(
    paths: &Paths,
    settings: &[u64; SETTINGS_WORDS],
    program: Option<&Path>,
    memfd: Option<&OwnedFd>,
) -> Result<bool, Error> {
    let _starting = Starting::set();
    start_owner_marked(paths, settings, program, memfd)
}

/// A thread-local mark set for a scope: the value before is put back when dropped (also when
/// a panic unwinds through the scope).
struct Mark<T: Copy + 'static> {
    key: &'static std::thread::LocalKey<std::cell::Cell<T>>,
    outer: T,
}

impl<T: Copy + 'static> Mark<T> {
    fn set(key: &'static std::thread::LocalKey<std::cell::Cell<T>>, value: T) -> Self {
        Self {
            key,
            outer: key.replace(value),
        }
    }
}

impl<T: Copy + 'static> Drop for Mark<T> {
    fn drop(&mut self) {
        self.key.set(self.outer);
    }
}

/// [`start_owner`], with this thread marked as starting one ([`starting_owner`]).
fn start_owner_marked(
    paths: &Paths,
    settings: &[u64; SETTINGS_WORDS],
    program: Option<&Path>,
    memfd: Option<&OwnedFd>,
) -> Result<bool, Error> {
    let name = &paths.name;
    let program = runtime::owner_program(name, program)?;
    let (ours, theirs) = Conn::pair().map_err(|e| io_error(name, "socketpair", e))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&paths.log)
        .map_err(|e| io_error(name, &format!("cannot open {}", paths.log.display()), e))?;
    let words: Vec<String> = settings.iter().map(|w| format!("{w:x}")).collect();
    let mut child = std::process::Command::new(&program)
        .arg(name)
        .env("FOLIOCACHE_OWNER_SETTINGS", words.join(","))
        .env("FOLIOCACHE_RUNTIME_DIR", &paths.dir)
        // A program run with the preload library starts the owner: the owner does its own
        // I/O, never through the library.
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::from(theirs.into_fd()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(log))
        .spawn()
        .map_err(|e| io_error(name, &format!("cannot start {}", program.display()), e))?;
    // The program starts its real self detached and returns at once.
    let _ = child.wait();
    let start = Msg::new(kind::HELLO, &[wire::PROTOCOL, u64::from(memfd.is_some())]);
    ours.send(&start, memfd.map(AsFd::as_fd))
        .map_err(|e| io_error(name, "cannot hand the owner its start", e))?;
    match ours.recv() {
        Ok(Some((msg, _))) if msg.kind == kind::OK => Ok(true),
        Ok(Some((msg, _))) if msg.kind == kind::ERROR => Err(shared_error(
            name,
            format!("the owner could not start: {}", msg.text),
        )),
        // It ended before it was ready (its log says why): the caller may start another.
        Ok(_) => Ok(false),
        Err(e) => Err(io_error(name, "waiting for the owner to start", e)),
    }
}
