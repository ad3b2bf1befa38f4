/*
 * A preload library's cost per pread: THREADS threads read 4 KiB blocks (BS bytes) at random
 * block offsets (plus SKEW bytes) of FILE, READS reads each, on one fd they share (`shared`),
 * an fd each (`each`) or an fd each moved far apart in the fd table (`far`: fds 200, 232, ...,
 * so that no two threads' fd-table slots share a cache line). One thread reads the whole file
 * first (so a cache holds it). Prints the time per read and the reads per second.
 *
 *     cc -O2 -pthread -o /tmp/preload-pread scripts/preload-pread.c
 *     FOLIOCACHE_PATHS=DIR FOLIOCACHE_SHARED=off FOLIOCACHE_CAPACITY_MB=512 \
 *         LD_PRELOAD=target/release/libfoliocache_preload.so \
 *         /tmp/preload-pread DIR/FILE THREADS READS BS shared|each|far [SKEW]
 *
 * Without LD_PRELOAD it measures the kernel's pread; with the dbbench suite's pread limit
 * (`fcache/src/bench/pread_limit.c`, which serves files named `*.sst`) the least a cache
 * behind pread can cost (docs/BENCHMARKS.md, "A preload read's own work").
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *path;
static int shared_fd = -1, fd_each, far;
static long reads, skew;
static size_t block;
static off_t size;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *reader(void *arg)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    int fd = fd_each ? open(path, O_RDONLY) : shared_fd;
    if (far) {
        int moved = dup2(fd, 200 + 32 * (int)(uintptr_t)arg);
        close(fd);
        fd = moved;
    }
    char *buf = aligned_alloc(4096, block + 4096);
    long blocks = (size - skew - (off_t)block) / 4096;
    volatile long sum = 0;
    for (long i = 0; i < reads; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        off_t off = (off_t)(x % (uint64_t)blocks) * 4096 + skew;
        if (pread(fd, buf, block, off) != (ssize_t)block) {
            perror("pread");
            exit(1);
        }
        sum += buf[0];
    }
    if (fd_each)
        close(fd);
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s FILE THREADS READS BS shared|each|far [SKEW]\n", argv[0]);
        return 2;
    }
    path = argv[1];
    int threads = atoi(argv[2]);
    reads = atol(argv[3]);
    block = (size_t)atol(argv[4]);
    fd_each = strcmp(argv[5], "shared") != 0;
    far = strcmp(argv[5], "far") == 0;
    skew = argc > 6 ? atol(argv[6]) : 0;
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    size = st.st_size;
    if (threads < 1 || threads > 64 || reads < 1 || block < 1 ||
        size < skew + (off_t)block + 4096) {
        fprintf(stderr, "1 to 64 threads, at least one read, and a file larger than a block\n");
        return 2;
    }
    if (!fd_each)
        shared_fd = open(path, O_RDONLY);
    /* One pass in order first, so that a cache holds the file. */
    int fd = open(path, O_RDONLY);
    char *chunk = malloc(1 << 20);
    while (read(fd, chunk, 1 << 20) > 0) {
    }
    close(fd);
    free(chunk);
    pthread_t t[64];
    double start = now_ns();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, reader, (void *)(uintptr_t)i);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double elapsed = now_ns() - start;
    printf("%.0f ns per read per thread, %.2f M reads/s\n", elapsed / reads,
           threads * reads / elapsed * 1e3);
    return 0;
}
