/* Strict JSON (RFC 8259) for every JSON a source holds (safetensors headers, config.json,
 * model.safetensors.index.json, metadata.json, -o hf_config): checked, bounded, before
 * json-glib (lenient, and recursive without bound) parses it. */
#ifndef CKPTFS_JSON_STRICT_H
#define CKPTFS_JSON_STRICT_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stddef.h>

/* Whether DATA (LEN bytes) is one JSON object and nothing but whitespace around it: strict
 * syntax, no \u0000 in a string, no key given twice in any object (at any depth), integers that
 * fit in 64 bits, nesting at most CKPTFS_MAX_JSON_DEPTH. WHAT names the input in errors, which
 * are one line and give the byte offset. */
bool ckptfs_json_check_strict(const char *what, const char *data, size_t len, GError **error);

/* DATA checked as above, then parsed by json-glib: a new reference to its top-level object
 * (json_object_unref it), or NULL with ERROR set. */
JsonObject *ckptfs_json_parse_object(const char *what, const char *data, size_t len, GError **error);

/* The JSON object in the file PATH: read with ckptfs_read_small_file (a regular file of at most
 * CKPTFS_MAX_JSON_BYTES, never blocking on a FIFO) and parsed as ckptfs_json_parse_object does.
 * Errors name PATH; a missing file is CKPTFS_ERROR_NOT_FOUND. */
JsonObject *ckptfs_json_load_object(const char *path, GError **error);

#endif
