/* A C library between Python and the capture, for tests/python.rs: c_entry calls the
 * capture on the caller's thread, below a frame of its own; c_thread_entry calls it on a
 * thread of its own, which has no Python thread state. */
#include <pthread.h>

typedef long (*fold_fn)(char *buf, unsigned long len);

struct job {
    fold_fn fold;
    char *buf;
    unsigned long len;
    long result;
};

__attribute__((noinline)) long c_entry(fold_fn fold, char *buf, unsigned long len) {
    long r = fold(buf, len);
    /* Keeps this frame on the stack: no tail call. */
    __asm__ volatile("" ::: "memory");
    return r;
}

__attribute__((noinline)) static void *c_thread_main(void *arg) {
    struct job *j = arg;
    j->result = j->fold(j->buf, j->len);
    __asm__ volatile("" ::: "memory");
    return 0;
}

long c_thread_entry(fold_fn fold, char *buf, unsigned long len) {
    struct job j = {fold, buf, len, -3};
    pthread_t t;
    if (pthread_create(&t, 0, c_thread_main, &j) != 0)
        return -4;
    pthread_join(t, 0);
    return j.result;
}
