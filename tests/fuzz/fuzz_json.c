/* libFuzzer target: the input is a whole JSON file as a source holds it (config.json,
 * model.safetensors.index.json, metadata.json; safetensors headers take the same path). It goes
 * through the one path every JSON file takes: the strict check, then json-glib. What the check
 * accepts json-glib must parse to an object no deeper than the bound; what it refuses gives one
 * line naming the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Nesting levels of NODE's arrays and objects (a scalar is 0). */
static unsigned depth_of(JsonNode *node)
{
    unsigned deepest = 0;
    if (JSON_NODE_HOLDS_OBJECT(node)) {
        g_autoptr(GList) members = json_object_get_values(json_node_get_object(node));
        for (GList *m = members; m; m = m->next) {
            unsigned d = depth_of(m->data); /* not inside MAX, which evaluates twice */
            deepest = MAX(deepest, d);
        }
        return deepest + 1;
    }
    if (JSON_NODE_HOLDS_ARRAY(node)) {
        JsonArray *array = json_node_get_array(node);
        for (guint i = 0; i < json_array_get_length(array); i++) {
            unsigned d = depth_of(json_array_get_element(array, i));
            deepest = MAX(deepest, d);
        }
        return deepest + 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    GError *check_error = NULL;
    bool strict = ckptfs_json_check_strict("fuzz.json", text, size, &check_error);
    GError *error = NULL;
    JsonObject *object = ckptfs_json_parse_object("fuzz.json", text, size, &error);
    /* The check alone decides: json-glib never refuses what it accepts. */
    if (strict != (object != NULL))
        abort();
    if (object == NULL) {
        if (error == NULL || check_error == NULL || strcmp(error->message, check_error->message) != 0 ||
            !g_str_has_prefix(error->message, "fuzz.json: ") || strchr(error->message, '\n') != NULL)
            abort();
        g_error_free(error);
        g_error_free(check_error);
        return 0;
    }
    g_autoptr(JsonNode) root = json_node_init_object(json_node_alloc(), object);
    if (depth_of(root) > CKPTFS_MAX_JSON_DEPTH)
        abort();
    json_object_unref(object);
    return 0;
}
