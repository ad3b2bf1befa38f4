//! Write-back mode (`FOLIOCACHE_WRITES=back`) on small C and Python programs: what the program
//! sees of its own writes through every other door (the stat calls, `lseek`, `mmap`, a child
//! process, a new program, another process under a lock), and what is on storage afterwards
//! (read here, without the library), checked against a byte model.

mod common;

use common::{CacheMode, With, Writes, command, compile_c, have, run, stats, work_dir};
use std::path::Path;

/// Runs `program args` in `dir` with the library in write-back mode; its counters go to
/// `dir/stats.jsonl`. The program prints `ok` when its own checks passed.
fn run_back(dir: &Path, program: &str, args: &[&str]) -> String {
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Private,
        writes: Writes::Back,
        stats: &stats_path,
    };
    let out = run(dir, with, program, args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_ok(text: &str) {
    assert!(
        text.lines().any(|line| line == "ok"),
        "the program's checks failed:\n{text}"
    );
}

/// C: appends, and after each one the size every stat call and `lseek(SEEK_END)` reports. The
/// raw `fstat` system call shows what the kernel has: in write-back mode it lags (the test
/// checks that it did at least once, or the hooks would have had nothing to correct). `dup`:
/// the second fd is a duplicate (one description, which write-back mode caches); `reopen`: a
/// second open (two descriptions, one writable: the file passes through).
const SIZES_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
extern int __fxstat(int version, int fd, struct stat *buf);
extern int __xstat(int version, const char *path, struct stat *buf);
#define STAT_VERSION 1
#endif

static int bad = 0;
#define CHECK(what, got, want) do { long long g_ = (got), w_ = (want); \
    if (g_ != w_) { printf("%s: %lld, expected %lld\n", what, g_, w_); bad = 1; } } while (0)

int main(int argc, char **argv) {
    const char *path = argv[1];
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND, 0644);
    int rd = strcmp(argv[2], "dup") == 0 ? dup(fd) : open(path, O_RDONLY);
    if (fd < 0 || rd < 0) { perror("open"); return 1; }
    char buf[9000];
    memset(buf, 'x', sizeof buf);
    long long size = 0;
    int lagged = 0;
    /* The modification time must move past the open's: a gap between them, and a margin of
       a few clock ticks (the kernel stamps files with a coarse clock). */
    usleep(100000);
    struct timespec start;
    clock_gettime(CLOCK_REALTIME, &start);
    long long start_ns = start.tv_sec * 1000000000LL + start.tv_nsec - 30000000LL;
    for (int i = 0; i < 60; i++) {
        int n = 1 + (i * 977) % 9000;
        if (write(fd, buf, n) != n) { perror("write"); return 1; }
        size += n;
        struct stat st;
        CHECK("fstat", fstat(fd, &st) == 0 ? st.st_size : -1, size);
        if (st.st_blocks * 512 < size) { printf("st_blocks %lld short\n", (long long)st.st_blocks); bad = 1; }
        if (st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec < start_ns) { printf("st_mtime older than the write\n"); bad = 1; }
        CHECK("fstat of another fd", fstat(rd, &st) == 0 ? st.st_size : -1, size);
        CHECK("stat", stat(path, &st) == 0 ? st.st_size : -1, size);
        CHECK("lstat", lstat(path, &st) == 0 ? st.st_size : -1, size);
        CHECK("fstatat", fstatat(AT_FDCWD, path, &st, 0) == 0 ? st.st_size : -1, size);
#if defined(__x86_64__)
        CHECK("__fxstat", __fxstat(STAT_VERSION, rd, &st) == 0 ? st.st_size : -1, size);
        CHECK("__xstat", __xstat(STAT_VERSION, path, &st) == 0 ? st.st_size : -1, size);
#endif
        struct statx sx;
        CHECK("statx", statx(AT_FDCWD, path, 0, STATX_SIZE | STATX_BLOCKS, &sx) == 0 ? (long long)sx.stx_size : -1, size);
        if (sx.stx_blocks * 512 < (unsigned long long)size) { printf("stx_blocks short\n"); bad = 1; }
        statx(AT_FDCWD, path, 0, STATX_MTIME, &sx);
        if (sx.stx_mtime.tv_sec * 1000000000LL + sx.stx_mtime.tv_nsec < start_ns) { printf("stx_mtime older than the write\n"); bad = 1; }
        CHECK("lseek(SEEK_END)", lseek(rd, 0, SEEK_END), size);
        CHECK("lseek(SEEK_END, -1)", lseek(rd, -1, SEEK_END), size - 1);
        CHECK("read at the end", read(rd, buf, 1), 1);
        struct stat raw;
        syscall(SYS_fstat, fd, &raw);
        if (raw.st_size < size) lagged = 1;
    }
    /* The kernel answers SEEK_DATA/SEEK_HOLE after a write back. */
    CHECK("SEEK_DATA", lseek(rd, 0, SEEK_DATA), 0);
    CHECK("SEEK_HOLE", lseek(rd, 0, SEEK_HOLE), size);
    printf("lagged %d\n", lagged);
    if (!bad) printf("ok\n");
    return 0;
}
"#;

#[test]
fn every_stat_call_and_seek_end_report_the_size_the_writes_made() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("wb-sizes");
    let exe = compile_c(&dir, "sizes", SIZES_C);
    let exe = exe.to_str().unwrap();
    // Without the library and write-through, the kernel has every byte at once.
    for with in [
        With::Kernel,
        With::Library {
            cache: CacheMode::Private,
            writes: Writes::Through,
            stats: &dir.join("t.jsonl"),
        },
    ] {
        for how in ["dup", "reopen"] {
            let out = run(&dir, with, exe, &["data", how]);
            let text = String::from_utf8_lossy(&out.stdout);
            assert_ok(&text);
            assert!(text.contains("lagged 0"), "{with:?}, {how}: {text}");
        }
    }
    let text = run_back(&dir, exe, &["data", "dup"]);
    assert_ok(&text);
    assert!(text.contains("lagged 1"), "the kernel never lagged: {text}");
    stats(&dir.join("stats.jsonl")).assert_writes_went(CacheMode::Private, Writes::Back);
    // Two descriptions: no lease, the file passes through, and the kernel has every byte.
    let _ = std::fs::remove_file(dir.join("stats.jsonl"));
    let text = run_back(&dir, exe, &["data", "reopen"]);
    assert_ok(&text);
    assert!(text.contains("lagged 0"), "{text}");
    let s = stats(&dir.join("stats.jsonl"));
    assert!(s.passed("busy") > 0, "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// C: threads append fixed-size records, through one shared O_APPEND fd and (`several`) through
/// fds of their own (other open file descriptions of the same file), with write and writev (a
/// record in two pieces). No fsync: the exit writes it back.
const APPENDS_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define THREADS 6
#define RECORDS 400
#define RECORD 64

static const char *path;
static int shared_fd, several;

static void *appender(void *arg) {
    long t = (long)arg;
    int fd = t < 3 || !several ? shared_fd : open(path, O_WRONLY | O_APPEND);
    char record[RECORD];
    for (int r = 0; r < RECORDS; r++) {
        memset(record, '.', RECORD);
        int n = snprintf(record, RECORD, "T%ld R%d ", t, r);
        record[n] = '.';
        record[RECORD - 1] = '\n';
        ssize_t done;
        if (r % 2) {
            struct iovec iov[2] = {{record, 10}, {record + 10, RECORD - 10}};
            done = writev(fd, iov, 2);
        } else {
            done = write(fd, record, RECORD);
        }
        if (done != RECORD) { perror("append"); return (void *)1; }
    }
    return 0;
}

int main(int argc, char **argv) {
    path = argv[1];
    several = argc > 2 && strcmp(argv[2], "several") == 0;
    shared_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (shared_fd < 0) { perror("open"); return 1; }
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&threads[t], 0, appender, (void *)t);
    for (int t = 0; t < THREADS; t++) {
        void *status;
        pthread_join(threads[t], &status);
        if (status) return 1;
    }
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn appends_from_many_threads_lose_and_overlap_nothing() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("wb-appends");
    let exe = compile_c(&dir, "appends", APPENDS_C);
    // One description: the cache takes the appends. Several: the file passes through (no
    // lease can be had), and the kernel's appends must be as whole.
    for how in ["one", "several"] {
        let stats_path = dir.join("stats.jsonl");
        let _ = std::fs::remove_file(&stats_path);
        assert_ok(&run_back(&dir, exe.to_str().unwrap(), &["log", how]));
        let data = std::fs::read(dir.join("log")).unwrap();
        let (threads, records, size) = (6, 400, 64);
        assert_eq!(
            data.len(),
            threads * records * size,
            "{how}: records lost or torn"
        );
        let mut next = vec![0usize; threads];
        for record in data.chunks(size) {
            let text = std::str::from_utf8(record).expect("a torn record");
            assert!(text.ends_with(".\n"), "{how}: a torn record: {text:?}");
            let mut words = text.split(' ');
            let t: usize = words.next().unwrap()[1..].parse().expect("thread");
            let r: usize = words.next().unwrap()[1..].parse().expect("record");
            // One thread's appends land in the order it made them, each once.
            assert_eq!(
                r, next[t],
                "{how}: thread {t}: record {r} out of order or repeated"
            );
            next[t] += 1;
        }
        assert!(next.iter().all(|&n| n == records), "{next:?}");
        let s = stats(&stats_path);
        if how == "one" {
            s.assert_writes_went(CacheMode::Private, Writes::Back);
        } else {
            assert!(s.passed("busy") > 0, "{s:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: a mapping shows the writes made before it; a shared mapping also shows the ones
/// made after it (the kernel keeps write and shared mappings coherent).
const MMAP_PY: &str = r#"
import mmap, os, sys
p = sys.argv[1]
data = bytes(range(256)) * 64 + b'tail'
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data)
bad = []
private = mmap.mmap(fd, len(data), flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
if private[:] != data: bad.append('private mapping')
os.pwrite(fd, b'AFTER', 100)  # still through the cache: a private mapping is only a flush point
shared = mmap.mmap(fd, len(data), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
expect = data[:100] + b'AFTER' + data[105:]
if shared[:] != expect: bad.append('shared mapping')
os.pwrite(fd, b'LATER', 200)
expect = expect[:200] + b'LATER' + expect[205:]
if shared[:] != expect: bad.append('shared mapping after a write')
if os.pread(fd, len(data), 0) != expect: bad.append('read')
print('ok' if not bad else 'BAD %r' % bad)
"#;

#[test]
fn mappings_see_the_writes() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("wb-mmap");
    std::fs::write(dir.join("maps.py"), MMAP_PY).unwrap();
    assert_ok(&run_back(&dir, "python3", &["maps.py", "data"]));
    let s = stats(&dir.join("stats.jsonl"));
    assert!(s.flushes > 0, "no flush before the mapping: {s:?}");
    s.assert_writes_went(CacheMode::Private, Writes::Back);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: writes that were never synced are seen by a forked child (through an inherited fd
/// and a new open), by new programs (`cat` through `subprocess` and `os.system`, with and
/// without the library), and the parent's writes after that still land where they should.
const CHILDREN_PY: &str = r#"
import os, subprocess, sys
p, outside = sys.argv[1], sys.argv[2]
data = os.urandom(300000)
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data)
bad = []
pid = os.fork()
if pid == 0:
    ok = os.pread(fd, len(data) + 10, 0) == data
    with open(p, 'rb') as f:
        ok = ok and f.read() == data
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
if status != 0: bad.append('forked child')
out = subprocess.run(['cat', p], stdout=subprocess.PIPE).stdout
if out != data: bad.append('cat with the library')
env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}
out = subprocess.run(['cat', p], stdout=subprocess.PIPE, env=env).stdout
if out != data: bad.append('cat without the library')
with open(os.path.join(outside, 'expect'), 'wb') as f: f.write(data)
if os.system('cmp -s %s %s' % (p, os.path.join(outside, 'expect'))) != 0: bad.append('system')
# After the children: more writes, at the shared offset, then an append.
os.write(fd, b'more')
os.close(fd)
fd = os.open(p, os.O_WRONLY | os.O_APPEND)
subprocess.run(['true'])
os.write(fd, b'appended')
os.close(fd)
expect = data + b'more' + b'appended'
if open(p, 'rb').read() != expect: bad.append('reread')
with open(os.path.join(outside, 'expect'), 'wb') as f: f.write(expect)
print('ok' if not bad else 'BAD %r' % bad)
"#;

#[test]
fn children_and_new_programs_see_unsynced_writes() {
    if !have("python3") || !have("cat") || !have("cmp") {
        return;
    }
    let dir = work_dir("wb-children");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::write(dir.join("children.py"), CHILDREN_PY).unwrap();
    let script = dir.join("children.py");
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Private,
        writes: Writes::Back,
        stats: &stats_path,
    };
    let out = run(
        &served,
        with,
        "python3",
        &[script.to_str().unwrap(), "data", dir.to_str().unwrap()],
    );
    assert_ok(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        std::fs::read(served.join("data")).unwrap(),
        std::fs::read(dir.join("expect")).unwrap()
    );
    stats(&stats_path).assert_writes_went(CacheMode::Private, Writes::Back);
    let _ = std::fs::remove_dir_all(&dir);
}

/// C: stdio streams and plain fds written and left open, no fsync, no fclose: a normal exit
/// puts everything on storage.
const EXIT_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    FILE *f = fopen("stream.txt", "w");
    for (int i = 0; i < 20000; i++) fprintf(f, "line %d\n", i);
    int fd = open("plain.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[4096];
    for (int i = 0; i < 1000; i++) {
        for (int j = 0; j < 4096; j++) buf[j] = (char)(i + j);
        if (write(fd, buf, 4096) != 4096) return 1;
    }
    if (write(fd, "end", 3) != 3) return 1;
    printf("ok\n");
    return 0; /* f and fd stay open */
}
"#;

#[test]
fn a_normal_exit_leaves_unsynced_writes_on_storage() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("wb-exit");
    let exe = compile_c(&dir, "exit", EXIT_C);
    assert_ok(&run_back(&dir, exe.to_str().unwrap(), &[]));
    let stream: String = (0..20000).map(|i| format!("line {i}\n")).collect();
    assert!(
        std::fs::read(dir.join("stream.txt")).unwrap() == stream.as_bytes(),
        "the stdio stream's data"
    );
    let mut plain = Vec::new();
    for i in 0..1000u32 {
        plain.extend((0..4096u32).map(|j| (i + j) as u8));
    }
    plain.extend(b"end");
    assert!(std::fs::read(dir.join("plain.bin")).unwrap() == plain);
    stats(&dir.join("stats.jsonl")).assert_writes_went(CacheMode::Private, Writes::Back);
    let _ = std::fs::remove_dir_all(&dir);
}

/// C: a served file made the program's stdout, written both by `printf` (glibc writes its
/// streams with libc-internal calls no hook sees) and by `write`.
const STDOUT_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    int fd = open("log", O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (write(fd, "1\n", 2) != 2) return 1;
    dup2(fd, 1);
    printf("2\n");
    fflush(stdout);
    if (write(fd, "3\n", 2) != 2) return 1;
    printf("4\n");
    return 0;
}
"#;

#[test]
fn a_file_made_stdout_keeps_what_stdio_and_write_put_in_it() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("wb-stdout");
    let exe = compile_c(&dir, "stdout", STDOUT_C);
    run_back(&dir, exe.to_str().unwrap(), &[]);
    assert_eq!(
        String::from_utf8_lossy(&std::fs::read(dir.join("log")).unwrap()),
        "1\n2\n3\n4\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// C: streams glibc opens itself (freopen, an fopen mode with `,ccs=`) on files the program
/// also writes through the hooks; the files must end as they do without the library.
const STREAMS_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

int main(void) {
    int fd = open("a", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (write(fd, "one\n", 4) != 4) return 1;
    if (!freopen("a", "a", stdout)) return 1;
    printf("two\n");
    fflush(stdout);
    if (pwrite(fd, "ONE", 3, 0) != 3) return 1;
    printf("three\n");
    fflush(stdout);
    int b = open("b", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (write(b, "hello", 5) != 5) return 1;
    FILE *w = fopen("b", "r,ccs=UTF-8");
    wchar_t text[16] = {0};
    if (!w || !fgetws(text, 16, w) || wcscmp(text, L"hello") != 0) return 2;
    if (write(b, " world", 6) != 6) return 1;
    return 0;
}
"#;

#[test]
fn streams_glibc_opens_itself_see_and_keep_the_writes() {
    if !have("gcc") {
        return;
    }
    let dir = work_dir("wb-streams");
    let exe = compile_c(&dir, "streams", STREAMS_C);
    let exe = exe.to_str().unwrap();
    let (plain, back) = (dir.join("plain"), dir.join("back"));
    for sub in [&plain, &back] {
        std::fs::create_dir_all(sub).unwrap();
    }
    run(&plain, With::Kernel, exe, &[]);
    run_back(&back, exe, &[]);
    for name in ["a", "b"] {
        assert_eq!(
            String::from_utf8_lossy(&std::fs::read(back.join(name)).unwrap()),
            String::from_utf8_lossy(&std::fs::read(plain.join(name)).unwrap()),
            "file {name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: truncation down and up (ftruncate, truncate by path, O_TRUNC on a second open while
/// the first fd still has unsynced data), each checked by reads and fstat.
const TRUNCATE_PY: &str = r#"
import os, sys
p = sys.argv[1]
pat = bytes((i * 7 + 3) % 251 for i in range(10000))
bad = []
def check(what, fd, model):
    if os.fstat(fd).st_size != len(model): bad.append('%s: size %d' % (what, os.fstat(fd).st_size))
    if os.pread(fd, len(model) + 100, 0) != model: bad.append(what)
# Read only first, then writable: the cache's file becomes writable, one file for both fds.
with open(p, 'wb') as f: f.write(b'0' * 100)
r = os.open(p, os.O_RDONLY)
first = os.pread(r, 100, 0)
w = os.open(p, os.O_WRONLY)
os.pwrite(w, b'up', 0)
if os.pread(r, 3, 0) != b'up0' or first != b'0' * 100: bad.append('upgrade')
os.close(w); os.close(r)
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, pat); check('written', fd, pat)
os.ftruncate(fd, 3000); model = pat[:3000]; check('down', fd, model)
os.ftruncate(fd, 8000); model += bytes(5000); check('up', fd, model)
os.pwrite(fd, b'abc', 7000); model = model[:7000] + b'abc' + model[7003:]; check('write', fd, model)
os.truncate(p, 7500); model = model[:7500]; check('truncate by path', fd, model)
os.truncate(p, 7600); model += bytes(100); check('truncate by path up', fd, model)
os.close(fd)
# O_TRUNC while another fd holds unsynced data.
a = os.open(p, os.O_RDWR)
os.pwrite(a, b'Z' * 50000, 0)
b = os.open(p, os.O_WRONLY | os.O_TRUNC)
os.write(b, b'new')
check('O_TRUNC', a, b'new')
os.close(b); os.close(a)
print('ok' if not bad else 'BAD %r' % bad)
"#;

#[test]
fn truncation_down_and_up_agrees_with_reads_and_storage() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("wb-truncate");
    std::fs::write(dir.join("truncate.py"), TRUNCATE_PY).unwrap();
    assert_ok(&run_back(&dir, "python3", &["truncate.py", "data"]));
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"new");
    stats(&dir.join("stats.jsonl")).assert_writes_went(CacheMode::Private, Writes::Back);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: a seeded random mix of positional writes (inside, across and past the end, some
/// large enough for whole large folios), writes at the offset, appends, truncations and syncs,
/// each read back against a byte model as it goes; the model is written outside the served
/// directory at the end, for the test to compare with storage. Appends go through the same
/// description with `RWF_APPEND` (`one`: the cache serves the file), or through a second
/// O_APPEND description (`two`: the file passes through).
const MODEL_PY: &str = r#"
import os, random, sys
p, model_path, seed, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
model = bytearray()
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
ap = os.open(p, os.O_WRONLY | os.O_APPEND) if how == 'two' else fd
def append(data):
    if how == 'two': return os.write(ap, data)
    return os.pwritev(fd, [data], -1, os.RWF_APPEND)
bad = []
def put(pos, data):
    global model
    if pos > len(model): model += bytes(pos - len(model))
    model[pos:pos + len(data)] = data
for step in range(1500):
    op = rng.random()
    size = rng.choice([1, 7, 100, 4095, 4096, 5000, 65536, 2 << 20]) if rng.random() < 0.9 else rng.randrange(1, 300000)
    data = bytes([step % 256]) * size if rng.random() < 0.5 else rng.randbytes(min(size, 70000)) * (size // min(size, 70000)) + rng.randbytes(size % min(size, 70000))
    limit = max(len(model), 1) + 100000
    if op < 0.45:
        pos = rng.randrange(0, min(limit, 6 << 20))
        if os.pwrite(fd, data, pos) != len(data): bad.append('pwrite'); break
        put(pos, data)
    elif op < 0.6:
        pos = rng.randrange(0, limit)
        os.lseek(fd, pos, 0)
        if os.write(fd, data) != len(data): bad.append('write'); break
        put(pos, data)
    elif op < 0.75:
        if append(data) != len(data): bad.append('append'); break
        put(len(model), data)
    elif op < 0.82:
        n = rng.randrange(0, limit)
        os.ftruncate(fd, n)
        model = model[:n] + bytes(max(0, n - len(model)))
    elif op < 0.85:
        (os.fsync if rng.random() < 0.5 else os.fdatasync)(fd)
    else:
        pos = rng.randrange(0, limit)
        n = rng.randrange(1, 200000)
        if os.pread(fd, n, pos) != bytes(model[pos:pos + n]): bad.append('pread at %d, step %d' % (pos, step)); break
    if os.fstat(fd).st_size != len(model) or os.lseek(ap, 0, 2) != len(model):
        bad.append('size at step %d' % step); break
if os.pread(fd, len(model) + 1, 0) != bytes(model): bad.append('final read')
with open(model_path, 'wb') as f: f.write(model)
print('ok' if not bad else 'BAD %r' % bad)
"#;

#[test]
fn random_writes_read_back_without_the_library_equal_a_byte_model() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("wb-model");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let script = dir.join("model.py");
    std::fs::write(&script, MODEL_PY).unwrap();
    let model = dir.join("model.bin");
    let (script, model_arg) = (script.to_str().unwrap(), model.to_str().unwrap());
    for (seed, how) in [("1", "one"), ("2", "one"), ("3", "two")] {
        let stats_path = dir.join("stats.jsonl");
        let _ = std::fs::remove_file(&stats_path);
        let with = With::Library {
            cache: CacheMode::Private,
            writes: Writes::Back,
            stats: &stats_path,
        };
        let out = run(
            &served,
            with,
            "python3",
            &[script, "data", model_arg, seed, how],
        );
        assert_ok(&String::from_utf8_lossy(&out.stdout));
        let on_storage = std::fs::read(served.join("data")).unwrap();
        let expected = std::fs::read(&model).unwrap();
        assert_eq!(on_storage.len(), expected.len(), "seed {seed}: size");
        if let Some(at) = (0..expected.len()).find(|&i| on_storage[i] != expected[i]) {
            panic!("seed {seed}: storage differs from the model at byte {at}");
        }
        let s = stats(&stats_path);
        if how == "one" {
            s.assert_writes_went(CacheMode::Private, Writes::Back);
            assert!(s.syncs > 0, "{s:?}");
        } else {
            assert!(s.passed("busy") > 0, "{s:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: what was fsync'd, what was written through an O_DSYNC fd, and what was in a file
/// whose last fd was closed, is on storage even if the process is killed right after (the
/// sync went through the cache's writeback, not just to the kernel, which had nothing; the
/// last close wrote the file back).
const KILLED_PY: &str = r#"
import os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b'synced-' * 10000)
os.fsync(fd)
os.write(fd, b'not synced')
d = os.open(sys.argv[1] + '.dsync', os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC, 0o644)
os.write(d, b'dsync-' * 5000)
c = os.open(sys.argv[1] + '.closed', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(c, b'closed-' * 5000)
os.close(c)
print('ok', flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"#;

#[test]
fn synced_data_survives_a_kill() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("wb-killed");
    std::fs::write(dir.join("killed.py"), KILLED_PY).unwrap();
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Private,
        writes: Writes::Back,
        stats: &stats_path,
    };
    let out = command(&dir, with, "python3", &["killed.py", "data"])
        .output()
        .unwrap();
    assert_ok(&String::from_utf8_lossy(&out.stdout));
    let data = std::fs::read(dir.join("data")).unwrap();
    let synced = b"synced-".repeat(10000);
    assert!(
        data.len() >= synced.len() && data[..synced.len()] == synced[..],
        "the synced data is not on storage ({} bytes there)",
        data.len()
    );
    assert!(
        std::fs::read(dir.join("data.dsync")).unwrap() == b"dsync-".repeat(5000),
        "the O_DSYNC write is not on storage"
    );
    assert!(
        std::fs::read(dir.join("data.closed")).unwrap() == b"closed-".repeat(5000),
        "the closed file is not on storage"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python: one worker of several that each add rows to one sqlite database, each in its own
/// transaction, the next number read under the write lock: a worker that read a stale page
/// would repeat a number (a UNIQUE failure) or corrupt the database.
const WORKER_PY: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
me = int(sys.argv[2])
for _ in range(int(sys.argv[3])):
    db.execute('BEGIN IMMEDIATE')
    (n,) = db.execute('SELECT coalesce(max(n), 0) + 1 FROM t').fetchone()
    db.execute('INSERT INTO t(n, who, pad) VALUES (?, ?, ?)', (n, me, 'x' * (n % 700)))
    db.execute('COMMIT')
print('ok')
"#;

#[test]
fn processes_that_coordinate_through_locks_see_each_others_writes() {
    if !have("python3") || !have("sqlite3") {
        return;
    }
    let dir = work_dir("wb-locks");
    std::fs::write(dir.join("worker.py"), WORKER_PY).unwrap();
    run(
        &dir,
        With::Kernel,
        "sqlite3",
        &[
            "db.sqlite",
            "CREATE TABLE t(n INTEGER UNIQUE, who INTEGER, pad TEXT);",
        ],
    );
    let stats_path = dir.join("stats.jsonl");
    let with = With::Library {
        cache: CacheMode::Private,
        writes: Writes::Back,
        stats: &stats_path,
    };
    let (workers, rows) = (3, 60);
    let children: Vec<_> = (0..workers)
        .map(|me| {
            command(
                &dir,
                with,
                "python3",
                &["worker.py", "db.sqlite", &me.to_string(), &rows.to_string()],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(
        &dir,
        With::Kernel,
        "sqlite3",
        &[
            "db.sqlite",
            "SELECT count(*), min(n), max(n), count(DISTINCT who) FROM t; PRAGMA integrity_check;",
        ],
    );
    let total = workers * rows;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{total}|1|{total}|{workers}\nok\n")
    );
    let s = stats(&stats_path);
    assert_eq!(s.processes, workers as u64, "{s:?}");
    // The workers share the database file: it is cached only while one has it alone, and
    // passes through from the moment another opens it (a lease broken, or refused).
    assert!(s.leases_taken > 0, "{s:?}");
    assert!(s.leases_broken + s.passed("busy") > 0, "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The counters of a write-back run name the writes, the writeback, the syncs and the flush
/// points (one process, all kinds).
#[test]
fn the_counters_show_where_the_writes_went() {
    if !have("python3") {
        return;
    }
    let dir = work_dir("wb-counters");
    let script = "import os\n\
        fd = os.open('f', os.O_RDWR | os.O_CREAT, 0o644)\n\
        os.write(fd, b'x' * 100000)\n\
        os.fsync(fd)\n\
        os.pwrite(fd, b'y' * 5000, 1000)\n\
        import mmap; m = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)\n\
        os.lseek(fd, 0, os.SEEK_DATA)\n\
        print('ok')\n";
    std::fs::write(dir.join("c.py"), script).unwrap();
    assert_ok(&run_back(&dir, "python3", &["c.py"]));
    let s = stats(&dir.join("stats.jsonl"));
    assert_eq!(s.bytes_written_to_cache, 105_000, "{s:?}");
    assert_eq!(s.bytes_written_through, 0, "{s:?}");
    assert!(s.syncs >= 1 && s.flushes >= 2, "{s:?}");
    assert!(s.writeback_pages >= 100_000 / 4096, "{s:?}");
    let mut model = vec![b'x'; 100_000];
    model[1000..6000].fill(b'y');
    assert!(std::fs::read(dir.join("f")).unwrap() == model);
    let _ = std::fs::remove_dir_all(&dir);
}
