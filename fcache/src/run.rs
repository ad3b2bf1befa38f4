//! `fcache run`: runs a command with the preload library, so that it reads the files under
//! the given directories through a private foliocache.

use clap::Args;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The preload library's file name.
pub(crate) const PRELOAD_LIB: &str = "libfoliocache_preload.so";

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Directories whose files are cached, colon-separated (default: the current directory).
    #[arg(long, value_name = "DIRS")]
    paths: Option<String>,
    /// The cache's memory budget in MiB (default 256).
    #[arg(long, value_name = "N")]
    capacity_mb: Option<u64>,
    /// Maximum readahead window in KiB (default: the device's read_ahead_kb).
    #[arg(long, value_name = "KIB")]
    ra_kb: Option<u64>,
    /// Where the program's writes go: `through` to the kernel at once (the default, safe for
    /// any program), or `back` into the cache, written to storage later (see docs/PRELOAD.md).
    #[arg(long, value_name = "MODE", value_parser = ["through", "back"])]
    writes: Option<String>,
    /// The shared cache the program's processes use (a name; default: the user's one), or
    /// `off` for a private cache per process (see docs/PRELOAD.md).
    #[arg(long, value_name = "NAME|off")]
    shared: Option<String>,
    /// Append the cache's counters (one JSON object per process) to this file at exit.
    #[arg(long, value_name = "PATH")]
    stats: Option<PathBuf>,
    /// The preload library (default: next to this fcache binary, or $FOLIOCACHE_PRELOAD).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Where the preload library is: `explicit`, else `$FOLIOCACHE_PRELOAD`, else next to the
/// running binary (cargo puts both in `target/<profile>/`). When this fcache runs from the
/// checkout it was built in, the library and the owner program beside it are built first if
/// missing or older than their sources (one line says so): see [`ensure_built`].
pub(crate) fn find_preload(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let automatic = explicit.is_none() && std::env::var_os("FOLIOCACHE_PRELOAD").is_none();
    let candidate = match explicit {
        Some(path) => path.to_path_buf(),
        None => match std::env::var_os("FOLIOCACHE_PRELOAD") {
            Some(path) => PathBuf::from(path),
            None => std::env::current_exe()
                .map_err(|e| e.to_string())?
                .with_file_name(PRELOAD_LIB),
        },
    };
    if automatic {
        ensure_built(&candidate, &["-p", "foliocache-preload"]);
        // The shared cache's owner program, which the library looks for beside itself.
        let owner = candidate.with_file_name("foliocache-owner");
        ensure_built(&owner, &["-p", "foliocache", "--bin", "foliocache-owner"]);
    }
    if candidate.is_file() {
        std::fs::canonicalize(&candidate).map_err(|e| e.to_string())
    } else {
        Err(format!(
            "{} not found; build it with `cargo build --release -p foliocache-preload` (it lands \
             next to fcache in target/release/), or pass --lib PATH",
            candidate.display()
        ))
    }
}

/// Makes sure `wanted`, a helper cargo builds into `target/<profile>/` of the checkout this
/// fcache was built from (the preload library, the owner program), is there and no older than
/// any source it was built from, building it with `cargo build PACKAGE_ARGS` when it is not (one
/// line says why). A helper older than its sources would be measured silently in place of the
/// code in the checkout. An fcache installed elsewhere uses what it finds; a build that fails
/// leaves the helper as it was, missing (the caller says what to do) or stale (a warning says
/// so).
pub(crate) fn ensure_built(wanted: &Path, package_args: &[&str]) {
    let Some(workspace) = checkout_of(wanted) else {
        return;
    };
    let why = if wanted.is_file() {
        match newer_source(wanted) {
            Some(source) => format!("older than {}", source.display()),
            None => return,
        }
    } else {
        "missing".to_owned()
    };
    build(&workspace, wanted, package_args, &why);
    if wanted.is_file()
        && let Some(source) = newer_source(wanted)
    {
        eprintln!(
            "warning: {} is still older than {} (the build failed?): what it runs is not this \
             checkout's code",
            wanted.display(),
            source.display()
        );
    }
}

/// The workspace `wanted` belongs to: the checkout this fcache was built in, when `wanted` is
/// in its `target/<profile>/` and cargo's manifest is there; `None` for an installed fcache.
fn checkout_of(wanted: &Path) -> Option<PathBuf> {
    let workspace = std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).ok()?;
    let profile_dir = std::fs::canonicalize(wanted.parent()?).ok()?;
    let in_target = profile_dir.parent() == Some(workspace.join("target").as_path());
    (in_target && workspace.join("Cargo.toml").is_file()).then_some(workspace)
}

/// Runs `cargo build PACKAGE_ARGS` in `workspace`, in `wanted`'s profile, saying why.
fn build(workspace: &Path, wanted: &Path, package_args: &[&str], why: &str) {
    let release = wanted
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|name| name == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--quiet"])
        .args(package_args);
    if release {
        command.arg("--release");
    }
    println!(
        "building {} ({why}): cargo build{} {}",
        wanted.file_name().unwrap_or_default().to_string_lossy(),
        if release { " --release" } else { "" },
        package_args.join(" ")
    );
    let _ = command.status();
}

/// A source `built` was made from that changed after it (or is gone), by the dependency list
/// cargo writes beside it (`NAME.d`, Makefile syntax); `None` when it is up to date or the list
/// cannot be read.
fn newer_source(built: &Path) -> Option<PathBuf> {
    let built_at = std::fs::metadata(built).and_then(|m| m.modified()).ok()?;
    let list = std::fs::read_to_string(built.with_extension("d")).ok()?;
    dependencies(&list).into_iter().find(|source| {
        std::fs::metadata(source)
            .and_then(|m| m.modified())
            .map_or(true, |at| at > built_at)
    })
}

/// The prerequisites of the first rule of a Makefile-style dependency list (`target: a b`, a
/// space in a name escaped with a backslash, lines continued with one).
fn dependencies(list: &str) -> Vec<PathBuf> {
    let Some((_, rest)) = list.split_once(": ") else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(next) => current.push(next),
            },
            '\n' => break,
            c if c.is_whitespace() => {
                if !current.is_empty() {
                    paths.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        paths.push(PathBuf::from(current));
    }
    paths
}

/// The environment that makes a child run on the library.
pub(crate) fn preload_env(
    lib: &Path,
    paths: &str,
    capacity_mb: Option<u64>,
    ra_kb: Option<u64>,
    stats: Option<&Path>,
) -> Vec<(String, String)> {
    let mut preload = lib.display().to_string();
    if let Ok(existing) = std::env::var("LD_PRELOAD")
        && !existing.is_empty()
    {
        preload = format!("{preload}:{existing}");
    }
    let mut env = vec![
        ("LD_PRELOAD".to_owned(), preload),
        ("FOLIOCACHE_PATHS".to_owned(), paths.to_owned()),
    ];
    if let Some(mb) = capacity_mb {
        env.push(("FOLIOCACHE_CAPACITY_MB".to_owned(), mb.to_string()));
    }
    if let Some(kb) = ra_kb {
        env.push(("FOLIOCACHE_RA_KB".to_owned(), kb.to_string()));
    }
    if let Some(stats) = stats {
        env.push(("FOLIOCACHE_STATS".to_owned(), stats.display().to_string()));
    }
    env
}

pub(crate) fn run(args: &RunArgs) -> Result<(), String> {
    let lib = find_preload(args.lib.as_deref())?;
    let paths = match &args.paths {
        Some(paths) => paths.clone(),
        None => std::env::current_dir()
            .map_err(|e| e.to_string())?
            .display()
            .to_string(),
    };
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no command given (fcache run [OPTIONS] -- CMD ARGS)")?;
    let mut env = preload_env(
        &lib,
        &paths,
        args.capacity_mb,
        args.ra_kb,
        args.stats.as_deref(),
    );
    if let Some(writes) = &args.writes {
        env.push(("FOLIOCACHE_WRITES".to_owned(), writes.clone()));
    }
    if let Some(shared) = &args.shared {
        env.push(("FOLIOCACHE_SHARED".to_owned(), shared.clone()));
    }
    let error = Command::new(program).args(rest).envs(env).exec();
    Err(format!("cannot run {program}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A fresh directory under the system's temporary one, removed at drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("fcache-run-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temporary directory");
            Self(dir)
        }

        /// Writes `file` with its modification time `age_s` seconds before now.
        fn file(&self, file: &str, text: &str, age_s: u64) -> PathBuf {
            let path = self.0.join(file);
            std::fs::write(&path, text).expect("write");
            let at = SystemTime::now() - Duration::from_secs(age_s);
            let handle = std::fs::File::options()
                .write(true)
                .open(&path)
                .expect("open");
            handle.set_modified(at).expect("set mtime");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn dependencies_read_the_first_rule_with_escaped_spaces_and_continued_lines() {
        let list = "/t/out: /s/a.rs /s/my\\ file.rs \\\n  /s/b.rs\n\n/s/a.rs:\n# env-dep:X=1\n";
        let got = dependencies(list);
        let want: Vec<PathBuf> = ["/s/a.rs", "/s/my file.rs", "/s/b.rs"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(got, want);
        assert!(dependencies("no rule here").is_empty());
    }

    #[test]
    fn a_helper_older_than_one_of_its_sources_is_stale_and_names_it() {
        let dir = Scratch::new("stale");
        let old_source = dir.file("old.rs", "", 300);
        let helper = dir.file("helper", "binary", 200);
        let list = format!("{}: {}\n", helper.display(), old_source.display());
        dir.file("helper.d", &list, 0);
        assert_eq!(
            newer_source(&helper),
            None,
            "older sources only: up to date"
        );

        let edited = dir.file("edited.rs", "", 100);
        let list = format!(
            "{}: {} {}\n",
            helper.display(),
            old_source.display(),
            edited.display()
        );
        dir.file("helper.d", &list, 0);
        assert_eq!(
            newer_source(&helper),
            Some(edited),
            "a source edited after the build"
        );

        let gone = dir.0.join("gone.rs");
        let list = format!("{}: {}\n", helper.display(), gone.display());
        dir.file("helper.d", &list, 0);
        assert_eq!(
            newer_source(&helper),
            Some(gone),
            "a source no longer there"
        );
    }

    #[test]
    fn a_helper_without_a_dependency_list_is_taken_as_found() {
        let dir = Scratch::new("nolist");
        let helper = dir.file("helper", "binary", 200);
        assert_eq!(newer_source(&helper), None);
    }

    #[test]
    fn a_helper_outside_this_checkouts_target_is_not_built() {
        let dir = Scratch::new("outside");
        assert_eq!(checkout_of(&dir.0.join("foliocache-owner")), None);
    }
}
