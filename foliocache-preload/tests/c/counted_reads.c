/* Threads reading a served file at once, more of them than the library has read-counter
 * shards, each also reading once more in a pthread key destructor (after its thread-locals
 * are gone): every read must be counted once, whichever shard counts it.
 *
 * usage: counted_reads <file> <threads> <reads per thread>
 * (the file: 64 KiB, page p all 'A' + p) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 16

static int fd;
static long reads;
static pthread_key_t key;
static pthread_barrier_t start;

static void read_page(long page) {
    char buf[PAGE], want[PAGE];
    memset(want, 'A' + (int)page, PAGE);
    ssize_t n = pread(fd, buf, PAGE, page * PAGE);
    if (n != PAGE || memcmp(buf, want, PAGE) != 0) {
        fprintf(stderr, "a read of page %ld failed (%zd bytes): %m\n", page, n);
        _exit(3);
    }
}

static void destructor(void *value) {
    read_page((long)(size_t)value % PAGES);
}

static void *thread(void *arg) {
    long id = (long)(size_t)arg;
    pthread_setspecific(key, (void *)(size_t)(id + 1));
    pthread_barrier_wait(&start);
    for (long i = 0; i < reads; i++)
        read_page((id + i) % PAGES);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <file> <threads> <reads per thread>\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]);
    reads = atol(argv[3]);
    fd = open(argv[1], O_RDONLY);
    if (fd < 0 || threads < 1 || threads > 256 || reads < 0) {
        perror(argv[1]);
        return 2;
    }
    pthread_key_create(&key, destructor);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    pthread_t t[256];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, thread, (void *)(size_t)i) != 0)
            return 4;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("ok\n");
    return 0;
}
