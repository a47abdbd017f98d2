/* Strict JSON syntax (RFC 8259) for untrusted headers, checked before json-glib (which is
 * lenient) parses them. */
#ifndef CKPTFS_JSON_STRICT_H
#define CKPTFS_JSON_STRICT_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>

/* Whether DATA is one JSON object and nothing but whitespace around it, with no \u0000 in a
 * string and no key of the top-level object given twice. WHAT names the input in errors, which
 * give the byte offset. Nesting is bounded (64). */
bool ckptfs_json_check_strict(const char *what, const char *data, size_t len, GError **error);

#endif
