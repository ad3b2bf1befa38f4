//! Settings from the environment: `FOLIOCACHE_PATHS`, `FOLIOCACHE_SHARED`,
//! `FOLIOCACHE_CAPACITY_MB`, `FOLIOCACHE_RA_KB`, `FOLIOCACHE_WRITES`, `FOLIOCACHE_IO`,
//! `FOLIOCACHE_PLACE`, `FOLIOCACHE_STATS`, `FOLIOCACHE_LEASE_SIGNAL`. A bad value is one
//! clear line on stderr, and the program runs uncached.

use foliocache::EngineKind;
use std::path::{Path, PathBuf};

/// The library's settings.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Canonical directories whose files are cached.
    pub(crate) dirs: Vec<PathBuf>,
    /// The cache's memory budget in bytes.
    pub(crate) capacity: u64,
    /// The readahead window in bytes; `None`: each device's `read_ahead_kb`.
    pub(crate) ra_bytes: Option<u64>,
    /// Where the program's writes go.
    pub(crate) writes: Writes,
    /// How the cache reads and writes storage (`FOLIOCACHE_IO`).
    pub(crate) io: EngineKind,
    /// Whether a private cache places a random reader's pages by their offset
    /// (`FOLIOCACHE_PLACE=offset`).
    pub(crate) place_by_offset: bool,
    /// Where to write the counters at exit.
    pub(crate) stats_path: Option<PathBuf>,
    /// The signal lease breaks arrive with (`None`: the library chooses, see `lease`).
    pub(crate) lease_signal: Option<i32>,
    /// The shared cache the processes attach to (`None`: a private cache per process).
    pub(crate) shared: Option<String>,
}

/// The shared cache a process attaches to when `FOLIOCACHE_SHARED` is unset: one per user
/// (a cache's name is looked up in the user's own runtime directory).
pub(crate) const DEFAULT_SHARED: &str = "default";

/// Where a program's writes to the served files go (`FOLIOCACHE_WRITES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writes {
    /// `through` (the default): to the kernel at once, through the program's own fd; the
    /// cached range is then invalidated. Safe for any program.
    Through,
    /// `back`: into the cache as dirty folios, written to storage later by the cache (see
    /// `adapter` and docs/PRELOAD.md for what the program and others see meanwhile).
    Back,
}

/// The default budget: 256 MiB.
const DEFAULT_CAPACITY_MB: u64 = 256;

impl Config {
    /// Reads the settings. `Ok(None)`: no `FOLIOCACHE_PATHS`, nothing to cache. `Err`: the line
    /// to print.
    pub(crate) fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let Some(paths) = get("FOLIOCACHE_PATHS").filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let mut dirs = Vec::new();
        for dir in paths.split(':').filter(|d| !d.is_empty()) {
            let canonical =
                std::fs::canonicalize(dir).map_err(|e| format!("FOLIOCACHE_PATHS: {dir}: {e}"))?;
            if !canonical.is_dir() {
                return Err(format!("FOLIOCACHE_PATHS: {dir} is not a directory"));
            }
            dirs.push(canonical);
        }
        let capacity_mb = match get("FOLIOCACHE_CAPACITY_MB") {
            None => DEFAULT_CAPACITY_MB,
            Some(text) => text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|mb| (1..=1 << 24).contains(mb))
                .ok_or_else(|| {
                    format!(
                        "FOLIOCACHE_CAPACITY_MB={text}: expected a whole number of MiB from 1 \
                         to 16777216"
                    )
                })?,
        };
        let ra_bytes = match get("FOLIOCACHE_RA_KB") {
            None => None,
            Some(text) => Some(
                text.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|kb| *kb <= 1 << 20)
                    .ok_or_else(|| {
                        format!(
                            "FOLIOCACHE_RA_KB={text}: expected a whole number of KiB from 0 to \
                             1048576"
                        )
                    })?
                    << 10,
            ),
        };
        let writes = match get("FOLIOCACHE_WRITES").as_deref().map(str::trim) {
            None | Some("through") => Writes::Through,
            Some("back") => Writes::Back,
            Some(text) => {
                return Err(format!(
                    "FOLIOCACHE_WRITES={text}: expected `through` (the default) or `back`"
                ));
            }
        };
        let io = match get("FOLIOCACHE_IO").as_deref().map(str::trim) {
            None | Some("auto") => EngineKind::Auto,
            Some("io_uring") => EngineKind::IoUring,
            Some("threads") => EngineKind::Threads,
            Some(text) => {
                return Err(format!(
                    "FOLIOCACHE_IO={text}: expected `auto` (the default: io_uring where the \
                     kernel allows it, else threads), `io_uring` or `threads`"
                ));
            }
        };
        let place_by_offset = match get("FOLIOCACHE_PLACE").as_deref().map(str::trim) {
            None | Some("anywhere") => false,
            Some("offset") => true,
            Some(text) => {
                return Err(format!(
                    "FOLIOCACHE_PLACE={text}: expected `anywhere` (the default) or `offset`"
                ));
            }
        };
        let lease_signal = match get("FOLIOCACHE_LEASE_SIGNAL") {
            None => None,
            Some(text) => {
                let (low, high) = (libc::SIGRTMIN(), libc::SIGRTMAX());
                Some(
                    text.trim()
                        .parse::<i32>()
                        .ok()
                        .filter(|n| (low..=high).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "FOLIOCACHE_LEASE_SIGNAL={text}: expected a real-time signal \
                                 number from {low} to {high}"
                            )
                        })?,
                )
            }
        };
        let shared = match get("FOLIOCACHE_SHARED").as_deref().map(str::trim) {
            None | Some("") => Some(DEFAULT_SHARED.to_owned()),
            Some("off") => None,
            Some(name)
                if name.len() <= 64
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
            {
                Some(name.to_owned())
            }
            Some(text) => {
                return Err(format!(
                    "FOLIOCACHE_SHARED={text}: expected a cache name (1 to 64 letters, digits, \
                     `.`, `_`, `-`) or `off` (a private cache per process)"
                ));
            }
        };
        let stats_path = get("FOLIOCACHE_STATS")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        Ok(Some(Self {
            dirs,
            capacity: capacity_mb << 20,
            ra_bytes,
            writes,
            io,
            place_by_offset,
            stats_path,
            lease_signal,
            shared,
        }))
    }

    /// Whether the canonical path `path` lies in one of the directories.
    pub(crate) fn covers(&self, path: &Path) -> bool {
        self.dirs.iter().any(|dir| path.starts_with(dir))
    }
}

/// The maximum readahead window of the block device `dev` (its `read_ahead_kb`), in bytes.
pub(crate) fn device_read_ahead_bytes(dev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    // A partition's queue settings are its disk's.
    [
        format!("{base}/queue/read_ahead_kb"),
        format!("{base}/../queue/read_ahead_kb"),
    ]
    .iter()
    .find_map(|path| {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    })
    .map(|kb| kb << 10)
}

/// open(2) flags for an fopen mode, or `None` for a mode this library leaves to glibc
/// (`,ccs=`, or not starting with r/w/a).
pub(crate) fn fopen_flags(mode: &[u8]) -> Option<i32> {
    let plus = mode.contains(&b'+');
    let mut flags = match (mode.first()?, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in &mode[1..] {
        match c {
            b'e' => flags |= libc::O_CLOEXEC,
            b'x' => flags |= libc::O_EXCL,
            b'b' | b't' | b'm' | b'+' | b'c' => {}
            _ => return None, // ",ccs=..." and anything unknown
        }
    }
    Some(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_and_bad_values() {
        assert!(Config::from_env(env(&[])).unwrap().is_none());
        let tmp = std::env::temp_dir();
        let tmp_text = tmp.to_str().unwrap();
        let config = Config::from_env(env(&[("FOLIOCACHE_PATHS", tmp_text)]))
            .unwrap()
            .unwrap();
        assert_eq!(config.capacity, 256 << 20);
        assert_eq!(config.ra_bytes, None);
        assert_eq!(config.writes, Writes::Through);
        assert_eq!(config.io, EngineKind::Auto);
        assert!(!config.place_by_offset);
        let placed = Config::from_env(env(&[
            ("FOLIOCACHE_PATHS", tmp_text),
            ("FOLIOCACHE_PLACE", "offset"),
        ]))
        .unwrap()
        .unwrap();
        assert!(placed.place_by_offset);
        assert_eq!(config.shared.as_deref(), Some(DEFAULT_SHARED));
        let private = Config::from_env(env(&[
            ("FOLIOCACHE_PATHS", tmp_text),
            ("FOLIOCACHE_SHARED", "off"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(private.shared, None);
        let back = Config::from_env(env(&[
            ("FOLIOCACHE_PATHS", tmp_text),
            ("FOLIOCACHE_WRITES", "back"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(back.writes, Writes::Back);
        for (text, kind) in [
            ("auto", EngineKind::Auto),
            ("io_uring", EngineKind::IoUring),
            (" threads ", EngineKind::Threads),
        ] {
            let config = Config::from_env(env(&[
                ("FOLIOCACHE_PATHS", tmp_text),
                ("FOLIOCACHE_IO", text),
            ]))
            .unwrap()
            .unwrap();
            assert_eq!(config.io, kind, "{text}");
        }
        assert!(config.covers(&std::fs::canonicalize(&tmp).unwrap().join("x")));
        assert!(!config.covers(Path::new("/definitely/elsewhere")));
        for (key, value) in [
            ("FOLIOCACHE_CAPACITY_MB", "lots"),
            ("FOLIOCACHE_CAPACITY_MB", "0"),
            ("FOLIOCACHE_RA_KB", "-1"),
            ("FOLIOCACHE_WRITES", "bogus"),
            ("FOLIOCACHE_WRITES", ""),
            ("FOLIOCACHE_IO", "uring"),
            ("FOLIOCACHE_IO", ""),
            ("FOLIOCACHE_PLACE", "yes"),
            ("FOLIOCACHE_SHARED", "a/b"),
            ("FOLIOCACHE_SHARED", "white space"),
        ] {
            let error =
                Config::from_env(env(&[("FOLIOCACHE_PATHS", tmp_text), (key, value)])).unwrap_err();
            assert!(error.starts_with(key), "{error}");
        }
        let error =
            Config::from_env(env(&[("FOLIOCACHE_PATHS", "/no/such/dir/here")])).unwrap_err();
        assert!(error.contains("/no/such/dir/here"), "{error}");
    }

    #[test]
    fn fopen_modes() {
        assert_eq!(fopen_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"rb"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"r+e"), Some(libc::O_RDWR | libc::O_CLOEXEC));
        assert_eq!(
            fopen_flags(b"wx"),
            Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL)
        );
        assert_eq!(fopen_flags(b"r,ccs=UTF-8"), None);
        assert_eq!(fopen_flags(b"q"), None);
    }
}
