//! What the preload test files share: the library (built once), work directories on a file
//! system with direct I/O, running a program with and without the library, and the counters
//! the library writes (`FOLIOCACHE_STATS`).
#![allow(dead_code)] // each test file uses its part

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The preload library, built once (release) into this checkout's target directory.
pub(crate) fn preload_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let target = target_dir();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "foliocache-preload",
                "-p",
                "foliocache",
                "--bin",
                "foliocache-owner",
                "--lib",
                "--target-dir",
            ])
            .arg(&target)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build -p foliocache-preload failed");
        let lib = target.join("release/libfoliocache_preload.so");
        assert!(lib.is_file(), "{} missing", lib.display());
        lib
    })
}

/// target/ of this checkout (the test executable is target/<profile>/deps/<test>).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.ancestors()
        .nth(3)
        .expect("target directory")
        .to_path_buf()
}

/// A fresh directory on the checkout's file system (real direct I/O; the system temporary
/// directory may be tmpfs).
pub(crate) fn work_dir(name: &str) -> PathBuf {
    let dir = target_dir()
        .join("preload-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::canonicalize(dir).unwrap()
}

/// Whether `program` runs; if not, the test fails (or skips with FOLIOCACHE_ALLOW_SKIP=1).
pub(crate) fn have(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        if std::env::var("FOLIOCACHE_ALLOW_SKIP").as_deref() == Ok("1") {
            eprintln!("SKIPPED: {program} is not installed (FOLIOCACHE_ALLOW_SKIP=1)");
        } else {
            panic!(
                "{program} is not installed: `apt-get install` it (see .ci/run), or set \
                 FOLIOCACHE_ALLOW_SKIP=1 to skip"
            );
        }
    }
    found
}

/// The runtime directory of this test binary's shared caches (its owners' sockets and logs):
/// one per test binary, so the tests of one binary share one owner, as the programs of one
/// user do. Short, for the socket's path.
pub(crate) fn runtime_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fc-preload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // SAFETY: set once, before any test of this binary asks a shared cache anything;
        // the tests read the environment only through std (which locks it).
        unsafe { std::env::set_var("FOLIOCACHE_RUNTIME_DIR", &dir) };
        dir
    })
}

/// Asks this binary's shared cache (`default`) to write everything back: before a program
/// without the library reads what programs with it wrote in write-back mode (the kernel sees
/// the shared cache's dirty data only once written back, as docs/PRELOAD.md says).
pub(crate) fn sync_shared() {
    let _ = runtime_dir();
    // No owner runs: nothing is dirty.
    let _ = foliocache::cache_command("default", foliocache::CacheCommand::Sync);
}

/// Which cache the library uses (`FOLIOCACHE_SHARED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheMode {
    /// The shared cache (the default): one per user, kept by its owner process.
    Shared,
    /// A private cache per process (`FOLIOCACHE_SHARED=off`).
    Private,
}

impl CacheMode {
    /// Private first: a shared cache's owner keeps the files it served open after the
    /// programs left, and a private cache then finds them busy (no lease) and passes them
    /// through, as it must beside another cache of the same file.
    pub(crate) const BOTH: [CacheMode; 2] = [CacheMode::Private, CacheMode::Shared];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheMode::Shared => "shared",
            CacheMode::Private => "private",
        }
    }
}

/// The library's write modes (`FOLIOCACHE_WRITES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writes {
    Through,
    Back,
}

impl Writes {
    pub(crate) const BOTH: [Writes; 2] = [Writes::Through, Writes::Back];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Writes::Through => "through",
            Writes::Back => "back",
        }
    }
}

/// Every cache with every write mode.
pub(crate) fn modes() -> impl Iterator<Item = (CacheMode, Writes)> {
    CacheMode::BOTH
        .into_iter()
        .flat_map(|cache| Writes::BOTH.into_iter().map(move |writes| (cache, writes)))
}

/// How a program runs: without the library, or with it serving its directory.
#[derive(Debug, Clone, Copy)]
pub(crate) enum With<'a> {
    Kernel,
    /// The library serves the program's directory, from this cache, in this mode, counters
    /// appended to `stats`.
    Library {
        cache: CacheMode,
        writes: Writes,
        stats: &'a Path,
    },
}

/// The command for `program args` in `dir`, run as `with` says.
pub(crate) fn command(dir: &Path, with: With<'_>, program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args).current_dir(dir);
    if let With::Library {
        cache,
        writes,
        stats,
    } = with
    {
        command
            .env("LD_PRELOAD", preload_lib())
            .env(
                "FOLIOCACHE_SHARED",
                match cache {
                    CacheMode::Shared => "default",
                    CacheMode::Private => "off",
                },
            )
            .env("FOLIOCACHE_PATHS", dir)
            .env("FOLIOCACHE_WRITES", writes.as_str())
            .env("FOLIOCACHE_STATS", stats)
            .env("FOLIOCACHE_RUNTIME_DIR", runtime_dir())
            // An owner left by a test goes soon after the binary's last program.
            .env("FOLIOCACHE_IDLE_SECS", "20");
    }
    command
}

/// Runs `program args` in `dir` as `with` says; it must succeed.
pub(crate) fn run(dir: &Path, with: With<'_>, program: &str, args: &[&str]) -> Output {
    let out = command(dir, with, program, args)
        .output()
        .expect("run program");
    assert!(
        out.status.success(),
        "{program} {args:?} ({with:?}) failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The counters every process that used the cache appended to a stats file, summed.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) processes: u64,
    pub(crate) files: u64,
    pub(crate) reads: u64,
    pub(crate) hits: u64,
    pub(crate) bytes_from_cache: u64,
    pub(crate) writes: u64,
    pub(crate) bytes_written_through: u64,
    pub(crate) bytes_written_to_cache: u64,
    pub(crate) writeback_pages: u64,
    pub(crate) syncs: u64,
    pub(crate) flushes: u64,
    /// File leases taken and broken (by another process's open, or the program's own).
    pub(crate) leases_taken: u64,
    pub(crate) leases_broken: u64,
    /// Files passed through to the kernel, by reason (`passthrough` in the JSON).
    pub(crate) passthrough: std::collections::BTreeMap<String, u64>,
    /// The shared cache's own counters (the most any process saw): pages in use, processes
    /// attached at once.
    pub(crate) shared_used_pages: u64,
    pub(crate) shared_attached_most: u64,
    /// The most `bytes_from_device` any process reported (on a shared cache, the files'
    /// device reads so far, every process's).
    pub(crate) device_bytes_most: u64,
}

pub(crate) fn stats(path: &Path) -> Stats {
    let mut sum = Stats::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let get = |key: &str| {
            value[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key} in {line}"))
        };
        sum.processes += 1;
        sum.files += get("files");
        sum.reads += get("reads");
        sum.hits += get("hits");
        sum.bytes_from_cache += get("bytes_from_cache");
        sum.writes += get("writes");
        sum.bytes_written_through += get("bytes_written_through");
        sum.bytes_written_to_cache += get("bytes_written_to_cache");
        sum.writeback_pages += get("writeback_pages");
        sum.syncs += get("syncs");
        sum.flushes += get("flushes");
        // Counters a build before the lease work did not write read as zero (so a test run
        // against it fails on its assertions, not here).
        let optional = |key: &str| value[key].as_u64().unwrap_or(0);
        sum.leases_taken += optional("leases_taken");
        sum.leases_broken += optional("leases_broken");
        sum.device_bytes_most = sum
            .device_bytes_most
            .max(value["bytes_from_device"].as_u64().unwrap_or(0));
        if let Some(shared) = value["shared"].as_object() {
            let most = |key: &str| shared.get(key).and_then(serde_json::Value::as_u64);
            sum.shared_used_pages = sum.shared_used_pages.max(most("used_pages").unwrap_or(0));
            sum.shared_attached_most = sum
                .shared_attached_most
                .max(most("attached_processes").unwrap_or(0));
        }
        if let Some(reasons) = value["passthrough"].as_object() {
            for (reason, n) in reasons {
                *sum.passthrough.entry(reason.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
        }
    }
    sum
}

impl Stats {
    /// Files passed through for `reason`.
    pub(crate) fn passed(&self, reason: &str) -> u64 {
        self.passthrough.get(reason).copied().unwrap_or(0)
    }

    /// The writes went where the mode sends them: to the kernel before the call returned
    /// (write-through: through the program's fd with a private cache, through the shared
    /// cache and written back at once with a shared one), or into the cache and from there
    /// to storage (write-back; a shared cache's owner writes back on its own time, after the
    /// process may have gone, so only the writes into it are the process's to count).
    pub(crate) fn assert_writes_went(&self, cache: CacheMode, writes: Writes) {
        assert!(self.writes > 0, "{writes:?}: no write was seen: {self:?}");
        match writes {
            Writes::Through => {
                assert!(self.bytes_written_through > 0, "{self:?}");
                assert_eq!(self.bytes_written_to_cache, 0, "{self:?}");
            }
            Writes::Back => {
                assert!(self.bytes_written_to_cache > 0, "{self:?}");
                if cache == CacheMode::Private {
                    assert!(self.writeback_pages > 0, "nothing written back: {self:?}");
                }
            }
        }
    }
}

/// `size` bytes of a pseudo-random pattern.
pub(crate) fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn write_pattern(path: &Path, size: usize, seed: u64) {
    std::fs::write(path, pattern(size, seed)).unwrap();
}

/// Compiles the C program `source` into `dir/name` with gcc (`-pthread`).
pub(crate) fn compile_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let out = Command::new("gcc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {name}.c failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
