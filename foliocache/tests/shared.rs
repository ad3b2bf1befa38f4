//! The shared cache with real processes (`docs/SHARED.md`): coherence between processes under
//! a byte model, a kill storm, the owner's death, and who may attach.
//!
//! Each test runs workers as child processes of this test binary (`FOLIOCACHE_CHILD` names
//! their role), attached to one shared cache whose owner (`foliocache-owner`) the first of
//! them starts. The model lives in a shared file mapping of its own (not the cache's): per
//! page, the last write sequence started and the last one that returned. A page's bytes are
//! 8-byte words `seq << 20 | page`, so any word read says which write it came from.
//!
//! The rule checked (the kernel's page cache's): a read that starts after a write returned sees
//! that write or a later one, never an older one, and never a write not yet started.
//!
//! Truncation: each worker slot also owns a small file, `tail-SLOT`, which only it writes and
//! truncates and every worker reads. Its model counts events per page (a write, or a
//! truncation that cut the page) and remembers the last truncation: a read may see zeros, or
//! end before the page, only if a truncation that cut the page happened since the last event
//! that returned before the read started.

mod common;

use foliocache::{Cache, CacheCommand, EngineKind, OpenOptions, Policy, RefcountPolicy};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGES: u64 = 64;
const PAGE: u64 = 4096;
/// The model's words: per page `started`, `done`; then per worker slot a heartbeat.
const SLOTS: usize = 8;
/// Pages of each slot's `tail-SLOT` file.
const TAIL_PAGES: u64 = 8;

fn word(seq: u64, page: u64) -> u64 {
    seq << 20 | page
}

/// The model: a file mapping shared by the test and its workers.
struct Model {
    words: &'static [AtomicU64],
}

impl Model {
    fn create(path: &Path) -> Self {
        let len = (2 * PAGES as usize + SLOTS + 2 + 3 * SLOTS * TAIL_PAGES as usize) * 8;
        std::fs::write(path, vec![0u8; len]).unwrap();
        Self::open(path)
    }

    fn open(path: &Path) -> Self {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY: a shared mapping of a file of `len` bytes, kept for the process's life
        // (leaked); it is only ever used as atomics.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` bytes, page aligned, and lives forever.
        let words = unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), len / 8) };
        Self { words }
    }

    fn started(&self, page: u64) -> &AtomicU64 {
        &self.words[page as usize]
    }

    fn done(&self, page: u64) -> &AtomicU64 {
        &self.words[(PAGES + page) as usize]
    }

    fn heartbeat(&self, slot: usize) -> &AtomicU64 {
        &self.words[2 * PAGES as usize + slot]
    }

    /// The operations workers `0..workers` have done, together.
    fn beats(&self, workers: usize) -> u64 {
        (0..workers)
            .map(|s| self.heartbeat(s).load(Ordering::Relaxed))
            .sum()
    }

    fn stop(&self) -> &AtomicU64 {
        &self.words[2 * PAGES as usize + SLOTS]
    }

    /// Workers that panicked: counted by their panic hook before anything else, so a worker
    /// the test kills while it unwinds is counted too.
    fn failures(&self) -> &AtomicU64 {
        &self.words[2 * PAGES as usize + SLOTS + 1]
    }

    /// The tail files' words: per slot and page, the last event started, the last that
    /// returned, and the last truncation started.
    fn tail(&self, slot: usize, page: u64, which: usize) -> &AtomicU64 {
        let base = 2 * PAGES as usize + SLOTS + 2;
        &self.words[base + (slot * TAIL_PAGES as usize + page as usize) * 3 + which]
    }

    /// Makes a panic in this process count in [`Self::failures`] first.
    fn count_panics(&self) {
        let model = Self { words: self.words };
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            model.failures().fetch_add(1, Ordering::AcqRel);
            report(info);
        }));
    }
}

const STARTED: usize = 0;
const DONE: usize = 1;
const TRUNCATED: usize = 2;

/// Checks one page of a tail file (`bytes`, however many were read) against its model: the
/// last event that returned before the read (`low`) and the last started after it (`high`),
/// and the last truncation started (`truncated`).
fn check_tail(bytes: &[u8], page: u64, low: u64, high: u64, truncated: u64, what: &str) {
    let zero = bytes.is_empty() || bytes.iter().all(|&b| b == 0);
    if zero {
        assert!(
            truncated >= low,
            "{what}: page {page} reads as cut off or zero ({} bytes), yet no truncation of it \
             started since event {low} returned (the last is {truncated})",
            bytes.len()
        );
        return;
    }
    assert_eq!(bytes.len() as u64, PAGE, "{what}: page {page} read in part");
    check_words(bytes, page, low, high, what);
}

/// One test's setting: a runtime directory of its own, a data file, the model, a cache name.
struct Setup {
    dir: PathBuf,
    name: String,
    refcount: RefcountPolicy,
    engine: EngineKind,
    /// The owner runs without fanotify (`FOLIOCACHE_NO_FANOTIFY`).
    no_fanotify: bool,
    /// The capacity the workers ask for (the first one's owner takes it): 32 MiB, or
    /// [`shared_floor`] for a cache that evicts all the time.
    capacity: u64,
}

impl Setup {
    fn new(test: &str, refcount: RefcountPolicy, engine: EngineKind) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "fc-shared-{test}-{:?}-{:?}-{}",
            refcount,
            engine,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut data = Vec::with_capacity((PAGES * PAGE) as usize);
        for page in 0..PAGES {
            for _ in 0..PAGE / 8 {
                data.extend_from_slice(&word(0, page).to_le_bytes());
            }
        }
        std::fs::write(dir.join("data"), &data).unwrap();
        // A file nobody writes: its pages survive an owner's death (takeover keeps them).
        std::fs::write(dir.join("static"), &data).unwrap();
        for slot in 0..SLOTS {
            std::fs::write(
                dir.join(format!("tail-{slot}")),
                &data[..(TAIL_PAGES * PAGE) as usize],
            )
            .unwrap();
        }
        Model::create(&dir.join("model"));
        Self {
            name: format!("t{}-{test}", std::process::id() % 100000),
            dir,
            refcount,
            engine,
            no_fanotify: false,
            capacity: 32 << 20,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "FOLIOCACHE_RUNTIME_DIR".into(),
                self.dir.join("rt").display().to_string(),
            ),
            ("FC_DIR".into(), self.dir.display().to_string()),
            ("FC_NAME".into(), self.name.clone()),
            ("FC_REFCOUNT".into(), format!("{:?}", self.refcount)),
            ("FC_ENGINE".into(), format!("{:?}", self.engine)),
            ("FC_CAPACITY".into(), self.capacity.to_string()),
        ];
        if self.no_fanotify {
            env.push(("FOLIOCACHE_NO_FANOTIFY".into(), "1".into()));
        }
        env
    }

    /// Starts a worker child running `role` in slot `slot`.
    fn spawn(&self, test: &str, role: &str, slot: usize, workers: usize) -> Child {
        let exe = std::env::current_exe().unwrap();
        Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("FOLIOCACHE_CHILD", role)
            .env("FC_SLOT", slot.to_string())
            .env("FC_WORKERS", workers.to_string())
            .envs(self.env())
            .spawn()
            .unwrap()
    }

    fn admin(&self, command: CacheCommand) -> Result<String, foliocache::Error> {
        // SAFETY (of the environment): the runtime directory is set before the call; tests
        // in this binary that call this run their children with the same value.
        with_runtime_dir(&self.dir.join("rt"), || {
            foliocache::cache_command(&self.name, command)
        })
    }

    /// The data file on storage, checked against the model: every word's write is between
    /// the last that returned and the last that started.
    fn check_storage(&self) {
        let model = Model::open(&self.dir.join("model"));
        let data = std::fs::read(self.dir.join("data")).unwrap();
        assert_eq!(data.len() as u64, PAGES * PAGE);
        for page in 0..PAGES {
            let done = model.done(page).load(Ordering::Acquire);
            let started = model.started(page).load(Ordering::Acquire);
            let bytes = &data[(page * PAGE) as usize..((page + 1) * PAGE) as usize];
            check_words(bytes, page, done, started, "storage after the final sync");
        }
        for slot in 0..SLOTS {
            let tail = std::fs::read(self.dir.join(format!("tail-{slot}"))).unwrap();
            assert_eq!(
                tail.len() as u64 % PAGE,
                0,
                "tail-{slot} ends within a page"
            );
            for page in 0..TAIL_PAGES {
                let at = ((page * PAGE) as usize).min(tail.len());
                let end = (((page + 1) * PAGE) as usize).min(tail.len());
                check_tail(
                    &tail[at..end],
                    page,
                    model.tail(slot, page, DONE).load(Ordering::Acquire),
                    model.tail(slot, page, STARTED).load(Ordering::Acquire),
                    model.tail(slot, page, TRUNCATED).load(Ordering::Acquire),
                    &format!("tail-{slot} on storage after the final sync"),
                );
            }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.admin(CacheCommand::Destroy { force: true });
        // FC_KEEP=1 keeps the directory (the owners' log is there).
        if std::env::var_os("FC_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

static ENV_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn with_runtime_dir<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    let _one = ENV_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: the variable is only read by foliocache calls made under this same lock.
    unsafe { std::env::set_var("FOLIOCACHE_RUNTIME_DIR", dir) };
    f()
}

fn check_words(bytes: &[u8], page: u64, low: u64, high: u64, what: &str) {
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(chunk.try_into().unwrap());
        let (seq, p) = (w >> 20, w & 0xfffff);
        assert!(
            p == page && seq >= low && seq <= high,
            "{what}: page {page} word {i} holds write {seq} of page {p}; the model allows \
             writes {low}..={high} of page {page}"
        );
    }
}

/// A worker: attaches, then reads and writes random pages until told to stop (or killed).
/// Writes go to the pages of its slot (page % workers == slot), so one process writes a page
/// at a time; reads go anywhere and are checked against the model.
fn worker() {
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let slot: usize = std::env::var("FC_SLOT").unwrap().parse().unwrap();
    let workers: u64 = std::env::var("FC_WORKERS").unwrap().parse().unwrap();
    let refcount = match std::env::var("FC_REFCOUNT").unwrap().as_str() {
        "Cas" => RefcountPolicy::Cas,
        _ => RefcountPolicy::FrozenBit,
    };
    let engine = match std::env::var("FC_ENGINE").unwrap().as_str() {
        "Threads" => EngineKind::Threads,
        _ => EngineKind::IoUring,
    };
    let model = Model::open(&dir.join("model"));
    model.count_panics();
    let capacity: u64 = std::env::var("FC_CAPACITY").unwrap().parse().unwrap();
    let cache = Cache::builder()
        .capacity(capacity)
        .policy(Policy {
            refcount,
            ..Policy::default()
        })
        .io_engine(engine)
        .idle_timeout(Duration::from_secs(5))
        .shared(name)
        .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
        .build()
        .expect("attach");
    let file = cache
        .open_with(dir.join("data"), OpenOptions::new().write(true))
        .expect("open");
    let mut handle = file.handle();
    let fixed = cache.open(dir.join("static")).expect("open");
    let mut fixed_handle = fixed.handle();
    // Its own tail file, writable; the others' read-only.
    let tails: Vec<foliocache::File> = (0..workers as usize)
        .map(|s| {
            let options = OpenOptions::new().write(s == slot);
            cache
                .open_with(dir.join(format!("tail-{s}")), options)
                .expect("open a tail file")
        })
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id()) << 7;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut buf = vec![0u8; PAGE as usize];
    let mut ops = 0u64;
    let (mut truncations, mut cut_reads) = (0u64, 0u64);
    while model.stop().load(Ordering::Acquire) == 0 {
        let r = next();
        match r % 20 {
            0..=5 => {
                let page = (r >> 8) % (PAGES / workers) * workers + slot as u64;
                let seq = model.started(page).load(Ordering::Acquire) + 1;
                model.started(page).store(seq, Ordering::Release);
                for chunk in buf.chunks_exact_mut(8) {
                    chunk.copy_from_slice(&word(seq, page).to_le_bytes());
                }
                let n = handle.write_at(&buf, page * PAGE).expect("write");
                assert_eq!(n, PAGE as usize);
                model.done(page).store(seq, Ordering::Release);
            }
            6 => handle.sync_data().expect("fsync"),
            16 => {
                // A write of a page of its own tail file (extending it if it was cut).
                let page = (r >> 8) % TAIL_PAGES;
                let seq = model.tail(slot, page, STARTED).load(Ordering::Acquire) + 1;
                model
                    .tail(slot, page, STARTED)
                    .store(seq, Ordering::Release);
                for chunk in buf.chunks_exact_mut(8) {
                    chunk.copy_from_slice(&word(seq, page).to_le_bytes());
                }
                let n = tails[slot]
                    .handle()
                    .write_at(&buf, page * PAGE)
                    .expect("write a tail page");
                assert_eq!(n, PAGE as usize);
                model.tail(slot, page, DONE).store(seq, Ordering::Release);
            }
            17 => {
                // A truncation of its own tail file to `keep` pages (all: an extension, which
                // cuts nothing).
                let keep = (r >> 8) % (TAIL_PAGES + 1);
                let size = tails[slot].size();
                let cut: Vec<(u64, u64)> = (keep..TAIL_PAGES)
                    .filter(|&p| p * PAGE < size)
                    .map(|p| {
                        let id = model.tail(slot, p, STARTED).load(Ordering::Acquire) + 1;
                        model.tail(slot, p, TRUNCATED).store(id, Ordering::Release);
                        model.tail(slot, p, STARTED).store(id, Ordering::Release);
                        (p, id)
                    })
                    .collect();
                tails[slot]
                    .set_len(keep * PAGE)
                    .expect("truncate a tail file");
                for (p, id) in cut {
                    model.tail(slot, p, DONE).store(id, Ordering::Release);
                }
                truncations += 1;
            }
            18 | 19 => {
                // A read of one page of any slot's tail file.
                let s = (r >> 8) as usize % workers as usize;
                let page = (r >> 16) % TAIL_PAGES;
                let low = model.tail(s, page, DONE).load(Ordering::Acquire);
                let mut bytes = vec![0u8; PAGE as usize];
                let n = tails[s]
                    .handle()
                    .read_at(&mut bytes, page * PAGE)
                    .expect("read a tail page");
                let high = model.tail(s, page, STARTED).load(Ordering::Acquire);
                let truncated = model.tail(s, page, TRUNCATED).load(Ordering::Acquire);
                if n < bytes.len() || bytes.iter().all(|&b| b == 0) {
                    cut_reads += 1;
                }
                check_tail(
                    &bytes[..n],
                    page,
                    low,
                    high,
                    truncated,
                    &format!("a read of tail-{s}"),
                );
            }
            7 => {
                // The file nobody writes: always its first bytes.
                let page = (r >> 8) % PAGES;
                let mut bytes = vec![0u8; PAGE as usize];
                let n = fixed_handle.read_at(&mut bytes, page * PAGE).expect("read");
                assert_eq!(n, bytes.len());
                check_words(&bytes, page, 0, 0, "a read of the file nobody writes");
            }
            _ => {
                // A read of one to three pages, from any process's pages.
                let first = (r >> 8) % PAGES;
                let count = (1 + (r >> 40) % 3).min(PAGES - first);
                let low: Vec<u64> = (first..first + count)
                    .map(|p| model.done(p).load(Ordering::Acquire))
                    .collect();
                let mut bytes = vec![0u8; (count * PAGE) as usize];
                let n = handle.read_at(&mut bytes, first * PAGE).expect("read");
                assert_eq!(n, bytes.len());
                for (i, page) in (first..first + count).enumerate() {
                    let high = model.started(page).load(Ordering::Acquire);
                    check_words(
                        &bytes[i * PAGE as usize..(i + 1) * PAGE as usize],
                        page,
                        low[i],
                        high,
                        "a read",
                    );
                }
            }
        }
        ops += 1;
        model.heartbeat(slot).fetch_add(1, Ordering::Relaxed);
    }
    println!(
        "worker {slot}: {ops} operations, {truncations} truncations, {cut_reads} reads of a \
         page cut off"
    );
}

fn child_entry() -> bool {
    match common::child_role().as_deref() {
        Some("worker") => {
            worker();
            true
        }
        Some("outside") => {
            outside_reader();
            true
        }
        Some("takeover") => {
            takeover_keeper();
            true
        }
        Some("held") => {
            held_writer();
            true
        }
        Some("returning") => {
            returning_writer();
            true
        }
        Some("visitor") => {
            visitor();
            true
        }
        Some("second-claimer") => {
            second_claimer();
            true
        }
        Some("releaser") => {
            // A thread claims a slot and ends (its slot's release goes to the owner, which the
            // test holds at the `release` point); this process waits to be killed.
            let (dir, cache) = attach_child();
            let file = cache.open(dir.join("data")).expect("open");
            std::thread::spawn(move || {
                let mut page = vec![0u8; PAGE as usize];
                assert_eq!(file.handle().read_at(&mut page, 0).unwrap(), page.len());
            });
            std::thread::sleep(Duration::from_secs(60));
            true
        }
        Some("forker") => {
            forker();
            true
        }
        Some("claims-other-user") => {
            // Another user's own cache, on a file the test user's cache serves: refused.
            let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
            let rt = std::env::temp_dir().join(format!("fc-claims-{}", std::process::id()));
            std::fs::create_dir_all(&rt).unwrap();
            std::fs::set_permissions(&rt, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .unwrap();
            let opened = with_runtime_dir(&rt, || {
                let cache = Cache::builder()
                    .capacity(32 << 20)
                    .idle_timeout(Duration::from_secs(2))
                    .shared("theirs")
                    .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
                    .build()
                    .expect("attach as another user");
                let opened = cache.open(dir.join("data")).map(drop);
                let _ = foliocache::cache_command("theirs", CacheCommand::Destroy { force: true });
                opened
            });
            let _ = std::fs::remove_dir_all(&rt);
            match opened {
                Err(e) if e.to_string().contains("another cache") => {
                    println!("refused: {e}");
                    std::process::exit(0);
                }
                other => {
                    eprintln!("another user's cache opened a claimed file: {other:?}");
                    std::process::exit(1);
                }
            }
        }
        Some("lease-reader") => {
            // Opens the file nobody writes read-only (the owner leases it from this
            // connection's thread), reads it, and leaves.
            let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
            let name = std::env::var("FC_NAME").unwrap();
            let cache = Cache::builder()
                .capacity(32 << 20)
                .io_engine(EngineKind::Threads)
                .idle_timeout(Duration::from_secs(5))
                .shared(name.clone())
                .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
                .build()
                .expect("attach");
            let path = dir.join("static");
            let file = cache.open(&path).expect("open");
            let mut page = vec![0u8; PAGE as usize];
            assert_eq!(file.handle().read_at(&mut page, 0).unwrap(), page.len());
            wait_for_signal(&name, &path, "lease");
            true
        }
        Some("other-user") => {
            let name = std::env::var("FC_NAME").unwrap();
            match Cache::builder()
                .capacity(32 << 20)
                .shared(name)
                .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
                .build()
            {
                Ok(_) => {
                    eprintln!("another user attached");
                    std::process::exit(1);
                }
                Err(e) => {
                    println!("refused: {e}");
                    std::process::exit(0);
                }
            }
        }
        Some(_) => true,
        None => false,
    }
}

fn combos() -> Vec<(RefcountPolicy, EngineKind)> {
    vec![
        (RefcountPolicy::FrozenBit, EngineKind::IoUring),
        (RefcountPolicy::Cas, EngineKind::Threads),
        (RefcountPolicy::FrozenBit, EngineKind::Threads),
        (RefcountPolicy::Cas, EngineKind::IoUring),
    ]
}

/// Waits for every child, failing on any that did not exit cleanly or took too long. On a
/// failure every child still running is killed first: a test that fails must not leave
/// workers running (they would load the machine for every later test).
fn join_all(mut children: Vec<Child>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut failure = None;
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                if !status.success() {
                    failure = Some(format!("a worker failed: {status}"));
                }
                break;
            }
            if Instant::now() > deadline {
                if let Some(secs) = std::env::var("FC_HANG_WAIT")
                    .ok()
                    .and_then(|s| s.parse().ok())
                {
                    eprintln!("HUNG worker pid {}", child.id());
                    std::thread::sleep(Duration::from_secs(secs));
                }
                failure = Some(format!(
                    "a worker hung (still running {limit:?} after the stop)"
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if failure.is_some() {
            break;
        }
    }
    if let Some(failure) = failure {
        kill_all(&mut children);
        panic!("{failure}");
    }
}

/// Waits up to 20 s for `children`'s work to reach `target` operations together and returns
/// how long it took; fails with `what` and the [`diagnosis`] if it does not, or if a worker
/// panics meanwhile. With `FC_HANG_WAIT=SECS` the diagnosis is printed and the processes are
/// left as they are for that long first (to look at them).
fn await_beats(
    setup: &Setup,
    model: &Model,
    children: &mut [Child],
    target: u64,
    what: &str,
) -> Duration {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(20);
    while model.beats(children.len()) < target {
        if Instant::now() > deadline || model.failures().load(Ordering::Acquire) > 0 {
            let said = diagnosis(setup, model, children);
            if let Some(secs) = std::env::var("FC_HANG_WAIT")
                .ok()
                .and_then(|s| s.parse().ok())
            {
                eprintln!("{said}");
                std::thread::sleep(Duration::from_secs(secs));
            }
            panic!("{what}\n{said}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// What a failing test says about its processes: the workers' panics counted in `model`, each
/// child's state (where its threads wait in the kernel, if it runs), and the end of the
/// owners' log.
fn diagnosis(setup: &Setup, model: &Model, children: &mut [Child]) -> String {
    let mut out = format!(
        "{} worker panic(s) counted\n",
        model.failures().load(Ordering::Acquire)
    );
    for (i, child) in children.iter_mut().enumerate() {
        let pid = child.id();
        match child.try_wait() {
            Ok(Some(status)) => out.push_str(&format!("worker {i} (pid {pid}): ended, {status}\n")),
            _ => {
                let waits: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|task| {
                        let wchan =
                            std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
                        format!("{}:{wchan}", task.file_name().to_string_lossy())
                    })
                    .collect();
                out.push_str(&format!(
                    "worker {i} (pid {pid}): running, threads in {}\n",
                    waits.join(" ")
                ));
            }
        }
    }
    out.push_str(&format!("owner pid now: {:?}\n", owner_pid(setup)));
    let log = setup.dir.join("rt").join(format!("{}.log", setup.name));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    out.push_str(&format!("{} (last 40 lines):\n", log.display()));
    for line in &lines[lines.len().saturating_sub(40)..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The smallest capacity a shared cache takes, as its refusal of a smaller one names it.
fn shared_floor() -> u64 {
    match Cache::builder()
        .capacity(64 << 10)
        .shared("fc-floor-never-created")
        .build()
    {
        Err(foliocache::Error::SharedCapacityTooSmall { minimum, .. }) => minimum,
        other => panic!("a 64 KiB shared cache: {:?}", other.map(drop)),
    }
}

/// Fails if a thread of the owner panicked (the owner then ends and a client starts the next
/// one, which would hide the bug from every other check): the log's lines from the panic on.
fn assert_owner_never_panicked(setup: &Setup) {
    let log = setup.dir.join("rt").join(format!("{}.log", setup.name));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if let Some(at) = text.find("panicked") {
        let from = text[..at].rfind('\n').map_or(0, |i| i + 1);
        let excerpt: String = text[from..].lines().take(40).collect::<Vec<_>>().join("\n");
        panic!(
            "a thread of the owner panicked ({}):\n{excerpt}",
            log.display()
        );
    }
}

/// Children that are killed if the test fails before it joins them.
struct Running(Vec<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        kill_all(&mut self.0);
    }
}

/// Kills and reaps every child still running.
fn kill_all(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn processes_see_each_others_writes() {
    if child_entry() {
        return;
    }
    let phase = common::stress_duration().max(Duration::from_millis(500)) / 4;
    for (i, (refcount, engine)) in combos().into_iter().enumerate() {
        let workers = 2 + i % 3;
        let setup = Setup::new("coherence", refcount, engine);
        let children: Vec<Child> = (0..workers)
            .map(|slot| setup.spawn("processes_see_each_others_writes", "worker", slot, workers))
            .collect();
        std::thread::sleep(phase + Duration::from_millis(300));
        Model::open(&setup.dir.join("model"))
            .stop()
            .store(1, Ordering::Release);
        join_all(children, Duration::from_secs(30));
        setup.admin(CacheCommand::Sync).expect("sync");
        setup.check_storage();
        assert_owner_never_panicked(&setup);
        println!("{refcount:?} {engine:?} with {workers} processes: coherent");
    }
}

#[test]
fn kill_storm() {
    if child_entry() {
        return;
    }
    let duration = common::stress_duration().max(Duration::from_secs(1));
    // Two storms on a cache far larger than the files, and one on the smallest cache there
    // is, where every read and write evicts (an index node was once handed out at offset 0
    // only there: page 0 of the arena became a node page).
    let storms = combos()
        .into_iter()
        .take(3)
        .zip([32 << 20, 32 << 20, shared_floor()]);
    for ((refcount, engine), capacity) in storms {
        let mut setup = Setup::new("storm", refcount, engine);
        setup.capacity = capacity;
        let workers = 4;
        let model = Model::open(&setup.dir.join("model"));
        let mut children: Vec<Child> = (0..workers)
            .map(|slot| setup.spawn("kill_storm", "worker", slot, workers))
            .collect();
        let start = Instant::now();
        let mut rng = 12345u64;
        let mut kills = 0;
        while start.elapsed() < duration {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            std::thread::sleep(Duration::from_millis(5 + (rng >> 33) % 40));
            let slot = (rng >> 20) as usize % workers;
            // A worker may panic and then be killed before it exits: its panic hook counted it.
            if model.failures().load(Ordering::Acquire) > 0 {
                let said = diagnosis(&setup, &model, &mut children);
                kill_all(&mut children);
                panic!("a worker panicked (see its output above)\n{said}");
            }
            let child = &mut children[slot];
            if let Some(status) = child.try_wait().unwrap() {
                kill_all(&mut children);
                panic!("worker {slot} ended by itself: {status}");
            }
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            kills += 1;
            // The owner finishes a dead process's request in flight before it forgets the
            // process: a replacement writing the same pages waits for that (see
            // docs/SHARED.md, "A client's death").
            wait_detached(&setup, pid);
            children[slot] = setup.spawn("kill_storm", "worker", slot, workers);
        }
        let beats = model.beats(workers);
        model.stop().store(1, Ordering::Release);
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        join_all(children, Duration::from_secs(30));
        assert_eq!(
            model.failures().load(Ordering::Acquire),
            0,
            "a worker panicked before it was killed (see its output above)"
        );
        setup.admin(CacheCommand::Sync).expect("sync");
        setup.check_storage();
        // Nothing the killed processes held stays held.
        for pid in pids {
            wait_detached(&setup, pid);
        }
        assert_owner_never_panicked(&setup);
        assert_all_free(&setup);
        println!(
            "{refcount:?} {engine:?}, {} KiB: {kills} kills, {beats} operations, storage \
             matches",
            capacity >> 10
        );
        assert!(beats > 0, "the workers made no progress");
    }
}

/// Whether the owner no longer lists `pid` among the attached processes (false while no owner
/// answers).
fn detached(setup: &Setup, pid: u32) -> bool {
    let Ok(status) = setup.admin(CacheCommand::Status) else {
        return false;
    };
    !status
        .split("\"processes\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .is_some_and(|list| list.split(',').any(|p| p == pid.to_string()))
}

/// Waits until the owner no longer lists `pid` among the attached processes.
fn wait_detached(setup: &Setup, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if detached(setup, pid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the owner never noticed process {pid} died"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The owner's pid, from the cache's status.
fn owner_pid(setup: &Setup) -> Option<i32> {
    let status = setup.admin(CacheCommand::Status).ok()?;
    status
        .split("\"owner_pid\":")
        .nth(1)?
        .split(',')
        .next()?
        .parse()
        .ok()
}

#[test]
fn owner_killed_while_processes_read_and_write() {
    if child_entry() {
        return;
    }
    let duration = common::stress_duration().max(Duration::from_secs(1));
    for (refcount, engine) in combos().into_iter().take(2) {
        let setup = Setup::new("owner", refcount, engine);
        let workers = 3;
        let model = Model::open(&setup.dir.join("model"));
        let mut children: Vec<Child> = (0..workers)
            .map(|slot| {
                setup.spawn(
                    "owner_killed_while_processes_read_and_write",
                    "worker",
                    slot,
                    workers,
                )
            })
            .collect();
        let start = Instant::now();
        let mut kills = 0;
        let mut owners = std::collections::HashSet::new();
        while start.elapsed() < duration {
            std::thread::sleep(Duration::from_millis(150));
            if let Some(pid) = owner_pid(&setup) {
                owners.insert(pid);
                // SAFETY: a plain kill(2) of the owner process this test's workers started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                kills += 1;
            }
        }
        // Work goes on after the last death, once a new owner has started: a bounded wait
        // (a loaded machine may take a while to start one), not a fixed window.
        let resumed = await_beats(
            &setup,
            &model,
            &mut children,
            model.beats(workers) + 1,
            "the workers stopped making progress after the owner's deaths",
        );
        let after = model.beats(workers);
        model.stop().store(1, Ordering::Release);
        join_all(children, Duration::from_secs(30));
        setup.admin(CacheCommand::Sync).expect("sync");
        setup.check_storage();
        println!(
            "{refcount:?} {engine:?}: owner killed {kills} times ({} owners), {after} operations \
             (going on {resumed:?} after the last kill), storage matches",
            owners.len()
        );
        assert!(kills > 0);
    }
}

/// A process that waited for another's owner to start, and saw that owner die before it
/// could connect, starts one again. The lock an owner holds while it starts is held here
/// for 4.5 s (an owner waits 2 s for one that is starting, then steps aside, so the first
/// start steps aside however late it began) and then let go, as when the starting owner is
/// killed; the attach must not wait out its 20 s for an owner nobody starts.
#[test]
fn an_owner_that_died_while_others_waited_is_started_again() {
    if child_entry() {
        return;
    }
    use std::os::unix::fs::DirBuilderExt;
    let setup = Setup::new("restart", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let rt = setup.dir.join("rt");
    std::fs::DirBuilder::new().mode(0o700).create(&rt).unwrap();
    let lock = std::fs::File::create(rt.join(format!("{}.lock", setup.name))).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(4500));
        drop(lock);
    });
    let start = Instant::now();
    let cache = with_runtime_dir(&rt, || {
        Cache::builder()
            .capacity(32 << 20)
            .shared(setup.name.clone())
            .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
            .build()
    });
    holder.join().unwrap();
    let cache = cache.unwrap_or_else(|e| panic!("the attach failed: {e}"));
    let took = start.elapsed();
    let file = cache.open(setup.dir.join("static")).expect("open");
    let mut bytes = vec![0u8; PAGE as usize];
    let n = file.handle().read_at(&mut bytes, 3 * PAGE).expect("read");
    assert_eq!(n, bytes.len());
    check_words(&bytes, 3, 0, 0, "a read through the owner started again");
    println!("attached after the starting owner died: {took:?}");
    drop(file);
    drop(cache);
}

#[test]
fn another_user_cannot_attach() {
    if child_entry() {
        return;
    }
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        common::skip("needs root, to run a process as another user");
        return;
    }
    let setup = Setup::new("uid", RefcountPolicy::FrozenBit, EngineKind::Threads);
    // The cache runs, attached by this process.
    let cache = with_runtime_dir(&setup.dir.join("rt"), || {
        Cache::builder()
            .capacity(32 << 20)
            .shared(setup.name.clone())
            .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
            .build()
    })
    .expect("attach");
    // The test directory must be reachable by the other user (the runtime directory inside
    // it stays 0700).
    std::fs::set_permissions(
        &setup.dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "another_user_cannot_attach",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FOLIOCACHE_CHILD", "other-user")
        .envs(setup.env())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.contains("Permission denied") && !text.contains("refused") {
        common::skip("the test binary is not readable by another user here");
        return;
    }
    assert!(out.status.success(), "another user attached: {text}");
    assert!(text.contains("refused"), "{text}");
    println!(
        "{}",
        text.lines().find(|l| l.contains("refused")).unwrap_or("")
    );
    drop(cache);
}

/// The file's state in the owner's status (`"lease"`, `"passing through"`, `"inotify"`).
fn file_signal(name: &str, path: &Path) -> String {
    let status = foliocache::cache_command(name, CacheCommand::Status).unwrap();
    let at = status
        .find(&format!("\"path\":{:?}", path.display().to_string()))
        .unwrap_or_else(|| panic!("the owner does not list {}: {status}", path.display()));
    status[at..]
        .split("\"signal\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

/// Waits (5 s at most) until the owner lists `path` with `signal`.
fn wait_for_signal(name: &str, path: &Path, signal: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = file_signal(name, path);
        if now == signal {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: the owner shows {now:?}, not {signal:?}, after 5 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child of the outside-writer tests: a reader attached to the cache, and in the same
/// process a plain descriptor (outside the cache) writing and truncating the file the reader
/// reads. `FC_SLOT` 1: the reader holds the file read-only, so the owner holds a lease and
/// every read after an outside write returned must see it; 0: the reader holds it writable
/// (no lease), so the inotify watch sees the writes, within a window this measures.
fn outside_reader() {
    use std::os::unix::fs::FileExt;
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let leased = std::env::var("FC_SLOT").unwrap() == "1";
    let cache = Cache::builder()
        .capacity(32 << 20)
        .io_engine(EngineKind::Threads)
        .idle_timeout(Duration::from_secs(5))
        .shared(name.clone())
        .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
        .build()
        .expect("attach");
    let path = dir.join("data");
    let file = if leased {
        cache.open(&path).expect("open")
    } else {
        cache
            .open_with(&path, OpenOptions::new().write(true))
            .expect("open")
    };
    let mut handle = file.handle();
    let mut page = vec![0u8; PAGE as usize];
    assert_eq!(handle.read_at(&mut page, 0).unwrap(), PAGE as usize);
    check_words(&page, 0, 0, 0, "the first read");
    assert!(
        file.cached_ranges().iter().any(|r| r.first == 0),
        "page 0 is not in the shared cache after a read"
    );
    wait_for_signal(&name, &path, if leased { "lease" } else { "inotify" });
    let opening = Instant::now();
    let outside = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let opened_after = opening.elapsed();
    if leased {
        // The owner stopped serving the file before the kernel let this open return.
        assert_eq!(file_signal(&name, &path), "passing through");
    }
    let mut windows = Vec::new();
    for round in 1..=20u64 {
        let bytes: Vec<u8> = (0..PAGE / 8)
            .flat_map(|_| word(round, 0).to_le_bytes())
            .collect();
        outside.write_all_at(&bytes, 0).unwrap();
        let written = Instant::now();
        loop {
            assert_eq!(handle.read_at(&mut page, 0).unwrap(), PAGE as usize);
            let first = u64::from_le_bytes(page[..8].try_into().unwrap());
            if first == word(round, 0) {
                check_words(&page, 0, round, round, "a read after the outside write");
                break;
            }
            assert!(
                !leased,
                "round {round}: a read after an outside write returned got the old bytes, \
                 though the owner held a lease"
            );
            // Until the event arrives the reader may see the write before, never another.
            check_words(&page, 0, round - 1, round - 1, "a read in the window");
            assert!(
                written.elapsed() < Duration::from_secs(10),
                "round {round}: the cache still serves the old bytes 10 s after an outside write"
            );
            std::thread::yield_now();
        }
        windows.push(written.elapsed());
        if !leased {
            // The page is cached again before the next round's write.
            assert!(file.cached_ranges().iter().any(|r| r.first == 0));
        }
    }
    // An outside truncation: the cache's size follows.
    outside.set_len(PAGES * PAGE / 2).unwrap();
    let truncated = Instant::now();
    while file.size() != PAGES * PAGE / 2 {
        assert!(
            !leased,
            "the size did not follow an outside truncation at once"
        );
        let _ = handle.read_at(&mut page, PAGES * PAGE / 2);
        assert!(
            truncated.elapsed() < Duration::from_secs(10),
            "the cache's size did not follow an outside truncation"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(handle.read_at(&mut page, PAGES * PAGE / 2).unwrap(), 0);
    let truncated_after = truncated.elapsed();
    drop(outside);
    if leased {
        // The writer is gone: the owner leases the file again and serves it from the cache.
        wait_for_signal(&name, &path, "lease");
        assert_eq!(handle.read_at(&mut page, 0).unwrap(), PAGE as usize);
        check_words(&page, 0, 20, 20, "a read once the lease is back");
        assert!(
            file.cached_ranges().iter().any(|r| r.first == 0),
            "page 0 is not cached again once the owner leases the file again"
        );
        assert_eq!(file.size(), PAGES * PAGE / 2);
    }
    windows.sort();
    println!(
        "{}: the outside open waited {opened_after:?}; writes seen after: median {:?}, max {:?} \
         (20 writes); truncation after {truncated_after:?}",
        if leased { "leased" } else { "watched" },
        windows[windows.len() / 2],
        windows[windows.len() - 1],
    );
}

/// A program outside the cache writes and truncates a file a shared cache serves, while a
/// reader attached to the cache holds it writable: no lease can be had, and the reader sees
/// each change once the owner's inotify watch has reported it (`docs/SHARED.md`, "Writers
/// outside the cache"), never bytes older than the last write.
#[test]
fn an_outside_writer_is_seen_by_readers() {
    if child_entry() {
        return;
    }
    let mut setup = Setup::new("outside", RefcountPolicy::FrozenBit, EngineKind::Threads);
    // The regime without an exact signal: an owner without fanotify (as one without
    // CAP_SYS_ADMIN is; with it, `an_outside_open_waits_while_clients_hold_a_file_writable`).
    setup.no_fanotify = true;
    let child = setup
        .spawn("an_outside_writer_is_seen_by_readers", "outside", 0, 1)
        .wait_with_output();
    let out = child.unwrap();
    assert!(out.status.success(), "the reader failed: {}", out.status);
    let status = setup.admin(CacheCommand::Status).unwrap_or_default();
    let changes: u64 = status
        .split("\"outside_changes\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the owner has no outside-writer watch: {status}"));
    // Each of the 21 changes was found by the watch (nothing else revalidates the file here).
    assert!(changes >= 21, "the watch found {changes} changes: {status}");
}

/// The same outside writer while the reader holds the file read-only: the owner holds a read
/// lease, the writer's open waits until the owner has stopped serving the file, and every
/// read after a write returned sees it (no window); once the writer closes, the owner leases
/// the file again and serves it from the cache.
#[test]
fn a_lease_holds_an_outside_writer_until_the_cache_lets_go() {
    if child_entry() {
        return;
    }
    let setup = Setup::new("lease", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let child = setup
        .spawn(
            "a_lease_holds_an_outside_writer_until_the_cache_lets_go",
            "outside",
            1,
            1,
        )
        .wait_with_output();
    let out = child.unwrap();
    assert!(out.status.success(), "the reader failed: {}", out.status);
    let status = setup.admin(CacheCommand::Status).unwrap_or_default();
    let count = |key: &str| -> u64 {
        status
            .split(&format!("\"{key}\":"))
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in the status: {status}"))
    };
    assert!(count("leases_taken") >= 2, "{status}");
    assert_eq!(count("lease_breaks"), 1, "{status}");
    // A lease taken for a client that has left since: a writer's open is let go as soon as
    // the owner hears the break, not when the kernel gives up on the lease (45 s). The
    // break once reached nobody: the thread that took the lease had exited with its client.
    let child = setup.spawn(
        "a_lease_holds_an_outside_writer_until_the_cache_lets_go",
        "lease-reader",
        2,
        1,
    );
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the lease reader failed: {}",
        out.status
    );
    // Its connection's thread ends once the owner has let the process go.
    wait_detached(&setup, pid);
    std::thread::sleep(Duration::from_millis(50));
    let path = setup.dir.join("static");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opened = std::fs::OpenOptions::new().write(true).open(&path);
        let _ = sender.send(opened.map(drop));
    });
    // (Without the fix the open waited until the owner left at its idle timeout, 5 s here,
    // or the kernel's 45 s; a break heard takes about a millisecond.)
    let opened = receiver
        .recv_timeout(Duration::from_secs(3))
        .expect("an outside open waited 3 s for a lease taken for a client that left");
    opened.unwrap();
}

/// The child of `a_forked_child_attaches_anew`: a file lent as a descriptor, detached and
/// attached again (its pages stay in the shared cache), then a fork. The forked child may not
/// use the parent's attachment (an error, not a hang, and the parent's thread slot is not
/// given back from there); attached anew it reads the parent's pages and writes a page the
/// parent then reads.
fn forker() {
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let attach = || {
        Cache::builder()
            .capacity(32 << 20)
            .io_engine(EngineKind::Threads)
            .idle_timeout(Duration::from_secs(5))
            .shared(name.clone())
            .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
            .build()
            .expect("attach")
    };
    let cache = attach();
    let path = dir.join("data");
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let file = cache
        .open_descriptor(fd.into(), OpenOptions::new().write(true))
        .expect("open a lent descriptor");
    let mut page = vec![0u8; PAGE as usize];
    assert_eq!(file.handle().read_at(&mut page, 0).unwrap(), page.len());
    check_words(&page, 0, 0, 0, "a read through a lent descriptor");
    let fd = file.detach_descriptor().expect("detach");
    assert!(
        file.cached_ranges().iter().any(|r| r.first == 0),
        "a detached file lost its pages"
    );
    assert!(file.detach_descriptor().is_err(), "detached twice");
    file.attach_descriptor(fd, true).expect("attach again");
    // SAFETY: fork in a single-purpose child process; the child only calls the cache, the
    // allocator and `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let refused = file.handle().read_at(&mut page, 0);
            assert!(
                refused.is_err(),
                "a forked child used its parent's attachment: {refused:?}"
            );
            let cache = attach();
            let file = cache
                .open_with(&path, OpenOptions::new().write(true))
                .expect("open in the child");
            let mut page = vec![0u8; PAGE as usize];
            assert_eq!(file.handle().read_at(&mut page, 0).unwrap(), page.len());
            check_words(&page, 0, 0, 0, "the child's read");
            let bytes: Vec<u8> = (0..PAGE / 8)
                .flat_map(|_| word(7, 1).to_le_bytes())
                .collect();
            assert_eq!(file.handle().write_at(&bytes, PAGE).unwrap(), bytes.len());
        }))
        .map_or(1, |()| 0);
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child failed ({status:#x})"
    );
    // The parent's thread slot still works, and it reads the child's write.
    assert_eq!(file.handle().read_at(&mut page, PAGE).unwrap(), page.len());
    check_words(&page, 1, 7, 7, "the parent's read of the child's write");
    println!("a forked child attached anew and shared the parent's pages");
}

/// A process lends the cache a descriptor, detaches and attaches it, and forks
/// (`forker`).
#[test]
fn a_forked_child_attaches_anew() {
    if child_entry() {
        return;
    }
    let setup = Setup::new("fork", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let out = setup
        .spawn("a_forked_child_attaches_anew", "forker", 0, 1)
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "the forker failed: {}", out.status);
}

/// One file, one cache (`docs/SHARED.md`): a second cache of the same user, and another
/// user's cache, are refused a file the first serves; once the first cache is gone the
/// second may serve it.
#[test]
fn a_file_is_served_by_one_cache_at_a_time() {
    if child_entry() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let setup = Setup::new("claims", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let second = format!("{}-b", setup.name);
    let attach = |name: &str| {
        with_runtime_dir(&setup.dir.join("rt"), || {
            Cache::builder()
                .capacity(32 << 20)
                .idle_timeout(Duration::from_secs(5))
                .shared(name)
                .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
                .build()
        })
        .expect("attach")
    };
    let first = attach(&setup.name);
    let path = setup.dir.join("data");
    let file = first
        .open_with(&path, OpenOptions::new().write(true))
        .expect("the first cache opens the file");
    let other = attach(&second);
    let refused = other.open(&path).map(drop);
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("another cache")),
        "a second cache opened a file the first serves: {refused:?}"
    );
    if rustix::process::geteuid().is_root() {
        std::fs::set_permissions(
            &setup.dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_file_is_served_by_one_cache_at_a_time",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FOLIOCACHE_CHILD", "claims-other-user")
            .envs(setup.env())
            .env_remove("FOLIOCACHE_RUNTIME_DIR")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if text.contains("Permission denied") && !text.contains("refused") {
            common::skip("the test binary is not readable by another user here");
        } else {
            assert!(out.status.success(), "{text}");
            println!("another user's cache: {}", text.trim());
        }
    }
    // The first cache goes: its claims go with its owner.
    drop(file);
    drop(first);
    let _ = setup.admin(CacheCommand::Destroy { force: true });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match other.open(&path) {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the second cache is still refused 10 s after the first went: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    with_runtime_dir(&setup.dir.join("rt"), || {
        let _ = foliocache::cache_command(&second, CacheCommand::Destroy { force: true });
    });
}

/// Whether process `pid` has exited (gone, or a zombie).
fn exited(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// The child of `a_new_owner_keeps_clean_pages`: reads two files whole through the cache, lets
/// a heartbeat pass, kills the owner, changes the second file with a plain write while no
/// owner watches, and makes a request (which starts a new owner). The first file must still be
/// cached whole; the second must read the new bytes.
fn takeover_keeper() {
    use std::os::unix::fs::FileExt;
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let other = dir.join("other");
    std::fs::copy(dir.join("data"), &other).unwrap();
    let cache = Cache::builder()
        .capacity(32 << 20)
        .io_engine(EngineKind::Threads)
        .idle_timeout(Duration::from_secs(5))
        .shared(name.clone())
        .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
        .build()
        .expect("attach");
    let files = [
        cache.open(dir.join("data")).expect("open"),
        cache.open(&other).expect("open"),
    ];
    let mut bytes = vec![0u8; (PAGES * PAGE) as usize];
    for file in &files {
        assert_eq!(file.handle().read_at(&mut bytes, 0).unwrap(), bytes.len());
        let cached: u64 = file.cached_ranges().iter().map(|r| r.pages).sum();
        assert_eq!(cached, PAGES, "a file read whole is not cached whole");
    }
    // The files' last changes must lie a heartbeat margin (1 s) before the owner's death.
    std::thread::sleep(Duration::from_millis(1500));
    let status = foliocache::cache_command(&name, CacheCommand::Status).unwrap();
    let pid: i32 = status
        .split("\"owner_pid\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // SAFETY: a plain kill(2) of the owner process this test's cache started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !exited(pid) {
        assert!(Instant::now() < deadline, "the owner did not die");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A change no owner sees: page 3 of the second file.
    let page: Vec<u8> = (0..PAGE / 8)
        .flat_map(|_| word(1, 3).to_le_bytes())
        .collect();
    let plain = std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .unwrap();
    plain.write_all_at(&page, 3 * PAGE).unwrap();
    drop(plain);
    // The next request starts a new owner, which takes the mapping over.
    let kept: u64 = files[0].cached_ranges().iter().map(|r| r.pages).sum();
    assert_eq!(
        kept, PAGES,
        "the new owner did not keep the clean pages of an unchanged file"
    );
    let mut got = vec![0u8; PAGE as usize];
    assert_eq!(
        files[1].handle().read_at(&mut got, 3 * PAGE).unwrap(),
        got.len()
    );
    check_words(&got, 3, 1, 1, "a page changed while no owner ran");
    assert_eq!(
        files[0].handle().read_at(&mut bytes, 0).unwrap(),
        bytes.len()
    );
    for page in 0..PAGES {
        let at = (page * PAGE) as usize;
        check_words(&bytes[at..at + PAGE as usize], page, 0, 0, "a kept page");
    }
    let status = foliocache::cache_command(&name, CacheCommand::Status).unwrap();
    assert!(
        !status.contains(&format!("\"owner_pid\":{pid},")),
        "the owner is the old one"
    );
    println!("a new owner kept all {kept} pages of the unchanged file");
}

/// The owner is killed; the next owner keeps the clean pages of a file that did not change,
/// and none of a file that changed while no owner watched (`docs/SHARED.md`, "The owner").
#[test]
fn a_new_owner_keeps_clean_pages() {
    if child_entry() {
        return;
    }
    let setup = Setup::new("keep", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let status = setup
        .spawn("a_new_owner_keeps_clean_pages", "takeover", 0, 1)
        .wait()
        .unwrap();
    assert!(status.success(), "the reader failed: {status}");
}

/// After a takeover every process comes back to the new owner in its own time, and until it
/// does, the claim words of its thread slots name the process slot it had. A process that
/// attaches first must not be given that slot: its detach would free the other's thread slot
/// (its staging folio gone while its thread still uses it: the next write failed with "the
/// thread's staging folio lies outside the arena"). Process A writes, the owner is killed,
/// process B attaches (starting the next owner) and leaves, then A writes and reads again.
#[test]
fn a_process_coming_back_after_a_takeover_keeps_its_slot() {
    if child_entry() {
        return;
    }
    let test = "a_process_coming_back_after_a_takeover_keeps_its_slot";
    let setup = Setup::new("return", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let mut running = another_attaches_after_a_takeover(&setup, test);
    std::fs::write(setup.dir.join("go"), "").unwrap();
    let returning = running.0[0].id();
    join_all(std::mem::take(&mut running.0), Duration::from_secs(30));
    wait_detached(&setup, returning);
    assert_all_free(&setup);
}

/// A process killed while the owner claims a thread slot for it: the owner stands paused in
/// the claim (`FOLIOCACHE_PAUSE_AT=claim`: the claim word checked, the slot found without a
/// staging folio, none given yet) while the process dies, and another process then attaches
/// and claims a slot. The paused claim must not give the slot (freed, and perhaps claimed
/// again by then) a second staging folio and server: the second process writes and reads its
/// page, and once every process has left and the cache is synced and dropped, every page of
/// the arena but the index nodes' is free (a staging folio given twice is lost for good).
#[test]
fn a_claim_for_a_process_that_died_meanwhile_gives_nothing_twice() {
    if child_entry() {
        return;
    }
    let test = "a_claim_for_a_process_that_died_meanwhile_gives_nothing_twice";
    let setup = Setup::new(
        "claim-death",
        RefcountPolicy::FrozenBit,
        EngineKind::Threads,
    );
    let (first_pid, marker) = spawn_held_and_kill(&setup, test, "returning", "claim");
    // The owner finds the dead process at its next tick (200 ms) and frees its thread slot,
    // once the claim is done: before the fix, at once. No status is asked meanwhile (the
    // owner's main loop, which answers it, waits for the claim now).
    std::thread::sleep(Duration::from_millis(600));
    let mut running = Running(vec![setup.spawn(test, "second-claimer", 1, 2)]);
    // Its first write claims a slot: before the fix, the dead process's (freed, the lowest
    // free one); now it can attach only once the claim goes on.
    let claimed = setup.dir.join("claimed");
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !claimed.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&marker, "claim").unwrap();
    wait_detached(&setup, first_pid);
    std::fs::write(setup.dir.join("go"), "").unwrap();
    let second_pid = running.0[0].id();
    join_all(std::mem::take(&mut running.0), Duration::from_secs(30));
    wait_detached(&setup, second_pid);
    assert_all_free(&setup);
}

/// A process killed after it took a thread slot's claim word in the mapping and before its
/// claim reached the owner: the owner frees that slot and nothing else, while another process
/// reads and writes through its own slot. Before, a fresh mapping's slot named staging folio 0
/// (its word was zero), and freeing the slot freed page 0: the first process's staging folio,
/// under that process's reads (the likely cause of a kill storm's read that returned another
/// page's bytes), or, if page 0 was another folio, the owner's check of it panicked.
#[test]
fn a_process_killed_before_its_claim_reaches_the_owner_frees_only_its_slot() {
    if child_entry() {
        return;
    }
    let test = "a_process_killed_before_its_claim_reaches_the_owner_frees_only_its_slot";
    let setup = Setup::new("claim-unsent", RefcountPolicy::Cas, EngineKind::Threads);
    let model = Model::open(&setup.dir.join("model"));
    // The first process: its staging folio is the cache's first allocation.
    let mut running = Running(vec![setup.spawn(test, "worker", 0, 2)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while model.beats(1) < 50 {
        assert!(
            Instant::now() < deadline,
            "the first worker made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let marker = setup.dir.join("kill-marker");
    std::fs::write(&marker, "").unwrap();
    let mut second = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("FOLIOCACHE_CHILD", "worker")
        .env("FC_SLOT", "1")
        .env("FC_WORKERS", "2")
        .env(
            "FOLIOCACHE_KILL_AT",
            format!("client-claimed:{}", marker.display()),
        )
        .envs(setup.env())
        .spawn()
        .unwrap();
    let status = second.wait().unwrap();
    assert!(
        !marker.exists() && !status.success(),
        "the second worker did not die at its claim: {status}"
    );
    wait_detached(&setup, second.id());
    // The first goes on reading and writing through its slot for a while, checking each byte.
    let beats = model.beats(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while model.beats(1) < beats + 2000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    model.stop().store(1, Ordering::Release);
    let first_pid = running.0[0].id();
    join_all(std::mem::take(&mut running.0), Duration::from_secs(30));
    assert_eq!(model.failures().load(Ordering::Acquire), 0);
    wait_detached(&setup, first_pid);
    assert_owner_never_panicked(&setup);
    assert_all_free(&setup);
}

/// Syncs and drops the cache, then checks that every page of the arena is free but those of
/// the index nodes (no process is attached: nothing else may hold a page), waiting 3 s at
/// most for the owner to finish freeing what the last process held (its idle timeout, 5 s,
/// stops it later).
fn assert_all_free(setup: &Setup) {
    setup.admin(CacheCommand::Sync).expect("sync");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        setup.admin(CacheCommand::Drop).expect("drop");
        let status = setup.admin(CacheCommand::Status).expect("status");
        let field = |name: &str| -> u64 {
            status
                .split(&format!("\"{name}\":"))
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {status}"))
        };
        let (free, nodes, total) = (
            field("free_pages"),
            field("index_reserve_pages"),
            field("total_pages"),
        );
        if free + nodes == total {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} pages are held beyond the index nodes' with no process attached and nothing \
             cached: {status}",
            total.saturating_sub(free + nodes)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The second process of `a_claim_for_a_process_that_died_meanwhile_gives_nothing_twice`.
fn second_claimer() {
    let (dir, cache) = attach_child();
    let file = cache
        .open_with(dir.join("data"), OpenOptions::new().write(true))
        .expect("open");
    let mut handle = file.handle();
    handle.write_at(&page_of(1, 2), 2 * PAGE).expect("write");
    std::fs::write(dir.join("claimed"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("go").exists() {
        assert!(Instant::now() < deadline, "never told to go on");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut got = vec![0u8; PAGE as usize];
    for seq in 2..40 {
        handle.write_at(&page_of(seq, 2), 2 * PAGE).expect("write");
        assert_eq!(handle.read_at(&mut got, 2 * PAGE).expect("read"), got.len());
        assert!(got == page_of(seq, 2), "write {seq} did not read back");
    }
}

/// Starts a child in `role` whose owner (it starts one) holds at `point`
/// (`FOLIOCACHE_PAUSE_AT`), waits until the owner stands there, and kills the child: its pid,
/// and the marker file the test writes again to let the owner go on.
fn spawn_held_and_kill(setup: &Setup, test: &str, role: &str, point: &str) -> (u32, PathBuf) {
    let marker = setup.dir.join("pause-marker");
    std::fs::write(&marker, point).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("FOLIOCACHE_CHILD", role)
        .env(
            "FOLIOCACHE_PAUSE_AT",
            format!("{point}:{}", marker.display()),
        )
        .envs(setup.env())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while marker.exists() {
        if Instant::now() > deadline {
            kill_all(std::slice::from_mut(&mut child));
            panic!("the owner never reached the {point} point");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id();
    kill_all(std::slice::from_mut(&mut child));
    (pid, marker)
}

/// A release of a thread slot that a process sent just before it died, read by the owner only
/// after its tick saw the death and gave the process slot to another process, frees nothing
/// of that process: its thread slot carries the same claim word (the process slot's number).
/// The owner is held at the `release` point while the first process dies and the second
/// attaches and claims.
#[test]
fn a_dead_process_release_read_late_frees_nothing_of_its_successor() {
    if child_entry() {
        return;
    }
    let test = "a_dead_process_release_read_late_frees_nothing_of_its_successor";
    let setup = Setup::new(
        "late-release",
        RefcountPolicy::FrozenBit,
        EngineKind::Threads,
    );
    let (first_pid, marker) = spawn_held_and_kill(&setup, test, "releaser", "release");
    // The owner's tick finds it dead and detaches it; its connection still holds the release.
    wait_detached(&setup, first_pid);
    let mut running = Running(vec![setup.spawn(test, "second-claimer", 1, 2)]);
    let claimed = setup.dir.join("claimed");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !claimed.exists() {
        assert!(
            Instant::now() < deadline,
            "the second process never claimed a slot"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let slots = |setup: &Setup| -> u64 {
        let status = setup.admin(CacheCommand::Status).expect("status");
        status
            .split("\"claimed_thread_slots\":")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no claimed_thread_slots in {status}"))
    };
    assert_eq!(slots(&setup), 1, "the second process's slot");
    // Lets the dead process's release go on, and waits for the owner's word on it.
    std::fs::write(&marker, "release").unwrap();
    let log = setup.dir.join("rt").join(format!("{}.log", setup.name));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(&format!(
            "came from process {first_pid}, no longer attached"
        )) {
            break;
        }
        assert!(
            slots(&setup) == 1 && Instant::now() < deadline,
            "the dead process's release freed the second process's slot, or was never \
             answered:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        slots(&setup),
        1,
        "the second process's slot after the release"
    );
    std::fs::write(setup.dir.join("go"), "").unwrap();
    let second_pid = running.0[0].id();
    join_all(std::mem::take(&mut running.0), Duration::from_secs(30));
    wait_detached(&setup, second_pid);
    assert_owner_never_panicked(&setup);
    assert_all_free(&setup);
}

/// Once every process has left and the cache is synced and dropped, every page of the arena
/// but the index nodes' is free: a process's staging folio goes back with its thread slot,
/// and the pages it read or wrote with the drop.
#[test]
fn a_cache_no_process_holds_frees_every_page() {
    if child_entry() {
        return;
    }
    let test = "a_cache_no_process_holds_frees_every_page";
    let setup = Setup::new("all-free", RefcountPolicy::FrozenBit, EngineKind::Threads);
    std::fs::write(setup.dir.join("go"), "").unwrap();
    for role in ["visitor", "second-claimer"] {
        let mut child = setup.spawn(test, role, 0, 1);
        let pid = child.id();
        let status = wait_child(&mut child, Duration::from_secs(30));
        assert!(status.success(), "the {role} process failed: {status}");
        wait_detached(&setup, pid);
    }
    assert_all_free(&setup);
}

/// A process that dies after a takeover, before it comes back to the new owner, leaves
/// nothing held: the takeover kept its thread slot (staging folio, server) for it, and the
/// owner frees it once it finds the process dead. Process A writes, the owner is killed,
/// process B attaches (starting the next owner) and leaves, A is killed.
#[test]
fn a_process_that_dies_before_it_comes_back_leaves_nothing_held() {
    if child_entry() {
        return;
    }
    let test = "a_process_that_dies_before_it_comes_back_leaves_nothing_held";
    let setup = Setup::new("never-back", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let mut running = another_attaches_after_a_takeover(&setup, test);
    kill_all(&mut running.0);
    assert_all_free(&setup);
}

/// Process A (`returning`) writes, the owner is killed, process B (`visitor`) attaches,
/// starting the next owner, and leaves (its detach done): A, still running, waiting for `go`.
fn another_attaches_after_a_takeover(setup: &Setup, test: &str) -> Running {
    let mut running = Running(vec![setup.spawn(test, "returning", 0, 1)]);
    let ready = setup.dir.join("ready");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(
            Instant::now() < deadline && running.0[0].try_wait().unwrap().is_none(),
            "the first process never wrote"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = owner_pid(setup).expect("an owner runs");
    // SAFETY: a plain kill(2) of the owner process this test's child started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !exited(pid) {
        assert!(Instant::now() < deadline, "the owner did not die");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut visitor = setup.spawn(test, "visitor", 1, 2);
    let visitor_pid = visitor.id();
    let status = wait_child(&mut visitor, Duration::from_secs(30));
    assert!(status.success(), "the second process failed: {status}");
    wait_detached(setup, visitor_pid);
    running
}

/// Waits for `child` to exit, `limit` at most (then kills it and fails).
fn wait_child(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            kill_all(std::slice::from_mut(child));
            panic!("a child process hung (still running after {limit:?})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A page of words `word(seq, page)`.
fn page_of(seq: u64, page: u64) -> Vec<u8> {
    (0..PAGE / 8)
        .flat_map(|_| word(seq, page).to_le_bytes())
        .collect()
}

/// Attaches a child of a test to the test's cache.
fn attach_child() -> (PathBuf, Cache) {
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let cache = Cache::builder()
        .capacity(32 << 20)
        .io_engine(EngineKind::Threads)
        .idle_timeout(Duration::from_secs(5))
        .shared(name)
        .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
        .build()
        .expect("attach");
    (dir, cache)
}

/// Process A of `a_process_coming_back_after_a_takeover_keeps_its_slot`.
fn returning_writer() {
    let (dir, cache) = attach_child();
    let file = cache
        .open_with(dir.join("data"), OpenOptions::new().write(true))
        .expect("open");
    let mut handle = file.handle();
    handle.write_at(&page_of(1, 0), 0).expect("the first write");
    std::fs::write(dir.join("ready"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("go").exists() {
        assert!(Instant::now() < deadline, "never told to go on");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle
        .write_at(&page_of(2, 0), 0)
        .expect("a write after another process came and went");
    let mut got = vec![0u8; PAGE as usize];
    assert_eq!(handle.read_at(&mut got, 0).expect("read"), got.len());
    assert!(
        got == page_of(2, 0),
        "the page read is not the page written"
    );
}

/// Process B of `a_process_coming_back_after_a_takeover_keeps_its_slot`: attaches (starting
/// the next owner), reads a page, and leaves.
fn visitor() {
    let (dir, cache) = attach_child();
    let file = cache.open(dir.join("data")).expect("open");
    let mut got = vec![0u8; PAGE as usize];
    assert_eq!(
        file.handle().read_at(&mut got, PAGE).expect("read"),
        got.len()
    );
    assert!(got == page_of(0, 1), "page 1 is not as the test wrote it");
}

/// The owner killed at named points (`foliocache::inject`'s kill points: between a lookup's
/// reference and its put, with folios under writeback, holding the file table's lock, halfway
/// through a takeover) while workers read and write under the model: the point must be
/// reached (its marker file is gone), no worker hangs, every byte read matches the model, and
/// after a final sync storage equals it.
#[test]
fn owner_killed_at_named_points() {
    if child_entry() {
        return;
    }
    kill_owner_at(
        &["get-put", "writeback", "records", "takeover"],
        "owner_killed_at_named_points",
    );
}

/// The same at the points around an insertion into an index: holding folio locks for a fill,
/// holding an index's writer lock, a folio prepared but not yet in the index.
#[test]
fn owner_killed_around_an_insertion() {
    if child_entry() {
        return;
    }
    kill_owner_at(
        &["fill", "index-lock", "insert"],
        "owner_killed_around_an_insertion",
    );
}

fn kill_owner_at(points: &[&str], test: &str) {
    let only = std::env::var("FC_POINTS").ok();
    for &point in points {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|p| p == point))
        {
            continue;
        }
        let setup = Setup::new(
            &format!("point-{point}"),
            RefcountPolicy::FrozenBit,
            EngineKind::Threads,
        );
        let marker = setup.dir.join("kill-marker");
        std::fs::write(&marker, point).unwrap();
        let workers = 2;
        let model = Model::open(&setup.dir.join("model"));
        let children: Vec<Child> = (0..workers)
            .map(|slot| {
                let exe = std::env::current_exe().unwrap();
                Command::new(exe)
                    .args([
                        "--exact",
                        test,
                        "--nocapture",
                        "--test-threads=1",
                        "--include-ignored",
                    ])
                    .env("FOLIOCACHE_CHILD", "worker")
                    .env("FC_SLOT", slot.to_string())
                    .env("FC_WORKERS", workers.to_string())
                    .env(
                        "FOLIOCACHE_KILL_AT",
                        format!("{point}:{}", marker.display()),
                    )
                    .envs(setup.env())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut running = Running(children);
        let deadline = Instant::now() + Duration::from_secs(20);
        // A takeover needs a dead owner first: kill the first one once the workers run.
        if point == "takeover" {
            while model.beats(workers) < 50 {
                assert!(Instant::now() < deadline, "the workers made no progress");
                std::thread::sleep(Duration::from_millis(5));
            }
            let pid = owner_pid(&setup).expect("an owner runs");
            // SAFETY: a plain kill(2) of the owner process this test's workers started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        while marker.exists() {
            assert!(
                Instant::now() < deadline,
                "{point}: the owner never reached the point"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Work goes on after the death.
        let after_kill = model.beats(workers);
        await_beats(
            &setup,
            &model,
            &mut running.0,
            after_kill + 200,
            &format!("{point}: the workers stopped after the owner died there"),
        );
        model.stop().store(1, Ordering::Release);
        join_all(std::mem::take(&mut running.0), Duration::from_secs(30));
        setup.admin(CacheCommand::Sync).expect("sync");
        setup.check_storage();
        println!("owner killed at {point}: recovered, storage matches");
    }
}

/// A client holds a file writable (no lease can be had) and a program outside the cache opens
/// it: with `CAP_SYS_ADMIN` the owner holds the open (fanotify) until it has written the
/// client's dirty pages back and stopped serving the file. The outside program reads the
/// client's acknowledged write (never written back otherwise: write-back, no sync), the
/// client's reads and writes go to storage while the outside description is open, and once
/// it is closed the file is served from the cache again (`owner/held.rs`). Skipped where the
/// owner has no fanotify and does not run as root; as root a missing fanotify fails.
#[test]
fn an_outside_open_waits_while_clients_hold_a_file_writable() {
    if child_entry() {
        return;
    }
    let setup = Setup::new("held", RefcountPolicy::FrozenBit, EngineKind::Threads);
    let out = setup
        .spawn(
            "an_outside_open_waits_while_clients_hold_a_file_writable",
            "held",
            0,
            1,
        )
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "the client failed: {}", out.status);
}

/// Runs `script` with `sh` outside the cache (no attachment), with `FILE` set to `path`; its
/// standard output.
fn outside(script: &str, path: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("FILE", path)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The child of `an_outside_open_waits_while_clients_hold_a_file_writable`.
fn held_writer() {
    let dir = PathBuf::from(std::env::var("FC_DIR").unwrap());
    let name = std::env::var("FC_NAME").unwrap();
    let cache = Cache::builder()
        .capacity(32 << 20)
        .io_engine(EngineKind::Threads)
        .idle_timeout(Duration::from_secs(5))
        .shared(name.clone())
        .owner_program(env!("CARGO_BIN_EXE_foliocache-owner"))
        .build()
        .expect("attach");
    let path = dir.join("data");
    let file = cache
        .open_with(&path, OpenOptions::new().write(true))
        .expect("open");
    let status = foliocache::cache_command(&name, CacheCommand::Status).unwrap();
    if !status.contains("outside_opens_held") {
        // Only an owner without CAP_SYS_ADMIN may lack it; as root (CI) that is a failure.
        assert!(
            !rustix::process::geteuid().is_root(),
            "the owner runs as root and has no fanotify: {status}"
        );
        println!("skipped: the owner has no fanotify (no CAP_SYS_ADMIN): {status}");
        return;
    }
    wait_for_signal(&name, &path, "fanotify");
    let mut handle = file.handle();
    let page_of = |seq: u64, page: u64| -> Vec<u8> {
        (0..PAGE / 8)
            .flat_map(|_| word(seq, page).to_le_bytes())
            .collect()
    };
    let mut page = vec![0u8; PAGE as usize];
    // A write the cache holds dirty (nothing syncs it), and page 1 cached.
    assert_eq!(handle.write_at(&page_of(5, 0), 0).unwrap(), PAGE as usize);
    assert_eq!(handle.read_at(&mut page, PAGE).unwrap(), PAGE as usize);
    check_words(&page, 1, 0, 0, "page 1 before");
    for round in 1..=5u64 {
        // An outside reader's open returns only once the cache's write is on storage.
        let seen = outside("od -An -tu8 -N8 \"$FILE\"", &path);
        let first: u64 = seen.trim().parse().unwrap_or(u64::MAX);
        assert_eq!(
            first,
            word(4 + round, 0),
            "round {round}: an outside open read {seen:?}, not the client's acknowledged write"
        );
        // An outside writer: the client's next read sees its bytes.
        outside(
            &format!(
                "dd if=/dev/zero of=\"$FILE\" bs={PAGE} seek=1 count=1 conv=notrunc status=none"
            ),
            &path,
        );
        assert_eq!(handle.read_at(&mut page, PAGE).unwrap(), PAGE as usize);
        assert!(
            page.iter().all(|&b| b == 0),
            "round {round}: a read after an outside write returned got old bytes"
        );
        // Served again once the outside description is closed.
        wait_for_signal(&name, &path, "fanotify");
        assert_eq!(
            handle.write_at(&page_of(5 + round, 0), 0).unwrap(),
            PAGE as usize
        );
    }
    // While an outside description stays open, the client's writes go to storage.
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$FILE\"; sleep 2")
        .env("FILE", &path)
        .spawn()
        .unwrap();
    wait_for_signal(&name, &path, "passing through");
    assert_eq!(
        handle.write_at(&page_of(9, 2), 2 * PAGE).unwrap(),
        PAGE as usize
    );
    let on_storage = std::fs::read(&path).unwrap();
    check_words(
        &on_storage[(2 * PAGE) as usize..(3 * PAGE) as usize],
        2,
        9,
        9,
        "storage while passing through",
    );
    assert_eq!(handle.read_at(&mut page, 2 * PAGE).unwrap(), PAGE as usize);
    check_words(&page, 2, 9, 9, "a read while passing through");
    holder.wait().unwrap();
    wait_for_signal(&name, &path, "fanotify");
    assert_eq!(handle.read_at(&mut page, 2 * PAGE).unwrap(), PAGE as usize);
    check_words(&page, 2, 9, 9, "a read once served again");
    assert!(
        file.cached_ranges()
            .iter()
            .any(|r| r.first <= 2 && 2 < r.first + r.pages),
        "page 2 is not cached once the file is served again"
    );
    let status = foliocache::cache_command(&name, CacheCommand::Status).unwrap();
    let held: u64 = status
        .split("\"outside_opens_held\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let waited: u64 = status
        .split("\"outside_opens_waited_ns\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // Each round's first outside open found the file served, and so did the holder's.
    assert!(held >= 6, "{held} outside opens held: {status}");
    println!(
        "{held} outside opens held, {:.2} ms each on average",
        waited as f64 / held as f64 / 1e6
    );
}
