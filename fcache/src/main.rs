//! `fcache`: foliocache's command-line tool. `fcache bench` runs the benchmark suites.

mod bench;
mod replay;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Replay(args) => replay::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fcache: {error}");
            ExitCode::FAILURE
        }
    }
}
