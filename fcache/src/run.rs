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
/// running binary (cargo puts both in `target/<profile>/`). When it is not there and this
/// fcache runs from the checkout it was built in, it is built first (one line says so).
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
    if !candidate.is_file() && automatic {
        build_in_checkout(&candidate, &["-p", "foliocache-preload"]);
    }
    // The shared cache's owner program, which the library looks for beside itself.
    let owner = candidate.with_file_name("foliocache-owner");
    if !owner.is_file() && automatic {
        build_in_checkout(&owner, &["-p", "foliocache", "--bin", "foliocache-owner"]);
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

/// Builds `wanted` (a file cargo puts in `target/<profile>/` of the checkout this fcache was
/// built from, with `cargo build PACKAGE_ARGS`), if this fcache runs from there and cargo is
/// at hand; a failure leaves it missing (the caller says what to do).
pub(crate) fn build_in_checkout(wanted: &Path, package_args: &[&str]) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(workspace) = std::fs::canonicalize(workspace) else {
        return;
    };
    let Some(profile_dir) = wanted.parent() else {
        return;
    };
    let target = workspace.join("target");
    if profile_dir.parent() != Some(target.as_path()) || !workspace.join("Cargo.toml").is_file() {
        return; // an installed fcache, not one in its checkout
    }
    let release = profile_dir
        .file_name()
        .is_some_and(|name| name == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&workspace)
        .args(["build", "--quiet"])
        .args(package_args);
    if release {
        command.arg("--release");
    }
    println!(
        "building {}: cargo build{} {}",
        wanted.file_name().unwrap_or_default().to_string_lossy(),
        if release { " --release" } else { "" },
        package_args.join(" ")
    );
    let _ = command.status();
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
