//! Where a shared cache's files live, how its owner program is found, and how it is started.
//!
//! The runtime directory (`FOLIOCACHE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/foliocache`, else
//! `/tmp/foliocache-UID`) holds, per cache name: `NAME.sock` (the owner's socket), `NAME.lock`
//! (the owner's `flock`: held while an owner lives), `NAME.log` (the owner's log) and
//! `NAME.clients` (the attached processes, for a new owner looking for the memfd). It is made
//! with mode 0700 and checked before use: a directory, not a symlink, owned by this user, open to
//! nobody else. That, and the owner's check of every connection's user, is what keeps other
//! users out (`docs/SHARED.md`, "Who may attach").

use crate::error::Error;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The owner program's file name.
pub(crate) const OWNER_PROGRAM: &str = "foliocache-owner";

/// How long a client waits for an owner it started to say it is ready.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The files of one shared cache in the runtime directory.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) sock: PathBuf,
    pub(crate) lock: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) clients: PathBuf,
}

pub(crate) fn shared_error(name: &str, reason: impl Into<String>) -> Error {
    Error::Shared {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

/// Checks a cache name: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(shared_error(
            name,
            "a cache name is 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'",
        ))
    }
}

/// The runtime directory, created (mode 0700) if missing and checked.
pub(crate) fn runtime_dir(name: &str) -> Result<PathBuf, Error> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = match std::env::var_os("FOLIOCACHE_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(xdg) if !xdg.is_empty() && Path::new(&xdg).is_dir() => {
                PathBuf::from(xdg).join("foliocache")
            }
            _ => std::env::temp_dir().join(format!("foliocache-{uid}")),
        },
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(shared_error(
                name,
                format!("cannot create the runtime directory {}: {e}", dir.display()),
            ));
        }
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| shared_error(name, format!("cannot inspect {}: {e}", dir.display())))?;
    if !meta.file_type().is_dir() {
        return Err(shared_error(
            name,
            format!("{} is not a directory (a symlink?)", dir.display()),
        ));
    }
    if meta.uid() != uid {
        return Err(shared_error(
            name,
            format!(
                "{} belongs to uid {}, not to this user ({uid})",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(shared_error(
            name,
            format!(
                "{} is open to other users (mode {:o}; it must be 0700)",
                dir.display(),
                meta.permissions().mode() & 0o777
            ),
        ));
    }
    Ok(dir)
}

impl Paths {
    /// The files of cache `name` (the name checked, the directory made and checked).
    pub(crate) fn of(name: &str) -> Result<Self, Error> {
        check_name(name)?;
        let dir = runtime_dir(name)?;
        Ok(Self {
            name: name.to_owned(),
            sock: dir.join(format!("{name}.sock")),
            lock: dir.join(format!("{name}.lock")),
            log: dir.join(format!("{name}.log")),
            clients: dir.join(format!("{name}.clients")),
            dir,
        })
    }
}

/// The owner program: `explicit`, else `FOLIOCACHE_OWNER`, else next to the running executable
/// (or one directory up, where cargo's test binaries live), else on `PATH`.
pub(crate) fn owner_program(name: &str, explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let usable = |p: &Path| p.is_file();
    if let Some(path) = explicit {
        return if usable(path) {
            Ok(path.to_owned())
        } else {
            Err(shared_error(
                name,
                format!("the owner program {} does not exist", path.display()),
            ))
        };
    }
    if let Some(path) = std::env::var_os("FOLIOCACHE_OWNER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if usable(&path) {
            Ok(path)
        } else {
            Err(shared_error(
                name,
                format!("FOLIOCACHE_OWNER={} does not exist", path.display()),
            ))
        };
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.push(dir.join(OWNER_PROGRAM));
        if let Some(up) = dir.parent() {
            candidates.push(up.join(OWNER_PROGRAM));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join(OWNER_PROGRAM)));
    }
    candidates.into_iter().find(|p| usable(p)).ok_or_else(|| {
        shared_error(
            name,
            format!(
                "cannot find the owner program `{OWNER_PROGRAM}` (next to this program, on PATH, \
                 or FOLIOCACHE_OWNER); build it with `cargo build --release -p foliocache \
                 --bin {OWNER_PROGRAM}`"
            ),
        )
    })
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, in clock ticks since boot):
/// with the pid, the identity of one process (a pid alone can be reused).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` is still alive (not a zombie).
pub(crate) fn alive(pid: u32, start: u64) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next();
    let started = fields.nth(18).and_then(|s| s.parse::<u64>().ok());
    started == Some(start) && !matches!(state, Some("Z" | "X" | "x"))
}
