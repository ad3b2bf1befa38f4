/*
 * cat through foliocache: prints each file named on the command line, read through one cache
 * (O_DIRECT underneath), then the cache's counters on stderr.
 *
 *   gcc -O2 -Iinclude examples/cat.c -L../target/release -lfoliocache_capi -o fc-cat
 *   LD_LIBRARY_PATH=../target/release ./fc-cat FILE...
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliocache.h"

static int fail(const char *what, long long rc) {
    const char *message = foliocache_last_error();
    fprintf(stderr, "fc-cat: %s: %s (%s)\n", what, strerror((int)-rc),
            message ? message : "no message");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fc-cat FILE...\n");
        return 2;
    }
    foliocache_settings settings;
    foliocache_settings_default(&settings);
    settings.capacity_bytes = 64u << 20;
    settings.readahead_bytes = 512u << 10;

    foliocache_cache *cache = NULL;
    int rc = foliocache_cache_new(&settings, &cache);
    if (rc < 0)
        return fail("cache", rc);

    /* Misuse is reported, not crashed on. */
    if (foliocache_open(cache, NULL, NULL, NULL) != -EINVAL)
        return fail("a null path must give -EINVAL", -EINVAL);

    static char buf[1 << 16];
    int status = 0;
    for (int i = 1; i < argc; i++) {
        foliocache_open_options options;
        foliocache_open_options_default(&options);
        foliocache_file *file = NULL;
        rc = foliocache_open(cache, argv[i], &options, &file);
        if (rc < 0) {
            status = fail(argv[i], rc);
            continue;
        }
        foliocache_advise(file, FOLIOCACHE_ADVICE_SEQUENTIAL, 0, 0);
        uint64_t offset = 0;
        for (;;) {
            int64_t n = foliocache_read_at(file, buf, sizeof buf, offset);
            if (n < 0) {
                status = fail(argv[i], n);
                break;
            }
            if (n == 0)
                break;
            if (fwrite(buf, 1, (size_t)n, stdout) != (size_t)n) {
                perror("fc-cat: stdout");
                return 1;
            }
            offset += (uint64_t)n;
        }
        /* Opened for reading only: a write is refused as write(2) refuses it. */
        if (foliocache_write_at(file, buf, 1, 0) != -EBADF)
            status = fail("a write to a file opened for reading must give -EBADF", -EINVAL);
        foliocache_file_stats stats;
        foliocache_get_file_stats(file, &stats);
        fprintf(stderr, "%s: %llu bytes, %llu read from the device in %llu requests, %llu misses\n",
                argv[i], (unsigned long long)stats.size, (unsigned long long)stats.device_bytes,
                (unsigned long long)stats.device_requests, (unsigned long long)stats.sync_misses);
        foliocache_close(file);
    }
    foliocache_cache_stats cstats;
    foliocache_get_cache_stats(cache, &cstats);
    fprintf(stderr, "cache: %llu of %llu pages free, %llu evicted\n",
            (unsigned long long)cstats.free_pages, (unsigned long long)cstats.total_pages,
            (unsigned long long)cstats.evicted_pages);
    foliocache_cache_free(cache);
    return status;
}
