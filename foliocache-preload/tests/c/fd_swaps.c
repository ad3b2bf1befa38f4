/* Readers of one fd number while the program keeps putting another file under it.
 *
 * With a number of reader threads: the main thread swaps (open, dup2 over it, close), and new
 * reader threads keep starting (more, over the run, than the fd table has reader records, so
 * records of exited threads are taken over).
 *
 * With `crowd`: more reader threads alive at once than the fd table has reader records (512),
 * all reading until the end, so that the ones without a record count in the fd's counter
 * while the main thread swaps.
 *
 * With `signal`: the main thread reads, and a timer's signal handler swaps the file under it
 * (open, dup2 over it, close: the description replaced is its last fd's, so it is freed),
 * interrupting the reads anywhere, also between the fd table's lookup and the hook's mark
 * (where the handler's close is not seen as nested).
 *
 * Two files, A (page p all 'A' + p) and B (page p all 'a' + p). Every read must return one
 * whole page of A or of B: the fd table frees a replaced description only after every
 * thread that could still be using it has finished (`src/readers.rs`).
 *
 * usage: fd_swaps <file A> <file B> <seconds> <reader threads|crowd|signal>
 * (each file: 64 KiB) */
#include <signal.h>
#include <sys/time.h>
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 16
#define SHARED_FD 100

static atomic_int stop;
static atomic_long reads_done, threads_started;

static void read_page(unsigned long page) {
    char buf[PAGE];
    ssize_t n = pread(SHARED_FD, buf, PAGE, (off_t)page * PAGE);
    if (n != PAGE) {
        fprintf(stderr, "a read of page %lu returned %zd: %m\n", page, n);
        _exit(3);
    }
    char first = buf[0];
    if (first != (char)('A' + page) && first != (char)('a' + page)) {
        fprintf(stderr, "page %lu starts with %d: neither file's\n", page, first);
        _exit(3);
    }
    for (int i = 1; i < PAGE; i++)
        if (buf[i] != first) {
            fprintf(stderr, "page %lu mixes bytes at %d\n", page, i);
            _exit(3);
        }
    atomic_fetch_add_explicit(&reads_done, 1, memory_order_relaxed);
}

/* A reader that lives for `reads` reads, then exits. */
static void *reader(void *arg) {
    unsigned long x = 0x9E3779B97F4A7C15ul * ((unsigned long)(size_t)arg + 1);
    long reads = 50 + (long)((size_t)arg % 7) * 25;
    for (long i = 0; i < reads && !atomic_load(&stop); i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        read_page(x % PAGES);
    }
    return NULL;
}

/* Keeps `count` readers running, starting a new one as each exits. */
static void *spawner(void *arg) {
    int count = (int)(size_t)arg;
    pthread_t t[64];
    size_t next = 0;
    for (int i = 0; i < count; i++)
        pthread_create(&t[i], NULL, reader, (void *)next++);
    while (!atomic_load(&stop)) {
        for (int i = 0; i < count; i++) {
            pthread_join(t[i], NULL);
            if (pthread_create(&t[i], NULL, reader, (void *)next++) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                _exit(4);
            }
            atomic_fetch_add(&threads_started, 1);
        }
    }
    for (int i = 0; i < count; i++)
        pthread_join(t[i], NULL);
    return NULL;
}

/* More readers than the fd table's records (`RECORDS` in src/readers.rs). */
#define CROWD 544
static pthread_barrier_t crowd_met;

/* A reader of the crowd: reads once (so it holds a record, or found none), waits for the
 * others to have read once too, then reads until the end. */
static void *crowd_reader(void *arg) {
    unsigned long x = 0x9E3779B97F4A7C15ul * ((unsigned long)(size_t)arg + 1);
    read_page(x % PAGES);
    pthread_barrier_wait(&crowd_met);
    while (!atomic_load(&stop)) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        read_page(x % PAGES);
    }
    return NULL;
}

/* Swaps the file under the shared fd: open, dup2 over it, close. */
static int swap_files(const char *a, const char *b, long swaps) {
    int fd = open(swaps % 2 ? b : a, O_RDONLY);
    if (fd < 0 || dup2(fd, SHARED_FD) != SHARED_FD) {
        perror("open or dup2");
        return -1;
    }
    close(fd);
    return 0;
}

/* The `crowd` mode. */
static int crowd_mode(const char *a, const char *b, double seconds) {
    static pthread_t t[CROWD];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_barrier_init(&crowd_met, NULL, CROWD + 1);
    if (swap_files(a, b, 0) != 0)
        return 2;
    for (size_t i = 0; i < CROWD; i++)
        if (pthread_create(&t[i], &attr, crowd_reader, (void *)i) != 0) {
            fprintf(stderr, "pthread_create failed at %zu\n", i);
            _exit(4);
        }
    pthread_barrier_wait(&crowd_met);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long swaps = 1;
    do {
        if (swap_files(a, b, swaps++) != 0)
            return 2;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
    atomic_store(&stop, 1);
    for (size_t i = 0; i < CROWD; i++)
        pthread_join(t[i], NULL);
    printf("%ld reads, %ld swaps, %d threads at once\nok\n", atomic_load(&reads_done), swaps,
           CROWD);
    return 0;
}

static const char *files[2];
static volatile sig_atomic_t handler_swaps;

static void swap_in_handler(int sig) {
    (void)sig;
    int saved = errno;
    int fd = open(files[handler_swaps % 2], O_RDONLY);
    if (fd < 0 || dup2(fd, SHARED_FD) != SHARED_FD)
        _exit(6);
    close(fd);
    handler_swaps++;
    errno = saved;
}

/* The `signal` mode: reads on this thread, swaps in the timer's handler. */
static int signal_mode(const char *a, const char *b, double seconds) {
    files[0] = a;
    files[1] = b;
    int first = open(a, O_RDONLY);
    if (first < 0 || dup2(first, SHARED_FD) != SHARED_FD) {
        perror(a);
        return 2;
    }
    close(first);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = swap_in_handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long x = 0x9E3779B97F4A7C15ul;
    for (long i = 0;; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        read_page(x % PAGES);
        if (i % 1024 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 >= seconds)
                break;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%ld reads, %ld swaps in a handler\nok\n", atomic_load(&reads_done),
           (long)handler_swaps);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s <file A> <file B> <seconds> <reader threads|crowd|signal>\n",
                argv[0]);
        return 2;
    }
    double seconds = atof(argv[3]);
    if (strcmp(argv[4], "signal") == 0)
        return signal_mode(argv[1], argv[2], seconds);
    if (strcmp(argv[4], "crowd") == 0)
        return crowd_mode(argv[1], argv[2], seconds);
    int count = atoi(argv[4]);
    if (count < 1 || count > 64) {
        fprintf(stderr, "1 to 64 reader threads\n");
        return 2;
    }
    int first = open(argv[1], O_RDONLY);
    if (first < 0 || dup2(first, SHARED_FD) != SHARED_FD) {
        perror(argv[1]);
        return 2;
    }
    close(first);
    pthread_t spawn;
    pthread_create(&spawn, NULL, spawner, (void *)(size_t)count);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long swaps = 0;
    /* Swap until the time is up and enough threads have come and gone. */
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = (now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9;
        if (elapsed >= seconds && atomic_load(&threads_started) >= 600)
            break;
        if (elapsed >= seconds * 20 + 60) {
            fprintf(stderr, "only %ld threads started\n", atomic_load(&threads_started));
            return 5;
        }
        if (swap_files(argv[1], argv[2], swaps++) != 0)
            return 2;
    }
    atomic_store(&stop, 1);
    pthread_join(spawn, NULL);
    printf("%ld reads, %ld swaps, %ld threads\nok\n", atomic_load(&reads_done), swaps,
           atomic_load(&threads_started) + count);
    return 0;
}
