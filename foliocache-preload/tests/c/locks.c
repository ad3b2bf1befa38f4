/* A program's POSIX record locks must survive everything the preload library does around
 * them: a lock belongs to the process and the inode, and closing *any* descriptor of the
 * file drops it, so a library that opens and closes descriptors of its own on the file takes
 * the program's locks away (SQLite's -shm file, PostgreSQL's files).
 *
 *   locks FILE CASE      prints "CASE kept" or "CASE LOST ..." and exits 0, 1 on an error
 *
 * Each case takes a lock on FILE, reads through the descriptor (so the library serves the
 * file), does something around it, then asks from a child process (F_GETLK) whether the lock
 * is still held by this process. Cases:
 *   mmap      extend the file and map it MAP_SHARED, without reading it first (SQLite's
 *             -shm sequence)
 *   reopen    open the file again read-only, read through it, keep it open
 *   fork      fork a child that reads the file through its own open and exits
 *   spawn     system("true")
 *   truncate  truncate(2) by path
 *   exec      exec this program again with execv (the descriptor kept across exec), then
 *             check there
 *   execl     the same with execl (glibc's execl does not go through execv)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) { perror(what); exit(1); }

/* From a child: is a write lock on the first byte refused because `owner` holds one? */
static int held_by(int fd, pid_t owner) {
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        struct flock probe = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fcntl(fd, F_GETLK, &probe) != 0) _exit(2);
        _exit(probe.l_type != F_UNLCK && probe.l_pid == owner ? 0 : 1);
    }
    int status;
    if (waitpid(child, &status, 0) != child) die("waitpid");
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void read_some(int fd) {
    char buf[8192];
    for (int k = 0; k < 3; k++)
        if (pread(fd, buf, sizeof buf, 0) < 0) die("pread");
}

static int report(const char *name, int fd) {
    int kept = held_by(fd, getpid());
    printf("%s %s\n", name, kept ? "kept" : "LOST");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[2], "exec-after") == 0) {
        int fd = atoi(argv[3]);
        read_some(fd);
        return report(argv[4], fd);
    }
    if (argc != 3) { fprintf(stderr, "usage: locks FILE CASE\n"); return 1; }
    const char *path = argv[1], *name = argv[2];
    int exec_case = strcmp(name, "exec") == 0 || strcmp(name, "execl") == 0;
    int fd = open(path, O_RDWR | (exec_case ? 0 : O_CLOEXEC));
    if (fd < 0) die("open");
    /* SQLite opens its -shm file, locks, extends and maps it without reading it first. */
    if (strcmp(name, "mmap") != 0) read_some(fd);
    struct flock lock = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(fd, F_SETLK, &lock) != 0) die("F_SETLK");
    if (!held_by(fd, getpid())) { printf("%s LOST before anything\n", name); return 0; }
    if (strcmp(name, "mmap") == 0) {
        struct stat st;
        if (fstat(fd, &st) != 0) die("fstat");
        off_t size = st.st_size + 65536;
        if (ftruncate(fd, size) != 0) die("ftruncate");
        void *map = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) die("mmap");
        ((char *)map)[size - 1] = 'x';
        read_some(fd);
        report(name, fd);
        munmap(map, size);
        return 0;
    }
    if (strcmp(name, "reopen") == 0) {
        int again = open(path, O_RDONLY | O_CLOEXEC);
        if (again < 0) die("open again");
        read_some(again);
        return report(name, fd);
    }
    if (strcmp(name, "fork") == 0) {
        pid_t child = fork();
        if (child < 0) die("fork");
        if (child == 0) {
            int own = open(path, O_RDONLY);
            if (own < 0) _exit(1);
            read_some(own);
            read_some(fd);
            _exit(0);
        }
        waitpid(child, 0, 0);
        read_some(fd);
        return report(name, fd);
    }
    if (strcmp(name, "spawn") == 0) {
        if (system("true") != 0) die("system");
        read_some(fd);
        return report(name, fd);
    }
    if (strcmp(name, "truncate") == 0) {
        struct stat st;
        if (fstat(fd, &st) != 0) die("fstat");
        if (truncate(path, st.st_size + 4096) != 0) die("truncate");
        read_some(fd);
        return report(name, fd);
    }
    if (exec_case) {
        char number[16];
        snprintf(number, sizeof number, "%d", fd);
        if (strcmp(name, "execl") == 0) {
            execl("/proc/self/exe", argv[0], path, "exec-after", number, name, (char *)0);
        } else {
            char *args[] = {argv[0], (char *)path, "exec-after", number, (char *)name, 0};
            execv("/proc/self/exe", args);
        }
        die("exec");
    }
    fprintf(stderr, "unknown case %s\n", name);
    return 1;
}
