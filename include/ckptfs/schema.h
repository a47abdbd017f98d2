/* The model description as one table, like the mapping table is one for tensors: each row a
 * field of CkptfsModel with its names in config.json (transformers 4 and 5 spellings, members
 * of rope_scaling / rope_parameters), its Megatron argument, its type, defaults, limits and
 * whether it changes what the model computes. Reading and writing config.json, reading and
 * writing Megatron args are four walks of it (MoE routing, shared experts and dense-layer
 * patterns stay with the architecture's rules: they are structure, not one value each). */
#ifndef CKPTFS_SCHEMA_H
#define CKPTFS_SCHEMA_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stddef.h>

#include "ckptfs/model.h"
#include "ckptfs/pickle.h"
#include "ckptfs/value.h"

typedef enum {
    CKPTFS_FIELD_UINT,       /* a positive integer (uint64_t) */
    CKPTFS_FIELD_COUNT,      /* an integer, 0 or null meaning none (uint64_t) */
    CKPTFS_FIELD_FLOAT,      /* a number (double) */
    CKPTFS_FIELD_BOOL,       /* bool */
    CKPTFS_FIELD_ROPE_TYPE,  /* the rope scaling's kind, a name (CkptfsRopeType) */
    CKPTFS_FIELD_ACTIVATION, /* the MLP's activation, a name: SwiGLU's silu only, or the row's
                                choice[0] (no member) */
    CKPTFS_FIELD_WINDOW,     /* a sliding attention window: Megatron's views have none (no member) */
    CKPTFS_FIELD_TOKEN_ID,   /* a tokenizer id as given: absent, null, one or a list (CkptfsTokenIds);
                                its argument a dict of them under config.json's names */
} CkptfsFieldType;

/* Which models have a field. */
typedef enum {
    CKPTFS_FOR_ALL,
    CKPTFS_FOR_MHA,    /* attention with q/k/v projections (not multi-head latent) */
    CKPTFS_FOR_MLA,    /* multi-head latent attention */
    CKPTFS_FOR_MOE,    /* mixtures of experts */
    CKPTFS_FOR_LLAMA3, /* rope scaled the Llama 3 way */
    CKPTFS_FOR_YARN,   /* rope scaled by YaRN (MLA models) */
    CKPTFS_FOR_PLAIN_ROPE,  /* one rope for every layer (all but Gemma's attention) */
    CKPTFS_FOR_LINEAR_ROPE, /* Gemma 3's full-attention layers' rope scaled linearly */
    CKPTFS_FOR_VISION, /* a vision-language model's vision tower and merger (its vision part;
                          read by ckptfs_schema_read_vision, not with the language model) */
    CKPTFS_FOR_LINEAR_ATTENTION, /* hybrid architectures' gated delta-net layers */
    CKPTFS_FOR_GLM4V_VISION, /* GLM-4.1V's vision tower (Glm4vVisionConfig's fields and defaults;
                                read like CKPTFS_FOR_VISION's, for architectures that name it) */
    CKPTFS_FOR_VISION_DEEPSTACK, /* Qwen3-VL's vision tower (Qwen3VLVisionConfig's fields and defaults),
                                    read like CKPTFS_FOR_VISION */
    CKPTFS_FOR_GEMMA_ATTENTION,  /* Gemma's attention (CkptfsArchitecture.gemma_attention) */
    CKPTFS_FOR_SIGLIP_VISION,    /* Gemma 3's SigLIP tower (SiglipVisionConfig's fields and defaults)
                                    and its projector's image tokens, read like CKPTFS_FOR_VISION */
} CkptfsFieldScope;

/* Where a default that is not one number comes from. */
typedef enum {
    CKPTFS_DERIVED_NONE,
    CKPTFS_DERIVED_HEADS,      /* num_attention_heads (key/value heads: no grouping) */
    CKPTFS_DERIVED_HEAD_DIM,   /* hidden_size / num_attention_heads */
    CKPTFS_DERIVED_FFN,        /* the dense ffn size (Megatron's moe_ffn_hidden_size) */
    CKPTFS_DERIVED_ROPE_THETA, /* the architecture's transformers default (Mixtral: 1e6) */
    CKPTFS_DERIVED_NORM_EPS,   /* the architecture's transformers default (Phi-3, Mixtral: 1e-5) */
    /* the architecture's partial_rotary_factor where it honours one (GLM-4.5: 0.5); FIXED at
     * the row's default for the others */
    CKPTFS_DERIVED_ROTARY_PERCENT,
    CKPTFS_DERIVED_MAX_POSITIONS, /* the architecture's transformers default (Llama: 2048) */
    CKPTFS_DERIVED_SHARED_GATE, /* the architecture's (Qwen2-MoE's shared expert is gated), with one */
    CKPTFS_DERIVED_GLU_CLAMP,  /* the architecture's clamped GLU (GPT-OSS: 7), fixed by its class */
    CKPTFS_DERIVED_TIED,       /* the architecture's transformers default (Gemma 3 ties the embeddings) */
    CKPTFS_DERIVED_QKV_BIAS,   /* the architecture's transformers default (GLM-4.5V's attention_bias) */
    CKPTFS_DERIVED_SIGMOID,    /* the architecture's routing: DeepSeek-V3's sigmoid scores and
                                  expert bias (CkptfsMoeConfig.sigmoid_routing) */
} CkptfsFieldDerived;

/* The name of a field in config.json that depends on the architecture. */
typedef enum {
    CKPTFS_ARCH_KEY_NONE,
    CKPTFS_ARCH_KEY_EXPERTS,    /* CkptfsMoeConfig.experts_key */
    CKPTFS_ARCH_KEY_EXPERT_FFN, /* CkptfsMoeConfig.ffn_key */
    CKPTFS_ARCH_KEY_QK_NORM,    /* CkptfsArchitecture.qk_norm_key */
    CKPTFS_ARCH_KEY_SHARED_FFN, /* CkptfsMoeConfig.shared_ffn_key (only that name) */
} CkptfsFieldArchKey;

enum {
    CKPTFS_FIELD_REQUIRED = 1u << 0,      /* no default: absent is an error */
    CKPTFS_FIELD_MATH = 1u << 1,          /* changes what the model computes */
    CKPTFS_FIELD_FIXED = 1u << 2,         /* Megatron has only the default: another value is refused */
    CKPTFS_FIELD_ARGS_NEGATED = 1u << 3,  /* the argument is the negation (untie_...) */
    CKPTFS_FIELD_ARGS_INTEGER = 1u << 4,  /* a number Megatron takes as an integer (rotary_base) */
    CKPTFS_FIELD_NULL_WHEN_ZERO = 1u << 5, /* a COUNT or FLOAT of 0 written as null */
    CKPTFS_FIELD_OMIT_ZERO = 1u << 6,     /* a COUNT of 0 (or false) not written to config.json */
    CKPTFS_FIELD_ARCH_HAS_IT = 1u << 7,   /* a BOOL the architecture may force on (Qwen2's q/k/v bias,
                                             Qwen3's q/k norm): not written to config.json then */
    CKPTFS_FIELD_ARGS_OPTIONAL = 1u << 8, /* REQUIRED in config.json, but args may leave it out: 0
                                             then, for the caller (vocab_size: the padded one) */
    /* Routing fields (CkptfsMoeConfig): */
    CKPTFS_FIELD_DEEPSEEK_ONLY = 1u << 9, /* its config.json names are DeepSeek's routing
                                             (deepseek_config): another MoE's config with one is
                                             refused by name, its rules not being that routing */
    CKPTFS_FIELD_DEEPSEEK_REQUIRED = 1u << 10, /* a DeepSeek config must give it: transformers'
                                                  defaults differ between V2 and V3 */
    CKPTFS_FIELD_SIGMOID_ONLY = 1u << 11, /* read from config.json only for sigmoid routing
                                             (DeepSeek-V3's expert groups): V2's is ignored */
    CKPTFS_FIELD_ARCH_FIXED = 1u << 12,   /* config.json may say only the architecture's value
                                             (its derived default): another is refused */
    CKPTFS_FIELD_TIMES_EXPERT_FFN = 1u << 13, /* a count of expert-sized MLPs, kept as their width
                                                 (DeepSeek's n_shared_experts): not in args */
    CKPTFS_FIELD_DEFAULT_AS_ZERO = 1u << 14,  /* transformers' default (1: no groups, no scaling)
                                                 kept as 0; 0 written as that default, None in args */
    CKPTFS_FIELD_ZERO_AS_DEFAULT = 1u << 15,  /* 0 written as transformers' default, None in args */
    CKPTFS_FIELD_ARGS_CHOICE = 1u << 16,  /* a CHOICE flag that args take by name too (else a bool) */
    CKPTFS_FIELD_OMIT_DEFAULT = 1u << 17, /* not written to config.json at transformers' default */
    /* absent from config.json, the expert's size where the architecture has no dense MLP
     * (CkptfsMoeConfig.ffn_from_expert: Qwen3.5-MoE's config has no intermediate_size, and
     * mbridge gives Megatron's ffn_hidden_size moe_intermediate_size); not written when equal */
    CKPTFS_FIELD_EXPERT_FFN_FALLBACK = 1u << 18,
    /* config.json may leave it out (transformers' default), args may not: Megatron has no
     * default for it (mbridge's Gemma3TransformerConfig fields), so absent is refused by name */
    CKPTFS_FIELD_ARGS_REQUIRED = 1u << 19,
    /* a FLOAT config.json has as an integer (transformers 5 validates the type: Gemma's
     * query_pre_attn_scalar): written as one when whole */
    CKPTFS_FIELD_HF_INTEGER = 1u << 20,
};

typedef struct {
    const char *field;       /* CkptfsModel's member, as inspect names it */
    CkptfsFieldType type;
    size_t offset;           /* of the member in CkptfsModel */
    CkptfsFieldScope scope;
    /* Names in config.json, the one written first (transformers 4's top-level field, which 5
     * reads too); "a.b" is member b of object a. NULL-terminated. */
    const char *hf[6];
    CkptfsFieldArchKey arch_key; /* read and written under the architecture's name too */
    const char *args;        /* Megatron's argument (NULL: none) */
    const char *args_old;    /* an older name of it, read when the first is absent */
    unsigned flags;          /* CKPTFS_FIELD_* */
    /* What transformers takes when config.json leaves it out, what Megatron takes when args do
     * (each loader's own default, never a guess; the field's value, also for a negated
     * argument); FIXED: the one value Megatron has. */
    double hf_default, args_default;
    CkptfsFieldDerived derived; /* a default that follows from other fields */
    /* a number's limits, min < value <= max; integers are positive (UINT) or not negative
     * (COUNT) here, their upper limits checked with the whole model (ckptfs_model_check_limits)
     * except a TIMES_EXPERT_FFN count's */
    double min, max;
    /* a BOOL that config.json gives as a name: CHOICE[0] for false, CHOICE[1] for true
     * (scoring_func softmax / sigmoid) */
    const char *choice[2];
} CkptfsModelField;

/* The table, and its number of rows. */
const CkptfsModelField *ckptfs_schema_fields(size_t *count);

/* Whether MODEL has FIELD (its scope). */
bool ckptfs_schema_applies(const CkptfsModelField *field, const CkptfsModel *model);

/* FIELD's value in MODEL as text ("1e+06", "true", "llama3"), for inspect. */
char *ckptfs_schema_value_text(const CkptfsModelField *field, const CkptfsModel *model);

/* The first name of CONFIG's "architectures" list, or NULL. */
const char *ckptfs_schema_config_architecture(JsonObject *config);

/* The language model's part of CONFIG, which the walks read as a text model's config.json: for
 * a vision-language model (PART: "text_config"), the members of that object over those at the
 * top level (releases wrote the language model's fields at the top, transformers 5 writes them
 * under text_config, some configs both: a member in both must be the same value); without PART
 * or that object, CONFIG. A new reference; NULL with an error naming both members when they
 * disagree or PART is not an object. */
JsonObject *ckptfs_schema_text_config(JsonObject *config, const char *part, GError **error);

/* Walk 1: MODEL's fields from CONFIG (MODEL's arch and mla set; arch may be NULL for a config
 * without one: dense, its defaults). Every name of a field is read: two that disagree, a value
 * of the wrong type or out of limits, a form with no Megatron equivalent (a rope type, a
 * sliding window, a member of rope_parameters not understood) are errors naming config.json
 * and the field. */
bool ckptfs_schema_read_config(JsonObject *config, CkptfsModel *model, GError **error);

/* The vision tower's fields of a vision-language model (MODEL's arch has a vision part, which
 * CONFIG holds): the rows of its scope, then every member of the part must be one a row reads or
 * one known to leave the weights' math alone (model_type, initializer_range, the dtype, and
 * fullatt_block_indexes, which the architecture's walk reads); another is refused by name. */
bool ckptfs_schema_read_vision(JsonObject *config, CkptfsModel *model, GError **error);
/* MODEL's vision fields into CONFIG (its vision part and the top-level image/video token ids),
 * under the release's names: what ckptfs_schema_read_vision reads back. */
void ckptfs_schema_write_vision(const CkptfsModel *model, JsonObject *config);

/* Walk 2: CONFIG's fields for MODEL, as transformers 4 writes them (5 reads them too). */
void ckptfs_schema_write_config(const CkptfsModel *model, JsonObject *config);

/* Walk 3: MODEL's fields from ARGS (a Megatron args Namespace; PATH names it in errors), with
 * Megatron's defaults. MODEL's experts (num_experts) and mla (multi_latent_attention) are read
 * first: they say which rows apply. */
bool ckptfs_schema_read_args(const CkptfsPy *args, const char *path, CkptfsModel *model, GError **error);

/* Walk 3 again once MODEL's architecture is picked: the rows only an architecture makes apply
 * (Gemma's rope base and query scalar), and the MLP the args say checked against the
 * architecture's (a gated tanh GELU is left to this pass when none is known yet). */
bool ckptfs_schema_read_args_for_arch(const CkptfsPy *args, const char *path, CkptfsModel *model, GError **error);

/* "default", "llama3", "yarn", "linear": TYPE as config.json names it. */
const char *ckptfs_rope_type_name(CkptfsRopeType type);

/* Walk 4: MODEL's fields into ARGS (a Namespace value). */
void ckptfs_schema_write_args(const CkptfsModel *model, CkptfsValue *args);

#endif
