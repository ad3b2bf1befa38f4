/* Threads, signals, fork and exec around reads of a served file.
 *
 *   fork_signals make FILE MIB     writes FILE: byte i is pattern(i)
 *   fork_signals stress FILE SECS  checks every byte it reads, for SECS seconds:
 *     - two threads pread random ranges (1 byte to 20 KiB) and malloc/free between reads;
 *     - a SIGALRM timer (every 300 us) whose handler preads 64 bytes, interrupting the
 *       readers anywhere: inside a hook, inside malloc, between the two;
 *     - the main thread forks: each child reads the file through the inherited fd and
 *       through a new one, starts a thread that reads too, then execs this program to
 *       check the file once more (`check`), which must exit 0.
 *   fork_signals check FILE         reads FILE whole and checks it
 *
 * The program counts the calls to glibc's allocator made while a signal handler reads (it
 * defines malloc, free, calloc and realloc, which the library's calls resolve to as well): a
 * handler may have interrupted malloc, so a read from it must not need malloc. The timer starts
 * once every thread has read once (a thread's first read may set up its thread-locals).
 *
 * Prints one line of counts and exits 0 when every byte was right, 1 on the first wrong
 * byte (with its offset), 2 on a failed call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static __thread int in_handler;
static atomic_long handler_mallocs;

void *malloc(size_t n) {
    if (in_handler) atomic_fetch_add(&handler_mallocs, 1);
    return __libc_malloc(n);
}
void free(void *p) {
    if (in_handler && p) atomic_fetch_add(&handler_mallocs, 1);
    __libc_free(p);
}
void *calloc(size_t n, size_t size) {
    if (in_handler) atomic_fetch_add(&handler_mallocs, 1);
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n) {
    if (in_handler) atomic_fetch_add(&handler_mallocs, 1);
    return __libc_realloc(p, n);
}

static unsigned char pattern(uint64_t i) { return (unsigned char)((i * 131) ^ (i >> 12) ^ (i >> 20)); }

static uint64_t file_size;
static int shared_fd;
static atomic_int stop, ready;
static atomic_long reads, signal_reads, forks;
static volatile sig_atomic_t signal_bad, signal_failed;
static volatile sig_atomic_t bad_offset_set;
static volatile uint64_t bad_offset;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t next(uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 17;
}

/* Checks buf against the pattern at pos; returns the first wrong offset or -1. */
static int64_t wrong(const unsigned char *buf, size_t n, uint64_t pos) {
    for (size_t i = 0; i < n; i++)
        if (buf[i] != pattern(pos + i)) return (int64_t)(pos + i);
    return -1;
}

static void fail_at(int64_t off, const char *who) {
    fprintf(stderr, "wrong byte at %lld (%s)\n", (long long)off, who);
    exit(1);
}

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    static uint64_t x = 99;
    unsigned char buf[64];
    uint64_t pos = next(&x) % (file_size - sizeof buf);
    in_handler = 1;
    ssize_t n = pread(shared_fd, buf, sizeof buf, (off_t)pos);
    in_handler = 0;
    if (n != (ssize_t)sizeof buf) {
        signal_failed = 1;
    } else if (wrong(buf, sizeof buf, pos) >= 0 && !bad_offset_set) {
        bad_offset = pos;
        bad_offset_set = 1;
        signal_bad = 1;
    }
    atomic_fetch_add(&signal_reads, 1);
    errno = saved;
}

static void read_range(int fd, uint64_t pos, size_t len, unsigned char *buf, const char *who) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, (off_t)(pos + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fprintf(stderr, "pread at %llu: %s\n", (unsigned long long)(pos + done),
                    n < 0 ? strerror(errno) : "end of file");
            exit(2);
        }
        done += (size_t)n;
    }
    int64_t off = wrong(buf, len, pos);
    if (off >= 0) fail_at(off, who);
}

static void *reader(void *arg) {
    uint64_t x = (uint64_t)(uintptr_t)arg;
    unsigned char *buf = malloc(20480);
    read_range(shared_fd, 0, 100, buf, "reader thread");
    atomic_fetch_add(&ready, 1);
    while (!atomic_load(&stop)) {
        size_t len = 1 + next(&x) % 20480;
        uint64_t pos = next(&x) % (file_size - len);
        read_range(shared_fd, pos, len, buf, "reader thread");
        atomic_fetch_add(&reads, 1);
        /* malloc and free between reads: a signal may land inside the allocator. */
        void *junk = malloc(1 + next(&x) % 100000);
        free(junk);
    }
    free(buf);
    return NULL;
}

static void *child_reader(void *arg) {
    unsigned char *buf = malloc(65536);
    uint64_t x = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 50; i++) {
        size_t len = 1 + next(&x) % 65536;
        uint64_t pos = next(&x) % (file_size - len);
        read_range(shared_fd, pos, len, buf, "child thread");
    }
    free(buf);
    return NULL;
}

static int check_whole(const char *path, const char *who) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 2;
    }
    unsigned char *buf = malloc(1 << 20);
    uint64_t pos = 0;
    for (;;) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            perror("read");
            return 2;
        }
        if (n == 0) break;
        int64_t off = wrong(buf, (size_t)n, pos);
        if (off >= 0) fail_at(off, who);
        pos += (uint64_t)n;
    }
    free(buf);
    close(fd);
    if (pos != file_size) {
        fprintf(stderr, "%s read %llu bytes of %llu\n", who, (unsigned long long)pos,
                (unsigned long long)file_size);
        return 1;
    }
    return 0;
}

static void child(const char *self, const char *path, uint64_t seed) {
    /* No timer in the child: a new process has no interval timer, the handler stays. */
    pthread_t t;
    pthread_create(&t, NULL, child_reader, (void *)(uintptr_t)(seed | 1));
    unsigned char *buf = malloc(65536);
    uint64_t x = seed;
    for (int i = 0; i < 50; i++) {
        size_t len = 1 + next(&x) % 65536;
        uint64_t pos = next(&x) % (file_size - len);
        read_range(shared_fd, pos, len, buf, "child, inherited fd");
    }
    pthread_join(t, NULL);
    int rc = check_whole(path, "child, new fd");
    if (rc != 0) _exit(rc);
    execl(self, self, "check", path, (char *)NULL);
    perror("execl");
    _exit(2);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "make") == 0) {
        uint64_t size = (uint64_t)atoll(argv[3]) << 20;
        FILE *f = fopen(argv[2], "wb");
        if (!f) return 2;
        for (uint64_t i = 0; i < size; i++) fputc(pattern(i), f);
        return fclose(f) == 0 ? 0 : 2;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s make FILE MIB | stress FILE SECS | check FILE\n", argv[0]);
        return 2;
    }
    const char *path = argv[2];
    shared_fd = open(path, O_RDONLY);
    if (shared_fd < 0) {
        perror("open");
        return 2;
    }
    file_size = (uint64_t)lseek(shared_fd, 0, SEEK_END);
    if (strcmp(argv[1], "check") == 0) return check_whole(path, "exec'd program");
    if (argc != 4 || strcmp(argv[1], "stress") != 0 || file_size < (1 << 20)) return 2;
    double secs = atof(argv[3]);

    unsigned char first[100];
    read_range(shared_fd, 0, sizeof first, first, "main thread");
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, reader, (void *)(uintptr_t)(i * 7919 + 1));
    while (atomic_load(&ready) < 2) sched_yield();

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 300}, {0, 300}};
    setitimer(ITIMER_REAL, &every, NULL);
    double end = now() + secs;
    uint64_t seed = 12345;
    while (now() < end) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) child(argv[0], path, next(&seed));
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child failed (status %d)\n", status);
            return 1;
        }
        atomic_fetch_add(&forks, 1);
        struct timespec pause = {0, 20 * 1000 * 1000};
        while (nanosleep(&pause, &pause) < 0 && errno == EINTR) {
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    if (signal_failed) {
        fprintf(stderr, "a read in the signal handler failed\n");
        return 2;
    }
    if (signal_bad) fail_at((int64_t)bad_offset, "signal handler");
    if (atomic_load(&handler_mallocs) > 0) {
        fprintf(stderr, "%ld calls to glibc's allocator during reads in signal handlers\n",
                atomic_load(&handler_mallocs));
        return 1;
    }
    printf("ok: %ld reads, %ld in signal handlers, %ld forks with exec\n", atomic_load(&reads),
           atomic_load(&signal_reads), atomic_load(&forks));
    return 0;
}
