//! `fcache`: foliocache's command-line tool. `fcache bench` runs the benchmark suites; `fcache
//! replay` shows readahead on a trace; `fcache ra-diff` compares it with the running kernel's;
//! `fcache cat` reads a file or an object through a cache.

mod bench;
mod cachecmd;
mod cat;
mod radiff;
mod replay;
mod run;
mod trace;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "fcache",
    version,
    about = "foliocache: a user-space page cache, measured"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run benchmark suites (all of them, quick size, when no suite is named).
    Bench(bench::BenchArgs),
    /// Replay an access trace (`offset length` lines) on a file through a fresh cache and show,
    /// after each read, which pages readahead cached (like fincore/vmtouch).
    Replay(replay::ReplayArgs),
    /// Replay a trace through the running kernel's page cache and through foliocache on the
    /// same file, and compare the cached pages step by step (or check a recorded comparison).
    RaDiff(radiff::RaDiffArgs),
    /// Run a command with the preload library: it reads the files under --paths through a
    /// private foliocache (`fcache run --paths DIR -- sqlite3 DIR/db.sqlite`).
    Run(run::RunArgs),
    /// Print a file or an object (`s3://bucket/key`) read through a fresh cache; what it cost
    /// (time, GETs, bytes fetched per byte read) goes to standard error.
    Cat(cat::CatArgs),
    /// A shared cache (`Cache::builder().shared(NAME)`): `status`, `drop`, `sync`, `destroy`.
    Cache(cachecmd::CacheArgs),
    /// One process of `fcache bench multiproc` (started by the suite, not by hand).
    #[command(hide = true)]
    MultiprocWorker(bench::MultiprocWorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::RaDiff(args) => radiff::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Cache(args) => cachecmd::run(&args),
        Command::Cat(args) => cat::run(&args),
        Command::MultiprocWorker(args) => bench::multiproc_worker(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fcache: {error}");
            ExitCode::FAILURE
        }
    }
}
