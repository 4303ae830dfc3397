/* A failing disk for one process, loaded with LD_PRELOAD.

   While the file named by $EIO_SWITCH exists, every write and every sync of a file whose path
   starts with $EIO_PREFIX fails with EIO, as a dying disk would answer; other files (sockets,
   logs) are untouched. Remove the switch file and the calls go through again. With
   $EIO_ONLY_SYNC set, writes go through and only fsync/fdatasync fail: data reached the page
   cache but could not be made durable.

   Build: gcc -shared -fPIC -O2 -o eioshim.so eioshim.c -ldl */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int failing(int fd) {
    const char *flag = getenv("EIO_SWITCH");
    const char *prefix = getenv("EIO_PREFIX");
    if (flag == NULL || prefix == NULL || access(flag, F_OK) != 0) {
        return 0;
    }
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) {
        return 0;
    }
    target[n] = '\0';
    return strncmp(target, prefix, strlen(prefix)) == 0;
}

/* Look the real call up once, then fail it or pass it on. */
#define NEXT(name) \
    static __typeof__(name) *real; \
    if (real == NULL) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

#define REFUSE(fd) \
    if (getenv("EIO_ONLY_SYNC") == NULL && failing(fd)) { errno = EIO; return -1; }

#define REFUSE_SYNC(fd) \
    if (failing(fd)) { errno = EIO; return -1; }

ssize_t write(int fd, const void *buf, size_t count) {
    NEXT(write);
    REFUSE(fd);
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    NEXT(pwrite);
    REFUSE(fd);
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    NEXT(pwrite64);
    REFUSE(fd);
    return real(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    NEXT(writev);
    REFUSE(fd);
    return real(fd, iov, iovcnt);
}

int fsync(int fd) {
    NEXT(fsync);
    REFUSE_SYNC(fd);
    return real(fd);
}

int fdatasync(int fd) {
    NEXT(fdatasync);
    REFUSE_SYNC(fd);
    return real(fd);
}

int ftruncate(int fd, off_t length) {
    NEXT(ftruncate);
    REFUSE(fd);
    return real(fd, length);
}
