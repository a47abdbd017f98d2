/* libFuzzer target: any bytes as a torch.save zip file. The directory is read and data.pkl
 * parsed; every entry found must lie inside the file. */
#include <glib/gstdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "ckptfs/pickle.h"
#include "ckptfs/zipreader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[] = "/tmp/ckptfs-fuzz-zip-XXXXXX";
    int fd = g_mkstemp(path);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    int src = ckptfs_srcfiles_add(files, path, NULL);
    GError *error = NULL;
    CkptfsZip *zip = src >= 0 ? ckptfs_zip_open(files, (unsigned)src, &error) : NULL;
    if (zip) {
        for (unsigned i = 0; i < ckptfs_zip_count(zip); i++) {
            const CkptfsZipEntry *e = ckptfs_zip_at(zip, i);
            if (e->data_offset + e->size > size)
                abort();
        }
        GBytes *pkl = ckptfs_zip_read(zip, files, "data.pkl", 1u << 20, NULL);
        if (pkl) {
            gsize n;
            const uint8_t *d = g_bytes_get_data(pkl, &n);
            ckptfs_pickle_free(ckptfs_pickle_parse("fuzz", d, n, NULL));
            g_bytes_unref(pkl);
        }
    } else if (src >= 0 && error == NULL) {
        abort();
    }
    g_clear_error(&error);
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
    g_unlink(path);
    return 0;
}
