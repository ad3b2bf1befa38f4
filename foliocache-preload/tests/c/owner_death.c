/* A process on the shared cache whose owner dies while it holds slots and files: the test
 * kills the owner after "ready", then says "go". Then, in the order `order` names, a thread
 * exits (its slot is given back as its thread-locals are destroyed, a request made from that
 * destructor) and the file is closed; whichever comes first finds the owner gone and starts
 * the next one. The file is opened again, and every byte read is checked.
 *
 * usage: owner_death <file> <thread-first|close-first> <marker>
 * (the file: 64 KiB, page 0 all 'A', made by the test; the marker: a file outside the served
 * directory, opened without close-on-exec and left open) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096

static const char *path;
static int fd;
static int go[2], read_done[2];

static void fill(int k, char byte) {
    char buf[PAGE];
    memset(buf, byte, PAGE);
    if (pwrite(fd, buf, PAGE, (off_t)k * PAGE) != PAGE) {
        fprintf(stderr, "pwrite page %d: %m\n", k);
        exit(3);
    }
}

static void check(int in, int k, char byte) {
    char buf[PAGE], want[PAGE];
    memset(want, byte, PAGE);
    ssize_t n = pread(in, buf, PAGE, (off_t)k * PAGE);
    if (n != PAGE || memcmp(buf, want, PAGE) != 0) {
        fprintf(stderr, "page %d read back wrong (%zd bytes)\n", k, n);
        exit(3);
    }
}

static void *thread(void *arg) {
    (void)arg;
    check(fd, 1, 'B');
    char c = 'r';
    if (write(read_done[1], &c, 1) != 1) return (void *)1;
    if (read(go[0], &c, 1) != 1) return (void *)1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: owner_death <file> <thread-first|close-first> <marker>\n");
        return 2;
    }
    path = argv[1];
    int close_first = strcmp(argv[2], "close-first") == 0;
    /* A descriptor without close-on-exec of a file the library does not serve, which an
     * owner this program starts must not keep. */
    if (open(argv[3], O_RDWR | O_CREAT, 0644) < 0) {
        perror("open marker");
        return 1;
    }
    fd = open(path, O_RDWR);
    if (fd < 0 || pipe(go) != 0 || pipe(read_done) != 0) {
        perror("open");
        return 1;
    }
    fill(1, 'B');
    check(fd, 0, 'A');
    pthread_t t;
    pthread_create(&t, 0, thread, 0);
    char c;
    if (read(read_done[0], &c, 1) != 1) return 1; /* the thread has read: it holds a slot */
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    /* The owner is dead now. */
    if (close_first && close(fd) != 0) {
        perror("close");
        return 1;
    }
    if (write(go[1], "g", 1) != 1) return 1;
    void *status;
    pthread_join(t, &status);
    if (status) return 1;
    if (!close_first && close(fd) != 0) {
        perror("close");
        return 1;
    }
    printf("thread exited, file closed\n");
    fflush(stdout);
    fd = open(path, O_RDWR);
    if (fd < 0) {
        perror("open again");
        return 1;
    }
    check(fd, 0, 'A');
    check(fd, 1, 'B');
    fill(2, 'C');
    check(fd, 2, 'C');
    close(fd);
    printf("ok\n");
    return 0;
}
