/* Threads, one after the other, each reading a served file only in a pthread key destructor
 * (after its thread-locals are destroyed), more threads than a shared cache has slots: each
 * such thread's slot must be given back when it ends.
 *
 * usage: late_threads <file> <threads>  (the file: 64 KiB, page 0 all 'A') */
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

static void destructor(void *value) {
    (void)value;
    char buf[PAGE], want[PAGE];
    memset(want, 'A', PAGE);
    ssize_t n = pread(fd, buf, PAGE, 0);
    if (n != PAGE || memcmp(buf, want, PAGE) != 0) {
        fprintf(stderr, "a key destructor's read failed (%zd bytes): %m\n", n);
        _exit(3);
    }
}

static void *thread(void *arg) {
    (void)arg;
    pthread_setspecific(key, (void *)1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: late_threads <file> <threads>\n");
        return 2;
    }
    fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    pthread_key_create(&key, destructor);
    int threads = atoi(argv[2]);
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, 0, thread, 0) != 0 || pthread_join(t, 0) != 0) {
            perror("thread");
            return 1;
        }
    }
    printf("ok\n");
    return 0;
}
