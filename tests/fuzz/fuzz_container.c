/* libFuzzer target: any bytes as a source file. A packed container (its magic first) is
 * checked when added; one that is accepted is read whole, frame by frame: every read either
 * returns the original size's bytes or fails, never crashes or reads outside its buffers. */
#include <glib/gstdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "ckptfs/srcfiles.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[] = "/tmp/ckptfs-fuzz-container-XXXXXX";
    int fd = g_mkstemp(path);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    ckptfs_srcfiles_set_frame_cache(files, 1u << 20);
    GError *error = NULL;
    int src = ckptfs_srcfiles_add(files, path, &error);
    if (src < 0 && error == NULL)
        abort();
    if (src >= 0) {
        uint64_t total = ckptfs_srcfiles_get(files, (unsigned)src)->size;
        static uint8_t buf[1u << 16];
        for (uint64_t at = 0; at < total && at < (64u << 20);) {
            size_t n = (size_t)MIN((uint64_t)sizeof buf, total - at);
            if (!ckptfs_srcfiles_pread(files, (unsigned)src, buf, n, at, &error))
                break;
            at += n;
        }
    }
    g_clear_error(&error);
    ckptfs_srcfiles_free(files);
    g_unlink(path);
    return 0;
}
