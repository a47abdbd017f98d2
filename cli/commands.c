#include "commands.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/layout.h"
#include "ckptfs/mount.h"
#include "ckptfs/pack.h"
#include "ckptfs/readahead_policy.h"
#include "ckptfs/schema.h"
#include "ckptfs/verl_run.h"

#define COPY_CHUNK (4u << 20)

typedef struct {
    const char *pos[3];
    int npos;
    bool json;
    const char *layout; /* inspect --layout NAME */
    CkptfsOptions options;
} CmdArgs;

static bool parse_cmd_args_inner(const char *cmd, int argc, char **argv, int min_pos, int max_pos,
                           bool allow_json, CmdArgs *a)
{
    memset(a, 0, sizeof *a);
    ckptfs_options_init(&a->options);
    bool options_done = false; /* after "--" every argument is a path */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (options_done) {
            if (a->npos >= max_pos) {
                fprintf(stderr, "ckptfs %s: unexpected argument '%s'\n", cmd, arg);
                return false;
            }
            a->pos[a->npos++] = arg;
        } else if (allow_json && strcmp(arg, "--json") == 0) {
            a->json = true;
        } else if (allow_json && strcmp(arg, "--layout") == 0 && i + 1 < argc) {
            a->layout = argv[++i];
        } else if (g_str_has_prefix(arg, "-o")) {
            const char *list = arg[2] ? arg + 2 : (i + 1 < argc ? argv[++i] : NULL);
            GError *error = NULL;
            if (list == NULL) {
                fprintf(stderr, "ckptfs %s: -o needs an option list\n", cmd);
                return false;
            }
            if (!ckptfs_options_apply_list(&a->options, list, &error)) {
                fprintf(stderr, "ckptfs %s: %s\n", cmd, error->message);
                g_error_free(error);
                return false;
            }
        } else if (arg[0] == '-' && arg[1] != '\0') {
            fprintf(stderr, "ckptfs %s: unknown argument '%s'\n", cmd, arg);
            return false;
        } else if (a->npos < max_pos) {
            a->pos[a->npos++] = arg;
        } else {
            fprintf(stderr, "ckptfs %s: unexpected argument '%s'\n", cmd, arg);
            return false;
        }
    }
    if (a->npos < min_pos) {
        fprintf(stderr, "ckptfs %s: missing arguments (see ckptfs --help)\n", cmd);
        return false;
    }
    return true;
}

/* Opens the source; the mount keeps its own copy of the options. */
/* Parses "POSITIONAL... [-o OPTS] [--json]"; prints the problem and returns false on misuse. */
static bool parse_cmd_args(const char *cmd, int argc, char **argv, int min_pos, int max_pos,
                           bool allow_json, CmdArgs *a)
{
    if (parse_cmd_args_inner(cmd, argc, argv, min_pos, max_pos, allow_json, a))
        return true;
    ckptfs_options_clear(&a->options);
    return false;
}

static CkptfsMount *open_or_complain(const char *cmd, CmdArgs *a)
{
    GError *error = NULL;
    CkptfsMount *mount = ckptfs_mount_open(a->pos[0], &a->options, &error);
    ckptfs_options_clear(&a->options);
    if (mount == NULL) {
        fprintf(stderr, "ckptfs %s: %s\n", cmd, error->message);
        g_error_free(error);
    }
    return mount;
}

static int report(const char *cmd, int rc, GError *error, const char *what)
{
    if (error != NULL) {
        fprintf(stderr, "ckptfs %s: %s\n", cmd, error->message);
        g_error_free(error);
    } else {
        fprintf(stderr, "ckptfs %s: %s: %s\n", cmd, what, g_strerror(-rc));
    }
    return 1;
}

/* --- inspect --- */

static const char *config_string(JsonObject *config, const char *key)
{
    return config ? ckptfs_json_member_string(config, key) : NULL;
}

static const char *config_architecture(JsonObject *config)
{
    return config ? ckptfs_schema_config_architecture(config) : NULL;
}

static bool config_int(JsonObject *config, const char *key, gint64 *out)
{
    return config && ckptfs_json_member_int(config, key, out) == CKPTFS_JSON_FOUND;
}

/* The language model's fields of CONFIG (a vision-language model's text_config with the top
 * level's), or CONFIG: what the model line lists. NULL when CONFIG is. */
static JsonObject *language_config(JsonObject *config)
{
    if (config == NULL)
        return NULL;
    const char *name = config_architecture(config) ? config_architecture(config) : config_string(config, "model_type");
    const CkptfsArchitecture *arch = name ? ckptfs_architecture_find(name, NULL) : NULL;
    JsonObject *text = ckptfs_schema_text_config(config, arch ? arch->text_part : NULL, NULL);
    return text ? text : json_object_ref(config);
}

/* A hybrid's layer kinds, one letter a layer: L linear attention, A attention. */
static char *layer_pattern(const CkptfsModel *m)
{
    GString *out = g_string_new(NULL);
    for (uint64_t l = 0; l < m->layers; l++)
        g_string_append_c(out, ckptfs_model_layer_is_linear(m, l) ? 'L' : 'A');
    return g_string_free(out, FALSE);
}

/* Whether inspect lists FIELD of M: with TOKEN_IDS, the tokenizer's ids hf/config.json has; else
 * every field that changes what the model computes, with the value the views use. */
static bool listed(const CkptfsModelField *field, const CkptfsModel *m, bool token_ids)
{
    if (token_ids)
        return field->type == CKPTFS_FIELD_TOKEN_ID;
    return (field->flags & CKPTFS_FIELD_MATH) && ckptfs_schema_applies(field, m);
}

static const char *const model_fields[] = {"num_hidden_layers", "hidden_size",
                                           "num_attention_heads", "num_key_value_heads",
                                           "intermediate_size", "vocab_size"};

/* A packed source (ckptfs pack): per byte-plane class (raw bytes, 2-, 4- and 8-byte elements),
 * original and stored bytes. */
static const char *const plane_class_names[4] = {"bytes", "2-byte", "4-byte", "8-byte"};

static double stats_ratio(const CkptfsContainerStats *st, int k /* -1: all */)
{
    uint64_t o = 0, c = 0;
    for (int i = 0; i < 4; i++)
        if (k < 0 || k == i)
            o += st->original[i], c += st->stored[i];
    return o ? (double)c / (double)o : 1.0;
}

typedef struct {
    const char *name;
    gint64 value;
} NamedInt;

typedef struct {
    const char *name;
    char *value;
} NamedText;

typedef struct {
    const char *path;
    double ratio; /* stored bytes / original bytes */
} PackedFile;

static void named_text_clear(gpointer p)
{
    g_free(((NamedText *)p)->value);
}

/* What inspect says of a source, gathered once for the text and the JSON printer. */
typedef struct {
    const CkptfsMount *mount;
    const CkptfsSource *source;
    const CkptfsModel *model; /* NULL: no Megatron views (mount->model_problem says why) */
    char *about;              /* the format's own description */
    unsigned tensors;
    uint64_t bytes;
    uint64_t dtypes[CKPTFS_DTYPE_COUNT]; /* tensors per element type as served */
    uint64_t stored[CKPTFS_DTYPE_COUNT]; /* and as stored (views may serve another: -o dtype) */
    const char *architecture, *model_type; /* config.json's, NULL when not given */
    GArray *config_fields;                 /* NamedInt: the model_fields config.json has */
    GArray *math, *token_ids;              /* NamedText: the schema's fields (with a model) */
    GPtrArray *views;                      /* the root's directories, "hf/" ... */
    CkptfsReadaheadPolicy ahead;
    char *ahead_text;
    unsigned packed;                      /* files that are containers */
    CkptfsContainerStats packed_total;    /* over them; .codec: the last one's */
    const char *codec;                    /* its name */
    char codec_buf[32];
    GArray *packed_files;                 /* PackedFile */
} InspectFacts;

static bool collect_name(gpointer ctx, const char *name, const CkptfsAttr *attr, uint64_t next)
{
    (void)next;
    if (attr->type == CKPTFS_NODE_DIR)
        g_ptr_array_add(ctx, g_strdup_printf("%s/", name));
    return true;
}

static GArray *schema_facts(const CkptfsModel *m, bool token_ids)
{
    size_t n = 0;
    const CkptfsModelField *fields = ckptfs_schema_fields(&n);
    GArray *out = g_array_new(FALSE, FALSE, sizeof(NamedText));
    g_array_set_clear_func(out, named_text_clear);
    for (size_t i = 0; i < n; i++)
        if (listed(&fields[i], m, token_ids)) {
            NamedText f = {fields[i].field, ckptfs_schema_value_text(&fields[i], m)};
            g_array_append_val(out, f);
        }
    return out;
}

static void gather_packed(InspectFacts *f)
{
    const CkptfsSource *s = f->source;
    f->packed_files = g_array_new(FALSE, FALSE, sizeof(PackedFile));
    for (unsigned i = 0; i < ckptfs_srcfiles_count(s->files); i++) {
        CkptfsContainerStats st;
        if (!ckptfs_srcfiles_container_stats(s->files, i, &st))
            continue;
        f->packed++;
        f->packed_total.codec = st.codec;
        f->packed_total.frames += st.frames;
        for (int k = 0; k < 4; k++)
            f->packed_total.original[k] += st.original[k], f->packed_total.stored[k] += st.stored[k];
        PackedFile file = {ckptfs_srcfiles_get(s->files, i)->path, stats_ratio(&st, -1)};
        g_array_append_val(f->packed_files, file);
    }
    f->codec = ckptfs_codec_name(f->packed_total.codec, f->codec_buf, sizeof f->codec_buf);
}

static void gather_facts(InspectFacts *f, const CkptfsMount *mount)
{
    memset(f, 0, sizeof *f);
    const CkptfsSource *s = mount->source;
    f->mount = mount;
    f->source = s;
    f->model = mount->model;
    f->about = s->format->describe(s);
    f->tensors = ckptfs_catalog_count(s->catalog);
    f->bytes = ckptfs_catalog_total_bytes(s->catalog);
    for (unsigned i = 0; i < f->tensors; i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(s->catalog, i);
        f->dtypes[t->dtype]++;
        f->stored[t->stored]++;
    }
    f->architecture = config_architecture(s->config);
    f->model_type = config_string(s->config, "model_type");
    f->config_fields = g_array_new(FALSE, FALSE, sizeof(NamedInt));
    g_autoptr(JsonObject) language = language_config(s->config);
    for (size_t i = 0; i < G_N_ELEMENTS(model_fields); i++) {
        NamedInt field = {model_fields[i], 0};
        if (config_int(language, model_fields[i], &field.value))
            g_array_append_val(f->config_fields, field);
    }
    if (f->model) {
        f->math = schema_facts(f->model, false);
        f->token_ids = schema_facts(f->model, true);
    }
    f->views = g_ptr_array_new_with_free_func(g_free);
    ckptfs_tree_readdir(mount->tree, CKPTFS_ROOT_INO, 0, collect_name, f->views, NULL);
    ckptfs_readahead_policy(&mount->options, ckptfs_readahead_machine_cores(), &f->ahead);
    f->ahead_text = ckptfs_readahead_policy_describe(&f->ahead);
    gather_packed(f);
}

static void facts_clear(InspectFacts *f)
{
    g_free(f->about);
    g_array_unref(f->config_fields);
    if (f->math)
        g_array_unref(f->math);
    if (f->token_ids)
        g_array_unref(f->token_ids);
    g_ptr_array_unref(f->views);
    g_free(f->ahead_text);
    g_array_unref(f->packed_files);
}

/* The dense layers of an MoE model as "0, 3-5" (empty when none). */
static char *dense_layer_list(const CkptfsModel *m)
{
    GString *out = g_string_new(NULL);
    for (uint64_t l = 0; l < m->layers; l++) {
        if (ckptfs_model_layer_is_moe(m, l))
            continue;
        uint64_t end = l;
        while (end + 1 < m->layers && !ckptfs_model_layer_is_moe(m, end + 1))
            end++;
        g_string_append_printf(out, "%s%" G_GUINT64_FORMAT, out->len ? ", " : "", l);
        if (end > l)
            g_string_append_printf(out, "-%" G_GUINT64_FORMAT, end);
        l = end;
    }
    return g_string_free(out, FALSE);
}

/* One line on a model's experts for inspect. */
static char *experts_text(const CkptfsModel *m)
{
    g_autofree char *dense = dense_layer_list(m);
    return g_strdup_printf("%" G_GUINT64_FORMAT " routed (top-%" G_GUINT64_FORMAT ", ffn %" G_GUINT64_FORMAT
                           ", %s) in %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT " layers%s%s%s; %s",
                           m->experts, m->topk, m->moe_ffn,
                           m->renormalize ? "weights renormalised" : "weights not renormalised",
                           ckptfs_model_moe_layers(m), m->layers, *dense ? " (dense: " : "", dense,
                           *dense ? ")" : "",
                           m->shared_ffn ? (m->shared_gate ? "a gated shared expert" : "a shared expert")
                                         : "no shared expert");
}

/* inspect --layout NAME: is it valid, and what would its files hold. */
static int inspect_layout(CkptfsMount *mount, const char *name, bool json)
{
    CkptfsLayout layout;
    GError *error = NULL;
    bool ok = ckptfs_mount_layout(mount, name, &layout, &error);
    g_autofree char *canonical = ok ? ckptfs_layout_name(&layout) : NULL;
    if (json) {
        g_autoptr(JsonBuilder) b = json_builder_new();
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "layout");
        json_builder_add_string_value(b, name);
        json_builder_set_member_name(b, "valid");
        json_builder_add_boolean_value(b, ok);
        json_builder_set_member_name(b, ok ? "canonical" : "reason");
        json_builder_add_string_value(b, ok ? canonical : error->message);
        json_builder_end_object(b);
        g_autoptr(JsonNode) root = json_builder_get_root(b);
        g_autofree char *text = json_to_string(root, TRUE);
        printf("%s\n", text);
    } else if (ok) {
        printf("%s: valid (%s): tp %u, pp %u, vpp %u", name, canonical, layout.tp, layout.pp,
               layout.vpp);
        if (layout.pp_first || layout.pp_last) {
            /* The stage sizes that follow from the option given (an unset one shares the rest). */
            uint64_t stage_layers[2] = {0, 0}, first, count;
            for (unsigned s = 0; s < 2; s++)
                for (unsigned v = 0; v < layout.vpp; v++) {
                    ckptfs_layout_chunk_layers(&layout, mount->model, s ? layout.pp - 1 : 0, v, &first, &count);
                    stage_layers[s] += count;
                }
            printf(", first stage %" G_GUINT64_FORMAT " layers, last stage %" G_GUINT64_FORMAT " layers",
                   stage_layers[0], stage_layers[1]);
        }
        if (mount->model && mount->model->experts) {
            g_autoptr(GArray) files = ckptfs_layout_rank_files(&layout);
            printf(", ep %u (%" G_GUINT64_FORMAT " experts per rank), etp %u; %u rank files per stage",
                   ckptfs_layout_ep(&layout), mount->model->experts / ckptfs_layout_ep(&layout),
                   ckptfs_layout_etp(&layout), files->len);
        }
        printf("\n");
        if (mount->model && layout.tp > mount->model->kv_heads)
            printf("note: tp %u is larger than the %" G_GUINT64_FORMAT
                   " query groups: Megatron-core older than 0.16 rejects this layout\n",
                   layout.tp, mount->model->kv_heads);
    } else {
        fprintf(stderr, "ckptfs inspect: %s\n", error->message);
    }
    g_clear_error(&error);
    return ok ? 0 : 1;
}

static void add_string_or_null(JsonBuilder *b, const char *value)
{
    if (value)
        json_builder_add_string_value(b, value);
    else
        json_builder_add_null_value(b);
}

/* A verl run or step: each step's roles, each opened as the mount of its own it becomes. */
static int inspect_run(const CkptfsMount *run, bool json)
{
    g_autoptr(GArray) steps = NULL;
    if (run->run_is_step) {
        steps = g_array_new(FALSE, FALSE, sizeof(uint64_t));
        g_autofree char *base = g_path_get_basename(run->run_dir);
        uint64_t step = 0;
        ckptfs_verl_step_name(base, &step);
        g_array_append_val(steps, step);
    } else {
        steps = ckptfs_verl_steps(run->run_dir);
    }
    uint64_t latest = 0;
    bool has_latest = !run->run_is_step && ckptfs_verl_latest(run->run_dir, &latest, NULL);
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "source");
    json_builder_add_string_value(b, run->run_dir);
    json_builder_set_member_name(b, "format");
    json_builder_add_string_value(b, run->run_is_step ? "verl-step" : "verl-run");
    json_builder_set_member_name(b, "latest");
    if (has_latest)
        json_builder_add_int_value(b, (gint64)latest);
    else
        json_builder_add_null_value(b);
    json_builder_set_member_name(b, "steps");
    json_builder_begin_array(b);
    if (!json) {
        printf("source:       %s\n", run->run_dir);
        printf("format:       verl %s (%u step%s", run->run_is_step ? "step" : "run", steps->len,
               steps->len == 1 ? "" : "s");
        if (has_latest)
            printf("; latest: global_step_%" G_GUINT64_FORMAT, latest);
        printf(")\n");
        g_autofree char *problem = has_latest ? ckptfs_verl_tracker_problem(run->run_dir, latest) : NULL;
        if (problem)
            printf("warning:      %s\n", problem);
    }
    int status = 0;
    for (guint i = 0; i < steps->len; i++) {
        uint64_t step = g_array_index(steps, uint64_t, i);
        g_autofree char *step_dir = run->run_is_step
                                        ? g_strdup(run->run_dir)
                                        : g_strdup_printf("%s/global_step_%" G_GUINT64_FORMAT, run->run_dir, step);
        g_autoptr(GPtrArray) roles = ckptfs_verl_roles(step_dir);
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "step");
        json_builder_add_int_value(b, (gint64)step);
        json_builder_set_member_name(b, "roles");
        json_builder_begin_array(b);
        for (guint r = 0; r < roles->len; r++) {
            const char *role = g_ptr_array_index(roles, r);
            g_autofree char *path = g_build_filename(step_dir, role, NULL);
            GError *error = NULL;
            CkptfsOptions options;
            ckptfs_options_copy(&options, &run->options);
            CkptfsMount *m = ckptfs_mount_open(path, &options, &error);
            ckptfs_options_clear(&options);
            g_autofree char *about = m ? m->source->format->describe(m->source) : NULL;
            json_builder_begin_object(b);
            json_builder_set_member_name(b, "role");
            json_builder_add_string_value(b, role);
            json_builder_set_member_name(b, "format");
            add_string_or_null(b, m ? m->source->format->name : NULL);
            json_builder_set_member_name(b, "found");
            add_string_or_null(b, m ? (m->source->found ? m->source->found : about) : NULL);
            json_builder_set_member_name(b, "tensors");
            json_builder_add_int_value(b, m ? ckptfs_catalog_count(m->source->catalog) : 0);
            json_builder_set_member_name(b, "megatron");
            add_string_or_null(b, m && m->model ? m->model->arch->model_type : NULL);
            json_builder_set_member_name(b, "error");
            add_string_or_null(b, error ? error->message : NULL);
            json_builder_set_member_name(b, "warnings");
            json_builder_begin_array(b);
            for (guint w = 0; m && w < m->source->warnings->len; w++)
                json_builder_add_string_value(b, g_ptr_array_index(m->source->warnings, w));
            json_builder_end_array(b);
            json_builder_end_object(b);
            if (!json && m)
                printf("global_step_%" G_GUINT64_FORMAT "/%s: %s (%s); %u tensors; %s\n", step, role,
                       m->source->format->name, m->source->found ? m->source->found : about,
                       ckptfs_catalog_count(m->source->catalog),
                       m->model ? "hf/, mcore/ and Megatron layouts" : "hf/ only (no Megatron rules)");
            else if (!json)
                printf("global_step_%" G_GUINT64_FORMAT "/%s: cannot be read: %s\n", step, role, error->message);
            for (guint w = 0; !json && m && w < m->source->warnings->len; w++)
                printf("global_step_%" G_GUINT64_FORMAT "/%s: warning: %s\n", step, role,
                       (const char *)g_ptr_array_index(m->source->warnings, w));
            status |= m == NULL;
            g_clear_error(&error);
            ckptfs_mount_free(m);
        }
        json_builder_end_array(b);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    if (json) {
        g_autoptr(JsonNode) root = json_builder_get_root(b);
        g_autofree char *text = json_to_string(root, TRUE);
        printf("%s\n", text);
    }
    return status;
}

static void add_named_texts(JsonBuilder *b, const char *member, const GArray *texts)
{
    json_builder_set_member_name(b, member);
    json_builder_begin_object(b);
    for (guint i = 0; i < texts->len; i++) {
        const NamedText *t = &g_array_index(texts, NamedText, i);
        json_builder_set_member_name(b, t->name);
        json_builder_add_string_value(b, t->value);
    }
    json_builder_end_object(b);
}

static void add_dtype_counts(JsonBuilder *b, const char *member, const uint64_t *counts)
{
    json_builder_set_member_name(b, member);
    json_builder_begin_object(b);
    for (int d = 1; d < CKPTFS_DTYPE_COUNT; d++) {
        if (counts[d] == 0)
            continue;
        json_builder_set_member_name(b, ckptfs_dtype_safetensors_name((CkptfsDtype)d));
        json_builder_add_int_value(b, (gint64)counts[d]);
    }
    json_builder_end_object(b);
}

static void add_string_list(JsonBuilder *b, const char *member, const GPtrArray *strings)
{
    json_builder_set_member_name(b, member);
    json_builder_begin_array(b);
    for (guint i = 0; i < strings->len; i++)
        json_builder_add_string_value(b, g_ptr_array_index(strings, i));
    json_builder_end_array(b);
}

static void packed_json(JsonBuilder *b, const InspectFacts *f)
{
    json_builder_set_member_name(b, "packed");
    if (f->packed == 0) {
        json_builder_add_null_value(b);
        return;
    }
    const CkptfsContainerStats *total = &f->packed_total;
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "codec");
    json_builder_add_string_value(b, f->codec);
    json_builder_set_member_name(b, "ratio");
    json_builder_add_double_value(b, stats_ratio(total, -1));
    json_builder_set_member_name(b, "classes");
    json_builder_begin_object(b);
    for (int k = 0; k < 4; k++) {
        if (!total->original[k])
            continue;
        json_builder_set_member_name(b, plane_class_names[k]);
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "original");
        json_builder_add_int_value(b, (gint64)total->original[k]);
        json_builder_set_member_name(b, "stored");
        json_builder_add_int_value(b, (gint64)total->stored[k]);
        json_builder_end_object(b);
    }
    json_builder_end_object(b);
    json_builder_set_member_name(b, "files");
    json_builder_begin_object(b);
    for (guint i = 0; i < f->packed_files->len; i++) {
        const PackedFile *file = &g_array_index(f->packed_files, PackedFile, i);
        json_builder_set_member_name(b, file->path);
        json_builder_add_double_value(b, file->ratio);
    }
    json_builder_end_object(b);
    json_builder_end_object(b);
}

/* What -o readahead does on this machine, as a mount of these options would. */
static void readahead_json(JsonBuilder *b, const InspectFacts *f)
{
    const CkptfsReadaheadPolicy *p = &f->ahead;
    static const char *const modes[] = {[CKPTFS_AHEAD_OFF] = "off", [CKPTFS_AHEAD_CACHED] = "cached",
                                        [CKPTFS_AHEAD_LONE] = "lone"};
    json_builder_set_member_name(b, "readahead");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "auto");
    json_builder_add_boolean_value(b, p->automatic);
    json_builder_set_member_name(b, "mode");
    json_builder_add_string_value(b, modes[p->mode]);
    json_builder_set_member_name(b, "cores");
    json_builder_add_int_value(b, p->cores);
    json_builder_set_member_name(b, "cores_needed");
    json_builder_add_int_value(b, CKPTFS_READAHEAD_AUTO_MIN_CORES);
    json_builder_set_member_name(b, "streams");
    json_builder_add_int_value(b, p->streams);
    json_builder_set_member_name(b, "cap");
    json_builder_add_int_value(b, (gint64)p->cap);
    json_builder_set_member_name(b, "text");
    json_builder_add_string_value(b, f->ahead_text);
    json_builder_end_object(b);
}

static void add_uint_fields(JsonBuilder *b, const NamedInt *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_builder_set_member_name(b, fields[i].name);
        json_builder_add_int_value(b, fields[i].value);
    }
}

static void model_json(JsonBuilder *b, const CkptfsModel *m)
{
    if (m->mla) {
        json_builder_set_member_name(b, "mla");
        json_builder_begin_object(b);
        const NamedInt fields[] = {{"q_lora_rank", (gint64)m->q_lora}, {"kv_lora_rank", (gint64)m->kv_lora},
                                   {"qk_head_dim", (gint64)m->qk_head_dim},
                                   {"qk_pos_emb_head_dim", (gint64)m->qk_rope_dim},
                                   {"v_head_dim", (gint64)m->v_head_dim}};
        add_uint_fields(b, fields, G_N_ELEMENTS(fields));
        json_builder_end_object(b);
    }
    json_builder_set_member_name(b, "mtp_layers");
    json_builder_add_int_value(b, (gint64)m->mtp_layers);
    json_builder_set_member_name(b, "mtp_served");
    json_builder_add_boolean_value(b, m->mtp);
    if (m->arch->hybrid_attention) {
        g_autofree char *pattern = layer_pattern(m);
        json_builder_set_member_name(b, "layer_pattern");
        json_builder_add_string_value(b, pattern);
    }
    if (!m->experts)
        return;
    json_builder_set_member_name(b, "experts");
    json_builder_begin_object(b);
    const NamedInt fields[] = {{"routed", (gint64)m->experts}, {"top_k", (gint64)m->topk},
                               {"ffn", (gint64)m->moe_ffn}, {"shared_ffn", (gint64)m->shared_ffn},
                               {"moe_layers", (gint64)ckptfs_model_moe_layers(m)}};
    add_uint_fields(b, fields, G_N_ELEMENTS(fields));
    json_builder_set_member_name(b, "score");
    json_builder_add_string_value(b, m->sigmoid_scores ? "sigmoid" : "softmax");
    json_builder_set_member_name(b, "expert_bias");
    json_builder_add_boolean_value(b, m->expert_bias);
    json_builder_set_member_name(b, "groups");
    json_builder_add_int_value(b, (gint64)m->groups);
    json_builder_set_member_name(b, "group_topk");
    json_builder_add_int_value(b, (gint64)m->group_topk);
    json_builder_set_member_name(b, "scaling");
    json_builder_add_double_value(b, m->topk_scaling > 0 ? m->topk_scaling : 1.0);
    json_builder_set_member_name(b, "shared_gate");
    json_builder_add_boolean_value(b, m->shared_gate);
    json_builder_set_member_name(b, "renormalize");
    json_builder_add_boolean_value(b, m->renormalize);
    json_builder_set_member_name(b, "dense_layers");
    json_builder_begin_array(b);
    for (uint64_t l = 0; l < m->layers; l++)
        if (!ckptfs_model_layer_is_moe(m, l))
            json_builder_add_int_value(b, (gint64)l);
    json_builder_end_array(b);
    json_builder_end_object(b);
}

static void inspect_json(const InspectFacts *f)
{
    const CkptfsSource *s = f->source;
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "source");
    json_builder_add_string_value(b, s->dir);
    json_builder_set_member_name(b, "format");
    json_builder_add_string_value(b, s->format->name);
    add_string_list(b, "weight_files", s->weight_files);
    json_builder_set_member_name(b, "tensors");
    json_builder_add_int_value(b, f->tensors);
    json_builder_set_member_name(b, "bytes");
    json_builder_add_int_value(b, (gint64)f->bytes);
    add_dtype_counts(b, "dtypes", f->dtypes);
    /* The element types on disk, when views serve others (-o dtype, verl's fp32 shards). */
    add_dtype_counts(b, "stored_dtypes", f->stored);
    json_builder_set_member_name(b, "converted");
    json_builder_add_int_value(b, s->converted);
    packed_json(b, f);
    json_builder_set_member_name(b, "architecture");
    add_string_or_null(b, f->architecture);
    json_builder_set_member_name(b, "model_type");
    add_string_or_null(b, f->model_type);
    add_uint_fields(b, (const NamedInt *)(void *)f->config_fields->data, f->config_fields->len);
    json_builder_set_member_name(b, "config_problem");
    add_string_or_null(b, s->config_problem);
    json_builder_set_member_name(b, "megatron");
    add_string_or_null(b, f->model ? f->model->arch->model_type : NULL);
    if (f->model) {
        add_named_texts(b, "math", f->math);
        add_named_texts(b, "token_ids", f->token_ids);
        model_json(b, f->model);
    }
    json_builder_set_member_name(b, "megatron_problem");
    add_string_or_null(b, f->mount->model_problem);
    add_string_list(b, "views", f->views);
    readahead_json(b, f);
    if (s->found) {
        json_builder_set_member_name(b, "found");
        json_builder_add_string_value(b, s->found);
    }
    add_string_list(b, "warnings", s->warnings);
    json_builder_end_object(b);
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    g_autoptr(JsonGenerator) gen = json_generator_new();
    json_generator_set_pretty(gen, TRUE);
    json_generator_set_root(gen, root);
    g_autofree char *text = json_generator_to_data(gen, NULL);
    printf("%s\n", text);
}

static void print_dtype_counts(const uint64_t *counts)
{
    for (int d = 1; d < CKPTFS_DTYPE_COUNT; d++)
        if (counts[d])
            printf(" %s x %" G_GUINT64_FORMAT, ckptfs_dtype_safetensors_name((CkptfsDtype)d), counts[d]);
}

static char *named_texts_line(const GArray *texts)
{
    GString *line = g_string_new(NULL);
    for (guint i = 0; i < texts->len; i++) {
        const NamedText *t = &g_array_index(texts, NamedText, i);
        g_string_append_printf(line, "%s%s=%s", line->len ? " " : "", t->name, t->value);
    }
    return g_string_free(line, FALSE);
}

static void print_packed(const InspectFacts *f)
{
    if (f->packed == 0)
        return;
    const CkptfsContainerStats *total = &f->packed_total;
    printf("packed:       %u files, %s, %" G_GUINT64_FORMAT " frames: %.3f of the original size;", f->packed, f->codec,
           total->frames, stats_ratio(total, -1));
    for (int k = 0; k < 4; k++)
        if (total->original[k])
            printf(" %s %.3f", plane_class_names[k], stats_ratio(total, k));
    printf(" (-o frame_cache=SIZE)\n");
    for (guint i = 0; i < f->packed_files->len; i++) {
        const PackedFile *file = &g_array_index(f->packed_files, PackedFile, i);
        printf("              %s: %.3f\n", file->path, file->ratio);
    }
}

static void print_model(const InspectFacts *f)
{
    const CkptfsModel *m = f->model;
    printf("megatron:     %s rules: %" G_GUINT64_FORMAT " layers, hidden %" G_GUINT64_FORMAT
           ", %" G_GUINT64_FORMAT " heads / %" G_GUINT64_FORMAT " query groups, head dim %"
           G_GUINT64_FORMAT ", ffn %" G_GUINT64_FORMAT ", vocab %" G_GUINT64_FORMAT "%s%s%s\n",
           m->arch->model_type, m->layers, m->hidden, m->heads, m->kv_heads, m->head_dim,
           m->ffn, m->vocab, m->tied_embeddings ? ", tied embeddings" : "",
           m->qkv_bias ? ", qkv bias" : "", m->qk_norm ? ", q/k norm" : "");
    g_autofree char *math = named_texts_line(f->math);
    printf("math:         %s\n", math);
    g_autofree char *token_ids = named_texts_line(f->token_ids);
    printf("token ids:    %s (hf/config.json)\n", token_ids);
    if (m->mla) {
        g_autofree char *q = m->q_lora ? g_strdup_printf("%" G_GUINT64_FORMAT, m->q_lora) : g_strdup("none (q_proj)");
        printf("attention:    multi-head latent: q_lora_rank %s, kv_lora_rank %" G_GUINT64_FORMAT
               ", per head qk %" G_GUINT64_FORMAT " + rope %" G_GUINT64_FORMAT ", v %" G_GUINT64_FORMAT "%s\n",
               q, m->kv_lora, m->qk_head_dim, m->qk_rope_dim, m->v_head_dim,
               m->yarn_factor > 0 ? "; YaRN rope" : "");
    }
    if (m->experts) {
        g_autofree char *experts = experts_text(m);
        printf("experts:      %s\n", experts);
    }
    if (m->arch->hybrid_attention) {
        g_autofree char *pattern = layer_pattern(m);
        printf("layers:       %s (L: gated delta-net, %" G_GUINT64_FORMAT " key / %" G_GUINT64_FORMAT
               " value heads of %" G_GUINT64_FORMAT " / %" G_GUINT64_FORMAT ", conv %" G_GUINT64_FORMAT
               "; A: %sattention)\n", pattern, m->linear_key_heads, m->linear_value_heads, m->linear_key_dim,
               m->linear_value_dim, m->conv_kernel, m->arch->attention_gate ? "gated " : "");
    }
    if (m->experts && (m->sigmoid_scores || m->groups || m->topk_scaling > 0))
        printf("routing:      %s scores%s, top-%" G_GUINT64_FORMAT " of the best %" G_GUINT64_FORMAT
               " of %" G_GUINT64_FORMAT " groups, weights x %g\n",
               m->sigmoid_scores ? "sigmoid" : "softmax", m->expert_bias ? " + expert bias for the choice" : "",
               m->topk, m->groups ? m->group_topk : 1, m->groups ? m->groups : 1,
               m->topk_scaling > 0 ? m->topk_scaling : 1.0);
    if (m->arch->vision && m->vision_image_tokens > 0) /* a tower whose projector pools images (SigLIP's) */
        printf("vision:       %" G_GUINT64_FORMAT " blocks of width %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
               " heads, ffn %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " images in patches of %"
               G_GUINT64_FORMAT ", pooled to %" G_GUINT64_FORMAT
               " tokens: %s* on the first pipeline stage, %s %s*\n",
               m->vision_depth, m->vision_hidden, m->vision_heads, m->vision_ffn, m->vision_image_size,
               m->vision_image_size, m->vision_patch, m->vision_image_tokens, m->arch->vision->megatron_prefix,
               m->arch->language_first ? "after" : "before", m->arch->megatron_prefix);
    else if (m->arch->vision)
        printf("vision:       %" G_GUINT64_FORMAT " blocks of width %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
               " heads, ffn %" G_GUINT64_FORMAT ", merger %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " into %"
               G_GUINT64_FORMAT ", mrope sections %" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT
               ": %s* on the first pipeline stage, %s* the language model\n",
               m->vision_depth, m->vision_hidden, m->vision_heads, m->vision_ffn, m->vision_merge, m->vision_merge,
               m->vision_out_hidden, m->mrope_section[0], m->mrope_section[1], m->mrope_section[2],
               m->arch->vision->megatron_prefix, m->arch->megatron_prefix);
    if (m->mtp_layers) {
        uint64_t mtp_first;
        const char *mtp_prefix = ckptfs_mtp_hf_prefix(m->arch->family->mtp_hf_prefix, CKPTFS_HF_LAYER_PREFIX,
                                                      m->layers, &mtp_first);
        printf("mtp:          %" G_GUINT64_FORMAT " multi-token prediction layer%s (%s%" G_GUINT64_FORMAT
                   "%s): %s\n", m->mtp_layers, m->mtp_layers > 1 ? "s" : "", mtp_prefix, mtp_first,
                   m->mtp_layers > 1 ? "..." : "",
                   m->mtp ? "in the Megatron views as mtp.layers.N"
                   : ckptfs_family_has(m->arch->family, CKPTFS_NEED_MTP)
                       ? "left out of the Megatron views; -o mtp=on adds them"
                       : "left out of the Megatron views (no rules for them)");
    }
    printf("layouts:      any tp{T}pp{P}[vpp{V}]%s that divides the model; tp larger than the "
           "query groups needs Megatron-core >= 0.16\n", m->experts ? "[ep{E}][etp{X}]" : "");
}

static void inspect_text(const InspectFacts *f)
{
    const CkptfsSource *s = f->source;
    g_autofree char *human = g_format_size(f->bytes);
    printf("source:       %s\n", s->dir);
    printf("format:       %s (%s)\n", s->format->name, f->about);
    printf("tensors:      %u, %s (%" G_GUINT64_FORMAT " bytes)\n", f->tensors, human, f->bytes);
    printf("dtypes:      ");
    print_dtype_counts(f->dtypes);
    printf("\n");
    if (s->converted) {
        printf("converted:    %u tensors converted on read; stored as", s->converted);
        print_dtype_counts(f->stored);
        printf(" (-o dtype=auto|bf16|fp32)\n");
    }
    if (s->config != NULL) {
        printf("architecture: %s (model_type %s)\n", f->architecture ? f->architecture : "not given",
               f->model_type ? f->model_type : "not given");
        printf("model:       ");
        for (guint i = 0; i < f->config_fields->len; i++) {
            const NamedInt *field = &g_array_index(f->config_fields, NamedInt, i);
            printf(" %s=%" G_GINT64_FORMAT, field->name, field->value);
        }
        printf("\n");
    } else {
        printf("architecture: unknown: %s\n", s->config_problem);
    }
    if (f->model != NULL)
        print_model(f);
    else
        printf("megatron:     no Megatron views: %s\n", f->mount->model_problem);
    printf("views:       ");
    for (guint i = 0; i < f->views->len; i++)
        printf(" %s", (char *)g_ptr_array_index(f->views, i));
    printf("\n");
    printf("read-ahead:   %s\n", f->ahead_text);
    print_packed(f);
    if (s->found)
        printf("found:        %s\n", s->found);
    for (guint i = 0; i < s->warnings->len; i++)
        printf("warning:      %s\n", (char *)g_ptr_array_index(s->warnings, i));
}

int ckptfs_cmd_inspect(int argc, char **argv)
{
    CmdArgs a;
    if (!parse_cmd_args("inspect", argc, argv, 1, 1, true, &a))
        return 2;
    CkptfsMount *mount = open_or_complain("inspect", &a);
    if (mount == NULL)
        return 1;
    int status = 0;
    if (a.layout != NULL) {
        status = inspect_layout(mount, a.layout, a.json);
    } else if (mount->source == NULL) {
        status = inspect_run(mount, a.json);
    } else {
        InspectFacts facts;
        gather_facts(&facts, mount);
        if (a.json)
            inspect_json(&facts);
        else
            inspect_text(&facts);
        facts_clear(&facts);
    }
    ckptfs_mount_free(mount);
    return status;
}

/* --- walking a view (ls, export) --- */

typedef struct {
    char *name;
    CkptfsAttr attr;
} Entry;

static void entry_free(gpointer p)
{
    Entry *e = p;
    g_free(e->name);
    g_free(e);
}

static bool collect_entry(gpointer ctx, const char *name, const CkptfsAttr *attr, uint64_t next)
{
    (void)next;
    Entry *e = g_new0(Entry, 1);
    e->name = g_strdup(name);
    e->attr = *attr;
    g_ptr_array_add(ctx, e);
    return true;
}

typedef int (*VisitFn)(gpointer ctx, const char *rel_path, const CkptfsAttr *attr);

/* Depth-first, parents before children; REL is the path below the walk's start. */
static int walk(CkptfsMount *mount, uint64_t dir_ino, const char *rel, VisitFn fn, gpointer ctx,
                GError **error)
{
    g_autoptr(GPtrArray) entries = g_ptr_array_new_with_free_func(entry_free);
    int rc = ckptfs_tree_readdir(mount->tree, dir_ino, 0, collect_entry, entries, error);
    for (guint i = 0; rc == 0 && i < entries->len; i++) {
        Entry *e = g_ptr_array_index(entries, i);
        g_autofree char *path = *rel ? g_strdup_printf("%s/%s", rel, e->name) : g_strdup(e->name);
        CkptfsAttr attr;
        rc = ckptfs_tree_getattr(mount->tree, e->attr.ino, &attr, error);
        if (rc == 0)
            rc = fn(ctx, path, &attr);
        if (rc == 0 && attr.type == CKPTFS_NODE_DIR)
            rc = walk(mount, attr.ino, path, fn, ctx, error);
    }
    return rc;
}

static int print_file(gpointer ctx, const char *rel, const CkptfsAttr *attr)
{
    (void)ctx;
    if (attr->type == CKPTFS_NODE_FILE)
        printf("%" G_GUINT64_FORMAT "\t%s\n", attr->size, rel);
    else if (attr->type == CKPTFS_NODE_SYMLINK)
        printf("-\t%s\n", rel);
    return 0;
}

int ckptfs_cmd_ls(int argc, char **argv)
{
    CmdArgs a;
    if (!parse_cmd_args("ls", argc, argv, 1, 2, false, &a))
        return 2;
    CkptfsMount *mount = open_or_complain("ls", &a);
    if (mount == NULL)
        return 1;
    int status = 0;
    GError *error = NULL;
    if (a.npos == 1) {
        g_autoptr(GPtrArray) views = g_ptr_array_new_with_free_func(g_free);
        ckptfs_tree_readdir(mount->tree, CKPTFS_ROOT_INO, 0, collect_name, views, NULL);
        for (guint i = 0; i < views->len; i++)
            printf("%s\n", (char *)g_ptr_array_index(views, i));
    } else {
        CkptfsAttr attr;
        int rc = ckptfs_tree_resolve(mount->tree, a.pos[1], &attr, &error);
        if (rc == 0 && attr.type != CKPTFS_NODE_DIR)
            rc = print_file(NULL, a.pos[1], &attr);
        else if (rc == 0)
            rc = walk(mount, attr.ino, "", print_file, NULL, &error);
        if (rc != 0)
            status = report("ls", rc, error, a.pos[1]);
    }
    ckptfs_mount_free(mount);
    return status;
}

/* --- cat --- */

static bool write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

typedef struct {
    uint64_t done, total;
    bool show;
    gint64 start_us, last_us;
} Progress;

static void progress_update(Progress *p, bool final)
{
    if (!p->show)
        return;
    gint64 now = g_get_monotonic_time();
    if (!final && now - p->last_us < 200000)
        return;
    p->last_us = now;
    double secs = (double)(now - p->start_us) / 1e6;
    g_autofree char *done = g_format_size(p->done);
    g_autofree char *total = g_format_size(p->total);
    g_autofree char *rate = g_format_size(secs > 0 ? (guint64)((double)p->done / secs) : 0);
    fprintf(stderr, "\rexport: %s of %s (%3.0f%%), %s/s   ", done, total,
            p->total ? 100.0 * (double)p->done / (double)p->total : 100.0, rate);
    if (final)
        fprintf(stderr, "\n");
}

/* Copies the bytes of PLAN (of a file of OWNER) to FD. */
static int copy_plan_bytes(const CkptfsMount *owner, const CkptfsPlan *plan, int fd, const char *dest_name,
                           Progress *progress, GError **error)
{
    if (!ckptfs_mount_check_sources(owner, plan, error))
        return -EIO;
    g_autofree uint8_t *buf = g_malloc(COPY_CHUNK);
    uint64_t size = ckptfs_plan_size(plan);
    for (uint64_t off = 0; off < size;) {
        int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(owner->source->files), buf, COPY_CHUNK, off, error);
        if (n <= 0)
            return -EIO;
        if (!write_all(fd, buf, (size_t)n)) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: write failed: %s", dest_name,
                        g_strerror(errno));
            return -EIO;
        }
        off += (uint64_t)n;
        if (progress) {
            progress->done += (uint64_t)n;
            progress_update(progress, false);
        }
    }
    return 0;
}

/* Copies a file's synthesized bytes to FD. */
static int copy_plan(CkptfsMount *mount, uint64_t ino, int fd, const char *dest_name,
                     Progress *progress, GError **error)
{
    const CkptfsPlan *plan;
    gpointer scope;
    int rc = ckptfs_tree_plan(mount->tree, ino, &plan, &scope, error);
    if (rc != 0)
        return rc;
    rc = copy_plan_bytes(ckptfs_mount_of_scope(mount, scope), plan, fd, dest_name, progress, error);
    ckptfs_tree_plan_release(mount->tree, ino); /* a rank file's plan is not kept (tree.h) */
    return rc;
}

int ckptfs_cmd_cat(int argc, char **argv)
{
    CmdArgs a;
    if (!parse_cmd_args("cat", argc, argv, 2, 2, false, &a))
        return 2;
    CkptfsMount *mount = open_or_complain("cat", &a);
    if (mount == NULL)
        return 1;
    GError *error = NULL;
    CkptfsAttr attr;
    int rc = ckptfs_tree_resolve(mount->tree, a.pos[1], &attr, &error);
    if (rc == 0 && attr.type != CKPTFS_NODE_FILE)
        rc = -EISDIR;
    if (rc == 0)
        rc = copy_plan(mount, attr.ino, STDOUT_FILENO, "stdout", NULL, &error);
    int status = rc == 0 ? 0 : report("cat", rc, error, a.pos[1]);
    ckptfs_mount_free(mount);
    return status;
}

/* --- export --- */

typedef struct {
    CkptfsMount *mount;
    const char *dest;
    Progress progress;
    GError **error;
} Export;

static int sum_sizes(gpointer ctx, const char *rel, const CkptfsAttr *attr)
{
    (void)rel;
    if (attr->type == CKPTFS_NODE_FILE)
        *(uint64_t *)ctx += attr->size;
    return 0;
}

static int export_entry(gpointer ctx, const char *rel, const CkptfsAttr *attr)
{
    Export *x = ctx;
    g_autofree char *path = g_build_filename(x->dest, rel, NULL);
    if (attr->type == CKPTFS_NODE_DIR) {
        if (mkdir(path, 0755) != 0) {
            g_set_error(x->error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: %s", path, g_strerror(errno));
            return -EIO;
        }
        return 0;
    }
    if (attr->type == CKPTFS_NODE_SYMLINK) {
        const char *target;
        int rc = ckptfs_tree_readlink(x->mount->tree, attr->ino, &target);
        if (rc == 0 && symlink(target, path) != 0) {
            g_set_error(x->error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: %s", path, g_strerror(errno));
            return -EIO;
        }
        return rc;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        g_set_error(x->error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: %s%s", path, g_strerror(errno),
                    errno == EEXIST ? " (export never overwrites)" : "");
        return -EIO;
    }
    int rc = copy_plan(x->mount, attr->ino, fd, path, &x->progress, x->error);
    if (close(fd) != 0 && rc == 0) {
        g_set_error(x->error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: %s", path, g_strerror(errno));
        rc = -EIO;
    }
    return rc;
}

int ckptfs_cmd_export(int argc, char **argv)
{
    CmdArgs a;
    if (!parse_cmd_args("export", argc, argv, 3, 3, false, &a))
        return 2;
    const char *dest = a.pos[2];
    struct stat st;
    bool dest_exists = stat(dest, &st) == 0;
    if (dest_exists && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ckptfs export: %s exists and is not a directory\n", dest);
        ckptfs_options_clear(&a.options);
        return 1;
    }
    CkptfsMount *mount = open_or_complain("export", &a);
    if (mount == NULL)
        return 1;
    GError *error = NULL;
    CkptfsAttr attr;
    int rc = ckptfs_tree_resolve(mount->tree, a.pos[1], &attr, &error);
    if (rc == 0 && attr.type != CKPTFS_NODE_DIR)
        rc = -ENOTDIR;
    Export x = {.mount = mount, .dest = dest, .error = &error};
    if (rc == 0)
        rc = walk(mount, attr.ino, "", sum_sizes, &x.progress.total, &error);
    if (rc == 0 && !dest_exists && mkdir(dest, 0755) != 0) {
        g_set_error(&error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: %s", dest, g_strerror(errno));
        rc = -EIO;
    }
    if (rc == 0) {
        x.progress.show = isatty(STDERR_FILENO);
        x.progress.start_us = g_get_monotonic_time();
        rc = walk(mount, attr.ino, "", export_entry, &x, &error);
        progress_update(&x.progress, true);
    }
    int status = rc == 0 ? 0 : report("export", rc, error, a.pos[1]);
    ckptfs_mount_free(mount);
    return status;
}

/* --- pack --- */

typedef struct {
    bool tty;
    gint64 start_us, last_us;
    bool verifying;
    bool line_open; /* a progress line without its newline yet */
} PackProgress;

static double ratio_of(uint64_t out, uint64_t in)
{
    return in ? (double)out / (double)in : 0.0;
}

static void pack_progress(const CkptfsPackStats *st, bool verifying, gpointer ctx)
{
    PackProgress *p = ctx;
    if (!p->tty)
        return;
    gint64 now = g_get_monotonic_time();
    if (verifying != p->verifying) { /* a new phase: its first line after a second */
        p->verifying = verifying;
        p->start_us = p->last_us = now;
        return;
    }
    if (now - p->last_us < 1000000)
        return;
    p->last_us = now;
    double secs = (double)(now - p->start_us) / 1e6;
    uint64_t done = verifying ? st->verified_bytes : st->bytes_in;
    g_autofree char *in = g_format_size(done);
    g_autofree char *total = g_format_size(st->total_in);
    fprintf(stderr, "\r\033[Kpack: %s %s of %s (%3.0f%%)", verifying ? "verified" : "read", in, total,
            st->total_in ? 100.0 * (double)done / (double)st->total_in : 100.0);
    if (!verifying)
        fprintf(stderr, ", ratio %.3f, %.2f GB/s", ratio_of(st->bytes_out, st->bytes_in),
                secs > 0 ? (double)st->bytes_in / secs / 1e9 : 0.0);
    p->line_open = true;
}

static void pack_warning(const char *message, gpointer ctx)
{
    PackProgress *p = ctx;
    if (p->line_open)
        fprintf(stderr, "\n");
    p->line_open = false;
    fprintf(stderr, "ckptfs pack: warning: %s\n", message);
}

static void pack_usage(FILE *out)
{
    fprintf(out,
            "usage: ckptfs pack SRC DEST [-o OPTS] [--verify]\n"
            "Writes a copy of checkpoint SRC into DEST (new, or an empty directory) in which every file\n"
            "holding tensor bytes is a compressed container; other files are copied. `ckptfs mount DEST`\n"
            "serves the same views as SRC.\n"
            "    -o codec=zstd|lz4      compressor (default zstd)\n"
            "    -o level=N             zstd 1-19 (default 1); lz4 1 (default, fast) or 2-12 (lz4hc)\n"
            "    -o frame=SIZE          uncompressed bytes per frame, 64K-64M, a multiple of 4096 (2M)\n"
            "    -o threads=N           compressing threads (default: the CPUs, at most 16)\n"
            "    -o OPTION              any source option of mount (iteration=N, ...)\n"
            "    --verify               read DEST back through the container reader and compare with SRC\n");
}

static bool pack_apply_list(const char *list, CkptfsPackOptions *po, CkptfsOptions *so)
{
    g_auto(GStrv) items = g_strsplit(list, ",", -1);
    for (char **item = items; *item; item++) {
        if (**item == '\0')
            continue;
        GError *error = NULL;
        CkptfsOptionResult r = ckptfs_pack_options_apply(po, *item, &error);
        if (r == CKPTFS_OPTION_UNKNOWN)
            r = ckptfs_options_apply(so, *item, &error);
        if (r == CKPTFS_OPTION_TAKEN)
            continue;
        if (r == CKPTFS_OPTION_UNKNOWN)
            fprintf(stderr, "ckptfs pack: unknown option '%s'\n", *item);
        else
            fprintf(stderr, "ckptfs pack: %s\n", error->message);
        g_clear_error(&error);
        return false;
    }
    return true;
}

int ckptfs_cmd_pack(int argc, char **argv)
{
    CkptfsPackOptions po;
    ckptfs_pack_options_init(&po);
    CkptfsOptions so;
    ckptfs_options_init(&so);
    const char *pos[2];
    int npos = 0;
    bool verify = false, options_done = false, bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (!options_done && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)) {
            pack_usage(stdout);
            ckptfs_options_clear(&so);
            return 0;
        } else if (!options_done && strcmp(arg, "--verify") == 0) {
            verify = true;
        } else if (!options_done && g_str_has_prefix(arg, "-o")) {
            const char *list = arg[2] ? arg + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (list == NULL) {
                fprintf(stderr, "ckptfs pack: -o needs an option list\n");
                bad = true;
            } else {
                bad = !pack_apply_list(list, &po, &so);
            }
        } else if (!options_done && arg[0] == '-' && arg[1] != '\0') {
            fprintf(stderr, "ckptfs pack: unknown argument '%s'\n", arg);
            bad = true;
        } else if (npos < 2) {
            pos[npos++] = arg;
        } else {
            fprintf(stderr, "ckptfs pack: unexpected argument '%s'\n", arg);
            bad = true;
        }
    }
    GError *error = NULL;
    if (!bad && npos < 2) {
        fprintf(stderr, "ckptfs pack: missing arguments\n");
        pack_usage(stderr);
        bad = true;
    }
    if (!bad && !ckptfs_pack_options_check(&po, &error)) {
        fprintf(stderr, "ckptfs pack: %s\n", error->message);
        g_clear_error(&error);
        bad = true;
    }
    if (bad) {
        ckptfs_options_clear(&so);
        return 2;
    }
    PackProgress progress = {.tty = isatty(STDERR_FILENO) == 1, .start_us = g_get_monotonic_time()};
    progress.last_us = progress.start_us;
    CkptfsPackHooks hooks = {.progress = pack_progress, .warning = pack_warning, .ctx = &progress};
    CkptfsPackStats st = {0};
    gint64 start = g_get_monotonic_time();
    /* The pack alone is timed: verification reports after it. */
    bool ok = ckptfs_pack_dir(pos[0], pos[1], &so, &po, false, &hooks, &st, &error);
    double secs = (double)(g_get_monotonic_time() - start) / 1e6;
    ckptfs_options_clear(&so);
    if (progress.line_open)
        fprintf(stderr, "\r\033[K");
    progress.line_open = false;
    if (!ok) {
        fprintf(stderr, "ckptfs pack: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    g_autofree char *in = g_format_size(st.bytes_in);
    g_autofree char *out = g_format_size(st.bytes_out);
    g_autofree char *skipped =
        st.files_skipped ? g_strdup_printf(", %" G_GUINT64_FORMAT " skipped", st.files_skipped) : g_strdup("");
    GString *line = g_string_new(NULL);
    g_string_append_printf(line,
                           "pack: %" G_GUINT64_FORMAT " files packed, %" G_GUINT64_FORMAT " copied%s; %s in (%"
                           G_GUINT64_FORMAT " bytes), %s out (%" G_GUINT64_FORMAT " bytes), ratio %.3f, %.2f GB/s"
                           " (%s level %d, frame %u, %u threads, %.1f s); ratio by class:",
                           st.files_packed, st.files_copied, skipped,
                           in, st.bytes_in, out, st.bytes_out, ratio_of(st.bytes_out, st.bytes_in),
                           secs > 0 ? (double)st.bytes_in / secs / 1e9 : 0.0,
                           ckptfs_codec(po.codec)->name, po.level, po.frame_size, po.threads, secs);
    for (unsigned c = 0; c < CKPTFS_PACK_CLASSES; c++) {
        if (st.class_in[c] == 0)
            continue;
        g_autofree char *cin = g_format_size(st.class_in[c]);
        g_string_append_printf(line, "%s %s %.3f of %s", line->str[line->len - 1] == ':' ? "" : ",",
                               ckptfs_pack_class_name(c), ratio_of(st.class_out[c], st.class_in[c]), cin);
    }
    if (st.files_packed == 0)
        g_string_append(line, " (no tensor bytes)");
    fprintf(stderr, "%s\n", line->str);
    g_string_free(line, TRUE);
    if (!verify)
        return 0;
    gint64 verify_start = g_get_monotonic_time();
    ok = ckptfs_pack_verify(pos[0], pos[1], &hooks, &st, &error);
    secs = (double)(g_get_monotonic_time() - verify_start) / 1e6;
    if (progress.line_open)
        fprintf(stderr, "\r\033[K");
    if (!ok) {
        fprintf(stderr, "ckptfs pack: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    fprintf(stderr, "verify: %" G_GUINT64_FORMAT " files, %" G_GUINT64_FORMAT " bytes identical to %s (%.2f GB/s)\n",
            st.verified_files, st.verified_bytes, pos[0], secs > 0 ? (double)st.verified_bytes / secs / 1e9 : 0.0);
    return 0;
}
