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

/* A cursor over JSON that ckptfs_json_check_strict accepted, for readers of one fixed schema
 * (safetensors headers: ~100k small objects, where json-glib's tree costs most of a mount): values
 * in document order, no tree. Every call stays inside the bytes whatever they hold. */
typedef struct {
    const unsigned char *p, *end;
} CkptfsJsonCursor;

typedef enum {
    CKPTFS_JSON_END, /* nothing left (or not JSON) */
    CKPTFS_JSON_OBJECT,
    CKPTFS_JSON_ARRAY,
    CKPTFS_JSON_STRING,
    CKPTFS_JSON_NUMBER,
    CKPTFS_JSON_LITERAL, /* true, false, null */
} CkptfsJsonKind;

void ckptfs_json_cursor_init(CkptfsJsonCursor *c, const char *data, size_t len);
/* The kind of the value at the cursor. */
CkptfsJsonKind ckptfs_json_cursor_kind(CkptfsJsonCursor *c);
/* Steps into the object or array at the cursor. */
void ckptfs_json_cursor_enter(CkptfsJsonCursor *c);
/* The next member of the object (its key into KEY, decoded) or element of the array (KEY NULL)
 * the cursor is in, the cursor then at its value; false at the end, the cursor after it. */
bool ckptfs_json_cursor_next(CkptfsJsonCursor *c, GString *key);
/* The string at the cursor, decoded into OUT; the cursor after it. */
void ckptfs_json_cursor_string(CkptfsJsonCursor *c, GString *out);
/* The number at the cursor; *IS_INT says whether it is an integer (then *I holds it; strict JSON
 * integers fit in 64 bits), else *D. The cursor after it. */
void ckptfs_json_cursor_number(CkptfsJsonCursor *c, bool *is_int, int64_t *i, double *d);
/* Skips the value at the cursor. */
void ckptfs_json_cursor_skip(CkptfsJsonCursor *c);

/* The JSON object in the file PATH: read with ckptfs_read_small_file (a regular file of at most
 * CKPTFS_MAX_JSON_BYTES, never blocking on a FIFO) and parsed as ckptfs_json_parse_object does.
 * Errors name PATH; a missing file is CKPTFS_ERROR_NOT_FOUND. */
JsonObject *ckptfs_json_load_object(const char *path, GError **error);

/* Typed members of a parsed object, the one set of accessors (json-glib's getters log a
 * critical and give 0 or NULL for a member of another type). PATH is a member name, or
 * "a.b" for member b of the object that is member a. */
typedef enum {
    CKPTFS_JSON_ABSENT, /* not there, null, or under a parent that is not an object */
    CKPTFS_JSON_FOUND,
    CKPTFS_JSON_WRONG_TYPE,
} CkptfsJsonMember;

/* The member at PATH, NULL when absent (a null member is returned: it is there). */
JsonNode *ckptfs_json_member(JsonObject *object, const char *path);
/* An integer (a JSON number without fraction or exponent). */
CkptfsJsonMember ckptfs_json_member_int(JsonObject *object, const char *path, gint64 *out);
/* Any number. */
CkptfsJsonMember ckptfs_json_member_number(JsonObject *object, const char *path, double *out);
CkptfsJsonMember ckptfs_json_member_bool(JsonObject *object, const char *path, bool *out);
/* A string (owned by OBJECT), or NULL when absent or not a string. */
const char *ckptfs_json_member_string(JsonObject *object, const char *path);
/* The object at PATH, or NULL when absent or not an object. */
JsonObject *ckptfs_json_member_object(JsonObject *object, const char *path);
/* Whether NODE (an element of an array) is an integer, then in *OUT. */
bool ckptfs_json_node_int(JsonNode *node, gint64 *out);

#endif
