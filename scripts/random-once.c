/*
 * A dense random reader: reads every 4 KiB page of FILE once, in a shuffled order, PASSES
 * times (default 2), with no advice (so reads that meet cached neighbours turn into readahead
 * windows, as in the kernel), and prints the process's resident memory after each pass. Run
 * under the preload library to see how much memory a private cache's data takes:
 *
 *     cc -O2 -o /tmp/random-once scripts/random-once.c
 *     FOLIOCACHE_PATHS=DIR FOLIOCACHE_SHARED=off FOLIOCACHE_CAPACITY_MB=208 \
 *         FOLIOCACHE_PLACE=offset|anywhere LD_PRELOAD=target/release/libfoliocache_preload.so \
 *         /tmp/random-once DIR/FILE [PASSES]
 *
 * (docs/BENCHMARKS.md, "Pages placed by their offset, and their memory".)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void resident(int pass)
{
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS", 5) == 0 || strncmp(line, "RssAnon", 7) == 0)
            printf("after pass %d: %s", pass, line);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s FILE [PASSES]\n", argv[0]);
        return 2;
    }
    int passes = argc == 3 ? atoi(argv[2]) : 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    long pages = size / 4096;
    if (pages < 1 || passes < 1) {
        fprintf(stderr, "a file of at least one page, and at least one pass\n");
        return 2;
    }
    long *order = malloc(pages * sizeof *order);
    if (!order)
        return 2;
    for (long i = 0; i < pages; i++)
        order[i] = i;
    unsigned long x = 88172645463325252ul;
    for (long i = pages - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        long j = (long)(x % (unsigned long)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    char buf[4096];
    for (int pass = 1; pass <= passes; pass++) {
        for (long i = 0; i < pages; i++)
            if (pread(fd, buf, sizeof buf, (off_t)order[i] * 4096) != (ssize_t)sizeof buf) {
                perror("pread");
                return 1;
            }
        resident(pass);
    }
    return 0;
}
