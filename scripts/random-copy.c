/*
 * The floor under a cache's random reads: the time of the copy alone. Copies 4 KiB blocks at
 * random block offsets (plus SKEW bytes, so a block may span two pages, as RocksDB's do) out of
 * MIB MiB of anonymous memory, aligned to a huge page and asked for huge pages (HUGE=1) or
 * small ones (HUGE=0), into one 4 KiB-aligned buffer, and prints the time per copy.
 *
 *     cc -O2 -o /tmp/random-copy scripts/random-copy.c && /tmp/random-copy MIB HUGE SKEW
 *
 * `read_loop` with READ_LOOP_RANDOM=1 and READ_LOOP_SKEW does the same reads through the cache
 * (docs/BENCHMARKS.md, "Where a random read's time goes").
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HUGE_PAGE (2UL << 20)
#define BLOCK 4096UL
#define COPIES 2000000L

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MIB HUGE(0|1) SKEW\n", argv[0]);
        return 2;
    }
    size_t size = strtoul(argv[1], NULL, 10) << 20;
    int huge = atoi(argv[2]);
    size_t skew = strtoul(argv[3], NULL, 10);
    if (size < 2 * BLOCK || skew >= BLOCK) {
        fprintf(stderr, "MIB must be at least 1 and SKEW below %lu\n", BLOCK);
        return 2;
    }
    char *mapped = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    char *src = (char *)(((uintptr_t)mapped + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    madvise(src, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    /* Distinct bytes everywhere (the host could merge identical pages). */
    for (size_t at = 0; at + 8 <= size; at += 8) {
        uint64_t word = at * 0x9E3779B97F4A7C15ull;
        memcpy(src + at, &word, 8);
    }
    char *dst = aligned_alloc(BLOCK, BLOCK);
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    size_t blocks = (size - skew) / BLOCK;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < COPIES; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        memcpy(dst, src + (rng % blocks) * BLOCK + skew, BLOCK);
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("%zu MiB, huge pages %s, skew %zu: %.1f ns per 4 KiB copy\n", size >> 20,
           huge ? "on" : "off", skew, ns / COPIES);
    return 0;
}
