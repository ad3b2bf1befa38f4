/*
 * The dbbench suite's `pread-limit`: a preload library for db_bench alone that serves RocksDB's
 * `pread` of its table files (`*.sst`, opened read-only) by copying out of a copy of the whole
 * file, read when the file is opened into anonymous memory aligned to a huge page and asked to
 * be backed by huge pages (`MADV_HUGEPAGE`), as the cache's arena is. A read then costs an array
 * index and the copy: no lookup in a cache, no reference, no system call, and a source whose
 * translations a few TLB entries hold (a mapping of the file itself would be of the kernel's
 * 4 KiB pages, or of its large folios, depending on how they were read in). It is the least
 * any cache behind `pread` can cost (it must copy into RocksDB's buffer), measured in the same
 * run as the library and RocksDB's own mmap reads. It is not a cache: table files never change
 * while open, and everything else passes through.
 *
 * FCACHE_PREAD_LIMIT_STATS=PATH: at exit, append "maps M preads P" (files mapped, and at least
 * P preads served) to PATH, so the suite can check that it served the reads it is credited
 * with.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FD 65536

#define HUGE_PAGE (2UL << 20)

struct mapped {
    const char *base; /* NULL: not served */
    size_t len;       /* the file's bytes */
    void *mapped;     /* what to unmap: `mapped_len` bytes */
    size_t mapped_len;
};

static struct mapped table[MAX_FD];
static unsigned long maps, preads;
/* Counted per thread and added to `preads` 1024 at a time, so the count costs no shared cache
 * line per read (a thread's last 1023 are not counted: `preads` is a lower bound). */
static __thread unsigned long thread_preads;

static void *next(const char *name)
{
    void *found = dlsym(RTLD_NEXT, name);
    if (!found)
        abort();
    return found;
}

static int is_table_file(const char *path, int flags)
{
    size_t len = path ? strlen(path) : 0;
    return (flags & O_ACCMODE) == O_RDONLY && len > 4 && strcmp(path + len - 4, ".sst") == 0;
}

static void forget(int fd)
{
    if (fd >= 0 && fd < MAX_FD && table[fd].base) {
        munmap(table[fd].mapped, table[fd].mapped_len);
        table[fd].base = NULL;
    }
}

static void track(int fd, const char *path, int flags)
{
    static ssize_t (*real_pread)(int, void *, size_t, off_t);
    struct stat st;
    char *mapped, *base;
    size_t len, mapped_len, done = 0;
    if (fd < 0 || fd >= MAX_FD || !is_table_file(path, flags))
        return;
    forget(fd);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
        return;
    if (!real_pread)
        real_pread = next("pread");
    len = (size_t)st.st_size;
    /* Room to align the copy to a huge page, and whole huge pages after it. */
    mapped_len = (len + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE + HUGE_PAGE;
    mapped = mmap(NULL, mapped_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED)
        return;
    base = (char *)(((unsigned long)mapped + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    madvise(base, mapped_len - (size_t)(base - mapped), MADV_HUGEPAGE);
    while (done < len) {
        ssize_t n = real_pread(fd, base + done, len - done, (off_t)done);
        if (n <= 0) {
            munmap(mapped, mapped_len);
            return;
        }
        done += (size_t)n;
    }
    table[fd].len = len;
    table[fd].mapped = mapped;
    table[fd].mapped_len = mapped_len;
    table[fd].base = base;
    __atomic_fetch_add(&maps, 1, __ATOMIC_RELAXED);
}

/* The mode argument of an open call, present only when it creates a file. */
#define MODE_OF(flags, mode)                                                                   \
    do {                                                                                       \
        va_list args;                                                                          \
        va_start(args, flags);                                                                 \
        mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(args, int) : 0; \
        va_end(args);                                                                          \
    } while (0)

/* A descriptor the program just opened: tracked if it is a table file, errno kept. */
static int opened(int fd, const char *path, int flags)
{
    int saved = errno;
    track(fd, path, flags);
    errno = saved;
    return fd;
}

int open(const char *path, int flags, ...)
{
    static int (*real)(const char *, int, ...);
    int mode;
    MODE_OF(flags, mode);
    if (!real)
        real = next("open");
    return opened(real(path, flags, mode), path, flags);
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dir, const char *path, int flags, ...)
{
    static int (*real)(int, const char *, int, ...);
    int mode;
    MODE_OF(flags, mode);
    if (!real)
        real = next("openat");
    return opened(real(dir, path, flags, mode), path, flags);
}

int openat64(int dir, const char *path, int flags, ...) __attribute__((alias("openat")));

int close(int fd)
{
    static int (*real)(int);
    if (!real)
        real = next("close");
    forget(fd);
    return real(fd);
}

int dup2(int old, int new)
{
    static int (*real)(int, int);
    if (!real)
        real = next("dup2");
    if (old != new)
        forget(new);
    return real(old, new);
}

int dup3(int old, int new, int flags)
{
    static int (*real)(int, int, int);
    if (!real)
        real = next("dup3");
    forget(new);
    return real(old, new, flags);
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset)
{
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (fd >= 0 && fd < MAX_FD && table[fd].base && offset >= 0) {
        size_t at = (size_t)offset, len = table[fd].len;
        if (++thread_preads % 1024 == 0)
            __atomic_fetch_add(&preads, 1024, __ATOMIC_RELAXED);
        if (at >= len)
            return 0;
        if (count > len - at)
            count = len - at;
        memcpy(buf, table[fd].base + at, count);
        return (ssize_t)count;
    }
    if (!real)
        real = next("pread");
    return real(fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t offset) __attribute__((alias("pread")));

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("FCACHE_PREAD_LIMIT_STATS");
    FILE *out;
    if (!path || !(out = fopen(path, "a")))
        return;
    fprintf(out, "maps %lu preads %lu\n", maps,
            __atomic_load_n(&preads, __ATOMIC_RELAXED) + thread_preads);
    fclose(out);
}
