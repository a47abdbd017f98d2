#include "ckptfs/source.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "ckptfs/error.h"
#include "ckptfs/fused.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/mapping.h"
#include "ckptfs/schema.h"
#include "source_internal.h"

static void source_file_free(gpointer data)
{
    CkptfsSourceFile *f = data;
    g_free(f->name);
    g_free(f);
}

static gint source_file_cmp(gconstpointer a, gconstpointer b)
{
    return strcmp((*(CkptfsSourceFile *const *)a)->name, (*(CkptfsSourceFile *const *)b)->name);
}

bool ckptfs_source_add_top_files(CkptfsSource *source, const char *dir_path, GError **error)
{
    GError *dir_error = NULL;
    g_autoptr(GDir) dir = g_dir_open(dir_path, 0, &dir_error);
    if (dir == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot list: %s", dir_path,
                    dir_error->message);
        g_error_free(dir_error);
        return false;
    }
    const char *name;
    while ((name = g_dir_read_name(dir)) != NULL) {
        g_autofree char *path = g_build_filename(dir_path, name, NULL);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (!ckptfs_source_add_file(source, name, path, error))
            return false;
    }
    return true;
}

bool ckptfs_source_add_file(CkptfsSource *source, const char *name, const char *path,
                            GError **error)
{
    if (ckptfs_source_top_file(source, name) != NULL)
        return true; /* the first one given wins */
    int index = ckptfs_srcfiles_add(source->files, path, error);
    if (index < 0)
        return false;
    CkptfsSourceFile *f = g_new0(CkptfsSourceFile, 1);
    f->name = g_strdup(name);
    f->src = (uint32_t)index;
    f->size = ckptfs_srcfiles_get(source->files, (unsigned)index)->size;
    g_ptr_array_add(source->top_files, f);
    g_ptr_array_sort(source->top_files, source_file_cmp); /* lookups bisect */
    return true;
}

/* The registry: formats tried in order (a verl role directory, FSDP or Megatron, is recognised
 * by its own file names and holds the others' formats below it; a NeMo 2 checkpoint holds a
 * torch_dist one in weights/ beside context/; a torch_dist directory may also
 * have a tracker; a DCP without Megatron's metadata.json holds torchtitan's names (its .metadata
 * names tok_embeddings) or Hugging Face's; a directory
 * that is neither Megatron format is read as Hugging Face). */
static const CkptfsSourceFormat *const formats[] = {&ckptfs_format_verl_fsdp, &ckptfs_format_verl_megatron,
                                                     &ckptfs_format_nemo2,
                                                     &ckptfs_format_torch_dist, &ckptfs_format_titan, &ckptfs_format_dcp_hf,
                                                     &ckptfs_format_deepspeed, &ckptfs_format_megatron,
                                                     &ckptfs_format_hf};

/* The block size of a block-FP8 checkpoint (quantization_config {"quant_method": "fp8",
 * "weight_block_size": [R, C]}: DeepSeek-V3, Qwen3-*-FP8): false with an error for another
 * quantisation or a block it cannot be, true with *BR = 0 when there is none. */
static bool block_fp8_config(const CkptfsSource *source, gint64 *br, gint64 *bc, GError **error)
{
    *br = *bc = 0;
    JsonNode *q = ckptfs_json_member(source->config, "quantization_config");
    if (q == NULL || JSON_NODE_HOLDS_NULL(q))
        return true;
    g_autofree char *what = g_strdup_printf("%s: config.json: quantization_config", source->dir);
    JsonObject *qc = ckptfs_json_member_object(source->config, "quantization_config");
    const char *name = ckptfs_json_member_string(qc, "quant_method");
    if (name == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: %s; without -o dtype=bf16 the checkpoint is "
                    "served as it is", what, qc ? "no \"quant_method\" string" : "not an object");
        return false;
    }
    if (strcmp(name, "mxfp4") == 0) /* no FP8 blocks: dequantize_mxfp4's */
        return true;
    if (strcmp(name, "fp8") != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: quant_method '%s' is not dequantised "
                    "(block FP8 \"fp8\" is); without -o dtype=bf16 the checkpoint is served as it is", what, name);
        return false;
    }
    JsonNode *block = ckptfs_json_member(qc, "weight_block_size");
    JsonArray *dims = block && JSON_NODE_HOLDS_ARRAY(block) ? json_node_get_array(block) : NULL;
    if (dims && json_array_get_length(dims) == 2 && !(ckptfs_json_node_int(json_array_get_element(dims, 0), br) &&
                                                      ckptfs_json_node_int(json_array_get_element(dims, 1), bc)))
        *br = *bc = 0;
    if (*br < 1 || *bc < 1 || *br > 65536 || *bc > 65536) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: weight_block_size is not two block sizes "
                    "from 1 to 65536 (per-tensor or per-channel FP8 is not dequantised)", what);
        return false;
    }
    return true;
}

/* Every FP8 weight X of CATALOG gets its scales X_scale_inv and is served as bf16,
 * dequantised on read; the scale tensors leave the catalog. The other tensors stay as they
 * are, as DeepSeek's fp8_cast_bf16.py leaves them. */
static bool dequantize_catalog(const CkptfsSource *source, CkptfsCatalog *catalog, gint64 br, gint64 bc,
                               GError **error)
{
    g_autoptr(GHashTable) scales = g_hash_table_new_full(ckptfs_name_hash, g_str_equal, g_free, NULL);
    for (unsigned i = 0; i < ckptfs_catalog_count(catalog); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(catalog, i);
        if (t->stored != CKPTFS_DTYPE_F8_E4M3 && t->stored != CKPTFS_DTYPE_F8_E5M2)
            continue;
        g_autofree char *scale = g_strconcat(t->name, "_scale_inv", NULL);
        if (ckptfs_catalog_find(catalog, scale) == NULL) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: FP8 tensor '%s' has no '%s'", source->dir,
                        t->name, scale);
            return false;
        }
        if (!ckptfs_catalog_set_block_scale(catalog, t->name, scale, (unsigned)br, (unsigned)bc, error)) {
            g_prefix_error(error, "%s: ", source->dir);
            return false;
        }
        g_hash_table_add(scales, g_steal_pointer(&scale));
    }
    ckptfs_catalog_remove(catalog, scales);
    ckptfs_catalog_dequantize(catalog);
    return true;
}

/* The first FP8 tensor of CATALOG with an X_scale_inv beside it, or NULL. */
static const char *scaled_fp8_tensor(const CkptfsCatalog *catalog)
{
    for (unsigned i = 0; i < ckptfs_catalog_count(catalog); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(catalog, i);
        if (t->stored != CKPTFS_DTYPE_F8_E4M3 && t->stored != CKPTFS_DTYPE_F8_E5M2)
            continue;
        g_autofree char *scale = g_strconcat(t->name, "_scale_inv", NULL);
        if (ckptfs_catalog_find(catalog, scale) != NULL)
            return t->name;
    }
    return NULL;
}

/* A block-FP8 checkpoint: with -o dtype=bf16 served as bf16 everywhere (hf/ then has no scales
 * and no quantization_config, as after fp8_cast_bf16.py); otherwise hf/ passes it through and
 * the Megatron views, which are bf16, read a dequantised copy of the catalog. *DEQUANTIZED:
 * whether the source's own catalog was. */
static bool dequantize_fp8(CkptfsSource *source, const CkptfsOptions *options, bool *dequantized, GError **error)
{
    gint64 br, bc;
    *dequantized = false;
    bool want_bf16 = options->dtype == CKPTFS_SERVE_BF16;
    GError *config_error = NULL;
    if (!block_fp8_config(source, &br, &bc, &config_error)) {
        if (want_bf16) {
            g_propagate_error(error, config_error);
            return false;
        }
        g_error_free(config_error); /* passed through; the Megatron views say what they miss */
        return true;
    }
    if (br == 0) {
        /* Scales but no block size to apply them with: a cast would leave the weights FP8 and
         * change the scales' values. */
        const char *scaled = scaled_fp8_tensor(source->catalog);
        if (scaled == NULL)
            return true;
        g_autofree char *why = g_strdup_printf("%s: FP8 tensor '%s' has block scales '%s_scale_inv' but config.json has "
                                               "no quantization_config with their weight_block_size",
                                               source->dir, scaled, scaled);
        if (want_bf16) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s; -o dtype=bf16 cannot dequantise it", why);
            return false;
        }
        if (source->model_problem == NULL)
            source->model_problem = g_steal_pointer(&why);
        return true;
    }
    if (!want_bf16) { /* a problem here costs the Megatron views, not the pass-through */
        GError *why = NULL;
        source->model_catalog = ckptfs_catalog_copy(source->catalog);
        if (!dequantize_catalog(source, source->model_catalog, br, bc, &why)) {
            source->model_problem = g_strdup(why->message);
            g_error_free(why);
        }
        return true;
    }
    if (!dequantize_catalog(source, source->catalog, br, bc, error))
        return false;
    json_object_remove_member(source->config, "quantization_config");
    source->config_changed = true;
    *dequantized = true;
    return true;
}

/* Whether config.json's quantization_config says MXFP4 (GPT-OSS's releases: {"quant_method":
 * "mxfp4", "modules_to_not_convert": [...]}). */
static bool mxfp4_config(const CkptfsSource *source)
{
    JsonObject *q = source->config ? ckptfs_json_member_object(source->config, "quantization_config") : NULL;
    const char *method = q ? ckptfs_json_member_string(q, "quant_method") : NULL;
    return method != NULL && strcmp(method, "mxfp4") == 0;
}

#define MXFP4_BLOCKS "_blocks"
#define MXFP4_SCALES "_scales"

/* Every MXFP4 pair X_blocks, X_scales of CATALOG becomes X, bf16 dequantised on read, as
 * transformers dequantises it; the pairs leave the catalog. A blocks tensor without its scales,
 * or scales without their blocks, is refused by name. */
static bool dequantize_mxfp4_catalog(const CkptfsSource *source, CkptfsCatalog *catalog, unsigned *pairs_found,
                                     GError **error)
{
    g_autoptr(GHashTable) pairs = g_hash_table_new_full(ckptfs_name_hash, g_str_equal, g_free, NULL);
    unsigned count = ckptfs_catalog_count(catalog);
    for (unsigned i = 0; i < count; i++) {
        const char *name = ckptfs_catalog_at(catalog, i)->name;
        bool blocks = g_str_has_suffix(name, MXFP4_BLOCKS), scales = g_str_has_suffix(name, MXFP4_SCALES);
        if (!blocks && !scales)
            continue;
        g_autofree char *stem = g_strndup(name, strlen(name) - strlen(MXFP4_BLOCKS)); /* both 7 letters */
        g_autofree char *other = g_strconcat(stem, blocks ? MXFP4_SCALES : MXFP4_BLOCKS, NULL);
        if (ckptfs_catalog_find(catalog, other) == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: MXFP4 %s '%s' have no %s '%s'", source->dir,
                               blocks ? "blocks" : "scales", name, blocks ? "scales" : "blocks", other);
        if (!blocks)
            continue;
        if (!ckptfs_catalog_add_mxfp4(catalog, stem, name, other, error)) {
            g_prefix_error(error, "%s: ", source->dir);
            return false;
        }
        g_hash_table_add(pairs, g_strdup(name));
        g_hash_table_add(pairs, g_steal_pointer(&other));
    }
    *pairs_found = g_hash_table_size(pairs) / 2;
    ckptfs_catalog_remove(catalog, pairs);
    return true;
}

/* An MXFP4 checkpoint (GPT-OSS's releases): with -o dtype=bf16 its experts are served as bf16
 * everywhere (hf/ then has no blocks, scales or quantization_config, as transformers'
 * dequantize=True loads it); otherwise hf/ passes it through and the Megatron views, which are
 * bf16, read a dequantised copy of the catalog, as block-FP8's. *DEQUANTIZED as dequantize_fp8's. */
static bool dequantize_mxfp4(CkptfsSource *source, const CkptfsOptions *options, bool *dequantized, GError **error)
{
    if (!mxfp4_config(source))
        return true;
    unsigned pairs = 0;
    if (options->dtype != CKPTFS_SERVE_BF16) { /* a problem here costs the Megatron views, not the pass-through */
        GError *why = NULL;
        source->model_catalog = ckptfs_catalog_copy(source->catalog);
        if (!dequantize_mxfp4_catalog(source, source->model_catalog, &pairs, &why)) {
            source->model_problem = g_strdup(why->message);
            g_error_free(why);
            return true;
        }
        g_autofree char *found = source->found;
        source->found = g_strdup_printf("%s%sMXFP4 experts in %u tensors: hf/ serves their blocks and scales, "
                                        "-o dtype=bf16 them dequantised", found ? found : "", found ? "; " : "", pairs);
        return true;
    }
    if (!dequantize_mxfp4_catalog(source, source->catalog, &pairs, error))
        return false;
    json_object_remove_member(source->config, "quantization_config");
    source->config_changed = true;
    *dequantized = true;
    return true;
}

/* config.json's element type, under both names where the file has both: transformers 5 writes
 * "dtype", earlier versions "torch_dtype" (both read both). */
static void set_config_dtype(CkptfsSource *source, CkptfsDtype dtype)
{
    static const char *const keys[] = {"torch_dtype", "dtype"};
    const char *name = ckptfs_dtype_torch_name(dtype);
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
        const char *given = ckptfs_json_member_string(source->config, keys[i]);
        bool present = ckptfs_json_member(source->config, keys[i]) != NULL,
             same = given != NULL && strcmp(given, name) == 0;
        if ((present || i == 0) && !same) {
            json_object_set_string_member(source->config, keys[i], name);
            source->config_changed = true;
        }
    }
}

/* The floating-point type holding most of the served weights' bytes: what transformers should
 * load a config.json made here as (a Megatron checkpoint saved without --bf16 holds fp32). */
static CkptfsDtype weights_dtype(const CkptfsCatalog *catalog)
{
    uint64_t bytes[CKPTFS_DTYPE_COUNT] = {0};
    CkptfsDtype most = CKPTFS_DTYPE_BF16;
    for (unsigned i = 0; i < ckptfs_catalog_count(catalog); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(catalog, i);
        if (!ckptfs_dtype_is_float(t->dtype))
            continue;
        bytes[t->dtype] += t->nbytes;
        if (bytes[t->dtype] > bytes[most])
            most = t->dtype;
    }
    return most;
}

/* -o dtype (or the format's default): floating-point weights served as bf16 or fp32,
 * converted on read, and config.json's torch_dtype saying so. */
static void serve_dtype(CkptfsSource *source, const CkptfsOptions *options, bool dequantized)
{
    CkptfsServeDtype want = options->dtype != CKPTFS_SERVE_AUTO ? options->dtype : source->default_dtype;
    if (want == CKPTFS_SERVE_AUTO) {
        if (source->config_dtype_from_weights && source->config != NULL)
            set_config_dtype(source, weights_dtype(source->catalog));
        return;
    }
    CkptfsDtype to = want == CKPTFS_SERVE_BF16 ? CKPTFS_DTYPE_BF16 : CKPTFS_DTYPE_F32;
    /* bf16: what a family keeps in fp32 (DeepSeek's router bias) stays so, as fp8_cast_bf16.py
     * leaves it. */
    source->converted = dequantized ? ckptfs_catalog_dequantize(source->catalog)
                                    : ckptfs_catalog_serve_as(source->catalog, to,
                                                              to == CKPTFS_DTYPE_BF16 ? ckptfs_tensor_keeps_fp32 : NULL);
    if (source->adapter != NULL)
        ckptfs_catalog_serve_as(source->adapter, to, NULL);
    /* The config says what is served whenever some weight is served as TO, converted or not:
     * verl's huggingface/config.json is the bf16 model's, its shards fp32 (-o dtype=fp32). */
    bool served = false;
    for (unsigned i = 0; i < ckptfs_catalog_count(source->catalog) && !served; i++)
        served = ckptfs_catalog_at(source->catalog, i)->dtype == to;
    if (served && source->config != NULL)
        set_config_dtype(source, to);
}

/* Experts fused on disk (transformers 5's form; some families' releases), in the decoder's layers
 * and, with -o mtp=on, the multi-token prediction layers': the Megatron views read per-expert
 * tensors, strided pieces of the fused ones, from a catalog of their own, as block-FP8's; hf/
 * serves the source's own form. A problem costs the Megatron views, not hf/. */
/* The model of SOURCE's config.json (a VLM's text part) as READ reads it (all of it, or its sizes
 * alone), for its architecture ARCH; NULL when it is not read (the mount reads it again and says
 * why). */
static CkptfsModel *source_text_model(const CkptfsSource *source, const CkptfsArchitecture *arch,
                                      bool (*read)(JsonObject *, CkptfsModel *, GError **))
{
    g_autofree CkptfsModel *model = g_new0(CkptfsModel, 1);
    model->arch = arch;
    GError *error = NULL;
    g_autoptr(JsonObject) text = ckptfs_schema_text_config(source->config, arch->text_part, &error);
    if (text == NULL || !read(text, model, &error)) {
        g_clear_error(&error);
        return NULL;
    }
    return g_steal_pointer(&model);
}

static void split_fused_experts(CkptfsSource *source, const CkptfsOptions *options)
{
    if (source->config == NULL || source->model_problem != NULL)
        return;
    const CkptfsArchitecture *arch = ckptfs_source_architecture(source);
    if (arch == NULL || arch->moe == NULL || arch->moe->fused_forms == NULL)
        return;
    g_autofree CkptfsModel *model = source_text_model(source, arch, ckptfs_model_read_config);
    if (model == NULL)
        return;
    GError *error = NULL;
    model->mtp = options->mtp; /* MTP layers left out are never read: their tensors stay as saved */
    if (!ckptfs_fused_experts_present(ckptfs_source_model_catalog(source), model, arch->moe->fused_forms))
        return;
    CkptfsCatalog *split = ckptfs_catalog_copy(ckptfs_source_model_catalog(source));
    unsigned layers = 0;
    if (!ckptfs_fused_experts_split(split, model, arch->moe->fused_forms, &layers, &error)) {
        source->model_problem = g_strdup_printf("%s: %s", source->dir, error->message);
        g_error_free(error);
        ckptfs_catalog_free(split);
        return;
    }
    if (layers == 0) {
        ckptfs_catalog_free(split);
        return;
    }
    ckptfs_catalog_free(source->model_catalog);
    source->model_catalog = split;
    g_autofree char *found = source->found;
    source->found = g_strdup_printf("%s%sexperts fused on disk in %u layers: hf/ serves them fused, the Megatron views "
                                    "per expert", found ? found : "", found ? "; " : "", layers);
}

const CkptfsArchitecture *ckptfs_source_architecture(const CkptfsSource *source)
{
    if (source->config == NULL)
        return NULL;
    const char *name = ckptfs_schema_config_architecture(source->config);
    name = name ? name : ckptfs_json_member_string(source->config, "model_type");
    return name ? ckptfs_architecture_find(name, NULL) : NULL;
}

/* Whether a tensor of CATALOG is under one of ARCH's module names (model.language_model.*). */
static bool holds_module_names(const CkptfsCatalog *catalog, const CkptfsArchitecture *arch)
{
    for (unsigned i = 0; arch && arch->module_names && i < ckptfs_catalog_count(catalog); i++)
        for (const char *const *p = arch->module_names; p[0]; p += 2)
            if (g_str_has_prefix(ckptfs_catalog_at(catalog, i)->name, p[0]))
                return true;
    return false;
}

/* A source keyed by the names a model holds in memory (verl's FSDP shards), of an architecture
 * whose save_pretrained writes the experts it holds fused one by one (GLM-4.5V): its catalog gets
 * them so, strided pieces of the fused tensors, for hf/ and the Megatron views alike. What cannot
 * be split so is refused by name: hf/ would otherwise serve names save_pretrained never writes. */
static bool split_experts_as_saved(CkptfsSource *source, GError **error)
{
    if (source->config == NULL || source->weight_files->len > 0)
        return true;
    const CkptfsArchitecture *arch = ckptfs_source_architecture(source);
    if (arch == NULL || arch->moe == NULL || arch->moe->saved_per_expert == NULL)
        return true;
    /* the sizes alone, so that a config the Megatron views refuse (hf/ still served) still gets
     * the experts as saved */
    g_autofree CkptfsModel *model = source_text_model(source, arch, ckptfs_model_read_sizes);
    if (model == NULL)
        return true;
    GError *why = NULL;
    CkptfsCatalog *split = ckptfs_catalog_copy(source->catalog);
    unsigned layers = 0;
    if (!ckptfs_fused_experts_split_as_saved(split, model, arch->moe->saved_per_expert, &layers, &why)) {
        ckptfs_catalog_free(split);
        g_set_error(error, CKPTFS_ERROR, why->code, "%s: %s's experts as save_pretrained writes them: %s",
                    source->dir, arch->hf_architecture, why->message);
        g_error_free(why);
        return false;
    }
    if (layers == 0) {
        ckptfs_catalog_free(split);
        return true;
    }
    ckptfs_catalog_free(source->catalog);
    source->catalog = split;
    g_autofree char *found = source->found;
    source->found = g_strdup_printf("%s%sexperts held fused in %u layers: served one by one, as save_pretrained "
                                    "writes them", found ? found : "", found ? "; " : "", layers);
    return true;
}

/* A checkpoint under a later transformers' module names (a VLM's model.language_model.*): the
 * Megatron views read it under the rules' names (Qwen2.5-VL's release's), from a catalog of their own; hf/
 * serves the source's own names. A clash costs the Megatron views, not hf/. */
static void rename_modules(CkptfsSource *source)
{
    if (source->config == NULL || source->model_problem != NULL)
        return;
    const CkptfsArchitecture *arch = ckptfs_source_architecture(source);
    const CkptfsCatalog *catalog = ckptfs_source_model_catalog(source);
    if (!holds_module_names(catalog, arch))
        return;
    g_autofree char *clash = NULL;
    CkptfsCatalog *copy = ckptfs_catalog_copy_renamed(catalog, arch->module_names, &clash);
    if (copy == NULL) {
        source->model_problem = g_strdup_printf("%s: tensor '%s' is there under both of %s's namings", source->dir,
                                                clash, arch->hf_architecture);
        return;
    }
    ckptfs_catalog_free(source->model_catalog);
    source->model_catalog = copy;
    g_autofree char *found = source->found;
    source->found = g_strdup_printf("%s%s%s's module names (%s*): hf/ serves them, the Megatron views read them "
                                    "under the rules' names (%s*)", found ? found : "", found ? "; " : "",
                                    arch->hf_architecture, arch->module_names[0], arch->module_names[1]);
}

/* The other way: a source holding the experts one by one (a Megatron one) of an architecture whose
 * Hugging Face class reads them only fused (GPT-OSS): hf/ serves them fused, made of the
 * per-expert pieces; the Megatron views keep reading them per expert. A problem is a warning
 * (hf/ then keeps them per expert). */
static void join_fused_experts(CkptfsSource *source)
{
    if (source->config == NULL || source->model_problem != NULL)
        return;
    const CkptfsArchitecture *arch = ckptfs_source_architecture(source);
    if (arch == NULL || arch->moe == NULL || arch->moe->hf_form == NULL)
        return;
    bool per_expert = false; /* a Hugging Face source keeps its own form (MXFP4 blocks too) */
    for (unsigned i = 0; i < ckptfs_catalog_count(source->catalog) && !per_expert; i++)
        per_expert = strstr(ckptfs_catalog_at(source->catalog, i)->name, ".mlp.experts.0.") != NULL;
    if (!per_expert)
        return;
    g_autofree CkptfsModel *model = g_new0(CkptfsModel, 1);
    model->arch = arch;
    GError *error = NULL;
    const CkptfsFusedExperts *forms[] = {arch->moe->hf_form, NULL};
    /* a VLM's language model is its text part's */
    g_autoptr(JsonObject) text = ckptfs_schema_text_config(source->config, arch->text_part, &error);
    if (text == NULL || !ckptfs_model_read_config(text, model, &error) ||
        ckptfs_fused_experts_present(source->catalog, model, forms)) {
        g_clear_error(&error); /* the mount reads the model again and says why */
        return;
    }
    CkptfsCatalog *joined = ckptfs_catalog_copy(source->catalog);
    if (!ckptfs_fused_experts_join(joined, model, arch->moe->hf_form, &error)) {
        g_ptr_array_add(source->warnings, g_strdup_printf("%s: hf/ serves the experts one by one, which %s does not "
                                                          "read: %s", source->dir, arch->hf_architecture,
                                                          error->message));
        g_error_free(error);
        ckptfs_catalog_free(joined);
        return;
    }
    if (source->model_catalog == NULL)
        source->model_catalog = source->catalog;
    else
        ckptfs_catalog_free(source->catalog);
    source->catalog = joined;
}

/* A source hf/ writes from its catalog (a Megatron one: no weight files of its own), of an
 * architecture whose releases save the tensors under the module names (Qwen3-VL's
 * model.language_model.*, model.visual.*): hf/ gets those names, the Megatron views keep reading
 * the rules' names. A clash is a warning (hf/ then keeps the rules' names). */
static void name_as_released(CkptfsSource *source)
{
    if (source->config == NULL || source->model_problem != NULL || source->weight_files->len > 0)
        return;
    const CkptfsArchitecture *arch = ckptfs_source_architecture(source);
    /* a catalog already under the module names (verl's FSDP shards of transformers' model) stays */
    if (arch == NULL || arch->module_names == NULL || !arch->released_under_module_names ||
        holds_module_names(source->catalog, arch))
        return;
    g_autoptr(GPtrArray) reversed = g_ptr_array_new(); /* the pairs the other way: the rules' names first */
    for (const char *const *p = arch->module_names; p[0] && p[1]; p += 2) {
        g_ptr_array_add(reversed, (gpointer)p[1]);
        g_ptr_array_add(reversed, (gpointer)p[0]);
    }
    g_ptr_array_add(reversed, NULL);
    g_autofree char *clash = NULL;
    CkptfsCatalog *renamed = ckptfs_catalog_copy_renamed(source->catalog, (const char *const *)reversed->pdata, &clash);
    if (renamed == NULL) {
        g_ptr_array_add(source->warnings, g_strdup_printf("%s: hf/ keeps the rules' names: tensor '%s' would be "
                                                          "there twice under %s's module names", source->dir,
                                                          clash, arch->hf_architecture));
        return;
    }
    if (source->model_catalog == NULL)
        source->model_catalog = source->catalog;
    else
        ckptfs_catalog_free(source->catalog);
    source->catalog = renamed;
}

/* -o frame_cache below one frame of a packed source would keep no frame between two reads of
 * it: every read would decode its frame again. Refused, naming the file and the size it needs,
 * rather than raised behind the user's back. */
static bool check_frame_cache(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    unsigned index = 0;
    uint32_t largest = ckptfs_srcfiles_largest_frame(source->files, &index);
    if (options->frame_cache == 0 || options->frame_cache >= largest)
        return true;
    return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "option frame_cache: %" G_GUINT64_FORMAT " bytes is less than "
                       "one frame of %s (%u bytes): the cache keeps whole frames; give at least frame_cache=%u",
                       options->frame_cache, ckptfs_srcfiles_get(source->files, index)->path, largest, largest);
}

CkptfsSource *ckptfs_source_open(const char *path, const CkptfsOptions *options, GError **error)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: %s", path, g_strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                    "%s: not a directory (give the checkpoint's directory)", path);
        return NULL;
    }
    CkptfsSource *source = g_new0(CkptfsSource, 1);
    source->dir = g_strdup(path);
    source->files = ckptfs_srcfiles_new(0);
    if (options->frame_cache)
        ckptfs_srcfiles_set_frame_cache(source->files, options->frame_cache);
    source->catalog = ckptfs_catalog_new();
    source->top_files = g_ptr_array_new_with_free_func(source_file_free);
    source->weight_files = g_ptr_array_new_with_free_func(g_free);
    source->warnings = g_ptr_array_new_with_free_func(g_free);
    source->saved_layout = (CkptfsLayout){.tp = 1, .pp = 1, .vpp = 1};
    for (size_t i = 0; i < G_N_ELEMENTS(formats) && source->format == NULL; i++)
        if (formats[i]->probe(path, options))
            source->format = formats[i];
    if (!source->format->open(source, options, error) || !check_frame_cache(source, options, error)) {
        ckptfs_source_free(source);
        return NULL;
    }
    bool dequantized = false;
    if (!dequantize_fp8(source, options, &dequantized, error) ||
        !dequantize_mxfp4(source, options, &dequantized, error)) {
        ckptfs_source_free(source);
        return NULL;
    }
    if (!split_experts_as_saved(source, error)) { /* before serve_dtype: the experts count as converted */
        ckptfs_source_free(source);
        return NULL;
    }
    serve_dtype(source, options, dequantized);
    rename_modules(source); /* first: the experts are split under the rules' names */
    split_fused_experts(source, options);
    join_fused_experts(source);
    name_as_released(source); /* last: the experts are joined under the rules' names */
    return source;
}

void ckptfs_source_free(CkptfsSource *source)
{
    if (source == NULL)
        return;
    g_free(source->dir);
    ckptfs_catalog_free(source->catalog);
    ckptfs_catalog_free(source->model_catalog);
    ckptfs_catalog_free(source->adapter);
    if (source->adapter_config)
        json_object_unref(source->adapter_config);
    g_ptr_array_unref(source->top_files);
    g_ptr_array_unref(source->weight_files);
    g_ptr_array_unref(source->warnings);
    g_free(source->found);
    if (source->config)
        json_object_unref(source->config);
    g_free(source->config_problem);
    g_free(source->model_problem);
    ckptfs_srcfiles_free(source->files);
    g_free(source);
}

const CkptfsCatalog *ckptfs_source_model_catalog(const CkptfsSource *source)
{
    return source->model_catalog ? source->model_catalog : source->catalog;
}

const CkptfsSourceFile *ckptfs_source_top_file(const CkptfsSource *source, const char *name)
{
    /* top_files is sorted by name: binary search. */
    guint lo = 0, hi = source->top_files->len;
    while (lo < hi) {
        guint mid = lo + (hi - lo) / 2;
        const CkptfsSourceFile *f = g_ptr_array_index(source->top_files, mid);
        int c = strcmp(f->name, name);
        if (c == 0)
            return f;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
