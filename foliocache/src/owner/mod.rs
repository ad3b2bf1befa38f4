//! A shared cache's owner: the one process that changes the cache (`docs/SHARED.md`). It
//! creates the mapping (or takes over one whose owner died), runs the cache over it, answers
//! its clients on the control socket and serves their mailboxes, and notices their deaths.
//!
//! * `control`: the control socket, one thread per client connection; a client's death (its
//!   connection closing, or its pid found dead) frees what it held.
//! * `serve`: one thread per claimed client thread slot, running the slot's requests.
//! * `takeover`: what a new owner does with a mapping whose owner died.
//! * `outside`: writers outside the cache, seen through inotify.
//!
//! The owner is started by the first client that finds none (`shared::client`): the program
//! `foliocache-owner NAME` starts itself again detached ([`main`]), takes the cache's lock,
//! builds the cache, listens, and tells its starter it is ready.

mod claims;
mod control;
mod held;

/// `FileRecord::signal`: how writers outside the cache are seen for a file.
pub(crate) mod signal {
    /// Through inotify and revalidation (no exact signal).
    pub(crate) const WATCH: u32 = 0;
    /// The owner holds a read lease (exact: `leases.rs`).
    pub(crate) const LEASE: u32 = 1;
    /// Outside opens wait for the owner (exact: fanotify permission events, `held.rs`).
    pub(crate) const HELD: u32 = 2;
}
mod leases;
mod outside;
mod serve;
mod takeover;

use crate::cache::{Cache, CacheBuilder};
use crate::error::Error;
use crate::file::File;
use crate::mem::epoch::{self, External};
use crate::mem::shared::{SETTINGS_WORDS, SharedMap};
use crate::shared::runtime::{self, Paths, shared_error};
use crate::shared::wire::{self, Conn, Listener, Msg, kind};
use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The environment variable that marks the detached (real) owner process.
const DETACHED: &str = "FOLIOCACHE_OWNER_DETACHED";

/// How often the owner looks for clients that died without their connection closing (a
/// connection a forked child inherited), and checks its idle timeout.
const TICK: Duration = Duration::from_millis(200);

/// The owner program's entry: `foliocache-owner NAME`. Returns the exit code.
#[doc(hidden)]
pub fn main() -> i32 {
    crate::io::close_inherited_descriptors();
    let args: Vec<String> = std::env::args().collect();
    let Some(name) = args.get(1).filter(|_| args.len() == 2) else {
        eprintln!(
            "usage: foliocache-owner NAME\n\nThe owner of the shared cache NAME. Programs that \
             attach to the cache start it themselves (Cache::builder().shared(NAME)); it is not \
             meant to be run by hand."
        );
        return 2;
    };
    if std::env::var_os(DETACHED).is_none() {
        // Start the real owner in a new session, with this process's standard input (the
        // socket to its starter) and error (the log), and return at once: the starter waits
        // for this process, then talks to the detached one.
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("foliocache-owner: cannot find its own program: {e}");
                return 1;
            }
        };
        return match std::process::Command::new(exe)
            .arg(name)
            .env(DETACHED, "1")
            .spawn()
        {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("foliocache-owner: cannot start detached: {e}");
                1
            }
        };
    }
    let _ = rustix::process::setsid();
    end_on_panic(name);
    // The owner holds descriptors of every file it serves (a database has thousands): it
    // takes all the descriptors the system lets it have, and retires idle files when even
    // those run out (`open_path`).
    let files = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: files.maximum,
            maximum: files.maximum,
        },
    );
    // Before any thread starts: lease breaks wait for the lease thread (`leases.rs`).
    if let Err(e) = crate::io::lease::block_signals() {
        eprintln!("foliocache-owner: cannot block the lease signals: {e}");
        return 1;
    }
    // Standard input is the socket to the starter.
    let stdin = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("foliocache-owner: no standard input: {e}");
            return 1;
        }
    };
    let starter = Conn::from_fd(stdin);
    match run(name, &starter) {
        Ok(()) => 0,
        Err(e) => {
            log(name, &format!("stopped: {e}"));
            let _ = starter.send(&Msg::with_text(kind::ERROR, &[], e.to_string()), None);
            1
        }
    }
}

/// Makes a panic in any thread of the owner end the owner, after the usual report (the message
/// and, with `RUST_BACKTRACE`, the backtrace) and a line saying so in the log. Its clients then
/// start the next owner, which rebuilds every structure from the folio descriptors (a takeover,
/// docs/SHARED.md, "When a process dies"): the one recovery the kill storms run hundreds of
/// times. Left to unwind alone, the thread would end and the owner go on without it: a server
/// thread's client then waited for its answer for ever, and what the thread held stayed held
/// (a folio locked for a change it never finished, found as a page no status could account
/// for: an index node handed out at offset 0, `mem::nodes`).
fn end_on_panic(name: &str) {
    let name = name.to_owned();
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        log(
            &name,
            "a thread of the owner panicked: the owner ends, and the next process to ask \
             starts a new one (a takeover)",
        );
        std::process::abort();
    }));
}

/// A line in the owner's log (its standard error, which its starter pointed at `NAME.log`).
pub(crate) fn log(name: &str, line: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let _ = writeln!(
        std::io::stderr(),
        "{}.{:03} foliocache-owner {name}[{}]: {line}",
        now.as_secs(),
        now.subsec_millis(),
        std::process::id()
    );
}

/// One file the owner serves: the cache's file, the generation of its record when it was
/// opened, its client opens (per process slot: a process that dies takes its opens along) and
/// when one last came or went.
struct Served {
    file: File,
    generation: u32,
    opens: HashMap<u32, usize>,
    used: Instant,
}

impl Served {
    fn new(file: File, generation: u32) -> Self {
        Self {
            file,
            generation,
            opens: HashMap::new(),
            used: Instant::now(),
        }
    }

    /// Whether no client has the file open.
    fn idle(&self) -> bool {
        self.opens.values().all(|&n| n == 0)
    }
}

/// The owner's state (see the module documentation).
pub(crate) struct Owner {
    name: String,
    paths: Paths,
    pub(crate) map: Arc<SharedMap>,
    pub(crate) cache: Cache,
    files: Mutex<HashMap<usize, Served>>,
    /// The server thread of each claimed thread slot.
    servers: Mutex<HashMap<u32, serve::Server>>,
    /// Per thread slot: held while the slot is claimed (its staging folio and server given)
    /// or freed, so a claim that checked the slot's claim word finishes before a free of the
    /// slot starts, and a free finishes before another claim of it is checked
    /// (`control::claim`, `control::free_thread_slot`).
    slot_locks: Box<[Mutex<()>]>,
    /// Attached processes (connections that said hello).
    clients: AtomicUsize,
    /// Held while a process slot is given out or freed (`control::detach`).
    attach_lock: Mutex<()>,
    /// When the last client left (`None` while one is attached).
    idle_since: Mutex<Option<Instant>>,
    idle: Duration,
    /// The cache's largest folio order (a file's default).
    max_order: u8,
    /// The order of the staging folios given to client threads.
    staging_order: u8,
    /// Set by `fcache cache destroy`: the accept loop ends.
    stopping: AtomicBool,
    /// The external pins of the clients, as the epoch domain sees them.
    pins: Arc<dyn External>,
    /// The watches for writers outside the cache (`None`: inotify could not be had, and
    /// only a revalidation on open sees their changes).
    outside: Option<Arc<outside::Outside>>,
    /// The read leases on files no process holds writable (the exact signal).
    leases: leases::Leases,
    /// fanotify permission events for files clients hold writable (the exact signal there;
    /// `None` without `CAP_SYS_ADMIN`).
    held: Option<held::Held>,
    /// Held shared by every client request that changes a file, exclusively while an outside
    /// opener makes a file pass through (`held.rs`).
    change_gate: std::sync::RwLock<()>,
    /// The files this cache serves, claimed machine-wide.
    claims: claims::Claims,
}

/// Takes the cache's lock. Held by another process, it is either a live owner (or one starting,
/// which will listen soon) or one that is dying: a SIGKILLed owner's descriptors close one by one
/// as its threads exit, so its socket can refuse connections (which is how a client saw it die
/// and started this owner) while its lock is still held for a moment. So while the lock is held
/// and nothing answers on the socket, this tries again, for up to two seconds.
fn take_lock(lock: &std::fs::File, paths: &Paths) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if rustix::fs::flock(lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            return true;
        }
        if Conn::connect(&paths.sock).is_ok() || Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The clients' thread pins, as the owner's epoch domain counts them (`mem::epoch::External`).
struct ClientPins(Arc<SharedMap>);

impl External for ClientPins {
    fn caught_up(&self, epoch: u64) -> bool {
        self.0
            .threads()
            .iter()
            .all(|t| epoch::pin_caught_up(t.pin.load(Ordering::Relaxed), epoch))
    }

    fn advanced(&self, epoch: u64) {
        self.0.live().epoch.store(epoch, Ordering::Release);
    }
}

/// Runs `collapse` (the rest of the mapping into huge pages) on a thread of the owner
/// (`foliocache-huge`), where the kernel can collapse pages other processes are using.
fn collapse_in_background(name: &str, map: &Arc<SharedMap>, collapse: fn(&SharedMap)) {
    if !crate::mem::shared::late_collapse_safe() {
        log(
            name,
            "the rest stays in small pages: this kernel (before 6.4) cannot collapse pages \
             other processes use",
        );
        return;
    }
    let map = Arc::clone(map);
    if let Err(e) = crate::mem::threads::spawn("foliocache-huge", move || collapse(&map)) {
        log(
            name,
            &format!("no thread to collapse the rest into huge pages: {e}"),
        );
    }
}

/// What the system does for huge pages in shared memory (`shmem_enabled`'s chosen value).
pub(crate) fn shmem_huge_pages() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .ok()
        .and_then(|t| {
            let start = t.find('[')?;
            let end = t[start..].find(']')?;
            Some(t[start + 1..start + end].to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut id);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    for (b, n) in id.iter_mut().zip(now.to_le_bytes()) {
        *b ^= n;
    }
    id[0] ^= std::process::id() as u8;
    id
}

/// Reads the settings words its starter put in the environment.
fn settings_from_env(name: &str) -> Result<[u64; SETTINGS_WORDS], Error> {
    let text = std::env::var("FOLIOCACHE_OWNER_SETTINGS")
        .map_err(|_| shared_error(name, "FOLIOCACHE_OWNER_SETTINGS is not set"))?;
    let mut words = [0u64; SETTINGS_WORDS];
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() != SETTINGS_WORDS {
        return Err(shared_error(
            name,
            format!(
                "FOLIOCACHE_OWNER_SETTINGS has {} words, not {SETTINGS_WORDS}",
                parts.len()
            ),
        ));
    }
    for (w, part) in words.iter_mut().zip(parts) {
        *w = u64::from_str_radix(part, 16)
            .map_err(|_| shared_error(name, format!("a bad settings word: {part:?}")))?;
    }
    Ok(words)
}

/// The mapping a client that still holds the cache could hand over: `NAME.clients` lists the
/// attached processes and their memfd's descriptor number.
fn memfd_from_clients(paths: &Paths) -> Option<OwnedFd> {
    let text = std::fs::read_to_string(&paths.clients).ok()?;
    for line in text.lines() {
        let mut parts = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(pid)), Some(Ok(start)), Some(Ok(fd))) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if !runtime::alive(pid as u32, start) {
            continue;
        }
        // Read and write: the mapping is mapped writable.
        if let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{fd}"))
        {
            return Some(file.into());
        }
    }
    None
}

/// The owner's life: lock, map, build, listen, serve until idle or destroyed.
fn run(name: &str, starter: &Conn) -> Result<(), Error> {
    crate::inject::kill::arm_kill_points_from_env();
    let settings = settings_from_env(name)?;
    let paths = Paths::of(name)?;
    let io = |what: &str, e: std::io::Error| shared_error(name, format!("{what}: {e}"));
    // What the starter hands over: a hello, and the mapping if it holds one.
    let (start, handed) = match starter.recv() {
        Ok(Some(got)) => got,
        Ok(None) => return Err(shared_error(name, "the starter left before the start")),
        Err(e) => return Err(io("reading the start", e)),
    };
    if start.kind != kind::HELLO || start.word(0).ok() != Some(wire::PROTOCOL) {
        return Err(shared_error(
            name,
            "the starter speaks another protocol (a program built from another foliocache)",
        ));
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&paths.lock)
        .map_err(|e| io(&format!("cannot open {}", paths.lock.display()), e))?;
    if !take_lock(&lock, &paths) {
        // Another owner runs (or is starting): the starter connects to it.
        let _ = starter.send(&Msg::new(kind::OK, &[1]), None);
        return Ok(());
    }
    let builder = CacheBuilder::from_shared_settings(&settings)?;
    let policy = builder.policy_value();
    let handed = handed.or_else(|| memfd_from_clients(&paths));
    let (map, free) = match handed {
        Some(fd) => {
            let map = Arc::new(SharedMap::attach(fd)?);
            let free = takeover::take_over(name, &map, policy.refcount)?;
            // The creator may have died before its thread had collapsed every range.
            if settings[crate::shared::settings::HUGE_PAGES] != 0 {
                collapse_in_background(name, &map, SharedMap::collapse_after_takeover);
            }
            // The dead owner's leases went with it: every file is served and watched until
            // this owner leases it (`leases.rs`).
            for rec in map.files() {
                if rec.serving.load(Ordering::Acquire) & 1 == 1 {
                    rec.serving.fetch_add(1, Ordering::AcqRel);
                }
                rec.signal.store(signal::WATCH, Ordering::Release);
            }
            (map, Some(free))
        }
        None => {
            let shape = builder.shared_shape()?;
            let huge = settings[crate::shared::settings::HUGE_PAGES] != 0;
            let map = SharedMap::create(name, shape, settings, random_id(), policy.refcount, huge)?;
            log(
                name,
                &format!(
                    "created: {} MiB, {} pages of {} KiB, {} thread slots, {} file records",
                    map.fixed().total >> 20,
                    shape.pages,
                    crate::mem::PAGE_SIZE >> 10,
                    shape.threads,
                    shape.files
                ),
            );
            if huge {
                let collapses = map.collapses();
                let note = if collapses.refused.load(Ordering::Relaxed) {
                    " (the kernel gives shared memory none)".to_owned()
                } else {
                    match collapses.short_of_memory.load(Ordering::Relaxed) {
                        0 => String::new(),
                        short => {
                            format!(" ({short} ranges of 2 MiB left small: no free huge page)")
                        }
                    }
                };
                log(
                    name,
                    &format!(
                        "{} MiB in huge pages at creation{note}",
                        map.huge_bytes() >> 20
                    ),
                );
            }
            let map = Arc::new(map);
            if map.huge_pending() {
                collapse_in_background(name, &map, SharedMap::collapse_rest);
            }
            (map, None)
        }
    };
    let cache = match &free {
        Some(free) => builder.build_owner(Arc::clone(&map), Some(&|pfn| free.is_free(pfn)))?,
        None => builder.build_owner(Arc::clone(&map), None)?,
    };
    if let (Some(free), Some(local)) = (&free, cache.local()) {
        for &(_, staging) in &free.claimed {
            local.memory().adopt_staging(staging.pfn);
        }
    }
    let live = map.live();
    let pid = std::process::id();
    live.owner_pid.store(pid, Ordering::Release);
    live.owner_start
        .store(runtime::start_time(pid).unwrap_or(0), Ordering::Release);
    live.owner_generation.fetch_add(1, Ordering::AcqRel);
    let pins: Arc<dyn External> = Arc::new(ClientPins(Arc::clone(&map)));
    // Start above every epoch a client may still pin with (a previous owner's).
    epoch::add_external(
        Arc::clone(&pins),
        live.epoch.load(Ordering::Acquire).saturating_add(2),
    );
    let pages = map.arena().1;
    let staging_order = (0..=5u8)
        .rev()
        .find(|&o| (1usize << o) * 64 <= pages)
        .unwrap_or(0);
    // FOLIOCACHE_NO_FANOTIFY=1 leaves the permission events out (to compare, or where they
    // misbehave): files clients hold writable are then only watched.
    let (held, held_events) = if std::env::var_os("FOLIOCACHE_NO_FANOTIFY").is_some() {
        log(
            name,
            "outside writers: fanotify left out (FOLIOCACHE_NO_FANOTIFY)",
        );
        (None, None)
    } else {
        match held::Held::new() {
            Ok((held, events)) => (Some(held), Some(events)),
            Err(e) => {
                log(
                    name,
                    &format!(
                        "outside writers: no fanotify ({e}); files clients hold writable are \
                         only watched"
                    ),
                );
                (None, None)
            }
        }
    };
    let slot_locks = (0..map.threads().len()).map(|_| Mutex::new(())).collect();
    let owner = Arc::new(Owner {
        name: name.to_owned(),
        paths: paths.clone(),
        map,
        cache,
        files: Mutex::new(HashMap::new()),
        servers: Mutex::new(HashMap::new()),
        slot_locks,
        clients: AtomicUsize::new(0),
        attach_lock: Mutex::new(()),
        idle_since: Mutex::new(Some(Instant::now())),
        idle: Duration::from_secs(
            std::env::var("FOLIOCACHE_IDLE_SECS")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(settings[crate::shared::settings::IDLE_SECS])
                .max(1),
        ),
        max_order: settings[crate::shared::settings::MAX_ORDER].min(9) as u8,
        staging_order,
        stopping: AtomicBool::new(false),
        pins,
        outside: match outside::Outside::new() {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                log(
                    name,
                    &format!("outside writers: no inotify ({e}); revalidation on open only"),
                );
                None
            }
        },
        leases: leases::Leases::default(),
        held,
        change_gate: std::sync::RwLock::new(()),
        claims: claims::Claims::open(name),
    });
    if let Some(events) = held_events {
        let reader = Arc::clone(&owner);
        let worker = Arc::clone(&owner);
        let spawned = std::thread::Builder::new()
            .name("fc-fanotify".into())
            .spawn(move || held::read(&reader))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("fc-held".into())
                    .spawn(move || held::work(&worker, &events))
            });
        if let Err(e) = spawned {
            log(name, &format!("outside writers: no fanotify threads ({e})"));
        }
    }
    {
        let owner = Arc::clone(&owner);
        let spawned = std::thread::Builder::new()
            .name("fc-leases".into())
            .spawn(move || leases::run(&owner));
        if let Err(e) = spawned {
            log(name, &format!("outside writers: no lease thread ({e})"));
        }
    }
    if let Some(watcher) = owner.outside.clone() {
        let owner = Arc::clone(&owner);
        let spawned = std::thread::Builder::new()
            .name("fc-outside".into())
            .spawn(move || outside::run(&owner, &watcher));
        if let Err(e) = spawned {
            log(name, &format!("outside writers: no watcher thread ({e})"));
        }
    }
    if let Some(free) = &free {
        owner.adopt_clean(&free.adopt);
        // Requests the previous owner left in slots run again, now.
        for &(slot, staging) in &free.claimed {
            owner.start_server(slot, staging);
        }
    }
    let listener = Listener::bind(&paths.sock)
        .map_err(|e| io(&format!("cannot listen at {}", paths.sock.display()), e))?;
    owner.write_clients_file();
    starter
        .send(&Msg::new(kind::OK, &[0]), None)
        .map_err(|e| io("telling the starter", e))?;
    log(name, "ready");
    owner.accept_loop(&listener);
    owner.shut_down();
    drop(lock);
    Ok(())
}

impl Owner {
    fn accept_loop(self: &Arc<Self>, listener: &Listener) {
        use rustix::event::{PollFd, PollFlags};
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: TICK.as_nanos() as i64,
        };
        while !self.stopping.load(Ordering::Acquire) {
            let mut fds = [PollFd::new(listener, PollFlags::IN)];
            if matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
                match listener.accept() {
                    Ok(conn) => {
                        let owner = Arc::clone(self);
                        let spawned = std::thread::Builder::new()
                            .name("fc-owner-conn".into())
                            .spawn(move || owner.serve_connection(conn));
                        if let Err(e) = spawned {
                            log(
                                &self.name,
                                &format!("cannot start a connection thread: {e}"),
                            );
                        }
                    }
                    Err(e) => log(&self.name, &format!("accept: {e}")),
                }
            }
            self.reap_dead();
            for record in self.passing_through() {
                self.try_lease(record);
            }
            self.retire_unreachable();
            self.publish_counters();
            let idle_for = self
                .idle_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map(|since| since.elapsed());
            if idle_for.is_some_and(|d| d >= self.idle) {
                log(&self.name, "idle timeout: no process attached");
                break;
            }
        }
    }

    /// The end: every dirty page written back, the socket removed.
    fn shut_down(&self) {
        let _ = std::fs::remove_file(&self.paths.sock);
        let _ = std::fs::remove_file(&self.paths.clients);
        if let Err(e) = self.sync_all() {
            log(&self.name, &format!("writing back at exit failed: {e}"));
        }
        let servers: Vec<serve::Server> = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, s)| s)
            .collect();
        for server in servers {
            server.stop();
        }
        epoch::remove_external(&self.pins);
        log(&self.name, "stopped");
    }

    /// Writes every dirty page of every file back (`fcache cache sync`, the last client leaving,
    /// the end). The first error is returned after trying every file.
    pub(crate) fn sync_all(&self) -> Result<(), Error> {
        let files: Vec<File> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|s| s.file.clone())
            .collect();
        let mut first = None;
        for file in files {
            if let Err(e) = file.sync_all() {
                log(&self.name, &format!("writing back a file failed: {e}"));
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// [`Self::file`] for a request that changes the file: a file this owner opened for a
    /// reader only (a takeover reopens files in the order clients ask, and a writer's request
    /// left in flight can come before its open) is opened for writing first.
    pub(crate) fn file_to_change(&self, record: usize, generation: u32) -> Result<File, Error> {
        let file = self.file(record, generation)?;
        if file.is_writable() {
            return Ok(file);
        }
        let rec = &self.map.files()[record];
        let path = rec.path().ok_or(Error::ReadOnly)?;
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        self.end_lease(record);
        let (file, record_now, generation_now) =
            self.open_path(&path, key, true, file.max_order())?;
        if record_now != record || generation_now != generation {
            return Err(Error::ReadOnly);
        }
        if let Some(served) = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&record)
        {
            served.file = file.clone();
        }
        self.serve_watched(record);
        Ok(file)
    }

    /// The file of record `record` at `generation`, opening it from the record's path if this
    /// owner has not opened it yet (a request a previous owner left, a client's first request
    /// after a takeover).
    pub(crate) fn file(&self, record: usize, generation: u32) -> Result<File, Error> {
        let stale = || {
            Error::SharedMapping(
                "the file's record was given to another file (the owner dropped it)".to_owned(),
            )
        };
        {
            let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(served) = files.get(&record) {
                return if served.generation == generation {
                    Ok(served.file.clone())
                } else {
                    Err(stale())
                };
            }
        }
        let rec = self.map.files().get(record).ok_or_else(stale)?;
        if rec.state.load(Ordering::Acquire) != crate::mem::records::LIVE
            || rec.generation.load(Ordering::Acquire) != generation
        {
            return Err(stale());
        }
        let path = rec.path().ok_or_else(stale)?;
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        let max_order = rec.max_order.load(Ordering::Acquire).min(9) as u8;
        let (file, record_now, generation_now) = self
            .open_path(&path, key, true, max_order)
            .or_else(|_| self.open_path(&path, key, false, max_order))?;
        if record_now != record || generation_now != generation {
            return Err(stale());
        }
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let served = files
            .entry(record)
            .or_insert_with(|| Served::new(file, generation));
        Ok(served.file.clone())
    }

    /// Opens `path` in the cache, checking it is the file `key` names: the file, its record and
    /// the record's generation.
    fn open_path(
        &self,
        path: &std::path::Path,
        key: (u64, u64),
        write: bool,
        max_order: u8,
    ) -> Result<(File, usize, u32), Error> {
        use std::os::unix::fs::MetadataExt;
        if let Some(records) = self.cache.local().and_then(|l| l.records())
            && records.find(key).is_none()
            && records.free_count() == 0
        {
            // Every record is taken: the least recently used idle files make room.
            self.retire_unreachable();
            if records.free_count() == 0 {
                self.retire_idle(8);
            }
        }
        if !self.claims.claim(key) {
            return Err(Error::OpenConflict {
                path: path.to_owned(),
                reason: "another cache serves this file (one file, one cache: it passes \
                         through here)"
                    .to_owned(),
            });
        }
        let options = crate::io::OpenOptions::new()
            .write(write)
            .max_order(max_order)
            .buffered_fallback(true);
        let file = match self.cache.open_with(path, options) {
            Err(Error::Open { source, .. }) if source.raw_os_error() == Some(libc::EMFILE) => {
                // Out of descriptors: idle files give theirs back.
                self.retire_unreachable();
                self.retire_idle(64);
                self.cache.open_with(path, options)?
            }
            other => other?,
        };
        let meta = std::fs::metadata(path).map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
        if (meta.dev(), meta.ino()) != key {
            return Err(Error::OpenConflict {
                path: path.to_owned(),
                reason: "the path names another file now (renamed or replaced)".to_owned(),
            });
        }
        let records = self
            .cache
            .local()
            .and_then(|l| l.records())
            .ok_or_else(|| shared_error(&self.name, "the owner's cache has no records"))?;
        let assigned = records.assign(key.0, key.1, max_order, path)?;
        if let Some(outside) = &self.outside
            && let Err(e) = outside.watch(assigned.record, path)
        {
            // Without a watch only a revalidation on open sees outside changes.
            log(
                &self.name,
                &format!("outside writers: cannot watch {}: {e}", path.display()),
            );
        }
        Ok((file, assigned.record, assigned.generation))
    }

    /// Puts the clean folios a takeover kept back into their files, opened again from the
    /// paths in their records; a file that cannot be opened (gone, replaced) has its folios
    /// freed.
    fn adopt_clean(&self, adopt: &[takeover::Kept]) {
        let Some(local) = self.cache.local() else {
            return;
        };
        let mut pages = 0;
        for (record, generation, folios) in adopt {
            let adopted = self
                .file(*record, *generation)
                .ok()
                .and_then(|file| file.local().map(|inode| inode.adopt_clean(folios)));
            match adopted {
                Some(n) => pages += n,
                None => {
                    for &(pfn, _, order) in folios {
                        // A new life, dropped at once: the folio goes back to the allocator.
                        drop(local.memory().adopt_folio(pfn, order));
                    }
                }
            }
        }
        log(
            &self.name,
            &format!("{pages} clean pages kept from the previous owner are in their files again"),
        );
    }

    /// Takes `record`'s file out of the cache, if no client has it open: its dirty data is
    /// written back (a failure keeps it), its folios go with the owner's last reference to
    /// the file, and the record is free for another file. Whether it went.
    fn retire(&self, record: usize) -> bool {
        let Some(local) = self.cache.local() else {
            return false;
        };
        let Some(records) = local.records() else {
            return false;
        };
        let served = {
            let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            match files.get(&record) {
                Some(served) if served.idle() => {}
                _ => return false,
            }
            files.remove(&record)
        };
        let Some(served) = served else { return false };
        if served.file.sync_all().is_err() {
            // Kept: the flusher tries again, and so does the next retirement.
            self.files
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(record)
                .or_insert(served);
            return false;
        }
        self.forget_lease(record);
        self.forget_held(record);
        if let Some(outside) = &self.outside {
            outside.forget(record);
        }
        drop(served);
        // A request in flight may still hold the file a moment: its folios leave when it
        // does. The record is free once its index is empty.
        let rec = &self.map.files()[record];
        let deadline = Instant::now() + Duration::from_secs(1);
        while rec.root.load(Ordering::Acquire) != 0 {
            if Instant::now() > deadline {
                log(
                    &self.name,
                    &format!("record {record}: its folios stay after retirement; kept"),
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        records.release(record);
        self.claims.release(key);
        if std::env::var_os("FOLIOCACHE_OWNER_DEBUG").is_some() {
            log(
                &self.name,
                &format!("record {record} retired ({:?})", rec.path()),
            );
        }
        true
    }

    /// Frees records for new files: retires up to `want` idle files, least recently used
    /// first. How many went.
    fn retire_idle(&self, want: usize) -> usize {
        let mut idle: Vec<(Instant, usize)> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, s)| s.idle())
            .map(|(&r, s)| (s.used, r))
            .collect();
        idle.sort_unstable();
        idle.into_iter()
            .take(want)
            .filter(|&(_, record)| self.retire(record))
            .count()
    }

    /// Every tick: idle files whose path names them no more (deleted, or renamed and not
    /// opened since) leave the cache, so the owner does not keep deleted files' blocks
    /// allocated by holding them open.
    fn retire_unreachable(&self) {
        use std::os::unix::fs::MetadataExt;
        let idle: Vec<usize> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, s)| s.idle())
            .map(|(&r, _)| r)
            .collect();
        for record in idle {
            let rec = &self.map.files()[record];
            let key = (
                rec.dev.load(Ordering::Acquire),
                rec.ino.load(Ordering::Acquire),
            );
            let reachable = rec
                .path()
                .and_then(|path| std::fs::metadata(path).ok())
                .is_some_and(|m| (m.dev(), m.ino()) == key);
            if !reachable {
                self.retire(record);
            }
        }
    }

    /// The file the owner serves for `record`, if it serves one.
    fn served_file(&self, record: usize) -> Option<File> {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&record)
            .map(|s| s.file.clone())
    }

    /// Every file the owner serves.
    fn served_files(&self) -> Vec<File> {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|s| s.file.clone())
            .collect()
    }

    /// Publishes the counters `fcache cache status` shows without asking (header live words).
    fn publish_counters(&self) {
        let stats = self.cache.stats();
        let live = self.map.live();
        let counters = [
            stats.free_pages,
            stats.dirty.dirty_pages,
            stats.dirty.writeback_pages,
            self.files
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64,
            self.clients.load(Ordering::Relaxed) as u64,
        ];
        for (w, v) in live.counters.iter().zip(counters) {
            w.store(v, Ordering::Relaxed);
        }
        // The heartbeat a new owner compares file change times with (`takeover`).
        live.counters[takeover::HEARTBEAT].store(takeover::wall_ns(), Ordering::Release);
    }

    /// Rewrites `NAME.clients`: every attached process, with its memfd's descriptor number
    /// (how a new owner finds the mapping when no client hands it over).
    pub(crate) fn write_clients_file(&self) {
        let mut text = String::new();
        for p in self.map.processes() {
            if p.state.load(Ordering::Acquire) != 0 {
                let fd = p.memfd.load(Ordering::Acquire);
                if fd != u32::MAX {
                    text.push_str(&format!(
                        "{} {} {}\n",
                        p.pid.load(Ordering::Acquire),
                        p.start.load(Ordering::Acquire),
                        fd
                    ));
                }
            }
        }
        let tmp = self.paths.clients.with_extension("clients.tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &self.paths.clients);
        }
    }

    /// Starts the server of thread slot `slot`, which owns `staging` from now on. Callers start
    /// one only for a slot that has none (a claim, a takeover's kept slots, under the slot's
    /// lock or before any client is served).
    fn start_server(self: &Arc<Self>, slot: u32, staging: serve::Staging) {
        let server = serve::Server::start(Arc::clone(self), slot, staging);
        let old = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slot, server);
        if let Some(old) = old {
            debug_assert!(false, "a second server for thread slot {slot}");
            let kept = old.staging;
            old.stop();
            if kept != staging {
                self.free_staging(kept);
            }
        }
    }

    /// Stops the server of thread slot `slot`, if it has one, after the request it runs; its
    /// staging folio, which the caller frees.
    fn stop_server(&self, slot: u32) -> Option<serve::Staging> {
        let server = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&slot)?;
        let staging = server.staging;
        server.stop();
        Some(staging)
    }

    /// Gives a staging folio back (one the owner handed out, never one named only by the
    /// mapping's words).
    fn free_staging(&self, staging: serve::Staging) {
        if let Some(local) = self.cache.local() {
            local.memory().free_staging(staging.pfn);
        }
    }
}
