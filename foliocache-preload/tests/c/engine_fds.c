/*
 * Reads FILE (4 pages, each filled with one letter: 'A', 'B', ...) through the library and
 * prints how many io_uring instances the process has open: `ok N`. With FOLIOCACHE_IO=threads
 * the cache must have none; with io_uring it has its ring.
 *
 *     engine_fds FILE
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: engine_fds FILE\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    char buf[4096];
    for (int page = 0; page < 4; page++) {
        if (pread(fd, buf, sizeof buf, (off_t)page * 4096) != (ssize_t)sizeof buf) {
            perror("pread");
            return 1;
        }
        for (size_t i = 0; i < sizeof buf; i++) {
            if (buf[i] != 'A' + page) {
                fprintf(stderr, "page %d byte %zu: %c\n", page, i, buf[i]);
                return 1;
            }
        }
    }
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) {
        perror("opendir");
        return 1;
    }
    int rings = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0)
            continue;
        target[n] = 0;
        if (strstr(target, "io_uring"))
            rings++;
    }
    closedir(dir);
    close(fd);
    printf("ok %d\n", rings);
    return 0;
}
