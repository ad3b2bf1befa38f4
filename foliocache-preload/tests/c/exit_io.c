/* Reads and writes a served file after the thread's thread-locals are gone: in a pthread key
 * destructor of a thread (glibc runs them after the thread's C++/Rust thread-local
 * destructors) and in an atexit handler of the main thread (exit() runs the main thread's
 * thread-local destructors first). Each stage reads 4 KiB it wrote before and writes 4 KiB of
 * its own; the test checks the file's bytes afterwards.
 *
 * usage: exit_io <file>  (the file: 64 KiB, made by the test)
 * Page k of the file gets byte 'A' + k from the stage that writes it:
 * page 1 by main, page 2 by the thread, page 3 by its key destructor, page 4 by the atexit
 * handler. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096

static int fd;
static pthread_key_t key;

/* Writes page `k` full of 'A' + k, then reads page `check` back and compares. Exits with 3
 * (without running more handlers) on any error. */
static void stage(const char *who, int k, int check) {
    char buf[PAGE], want[PAGE];
    memset(buf, 'A' + k, PAGE);
    if (pwrite(fd, buf, PAGE, (off_t)k * PAGE) != PAGE) {
        fprintf(stderr, "%s: pwrite: %m\n", who);
        _exit(3);
    }
    memset(want, 'A' + check, PAGE);
    if (pread(fd, buf, PAGE, (off_t)check * PAGE) != PAGE || memcmp(buf, want, PAGE) != 0) {
        fprintf(stderr, "%s: page %d read back wrong\n", who, check);
        _exit(3);
    }
    printf("%s ok\n", who);
    fflush(stdout);
}

static void destructor(void *value) {
    (void)value;
    stage("key destructor", 3, 2);
}

static void *thread(void *arg) {
    (void)arg;
    stage("thread", 2, 1);
    pthread_setspecific(key, (void *)1);
    return 0;
}

static void at_exit(void) {
    stage("atexit", 4, 3);
    /* The same bytes through a new descriptor too. */
    int again = open(getenv("EXIT_IO_FILE"), O_RDONLY);
    char buf[PAGE], want[PAGE];
    memset(want, 'A' + 4, PAGE);
    if (again < 0 || pread(again, buf, PAGE, 4 * PAGE) != PAGE || memcmp(buf, want, PAGE) != 0) {
        fprintf(stderr, "atexit: page 4 read back wrong through a new descriptor\n");
        _exit(3);
    }
    close(again);
    printf("atexit reopen ok\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: exit_io <file>\n");
        return 2;
    }
    setenv("EXIT_IO_FILE", argv[1], 1);
    fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    stage("main", 1, 0);
    pthread_key_create(&key, destructor);
    pthread_t t;
    pthread_create(&t, 0, thread, 0);
    pthread_join(t, 0);
    atexit(at_exit);
    return 0;
}
