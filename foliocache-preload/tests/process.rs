//! Threads, signals, fork and exec around reads of a served file (`tests/c/fork_signals.c`):
//! two threads read random ranges and call the allocator between reads, a 300 µs timer's
//! signal handler reads too (interrupting the threads anywhere, the forking thread included),
//! and the main thread forks children that read through the inherited fd and a new one, with a
//! thread of their own, then exec the program to read the file once more. Every byte is
//! checked against the pattern. The cache is small (8 MiB for a 24 MiB file), so reads evict
//! and miss all along.
//!
//! Both write modes. A hang is a failure: the run is killed after a generous deadline.
//! Duration: `FOLIOCACHE_STRESS_SECS` in all (default 2).

mod common;

use common::{CacheMode, With, Writes, command, compile_c, have, stats, work_dir};
use std::time::{Duration, Instant};

#[test]
fn forks_execs_and_signal_handlers_read_right_and_never_hang() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("process");
    let exe = compile_c(&dir, "fork_signals", include_str!("c/fork_signals.c"));
    let exe = exe.to_str().unwrap();
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let made = command(&dir, With::Kernel, exe, &["make", data, "24"])
        .status()
        .unwrap();
    assert!(made.success());
    let secs = std::env::var("FOLIOCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(2);
    // Half the time in each write mode (write-back also writes back at every fork).
    let each = secs.div_ceil(2);
    for writes in Writes::BOTH {
        let stats_path = dir.join(format!("stats-{}.jsonl", writes.as_str()));
        let with = With::Library {
            cache: CacheMode::Private,
            writes,
            stats: &stats_path,
        };
        let mut cmd = command(&dir, with, exe, &["stress", data, &each.to_string()]);
        cmd.env("FOLIOCACHE_CAPACITY_MB", "8");
        // The process group would be cleaner on a hang; the stress program's children are short.
        let out = output_within(cmd, Duration::from_secs(each + 60), &format!("{writes:?}"));
        let status = out.status;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            status.success(),
            "{writes:?}, {status}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.starts_with("ok: "), "{stdout}");
        // The run did what it says: reads in signal handlers, and forks.
        let count = |what: &str| -> u64 {
            stdout
                .split(',')
                .find(|part| part.contains(what))
                .and_then(|part| part.split_whitespace().find_map(|w| w.parse().ok()))
                .unwrap_or(0)
        };
        assert!(count("in signal handlers") > 0, "{stdout}");
        assert!(count("forks") > 0, "{stdout}");
        // Parent, children and exec'd programs each used a cache of their own, and it missed.
        let stats = stats(&stats_path);
        assert!(stats.processes >= 3, "{stats:?}");
        assert!(stats.hits > 0, "{stats:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A C program reads and writes a served file after its threads' thread-locals are destroyed:
/// in a pthread key destructor and in an `atexit` handler (`tests/c/exit_io.c`). The library
/// must serve those calls like any other (it once panicked there, on the shared cache: a
/// thread's slot was kept in a thread-local). Every cache and write mode; the bytes each stage
/// wrote must be in the file afterwards.
#[test]
fn io_in_exit_handlers_and_key_destructors_is_served() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("exit-io");
    let exe = compile_c(&dir, "exit_io", include_str!("c/exit_io.c"));
    let exe = exe.to_str().unwrap();
    for (cache, writes) in common::modes() {
        let data = dir.join(format!("data-{}-{}", cache.as_str(), writes.as_str()));
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..4096].fill(b'A');
        std::fs::write(&data, &bytes).unwrap();
        let stats_path = dir.join(format!(
            "stats-{}-{}.jsonl",
            cache.as_str(),
            writes.as_str()
        ));
        let with = With::Library {
            cache,
            writes,
            stats: &stats_path,
        };
        let out = common::run(&dir, with, exe, &[data.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        for stage in [
            "main ok",
            "thread ok",
            "key destructor ok",
            "atexit ok",
            "atexit reopen ok",
        ] {
            assert!(
                stdout.lines().any(|l| l == stage),
                "{cache:?}, {writes:?}: no {stage:?} in {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "{cache:?}, {writes:?}: {stderr}"
        );
        if cache == CacheMode::Shared {
            common::sync_shared();
        }
        let after = std::fs::read(&data).unwrap();
        for page in 0..5 {
            assert!(
                after[page * 4096..(page + 1) * 4096]
                    .iter()
                    .all(|&b| b == b'A' + page as u8),
                "{cache:?}, {writes:?}: page {page} of the file is not what its stage wrote"
            );
        }
        // Served, not passed through: every stage's read and write is counted (with a private
        // cache the reopened descriptor's read passes through, a second description of a
        // file in use; with the shared cache it is served too).
        let s = stats(&stats_path);
        let reads = if cache == CacheMode::Shared { 5 } else { 4 };
        assert!(
            s.reads >= reads && s.writes >= 4,
            "{cache:?}, {writes:?}: {s:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// More threads than a shared cache has slots (1024), one after the other, each reading a
/// served file only in a pthread key destructor (`tests/c/late_threads.c`): a slot claimed
/// after the thread-locals' destructors must be given back when the thread ends, or the
/// claims run out. A cache of the test's own, so no other program holds its slots.
#[test]
fn slots_claimed_in_key_destructors_are_given_back() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("late-threads");
    let exe = compile_c(&dir, "late_threads", include_str!("c/late_threads.c"));
    let data = dir.join("data");
    let mut bytes = vec![0u8; 64 << 10];
    bytes[..4096].fill(b'A');
    std::fs::write(&data, &bytes).unwrap();
    let name = format!("late-threads-{}", std::process::id());
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Shared,
        writes: Writes::Through,
        stats: &stats_path,
    };
    let out = command(
        &dir,
        with,
        exe.to_str().unwrap(),
        &[data.to_str().unwrap(), "1100"],
    )
    .env("FOLIOCACHE_SHARED", &name)
    .output()
    .unwrap();
    let _ = foliocache::cache_command(&name, foliocache::CacheCommand::Destroy { force: true });
    assert_printed_ok(&out);
    let s = stats(&stats_path);
    assert!(
        s.reads >= 1100,
        "the destructors' reads were not served: {s:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Served reads are counted in per-thread shards without a locked instruction, so each shard
/// must have one writer: 40 threads (more than the 16 shards) read at once, 3,000 reads each, and
/// once more each in a pthread key destructor, after the thread's thread-locals are gone
/// (`tests/c/counted_reads.c`). The counters must hold every read exactly once.
#[test]
fn reads_from_many_threads_are_each_counted_once() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("counted-reads");
    let exe = compile_c(&dir, "counted_reads", include_str!("c/counted_reads.c"));
    let data = dir.join("data");
    paged_file(&data, b'A');
    let (threads, each) = (40u64, 3000u64);
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Private,
        writes: Writes::Through,
        stats: &stats_path,
    };
    let args = [
        data.to_str().unwrap(),
        &threads.to_string(),
        &each.to_string(),
    ];
    let out = command(&dir, with, exe.to_str().unwrap(), &args)
        .output()
        .unwrap();
    assert_printed_ok(&out);
    let s = stats(&stats_path);
    let reads = threads * (each + 1);
    assert_eq!(s.reads, reads, "{s:?}");
    assert_eq!(s.bytes_from_cache, reads * 4096, "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shared cache's owner is SIGKILLed while a process holds slots and an open file
/// (`tests/c/owner_death.c`). Then one of its threads exits and it closes the file, in either
/// order; the first finds the owner gone and starts the next one. Each once deadlocked. A
/// thread's exit gives its slot back from a thread-local's destructor, so the next owner was
/// spawned from there through the library's own `posix_spawn` hook, which flushed the
/// process's files through the cache, which waited for the recovery it was part of. The close
/// held its file's lock across a request whose recovery took that lock again. Both write
/// modes; a hang is a failure (killed after a deadline).
#[test]
fn a_process_whose_owner_died_exits_threads_and_closes_files() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("owner-death");
    let exe = compile_c(&dir, "owner_death", include_str!("c/owner_death.c"));
    let exe = exe.to_str().unwrap();
    // A cache of this test's own: killing its owner disturbs no other test's.
    let name = format!("owner-death-{}", std::process::id());
    for (writes, order) in [
        (Writes::Back, "close-first"),
        (Writes::Through, "thread-first"),
        (Writes::Through, "close-first"),
        (Writes::Back, "thread-first"),
    ] {
        let data = dir.join(format!("data-{}-{order}", writes.as_str()));
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..4096].fill(b'A');
        std::fs::write(&data, &bytes).unwrap();
        let stats_path = dir.join(format!("stats-{}-{order}.jsonl", writes.as_str()));
        let with = With::Library {
            cache: CacheMode::Shared,
            writes,
            stats: &stats_path,
        };
        // Outside the served directory: the library does not serve it, the owner must not
        // hold it.
        let marker = dir.with_extension(format!("{}-{order}.marker", writes.as_str()));
        let mut child = command(
            &dir,
            with,
            exe,
            &[data.to_str().unwrap(), order, marker.to_str().unwrap()],
        )
        .env("FOLIOCACHE_SHARED", &name)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert_eq!(line, "ready\n", "{writes:?}, {order}");
        let pid = owner_pid(&name);
        // SAFETY: kill(2) with integer arguments.
        let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(killed, 0, "{writes:?}, {order}");
        let gone = Instant::now() + Duration::from_secs(10);
        // The owner runs detached (its parent is init, which reaps it): its /proc entry goes.
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let exit = loop {
            if let Some(exit) = child.try_wait().unwrap() {
                break exit;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{writes:?}, {order}: the program hung after its owner died (killed after 60 s)"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert!(
            exit.success() && rest == "thread exited, file closed\nok\n",
            "{writes:?}, {order}, {exit}: {rest}{stderr}"
        );
        // A new owner serves the cache, and kept none of the program's descriptors.
        let new_pid = owner_pid(&name);
        assert_ne!(
            new_pid, pid,
            "{writes:?}, {order}: the owner did not change"
        );
        let held: Vec<String> = std::fs::read_dir(format!("/proc/{new_pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|target| target.display().to_string())
            .filter(|target| target.ends_with(".marker"))
            .collect();
        assert!(
            held.is_empty(),
            "{writes:?}, {order}: the owner holds the program's {held:?}"
        );
        let _ = std::fs::remove_file(&marker);
        let s = stats(&stats_path);
        assert!(s.reads > 0 && s.writes > 0, "{writes:?}, {order}: {s:?}");
    }
    let _ = foliocache::cache_command(&name, foliocache::CacheCommand::Destroy { force: true });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pid of the owner of shared cache `name`, from its status.
fn owner_pid(name: &str) -> i32 {
    let status = foliocache::cache_command(name, foliocache::CacheCommand::Status)
        .expect("the cache's owner answers");
    status
        .split("\"owner_pid\":")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no owner_pid in the status: {status}"))
}

/// `FOLIOCACHE_IO` picks how a private cache reads storage: with `threads` the process has no
/// io_uring instance, with `io_uring` it has one (`tests/c/engine_fds.c` counts them after
/// reading a file through the cache); both read the file's bytes, from the cache.
#[test]
fn the_io_engine_is_the_one_asked_for() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("io-engine");
    let exe = compile_c(&dir, "engine_fds", include_str!("c/engine_fds.c"));
    let data = dir.join("data");
    let bytes: Vec<u8> = (0..4u8)
        .flat_map(|page| std::iter::repeat_n(b'A' + page, 4096))
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let uring_allowed = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map_or(true, |v| v.trim() == "0");
    for (io, rings) in [
        ("threads", Some(0)),
        ("io_uring", uring_allowed.then_some(1)),
    ] {
        let stats_path = dir.join(format!("stats-{io}.jsonl"));
        let with = With::Library {
            cache: CacheMode::Private,
            writes: Writes::Through,
            stats: &stats_path,
        };
        let out = command(&dir, with, exe.to_str().unwrap(), &[data.to_str().unwrap()])
            .env("FOLIOCACHE_IO", io)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("ok "),
            "{io}: {}: {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let found: u32 = stdout[3..].trim().parse().unwrap();
        if let Some(rings) = rings {
            assert_eq!(found, rings, "{io}: io_uring instances open");
        }
        let s = stats(&stats_path);
        assert_eq!(s.bytes_from_cache, 4 * 4096, "{io}: {s:?}");
    }
}

/// The fd table's readers (`src/readers.rs`) against its removers, with real threads: reader
/// threads read random pages of one fd number while the main thread keeps putting another
/// file under it (open, `dup2` over it, close), and readers keep exiting and starting, 600 at
/// least, more than the table has reader records (`tests/c/fd_swaps.c`). Then 544 readers
/// read at once while the main thread swaps, more than the table's 512 records: the readers
/// without one count in the fd's counter. Then one thread reads while a 200 µs timer's signal handler puts the other file under its fd, interrupting
/// the reads anywhere (also between the table's lookup and the hook's mark, where the
/// handler's close is not nested and must not free the description the read uses). Every
/// read must be one whole page of one of the two files (the oracle: each file's pattern), the
/// program must not hang, and the cache must have served reads (the protocol under test is
/// the served path's). Duration: `FOLIOCACHE_STRESS_SECS` per part (default 2).
#[test]
fn readers_of_an_fd_swapped_under_them_read_one_file_or_the_other() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("fd-swaps");
    let exe = compile_c(&dir, "fd_swaps", include_str!("c/fd_swaps.c"));
    let (a, b) = (dir.join("a"), dir.join("b"));
    paged_file(&a, b'A');
    paged_file(&b, b'a');
    let secs = std::env::var("FOLIOCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(2);
    for mode in ["3", "crowd", "signal"] {
        let stats_path = dir.join(format!("stats-{mode}.jsonl"));
        let with = With::Library {
            cache: CacheMode::Private,
            writes: Writes::Through,
            stats: &stats_path,
        };
        let args = [
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            &secs.to_string(),
            mode,
        ];
        let cmd = command(&dir, with, exe.to_str().unwrap(), &args);
        let out = output_within(cmd, Duration::from_secs(20 * secs + 90), mode);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.ends_with("ok\n"),
            "{mode}: {}: {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let s = stats(&stats_path);
        assert!(s.bytes_from_cache > 0, "{mode}: no read was served: {s:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 64 KiB file whose page `p` is all `first + p`.
fn paged_file(path: &std::path::Path, first: u8) {
    let bytes: Vec<u8> = (0..16u8)
        .flat_map(|page| std::iter::repeat_n(first + page, 4096))
        .collect();
    std::fs::write(path, &bytes).unwrap();
}

/// Runs `cmd` to its end with its output captured; a run longer than `limit` is killed and
/// fails the test as a hang (`what` names it).
fn output_within(
    mut cmd: std::process::Command,
    limit: Duration,
    what: &str,
) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: the program hung (killed after {} s)",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A test program's run must succeed and print `ok`.
fn assert_printed_ok(out: &std::process::Output) {
    assert!(
        out.status.success() && out.stdout == b"ok\n",
        "{}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
