/*
 * A log through foliocache: appends RECORDS text records of varying length to FILE (created,
 * or truncated), fdatasync after every 64 as a log does, then appends a torn tail and cuts it
 * off again with foliocache_set_len, fsyncs, closes, and reads the file back through a fresh
 * open to check every byte. Prints the size and the cache's writeback counters.
 *
 *   gcc -O2 -Iinclude examples/append.c -L../target/release -lfoliocache_capi -o fc-append
 *   LD_LIBRARY_PATH=../target/release ./fc-append FILE RECORDS
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliocache.h"

static int fail(const char *what, long long rc) {
    const char *message = foliocache_last_error();
    fprintf(stderr, "fc-append: %s: %s (%s)\n", what, strerror((int)-rc),
            message ? message : "no message");
    return 1;
}

/* Record k: a header and k % 200 filler bytes, so records straddle pages at every offset. */
static int record(char *out, size_t cap, long k) {
    int n = snprintf(out, cap, "record %08ld ", k);
    for (long i = 0; i < k % 200 && (size_t)n + 2 < cap; i++)
        out[n++] = (char)('a' + (k + i) % 26);
    out[n++] = '\n';
    return n;
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[2]) <= 0) {
        fprintf(stderr, "usage: fc-append FILE RECORDS\n");
        return 2;
    }
    long records = atol(argv[2]);
    foliocache_settings settings;
    foliocache_settings_default(&settings);
    settings.capacity_bytes = 16u << 20;
    foliocache_cache *cache = NULL;
    int rc = foliocache_cache_new(&settings, &cache);
    if (rc < 0)
        return fail("cache", rc);

    foliocache_open_options options;
    foliocache_open_options_default(&options);
    options.create = true;
    options.truncate = true;
    foliocache_file *log = NULL;
    rc = foliocache_open(cache, argv[1], &options, &log);
    if (rc < 0)
        return fail(argv[1], rc);

    char line[256];
    uint64_t size = 0;
    for (long k = 0; k < records; k++) {
        int n = record(line, sizeof line, k);
        int64_t wrote = foliocache_write_at(log, line, (size_t)n, size);
        if (wrote != n)
            return fail("write", wrote < 0 ? wrote : -EIO);
        size += (uint64_t)n;
        if ((k + 1) % 64 == 0 && (rc = foliocache_fdatasync(log)) < 0)
            return fail("fdatasync", rc);
    }
    /* A torn tail, then cut back to the last whole record. */
    static const char torn[] = "record torn-and-never-finish";
    if (foliocache_write_at(log, torn, sizeof torn - 1, size) != (int64_t)(sizeof torn - 1))
        return fail("write the tail", -EIO);
    if ((rc = foliocache_set_len(log, size)) < 0)
        return fail("set_len", rc);
    if ((rc = foliocache_fsync(log)) < 0)
        return fail("fsync", rc);
    if (foliocache_size(log) != (int64_t)size)
        return fail("the size after set_len", -EIO);
    foliocache_cache_stats stats;
    foliocache_get_cache_stats(cache, &stats);
    foliocache_close(log);

    /* Read it back through a fresh open of the same cache. */
    foliocache_file *check = NULL;
    if ((rc = foliocache_open(cache, argv[1], NULL, &check)) < 0)
        return fail("reopen", rc);
    uint64_t at = 0;
    for (long k = 0; k < records; k++) {
        int n = record(line, sizeof line, k);
        char got[256];
        int64_t r = foliocache_read_at(check, got, (size_t)n, at);
        if (r != n || memcmp(got, line, (size_t)n) != 0) {
            fprintf(stderr, "fc-append: record %ld at %llu differs\n", k, (unsigned long long)at);
            return 1;
        }
        at += (uint64_t)n;
    }
    char past;
    if (foliocache_read_at(check, &past, 1, at) != 0) {
        fprintf(stderr, "fc-append: bytes past the last record\n");
        return 1;
    }
    foliocache_close(check);
    printf("%llu bytes in %ld records; %llu pages written back, %llu dirty\n",
           (unsigned long long)size, records, (unsigned long long)stats.written_pages,
           (unsigned long long)stats.dirty_pages);
    foliocache_cache_free(cache);
    return 0;
}
