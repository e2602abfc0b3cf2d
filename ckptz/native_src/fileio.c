/* Reading files from native threads, shared by the module's calls and the restore plane. */

#include <errno.h>
#include <stdint.h>
#include <unistd.h>

/* Read ``want`` bytes at ``at`` into ``dst`` (retrying short and interrupted reads); the
 * bytes read, fewer where the file ends first or a read fails (``*error``: its errno). Called
 * without the GIL. */
static int64_t pread_fully(int fd, char *dst, int64_t want, int64_t at, int *error) {
    int64_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, dst + got, (size_t)(want - got), (off_t)(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) *error = errno;
        if (n <= 0) break;
        got += n;
    }
    return got;
}
