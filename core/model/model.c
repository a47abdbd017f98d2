#include "ckptfs/model.h"

#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/fused.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/mcore.h"
#include "ckptfs/schema.h"

static const CkptfsMoeConfig mixtral_moe = {"num_local_experts", "intermediate_size", .always_renormalize = true,
                                            .saved_per_expert = &ckptfs_saved_mixtral};
/* saved_per_expert: transformers 5.12.1 holds the experts fused and its save_pretrained writes
 * them one by one (its qwen2_moe conversion, which qwen3_moe, qwen3_next, deepseek_v2,
 * deepseek_v3, glm4_moe and qwen3_5_moe_text share, Qwen3.5-MoE's VLM its language model),
 * Mixtral's under its own names (ckptfs_saved_mixtral); GPT-OSS saves them fused */
static const CkptfsMoeConfig qwen2_moe_config = {"num_experts", "moe_intermediate_size",
                                                 "shared_expert_intermediate_size", .shared_gate = true,
                                                 .dense_layers = true, .saved_per_expert = &ckptfs_saved_per_expert};
/* transformers 5 loads a Qwen3-MoE checkpoint with its experts fused as it holds them in memory */
static const CkptfsFusedExperts *const transformers5_fused[] = {&ckptfs_fused_in_memory, NULL};
static const CkptfsMoeConfig qwen3_moe_config = {"num_experts", "moe_intermediate_size", .dense_layers = true,
                                                 .fused_forms = transformers5_fused,
                                                 .saved_per_expert = &ckptfs_saved_per_expert};
/* Qwen3.5-MoE: every layer MoE (no mlp_only_layers, decoder_sparse_step), the top-k always
 * renormalised (no norm_topk_prob), a gated shared expert; transformers 5 saves the experts per
 * expert and holds them fused */
static const CkptfsMoeConfig qwen3_5_moe_config = {"num_experts", "moe_intermediate_size",
                                                   "shared_expert_intermediate_size", .shared_gate = true,
                                                   .always_renormalize = true, .ffn_from_expert = true,
                                                   .fused_forms = transformers5_fused,
                                                   .saved_per_expert = &ckptfs_saved_per_expert};
/* Qwen3-Next: Qwen2-MoE's experts; its releases hold them per expert, transformers 5 holds them
 * fused (its Qwen2-MoE conversion), and both forms are read */
static const CkptfsMoeConfig qwen3_next_moe_config = {"num_experts", "moe_intermediate_size",
                                                      "shared_expert_intermediate_size", .shared_gate = true,
                                                      .dense_layers = true, .fused_forms = transformers5_fused,
                                                      .saved_per_expert = &ckptfs_saved_per_expert};
static const CkptfsMoeConfig deepseek_v2_moe = {"n_routed_experts", "moe_intermediate_size",
                                                .shared_count_key = "n_shared_experts",
                                                .deepseek_config = true, .saved_per_expert = &ckptfs_saved_per_expert};
/* DeepSeek-V3's, GLM-4.5's and GLM-4.5V's: transformers 5 holds the experts fused, saves them one by one */
static const CkptfsMoeConfig deepseek_v3_moe = {"n_routed_experts", "moe_intermediate_size",
                                                .shared_count_key = "n_shared_experts",
                                                .deepseek_config = true, .sigmoid_routing = true,
                                                .saved_per_expert = &ckptfs_saved_per_expert};

static const CkptfsArchitecture llama = {"LlamaForCausalLM", "llama", false, false, &ckptfs_family_llama, NULL, false, 0, 0, 0, false, 0, 0,
                                         .max_positions = 2048, .attention_bias_on_output = true};
static const CkptfsArchitecture mistral = {"MistralForCausalLM", "mistral", false, false, &ckptfs_family_llama, NULL, false, 0, 0,
                                           .sliding_window = 4096, .kv_heads = 8, .max_positions = 131072};
static const CkptfsArchitecture qwen2 = {"Qwen2ForCausalLM", "qwen2", true, false, &ckptfs_family_llama, NULL, false, 0, 0,
                                         .sliding_window = 4096, .window_opt_in = true, .kv_heads = 32,
                                         .max_positions = 32768};
static const CkptfsArchitecture qwen3 = {"Qwen3ForCausalLM", "qwen3", false, true, &ckptfs_family_llama, NULL, false, 0, 0,
                                         .sliding_window = 4096, .window_opt_in = true, .kv_heads = 32, .head_dim = 128,
                                         .max_positions = 32768, .attention_bias_on_output = true};
static const CkptfsArchitecture phi3 = {"Phi3ForCausalLM", "phi3", false, false, &ckptfs_family_phi3, NULL, false,
                                        0, 1e-5, 0, false, 0, 0, .max_positions = 4096};
static const CkptfsArchitecture mixtral = {"MixtralForCausalLM", "mixtral", false, false,
                                           &ckptfs_family_mixtral, &mixtral_moe, false, 1e6, 1e-5, 0, false, 8, 0,
                                           .max_positions = 131072};
static const CkptfsArchitecture qwen2_moe = {"Qwen2MoeForCausalLM", "qwen2_moe", true, false,
                                             &ckptfs_family_qwen_moe, &qwen2_moe_config, false, 0, 0,
                                             .sliding_window = 4096, .window_opt_in = true, .kv_heads = 16,
                                             .max_positions = 32768};
static const CkptfsArchitecture qwen3_moe = {"Qwen3MoeForCausalLM", "qwen3_moe", false, true,
                                             &ckptfs_family_qwen_moe, &qwen3_moe_config, false, 0, 0,
                                             .sliding_window = 4096, .window_opt_in = true, .kv_heads = 4,
                                             .max_positions = 32768, .attention_bias_on_output = true};
static const CkptfsArchitecture deepseek_v3 = {"DeepseekV3ForCausalLM", "deepseek_v3", false, false,
                                               &ckptfs_family_deepseek, &deepseek_v3_moe, true, 0, 0, 0, false, 0, 0,
                                               .max_positions = 4096};
static const CkptfsArchitecture deepseek_v2 = {"DeepseekV2ForCausalLM", "deepseek_v2", false, false,
                                               &ckptfs_family_deepseek, &deepseek_v2_moe, true, 0, 0, 0, false, 0, 0,
                                               .max_positions = 2048};
/* GLM-4.5/4.6: DeepSeek-V3's MoE config; optional attention biases and q/k norms; half of each
 * head rotated unless partial_rotary_factor says otherwise (transformers' defaults: 8 key/value
 * heads, rms_norm_eps 1e-5) */
static const CkptfsArchitecture glm4_moe = {"Glm4MoeForCausalLM", "glm4_moe", false, false,
                                            &ckptfs_family_glm4_moe, &deepseek_v3_moe, false, 0, 1e-5,
                                            .kv_heads = 8, .qk_norm_key = "use_qk_norm",
                                            .partial_rotary = 0.5, .max_positions = 131072};
/* MiMo: Qwen2 (MiMoConfig is Qwen2Config's) with multi-token prediction layers of its own */
static const CkptfsArchitecture mimo = {"MiMoForCausalLM", "mimo", true, false, &ckptfs_family_mimo, NULL, false, 0, 0,
                                        .sliding_window = 4096, .window_opt_in = true, .kv_heads = 32,
                                        .max_positions = 32768};
/* Qwen2.5-VL: Qwen2's language model (Qwen2_5_VLTextConfig's defaults: 8 key/value heads,
 * rms_norm_eps 1e-5, 32768 positions, rope_theta 1e6) in text_config, or at the top level as the
 * release wrote it; a window-attention ViT and its patch merger in vision_config */
static const CkptfsArchitecture qwen2_5_vl_vision = {"Qwen2_5_VisionTransformerPretrainedModel", "qwen2_5_vl_vision",
                                                     true, false, &ckptfs_family_qwen2_5_vl_vision, NULL, false,
                                                     .megatron_prefix = "vision_model.",
                                                     .hf_layer_prefix = "visual.blocks."};
/* transformers >= 4.52 holds (and Qwen3-VL's releases save) the language model and the tower
 * under model.language_model. and model.visual.; the Qwen2.5-VL release under model. and visual. */
static const char *const qwen2_5_vl_module_names[] = {"model.language_model.", "model.", "model.visual.", "visual.",
                                                      NULL};
/* Qwen2_5_VLVisionConfig's fullatt_block_indexes */
static const CkptfsVisionBlocks full_attention_blocks = {"fullatt_block_indexes",
                                                          offsetof(CkptfsModel, vision_full_attention),
                                                          {7, 15, 23, 31}, 4, false};
/* Megatron-Bridge's qwen25_vl bridge: the same language model, the tower as transformers' module
 * under visual. (Qwen25VLModel registers it before language_model, as mbridge does) */
static const CkptfsArchitecture qwen2_5_vl_hf_vision = {"Qwen2_5_VisionTransformerPretrainedModel",
                                                        "qwen2_5_vl_vision", true, false,
                                                        &ckptfs_family_qwen2_5_vl_hf_vision, NULL, false,
                                                        .megatron_prefix = "visual.",
                                                        .hf_layer_prefix = "visual.blocks.", .layer_prefix = "blocks."};
#define QWEN2_5_VL(tower_, bridge_)                                                                      \
    {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", true, false, &ckptfs_family_llama, NULL, false, \
     1e6, 1e-5, .sliding_window = 4096, .window_opt_in = true, .kv_heads = 8, .max_positions = 32768,   \
     .text_part = "text_config", .vision_part = "vision_config", .vision = (tower_),                   \
     .megatron_prefix = "language_model.", .module_names = qwen2_5_vl_module_names,                    \
     .saved_names = qwen2_5_vl_module_names, .vision_blocks = &full_attention_blocks,                  \
     .megatron_bridge = (bridge_)}
static const CkptfsArchitecture qwen2_5_vl_bridge;
static const CkptfsArchitecture qwen2_5_vl = QWEN2_5_VL(&qwen2_5_vl_vision, &qwen2_5_vl_bridge);
static const CkptfsArchitecture qwen2_5_vl_bridge = QWEN2_5_VL(&qwen2_5_vl_hf_vision, &qwen2_5_vl_bridge);
/* GLM-4.1V (Glm4vForConditionalGeneration): GLM-4's language model in text_config (q/k/v biases,
 * half of each head rotated, post-attention and post-MLP norms, gate_up_proj fused;
 * Glm4vTextConfig's defaults: 2 key/value heads, rms_norm_eps 1e-5, 32768 positions) with mrope,
 * and a ViT with a learned position embedding, a downsampling Conv2d and a gated merger in
 * vision_config (Glm4vVisionConfig's rows). mbridge keeps that tower as transformers' own module,
 * whole on every rank (glm4v_vision), and its language model has the glm4 rules, but its
 * interleaved mrope has no Megatron-core args (rotates_interleaved_pairs): hf/ only, said by name.
 * The release and transformers 5 name the tensors as the modules: model.language_model.,
 * model.visual., lm_head. */
/* GLM-4.1V's and GLM-4.5V's tower: transformers' own module, as mbridge's glm4v and glm4v_moe
 * bridges build it (glm4v_vision_rules) */
static const CkptfsArchitecture glm4v_vision = {"Glm4vMoeVisionModel", "glm4v_moe_vision", true, false,
                                                &ckptfs_family_glm4v_vision, NULL, false,
                                                .megatron_prefix = "vision_model.",
                                                .hf_layer_prefix = "visual.blocks.", .layer_prefix = "blocks."};
static const CkptfsArchitecture glm4v = {"Glm4vForConditionalGeneration", "glm4v", true, false, &ckptfs_family_glm4,
                                         NULL, false, 0, 1e-5, .kv_heads = 2, .partial_rotary = 0.5,
                                         .max_positions = 32768, .text_part = "text_config",
                                         .vision_part = "vision_config", .vision = &glm4v_vision,
                                         .vision_fields = CKPTFS_FOR_GLM4V_VISION, .megatron_prefix = "language_model.",
                                         .module_names = qwen2_5_vl_module_names,
                                         .released_under_module_names = true, .released_text_part = true,
                                         .rotates_interleaved_pairs = true};
/* GLM-4.5V (Glm4vMoeForConditionalGeneration): GLM-4.5's language model (Glm4vMoeTextConfig's
 * defaults: 8 key/value heads, 65536 positions, half of each head rotated, q/k/v biases, no q/k
 * norms) with mrope over the rotated half's frequencies, pairing halves as Megatron-core's mrope
 * does, and GLM-4.1V's tower (Glm4vMoeVisionConfig has Glm4vVisionConfig's fields and defaults).
 * mbridge's glm4v_moe bridge: the language model as its glm4moe one under language_model., the
 * tower as transformers' own module under vision_model. (docs/vlm.md). The release and
 * transformers 5 name the tensors as the modules. */
/* Megatron-Bridge's glm_45v bridge: the same language model, the tower as transformers' module
 * under visual. (GLM45VModel registers it before language_model, on the first stage, as mbridge
 * does under vision_model.) */
static const CkptfsArchitecture glm4v_hf_vision = {"Glm4vMoeVisionModel", "glm4v_moe_vision", true, false,
                                                   &ckptfs_family_glm4v_vision, NULL, false,
                                                   .megatron_prefix = "visual.",
                                                   .hf_layer_prefix = "visual.blocks.", .layer_prefix = "blocks."};
#define GLM4V_MOE(tower_, bridge_)                                                                          \
    {"Glm4vMoeForConditionalGeneration", "glm4v_moe", false, false, &ckptfs_family_glm4_moe, &deepseek_v3_moe, \
     false, 0, 1e-5, .kv_heads = 8, .biased_by_default = true, .partial_rotary = 0.5, .max_positions = 65536, \
     .text_part = "text_config", .vision_part = "vision_config", .vision = (tower_),                        \
     .vision_fields = CKPTFS_FOR_GLM4V_VISION, .megatron_prefix = "language_model.",                        \
     .module_names = qwen2_5_vl_module_names, .released_under_module_names = true, .released_text_part = true, \
     .megatron_bridge = (bridge_)}
static const CkptfsArchitecture glm4v_moe_bridge;
static const CkptfsArchitecture glm4v_moe = GLM4V_MOE(&glm4v_vision, &glm4v_moe_bridge);
static const CkptfsArchitecture glm4v_moe_bridge = GLM4V_MOE(&glm4v_hf_vision, &glm4v_moe_bridge);
/* Qwen3-VL: Qwen3's language model (q/k norms, no q/k/v bias; Qwen3VLTextConfig's defaults: 32
 * key/value heads of 128, rope_theta 5e5, 128000 positions) in text_config, saved under the
 * module names; a ViT with a learned position embedding and deepstack mergers (Qwen3VLVisionConfig)
 * in vision_config, named as mbridge's qwen3_vl bridge names it (docs/vlm.md). */
static const CkptfsArchitecture qwen3_vl_vision = {"Qwen3VLVisionModel", "qwen3_vl_vision", true, false,
                                                   &ckptfs_family_qwen3_vl_vision, NULL, false,
                                                   .megatron_prefix = "vision_model.",
                                                   .hf_layer_prefix = "visual.blocks.",
                                                   .list_prefix = "decoder.deepstack_merger_list.",
                                                   .list_hf_prefix = "visual.deepstack_merger_list."};
static const CkptfsVisionBlocks deepstack_blocks = {"deepstack_visual_indexes",
                                                     offsetof(CkptfsModel, vision_deepstack), {8, 16, 24}, 3,
                                                     true};
static const CkptfsArchitecture qwen3_vl = {"Qwen3VLForConditionalGeneration", "qwen3_vl", false, true,
                                            &ckptfs_family_llama, NULL, false, 5e5, 1e-6,
                                            .kv_heads = 32, .head_dim = 128, .max_positions = 128000,
                                            .attention_bias_on_output = true, .text_part = "text_config",
                                            .vision_part = "vision_config", .vision = &qwen3_vl_vision,
                                            .mrope_interleaved = true, .megatron_prefix = "language_model.",
                                            .module_names = qwen2_5_vl_module_names,
                                            .released_under_module_names = true, .released_text_part = true,
                                            .vision_fields = CKPTFS_FOR_VISION_DEEPSTACK,
                                            .vision_blocks = &deepstack_blocks,
                                            /* Megatron-Bridge's qwen3_vl bridge names the same tree */
                                            .megatron_bridge = &qwen3_vl};
/* Qwen3-VL-MoE: the same tower, Qwen3-MoE's language model (Qwen3VLMoeTextConfig's defaults: 16
 * key/value heads, rope_theta 5e5, 128000 positions; the top-k weights always renormalised), its
 * experts fused on disk: transposed as the releases hold them ([E, H, 2F], [E, F, H]), or as
 * transformers 5.12.1 holds them in memory and saves them ([E, 2F, H], [E, H, F]) */
static const CkptfsFusedExperts *const qwen3_vl_moe_fused[] = {&ckptfs_fused_transposed, &ckptfs_fused_in_memory,
                                                                NULL};
static const CkptfsMoeConfig qwen3_vl_moe_config = {"num_experts", "moe_intermediate_size", .dense_layers = true,
                                                    .always_renormalize = true, /* its router does */
                                                    .fused_forms = qwen3_vl_moe_fused,
                                                    /* what transformers 5 saves and reads whatever
                                                     * the sizes (the releases' transposed form is
                                                     * told apart by shape only when 2F != H) */
                                                    .hf_form = &ckptfs_fused_in_memory};
static const CkptfsArchitecture qwen3_vl_moe = {"Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", false, true,
                                                &ckptfs_family_qwen_moe, &qwen3_vl_moe_config, false, 5e5, 1e-6,
                                                .kv_heads = 16, .head_dim = 128, .max_positions = 128000,
                                                .attention_bias_on_output = true, .text_part = "text_config",
                                                .vision_part = "vision_config", .vision = &qwen3_vl_vision,
                                                .mrope_interleaved = true, .megatron_prefix = "language_model.",
                                                .module_names = qwen2_5_vl_module_names,
                                                .released_under_module_names = true, .released_text_part = true,
                                                .vision_fields = CKPTFS_FOR_VISION_DEEPSTACK,
                                                .vision_blocks = &deepstack_blocks,
                                                /* Megatron-Bridge's qwen3_vl bridge names the same tree */
                                                .megatron_bridge = &qwen3_vl_moe};
/* GPT-OSS: every layer MoE, softmax over the top-k logits (as Mixtral's), experts fused on disk
 * with gate and up interleaved; transformers' defaults: 8 key/value heads of 64, rope_theta
 * 150000, a window of 128 on every other layer (layer_types) */
static const CkptfsFusedExperts *const gpt_oss_fused[] = {&ckptfs_fused_interleaved, NULL};
static const CkptfsMoeConfig gpt_oss_moe = {"num_local_experts", "intermediate_size", .always_renormalize = true,
                                            .fused_forms = gpt_oss_fused, .hf_form = &ckptfs_fused_interleaved};
static const CkptfsArchitecture gpt_oss = {"GptOssForCausalLM", "gpt_oss", true, false, &ckptfs_family_gpt_oss,
                                           &gpt_oss_moe, false, 150000, 1e-5, .sliding_window = 128,
                                           .kv_heads = 8, .head_dim = 64, .max_positions = 131072,
                                           .linear_biases = true, .attention_sinks = true, .window_skip_freq = 2,
                                           .glu_clamp = 7, .yarn = true};
/* Qwen3-Next: gated delta-net layers among gated attention layers (q/k norms, a quarter of each
 * head rotated unless partial_rotary_factor says otherwise), zero-centred norms, Qwen2-MoE's
 * experts with a gated shared expert (transformers' defaults: 2 key/value heads, head_dim 256) */
static const CkptfsArchitecture qwen3_next = {"Qwen3NextForCausalLM", "qwen3_next", false, true,
                                              &ckptfs_family_qwen3_next, &qwen3_next_moe_config, false, 0, 0,
                                              .kv_heads = 2, .head_dim = 256, .partial_rotary = 0.25,
                                              .max_positions = 32768, .hybrid_attention = true,
                                              .attention_gate = true, .zero_centred_norms = true};
/* Qwen3.5's text model: Qwen3-Next's layers, dense (transformers' defaults: 4 key/value heads) */
static const CkptfsArchitecture qwen3_5_text = {"Qwen3_5ForCausalLM", "qwen3_5_text", false, true,
                                                &ckptfs_family_qwen3_5, NULL, false, 0, 0,
                                                .kv_heads = 4, .head_dim = 256, .partial_rotary = 0.25,
                                                .max_positions = 32768, .hybrid_attention = true,
                                                .attention_gate = true, .zero_centred_norms = true};
/* Gemma 3's text model: q/k norms, four zero-centred norms a layer, the embedding scaled by
 * sqrt(hidden_size), tied embeddings (also when config.json leaves tie_word_embeddings out, as the
 * 1B release does), the tanh-GELU gated MLP, a window on all layers but every
 * sixth (layer_types) whose rope has a base of its own; transformers' defaults: 4 key/value
 * heads of 256, rope_theta 1e6, a window of 4096, 131072 positions */
static const CkptfsArchitecture gemma3_text = {"Gemma3ForCausalLM", "gemma3_text", false, true, &ckptfs_family_gemma3,
                                               NULL, false, 1e6, 1e-6, .sliding_window = 4096, .kv_heads = 4,
                                               .head_dim = 256, .max_positions = 131072,
                                               .attention_bias_on_output = true, .window_skip_freq = 6,
                                               .zero_centred_norms = true, .activation = "gelu_pytorch_tanh",
                                               .scaled_embedding = true, .gemma_attention = true,
                                               .te_spec_only = true, .tied_by_default = true};
/* Qwen3.5's MoE text model: Qwen3.5's layers, Qwen3-Next's experts (transformers' defaults: 2
 * key/value heads) */
static const CkptfsArchitecture qwen3_5_moe_text = {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", false, true,
                                                    &ckptfs_family_qwen3_5_moe, &qwen3_5_moe_config, false, 0, 0,
                                                    .kv_heads = 2, .head_dim = 256, .partial_rotary = 0.25,
                                                    .max_positions = 32768, .hybrid_attention = true,
                                                    .attention_gate = true, .zero_centred_norms = true};
/* Gemma 3's VLM (Gemma3ForConditionalGeneration): Gemma 3's text model in text_config (Gemma3TextConfig's
 * defaults, as gemma3_text's), a SigLIP tower (SiglipVisionConfig's rows) and a projector that pools
 * its patches to mm_tokens_per_image tokens in vision_config. mbridge's gemma3 bridge builds the
 * language model first, with the post-norms as the layer's own (gemma3_vlm), then the tower
 * (CLIPViTModel, siglip) and the projector (docs/vlm.md); no virtual pipeline. transformers 5 saves
 * language_model.model.*, vision_tower.* and multi_modal_projector.*; the releases
 * vision_tower.vision_model.*: the rules read both as transformers 5's tower and the text family's
 * model.*. */
/* transformers 5.12.1 holds it under model.language_model., model.vision_tower.,
 * model.multi_modal_projector. and lm_head., and saves it under language_model.model.,
 * vision_tower., multi_modal_projector. and language_model.lm_head. */
static const char *const gemma3_saved_names[] = {"model.language_model.", "language_model.model.",
                                                 "model.vision_tower.", "vision_tower.",
                                                 "model.multi_modal_projector.", "multi_modal_projector.",
                                                 "lm_head.", "language_model.lm_head.", NULL};
static const CkptfsArchitecture siglip_vision = {"SiglipVisionModel", "siglip_vision_model", true, false,
                                                 &ckptfs_family_siglip_vision, NULL, false,
                                                 .megatron_prefix = "vision_model.",
                                                 .hf_layer_prefix = "vision_tower.encoder.layers."};
static const char *const gemma3_module_names[] = {"language_model.model.", "model.", "vision_tower.vision_model.",
                                                  "vision_tower.", NULL};
/* Megatron-Bridge's gemma3_vl bridge (Gemma3VLModel): transformers' SigLIP module as vision_tower and
 * its projector as multi_modal_projector, registered before the language model, which has the text
 * gemma3 family's names; its provider builds virtual pipeline stages (the tower on the first) */
static const CkptfsArchitecture siglip_hf_vision = {"SiglipVisionModel", "siglip_vision_model", true, false,
                                                    &ckptfs_family_siglip_hf_vision, NULL, false,
                                                    .megatron_prefix = "vision_tower.",
                                                    .hf_layer_prefix = "vision_tower.encoder.layers.",
                                                    .layer_prefix = "encoder.layers."};
#define GEMMA3_VLM(family_, tower_, mbridge_tree_, bridge_)                                            \
    {"Gemma3ForConditionalGeneration", "gemma3", false, true, (family_), NULL, false, 1e6, 1e-6,         \
     .sliding_window = 4096, .kv_heads = 4, .head_dim = 256, .max_positions = 131072,                   \
     .attention_bias_on_output = true, .window_skip_freq = 6, .zero_centred_norms = true,               \
     .activation = "gelu_pytorch_tanh", .scaled_embedding = true, .gemma_attention = true,              \
     .te_spec_only = true, .tied_by_default = true, .text_part = "text_config",                         \
     .vision_part = "vision_config", .vision = (tower_), .vision_fields = CKPTFS_FOR_SIGLIP_VISION,      \
     .megatron_prefix = "language_model.", .module_names = gemma3_module_names,                         \
     .language_first = (mbridge_tree_), .no_virtual_pipeline = (mbridge_tree_), .text_rope = true,      \
     .saved_names = gemma3_saved_names, .released_text_part = true, .released_under_module_names = true,   \
     .megatron_bridge = (bridge_)}
static const CkptfsArchitecture gemma3_bridge;
static const CkptfsArchitecture gemma3 = GEMMA3_VLM(&ckptfs_family_gemma3_vlm, &siglip_vision, true, &gemma3_bridge);
static const CkptfsArchitecture gemma3_bridge = GEMMA3_VLM(&ckptfs_family_gemma3, &siglip_hf_vision, false,
                                                           &gemma3_bridge);
/* Qwen3.5's releases (Qwen3_5ForConditionalGeneration): Qwen3.5's text model in text_config
 * (Qwen3_5TextConfig's defaults, as qwen3_5_text's) with interleaved mrope over the rotated quarter
 * of each head, and Qwen3-VL's tower without its deepstack mergers in vision_config (Qwen3-VL's
 * rows; Qwen3_5VisionConfig has no deepstack_visual_indexes). mbridge's qwen3_5 bridge keeps
 * that tower as transformers' own module under vision_model., named as transformers names it,
 * whole on every TP rank (docs/vlm.md). */
/* Megatron-Bridge's qwen35_vl bridge builds this tower as a Megatron-core ViT (Qwen3-VL's
 * vision_model.decoder.layers.N.*), not as transformers' module */
#define QWEN3_5_BRIDGE_NOTE                                                                          \
    "Megatron-Bridge's qwen35_vl bridge builds the tower as a Megatron-core ViT "                    \
    "(vision_model.decoder.layers.N.*), which has no rules yet"
static const CkptfsArchitecture qwen3_5_vision = {"Qwen3_5VisionModel", "qwen3_5_vision", true, false,
                                                  &ckptfs_family_qwen3_5_vision, NULL, false,
                                                  .megatron_prefix = "vision_model.",
                                                  .hf_layer_prefix = "visual.blocks.", .layer_prefix = "blocks."};
static const CkptfsArchitecture qwen3_5 = {"Qwen3_5ForConditionalGeneration", "qwen3_5", false, true,
                                           &ckptfs_family_qwen3_5, NULL, false, 0, 0,
                                           .kv_heads = 4, .head_dim = 256, .partial_rotary = 0.25,
                                           .max_positions = 32768, .hybrid_attention = true,
                                           .attention_gate = true, .zero_centred_norms = true,
                                           .text_part = "text_config", .vision_part = "vision_config",
                                           .vision = &qwen3_5_vision, .mrope_interleaved = true,
                                           .megatron_prefix = "language_model.",
                                           .module_names = qwen2_5_vl_module_names,
                                           .released_under_module_names = true, .released_text_part = true,
                                           .vision_fields = CKPTFS_FOR_VISION_DEEPSTACK,
                                           .bridge_names_note = QWEN3_5_BRIDGE_NOTE};
/* Qwen3.5-MoE's releases (Qwen3_5MoeForConditionalGeneration): Qwen3.5's MoE text model
 * (Qwen3_5MoeTextConfig's defaults, as qwen3_5_moe_text's) and the same tower */
static const CkptfsArchitecture qwen3_5_moe = {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", false, true,
                                               &ckptfs_family_qwen3_5_moe, &qwen3_5_moe_config, false, 0, 0,
                                               .kv_heads = 2, .head_dim = 256, .partial_rotary = 0.25,
                                               .max_positions = 32768, .hybrid_attention = true,
                                               .attention_gate = true, .zero_centred_norms = true,
                                               .text_part = "text_config", .vision_part = "vision_config",
                                               .vision = &qwen3_5_vision, .mrope_interleaved = true,
                                               .megatron_prefix = "language_model.",
                                               .module_names = qwen2_5_vl_module_names,
                                               .released_under_module_names = true, .released_text_part = true,
                                               .vision_fields = CKPTFS_FOR_VISION_DEEPSTACK,
                                               .bridge_names_note = QWEN3_5_BRIDGE_NOTE};
static const CkptfsArchitecture *const architectures[] = {&llama, &mistral, &qwen2, &qwen3, &phi3,
                                                          &mixtral, &qwen2_moe, &qwen3_moe,
                                                          &deepseek_v3, &deepseek_v2, &glm4_moe, &mimo,
                                                          &qwen2_5_vl, &gpt_oss, &qwen3_next, &qwen3_5_text,
                                                          &glm4v, &glm4v_moe, &qwen3_vl, &qwen3_vl_moe, &gemma3_text,
                                                          &qwen3_5_moe_text, &gemma3, &qwen3_5, &qwen3_5_moe, NULL};

const CkptfsArchitecture *const *ckptfs_architectures(void)
{
    return architectures;
}

/* Whether A is what a checkpoint with these features was made from. */
static bool features_match(const CkptfsArchitecture *a, const CkptfsModel *f, bool loose_bias)
{
    bool moe = f->experts > 0, shared = f->shared_ffn > 0;
    bool norms = a->qk_norm == f->qk_norm || a->qk_norm_key != NULL; /* GLM-4.5's are optional */
    if (a->vision_part != NULL) /* a text checkpoint's features never make a VLM */
        return false;
    if (a->hybrid_attention) /* a hybrid's checkpoint names its architecture */
        return false;
    if (a->mla != f->mla || (a->moe != NULL) != moe || a->attention_sinks != f->sinks ||
        a->linear_biases != f->linear_bias)
        return false;
    if (a->mla) /* DeepSeek-V3's routing or V2's */
        return a->moe->sigmoid_routing == f->sigmoid_scores;
    if (moe && a->moe->sigmoid_routing != f->sigmoid_scores) /* GLM-4.5's routing or Qwen's */
        return false;
    if (moe && (a->moe->shared_ffn_key != NULL || a->moe->shared_count_key != NULL) != shared)
        return false;
    /* Qwen2-MoE without a shared expert is not a Qwen2-MoE checkpoint; with one, its biases
     * and norms are what they are. */
    if (moe && shared)
        return norms;
    return (loose_bias || a->qkv_bias == f->qkv_bias) && norms;
}

const CkptfsArchitecture *ckptfs_architecture_find(const char *name, const CkptfsModel *features)
{
    for (const CkptfsArchitecture *const *a = architectures; *a; a++) {
        if (name ? strcmp(name, (*a)->model_type) == 0 || strcmp(name, (*a)->hf_architecture) == 0
                 : features_match(*a, features, false))
            return *a;
    }
    if (name)
        return NULL;
    /* Attention biases on a Qwen3-like or Mixtral-like model: their rules with attention_bias. */
    for (const CkptfsArchitecture *const *a = architectures; *a; a++)
        if (!(*a)->qkv_bias && features_match(*a, features, true))
            return *a;
    return NULL;
}

/* A set of layers, one bit a layer (layers past CKPTFS_MAX_LAYERS are never in it). */
static bool layer_in(const uint8_t *set, uint64_t layer)
{
    return layer < CKPTFS_MAX_LAYERS && (set[layer / 8] & (1u << (layer % 8)));
}

static void layer_add(uint8_t *set, uint64_t layer)
{
    if (layer < CKPTFS_MAX_LAYERS)
        set[layer / 8] |= (uint8_t)(1u << (layer % 8));
}

/* How many of M's layers satisfy IS. */
static uint64_t count_layers(const CkptfsModel *m, bool (*is)(const CkptfsModel *, uint64_t))
{
    uint64_t n = 0;
    for (uint64_t l = 0; l < m->layers; l++)
        n += is(m, l);
    return n;
}

bool ckptfs_model_layer_is_moe(const CkptfsModel *m, uint64_t layer)
{
    return m->experts > 0 && !layer_in(m->dense_layer, layer);
}

void ckptfs_model_set_dense_layer(CkptfsModel *m, uint64_t layer)
{
    layer_add(m->dense_layer, layer);
}

uint64_t ckptfs_model_moe_layers(const CkptfsModel *m)
{
    return count_layers(m, ckptfs_model_layer_is_moe);
}

bool ckptfs_model_layers_homogeneous(const CkptfsModel *m)
{
    uint64_t moe = ckptfs_model_moe_layers(m), linear = ckptfs_model_linear_layers(m);
    return (moe == 0 || moe == m->layers) && (linear == 0 || linear == m->layers);
}

bool ckptfs_model_layer_is_linear(const CkptfsModel *m, uint64_t layer)
{
    return layer_in(m->linear_layer, layer);
}

void ckptfs_model_set_linear_layer(CkptfsModel *m, uint64_t layer)
{
    layer_add(m->linear_layer, layer);
}

uint64_t ckptfs_model_linear_layers(const CkptfsModel *m)
{
    return count_layers(m, ckptfs_model_layer_is_linear);
}

char *ckptfs_hf_layer_name(uint64_t layer, const char *suffix)
{
    return g_strdup_printf(CKPTFS_HF_LAYER_PREFIX "%" G_GUINT64_FORMAT ".%s", layer, suffix);
}

uint64_t ckptfs_model_hf_layers(const CkptfsModel *m)
{
    return m->layers + (m->mtp ? m->mtp_layers : 0);
}

const char *ckptfs_mtp_hf_prefix(const char *mtp_prefix, const char *decoder_prefix, uint64_t layers,
                                 uint64_t *first)
{
    *first = mtp_prefix ? 0 : layers;
    return mtp_prefix ? mtp_prefix : decoder_prefix;
}

char *ckptfs_model_hf_layer_name(const CkptfsModel *m, uint64_t layer, const char *suffix)
{
    if (layer < m->layers)
        return ckptfs_hf_layer_name(layer, suffix);
    uint64_t first;
    const char *prefix =
        ckptfs_mtp_hf_prefix(m->arch->family->mtp_hf_prefix, CKPTFS_HF_LAYER_PREFIX, m->layers, &first);
    return g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s", prefix, first + (layer - m->layers), suffix);
}

#define CONFIG_ERROR(...)                                                                     \
    do {                                                                                      \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "config.json: %s", why_);  \
        return false;                                                                         \
    } while (0)

/* A count that may be absent, null or 0 (all three: none), else a positive integer; FALLBACK
 * when absent. */
static bool get_count(JsonObject *config, const char *key, uint64_t fallback, uint64_t *out, GError **error)
{
    gint64 v = 0;
    CkptfsJsonMember got = ckptfs_json_member_int(config, key, &v);
    if (got == CKPTFS_JSON_WRONG_TYPE || (got == CKPTFS_JSON_FOUND && v < 0))
        CONFIG_ERROR("\"%s\" is not a positive integer", key);
    *out = got == CKPTFS_JSON_FOUND ? (uint64_t)v : fallback;
    return true;
}

/* A positive integer, FALLBACK when absent or null. */
static bool get_uint(JsonObject *config, const char *key, uint64_t fallback, uint64_t *out, GError **error)
{
    if (!get_count(config, key, fallback, out, error))
        return false;
    if (*out == 0)
        CONFIG_ERROR("\"%s\" is not a positive integer", key);
    return true;
}

static const CkptfsArchitecture *find_architecture(JsonObject *config, GError **error)
{
    const char *name = ckptfs_schema_config_architecture(config);
    const char *model_type = ckptfs_json_member_string(config, "model_type");
    for (const CkptfsArchitecture *const *a = architectures; *a; a++)
        if ((name && strcmp(name, (*a)->hf_architecture) == 0) ||
            (!name && model_type && strcmp(model_type, (*a)->model_type) == 0))
            return *a;
    g_autoptr(GString) known = g_string_new(NULL);
    for (const CkptfsArchitecture *const *a = architectures; *a; a++)
        g_string_append_printf(known, "%s%s", known->len ? ", " : "", (*a)->hf_architecture);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                "config.json: architecture %s (model_type %s) has no Megatron rules; known: %s",
                name ? name : "not given", model_type ? model_type : "not given", known->str);
    return NULL;
}

/* A tensor the rules need: present, with this shape and the model's dtype (it, or NULL). */
static const CkptfsTensor *expect_shaped(const CkptfsCatalog *catalog, CkptfsModel *model, const char *name,
                                         unsigned ndim, const uint64_t *want, bool own_float, GError **error)
{
    const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
    if (t == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s' is missing from the checkpoint", name);
        return NULL;
    }
    bool shape_ok = t->ndim == ndim;
    for (unsigned i = 0; i < ndim && shape_ok; i++)
        shape_ok = t->shape[i] == want[i];
    if (!shape_ok) {
        g_autoptr(GString) got = g_string_new("["), implied = g_string_new("[");
        for (unsigned i = 0; i < t->ndim; i++)
            g_string_append_printf(got, "%s%" G_GUINT64_FORMAT, i ? ", " : "", t->shape[i]);
        for (unsigned i = 0; i < ndim; i++)
            g_string_append_printf(implied, "%s%" G_GUINT64_FORMAT, i ? ", " : "", want[i]);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s' has shape %s]; config.json implies %s]", name, got->str, implied->str);
        return NULL;
    }
    if (own_float) { /* kept in its own floating-point type (an fp32 expert bias) */
        if (model->fp32_dtype == CKPTFS_DTYPE_INVALID)
            model->fp32_dtype = t->dtype;
        if (ckptfs_dtype_is_float(t->dtype) && t->dtype == model->fp32_dtype)
            return t;
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "tensor '%s' is %s; %s expected (F32, or one floating-point type for every such tensor)",
                    name, ckptfs_dtype_safetensors_name(t->dtype), ckptfs_dtype_safetensors_name(model->fp32_dtype));
        return NULL;
    }
    if (model->dtype == CKPTFS_DTYPE_INVALID)
        model->dtype = t->dtype;
    if (t->dtype != model->dtype) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "tensor '%s' is %s but the other weights are %s; mixed dtypes are not supported",
                    name, ckptfs_dtype_safetensors_name(t->dtype),
                    ckptfs_dtype_safetensors_name(model->dtype));
        return NULL;
    }
    return t;
}

static const CkptfsTensor *expect_tensor(const CkptfsCatalog *catalog, CkptfsModel *model, const char *name,
                                         unsigned ndim, uint64_t d0, uint64_t d1, bool own_float, GError **error)
{
    /* ndim 3: [d0, 1, d1] (a convolution's weight) */
    const uint64_t want[3] = {d0, ndim == 3 ? 1 : d1, d1};
    return expect_shaped(catalog, model, name, ndim, want, own_float, error);
}

/* Whether NAME is a tensor of a multi-token prediction layer (DeepSeek's layers after the
 * decoder's): -o mtp decides whether the views serve them, and ckptfs_model_serve_mtp checks
 * them (their copies of the model's embedding and head are never read). */
static bool in_mtp_layer(const CkptfsModel *m, const char *name)
{
    const char *block = m->arch->family->mtp_hf_block_prefix;
    if (m->mtp_layers > 0 && block && g_str_has_prefix(name, block)) /* the whole block's */
        return true;
    uint64_t first; /* the number of MTP layer 0 */
    const char *prefix =
        ckptfs_mtp_hf_prefix(m->arch->family->mtp_hf_prefix, CKPTFS_HF_LAYER_PREFIX, m->layers, &first);
    const char *p = name + strlen(prefix);
    if (m->mtp_layers == 0 || !g_str_has_prefix(name, prefix) || !g_ascii_isdigit(*p))
        return false;
    char *end = NULL;
    guint64 layer = g_ascii_strtoull(p, &end, 10);
    return end != NULL && *end == '.' && layer >= first && layer - first < m->mtp_layers;
}

/* The Hugging Face tensors of M's keys, checked in CATALOG (added to USED when given). */
static bool check_model_tensors(const CkptfsCatalog *catalog, CkptfsModel *m, GHashTable *used, GError **error)
{
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(m, m->vocab, false);
    g_autoptr(GArray) tensors = ckptfs_model_hf_tensors(m, keys);
    for (guint k = 0; k < tensors->len; k++) {
        const CkptfsHfShape *t = &g_array_index(tensors, CkptfsHfShape, k);
        uint64_t kernel[5];
        unsigned kernel_dims = ckptfs_model_kernel_shape(m, t->cols_dim, t->d0, kernel);
        const CkptfsTensor *found = kernel_dims ? expect_shaped(catalog, m, t->name, kernel_dims, kernel, false, error)
                                              : expect_tensor(catalog, m, t->name, t->ndim, t->d0, t->d1, t->fp32, error);
        if (found == NULL)
            return false;
        if (used)
            g_hash_table_add(used, (gpointer)found);
    }
    return true;
}

/* Every Hugging Face tensor the mapping table fills the Megatron keys from, with its shape (a
 * vision-language model's vision tower's too, in the same dtype). With UNUSED, the names of
 * CATALOG's other tensors are added to it, less those left out on purpose: a tied model's output
 * copy, buffers transformers ignores too, MTP layers. */
static bool check_tensors(const CkptfsCatalog *catalog, CkptfsModel *m, GPtrArray *unused, GError **error)
{
    g_autoptr(GHashTable) used = unused ? g_hash_table_new(g_direct_hash, g_direct_equal) : NULL;
    if (!check_model_tensors(catalog, m, used, error))
        return false;
    if (m->arch->vision) {
        CkptfsModel tower;
        ckptfs_model_vision_tower(m, &tower);
        if (!check_model_tensors(catalog, &tower, used, error))
            return false;
        if (tower.dtype != m->dtype)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "the vision tower's tensors are %s but the language "
                               "model's are %s; mixed dtypes are not supported",
                               ckptfs_dtype_safetensors_name(tower.dtype), ckptfs_dtype_safetensors_name(m->dtype));
    }
    for (unsigned i = 0; unused && g_hash_table_size(used) < ckptfs_catalog_count(catalog) &&
                         i < ckptfs_catalog_count(catalog); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(catalog, i);
        if (!g_hash_table_contains(used, t) && !(m->tied_embeddings && strcmp(t->name, "lm_head.weight") == 0) &&
            !g_str_has_suffix(t->name, "rotary_emb.inv_freq") && !in_mtp_layer(m, t->name))
            g_ptr_array_add(unused, g_strdup(t->name));
    }
    return true;
}

unsigned ckptfs_model_kernel_shape(const CkptfsModel *m, CkptfsDim cols, uint64_t rows, uint64_t *shape)
{
    if (cols == CKPTFS_DIM_MERGE_KERNEL) {
        const uint64_t kernel[4] = {rows, m->hidden, m->vision_merge, m->vision_merge};
        memcpy(shape, kernel, sizeof kernel);
        return 4;
    }
    if (cols != CKPTFS_DIM_PATCH)
        return 0;
    if (m->vision_temporal_patch == 0) { /* a Conv2d */
        const uint64_t kernel[4] = {rows, m->vision_channels, m->vision_patch, m->vision_patch};
        memcpy(shape, kernel, sizeof kernel);
        return 4;
    }
    const uint64_t kernel[5] = {rows, m->vision_channels, m->vision_temporal_patch, m->vision_patch, m->vision_patch};
    memcpy(shape, kernel, sizeof kernel);
    return 5;
}

void ckptfs_model_vision_tower(const CkptfsModel *vlm, CkptfsModel *tower)
{
    *tower = *vlm;
    tower->arch = vlm->arch->vision;
    tower->layers = vlm->vision_depth;
    tower->hidden = vlm->vision_hidden;
    tower->heads = tower->kv_heads = vlm->vision_heads; /* no grouped-query attention */
    tower->head_dim = vlm->vision_heads ? vlm->vision_hidden / vlm->vision_heads : 0;
    tower->ffn = vlm->vision_ffn;
    tower->qkv_bias = true;
    tower->qk_norm = tower->tied_embeddings = tower->mla = tower->mtp = false;
    tower->experts = tower->mtp_layers = 0;
    tower->list_modules = vlm->vision_deepstack_count; /* the deepstack mergers */
    if (vlm->vision_image_size > 0) { /* a learned position per patch of an image_size square */
        uint64_t side = vlm->vision_patch ? vlm->vision_image_size / vlm->vision_patch : 0;
        tower->vision_positions = side * side;
    }
    if (vlm->vision_image_tokens > 0) /* a tower that pools whole images (SigLIP's): its projector */
        tower->vision_out_hidden = vlm->hidden; /* hands the language model's width */
    tower->dtype = CKPTFS_DTYPE_INVALID; /* the tower's own, checked against the model's */
}

/* A model without a shared expert whose checkpoint has one anyway (config.json's size or count
 * 0 or missing): Megatron's model would lack what the checkpoint holds, and transformers refuses
 * the shapes, so it is refused too instead of served without it. */
static bool check_no_shared_expert(const CkptfsModel *m, const GPtrArray *unused, GError **error)
{
    const CkptfsMoeConfig *moe = m->arch->moe;
    const char *key = moe ? (moe->shared_ffn_key ? moe->shared_ffn_key : moe->shared_count_key) : NULL;
    if (key == NULL || m->shared_ffn > 0 || m->moe_ffn == 0 || unused->len == 0)
        return true;
    CkptfsModel with = *m; /* the same model with one: its tensors the model leaves unused */
    with.shared_ffn = m->moe_ffn;
    with.shared_gate = moe->shared_gate;
    g_autoptr(GPtrArray) with_keys = ckptfs_mcore_keys(&with, with.vocab, false);
    g_autoptr(GArray) all = ckptfs_model_hf_tensors(&with, with_keys);
    g_autoptr(GHashTable) left = g_hash_table_new(ckptfs_name_hash, g_str_equal);
    for (guint k = 0; k < unused->len; k++)
        g_hash_table_add(left, g_ptr_array_index(unused, k));
    for (guint k = 0; k < all->len; k++) {
        const char *name = g_array_index(all, CkptfsHfShape, k).name;
        if (g_hash_table_contains(left, name)) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "tensor '%s' is a shared expert's, but config.json's \"%s\" says the model has none",
                        name, key);
            return false;
        }
    }
    return true;
}

/* DeepSeek's layer pattern fields: another MoE's rules have no such pattern, so a config with
 * one is refused (its routing fields are the schema's, refused there the same way). */
static const char *const deepseek_layer_fields[] = {"first_k_dense_replace", "moe_layer_freq", NULL};

/* What DeepSeek's routing fields (read with the schema) must satisfy to route as Megatron does.
 * Megatron's group-limited top-k sums the top topk / group_topk scores of a group where
 * DeepSeek sums its top two, so only topk = 2 * topk_group routes the same way. */
static bool check_deepseek_routing(CkptfsModel *model, GError **error)
{
    const CkptfsMoeConfig *moe = model->arch->moe;
    /* V2's gate scales the weights only when it does not renormalise them (V3's always). */
    if (!moe->sigmoid_routing && model->renormalize && model->topk > 1)
        model->topk_scaling = 0;
    if (model->sigmoid_scores && !model->renormalize && model->topk > 1)
        CONFIG_ERROR("norm_topk_prob is false: Megatron always normalises the top-k of sigmoid scores");
    if (!moe->sigmoid_routing)
        return true;
    uint64_t groups = model->groups ? model->groups : 1, group_topk = model->group_topk;
    if (groups > model->experts || model->experts % groups != 0 || group_topk > groups)
        CONFIG_ERROR("n_group %" G_GUINT64_FORMAT " with topk_group %" G_GUINT64_FORMAT
                     " does not divide the %" G_GUINT64_FORMAT " routed experts into groups",
                     groups, group_topk, model->experts);
    if (groups > 1 && group_topk < groups) {
        if (model->topk != 2 * group_topk)
            CONFIG_ERROR("num_experts_per_tok %" G_GUINT64_FORMAT " is not 2 x topk_group %" G_GUINT64_FORMAT
                         ": the groups would be ranked differently in Megatron (sum of its top "
                         "topk / topk_group scores) than here (sum of the top two)",
                         model->topk, group_topk);
        if (model->experts / groups < 2)
            CONFIG_ERROR("n_group %" G_GUINT64_FORMAT " leaves fewer than two experts per group", groups);
    } else {
        model->groups = model->group_topk = 0; /* every expert a candidate */
    }
    return true;
}

/* DeepSeek's dense layers: the first first_k_dense_replace, then all but every moe_layer_freq-th. */
static bool read_dense_first(JsonObject *config, CkptfsModel *model, GError **error)
{
    uint64_t first_dense = 0, freq = 1;
    if (!get_count(config, deepseek_layer_fields[0], 0, &first_dense, error) ||
        !get_uint(config, deepseek_layer_fields[1], 1, &freq, error))
        return false;
    if (first_dense >= model->layers)
        CONFIG_ERROR("first_k_dense_replace %" G_GUINT64_FORMAT " leaves no MoE layer of %" G_GUINT64_FORMAT,
                     first_dense, model->layers);
    for (uint64_t l = 0; l < model->layers && l < CKPTFS_MAX_LAYERS; l++)
        if (l < first_dense || l % freq != 0)
            ckptfs_model_set_dense_layer(model, l);
    return true;
}

/* The experts' structure of an MoE architecture (their sizes and routing read with the schema):
 * which layers are dense, and what the routing must satisfy. */
bool ckptfs_model_read_moe(JsonObject *config, CkptfsModel *model, GError **error)
{
    const CkptfsMoeConfig *moe = model->arch->moe;
    for (const char *const *f = deepseek_layer_fields; *f && !moe->deepseek_config; f++)
        if (ckptfs_json_member(config, *f) != NULL)
            CONFIG_ERROR("\"%s\" is set: %s routing with it is not supported", *f,
                         model->arch->hf_architecture);
    if (model->topk > model->experts)
        CONFIG_ERROR("num_experts_per_tok %" G_GUINT64_FORMAT " is more than the %" G_GUINT64_FORMAT " experts",
                     model->topk, model->experts);
    if (moe->deepseek_config)
        return check_deepseek_routing(model, error) && read_dense_first(config, model, error);
    if (!moe->dense_layers)
        return true;
    uint64_t step = 1;
    if (!get_uint(config, "decoder_sparse_step", 1, &step, error))
        return false;
    for (uint64_t l = 0; l < model->layers && l < CKPTFS_MAX_LAYERS; l++)
        if ((l + 1) % step != 0)
            ckptfs_model_set_dense_layer(model, l);
    JsonNode *only = ckptfs_json_member(config, "mlp_only_layers");
    if (only == NULL || JSON_NODE_HOLDS_NULL(only))
        return true;
    if (!JSON_NODE_HOLDS_ARRAY(only))
        CONFIG_ERROR("\"mlp_only_layers\" is not a list of layer numbers");
    JsonArray *list = json_node_get_array(only);
    for (guint i = 0; i < json_array_get_length(list); i++) {
        gint64 layer = -1;
        if (!ckptfs_json_node_int(json_array_get_element(list, i), &layer) || layer < 0 ||
            (uint64_t)layer >= model->layers)
            CONFIG_ERROR("\"mlp_only_layers\" entry %u is not a layer number below num_hidden_layers %" G_GUINT64_FORMAT,
                         i, model->layers);
        ckptfs_model_set_dense_layer(model, (uint64_t)layer);
    }
    return true;
}

bool ckptfs_model_read_layer_kinds(JsonObject *config, CkptfsModel *model, GError **error)
{
    static const char *const kinds[] = {"full_attention", "linear_attention"};
    uint64_t interval = 4; /* transformers' default */
    bool interval_given = ckptfs_json_member(config, "full_attention_interval") != NULL;
    if (!get_uint(config, "full_attention_interval", 4, &interval, error))
        return false;
    memset(model->linear_layer, 0, sizeof model->linear_layer);
    JsonNode *types = ckptfs_json_member(config, "layer_types");
    if (types == NULL || JSON_NODE_HOLDS_NULL(types)) {
        for (uint64_t l = 0; l < model->layers && l < CKPTFS_MAX_LAYERS; l++)
            if ((l + 1) % interval != 0)
                ckptfs_model_set_linear_layer(model, l);
        return true;
    }
    if (!JSON_NODE_HOLDS_ARRAY(types))
        CONFIG_ERROR("\"layer_types\" is not a list of layer kinds");
    JsonArray *list = json_node_get_array(types);
    if (json_array_get_length(list) != model->layers)
        CONFIG_ERROR("\"layer_types\" lists %u layers but num_hidden_layers is %" G_GUINT64_FORMAT,
                     json_array_get_length(list), model->layers);
    for (guint l = 0; l < json_array_get_length(list); l++) {
        JsonNode *e = json_array_get_element(list, l);
        const char *kind = JSON_NODE_HOLDS_VALUE(e) && json_node_get_value_type(e) == G_TYPE_STRING
                               ? json_node_get_string(e) : NULL;
        if (kind == NULL || (strcmp(kind, kinds[0]) != 0 && strcmp(kind, kinds[1]) != 0))
            CONFIG_ERROR("\"layer_types\" entry %u is not \"%s\" or \"%s\"", l, kinds[0], kinds[1]);
        bool linear = strcmp(kind, kinds[1]) == 0;
        if (interval_given && linear != ((l + 1) % interval != 0))
            CONFIG_ERROR("\"layer_types\" entry %u (%s) disagrees with full_attention_interval %" G_GUINT64_FORMAT,
                         l, kind, interval);
        if (linear)
            ckptfs_model_set_linear_layer(model, l);
    }
    return true;
}

/* Multi-head latent attention: what its sizes must satisfy (read with the schema). */
static bool check_mla(const CkptfsModel *model, GError **error)
{
    if (model->qk_rope_dim % 2 != 0)
        CONFIG_ERROR("qk_rope_head_dim %" G_GUINT64_FORMAT " is odd: rotary halves need an even width",
                     model->qk_rope_dim);
    if (model->kv_heads != model->heads)
        CONFIG_ERROR("num_key_value_heads %" G_GUINT64_FORMAT " differs from num_attention_heads %" G_GUINT64_FORMAT
                     ": multi-latent attention has a key and value per head",
                     model->kv_heads, model->heads);
    return true;
}

uint64_t ckptfs_model_rotated_dim(const CkptfsModel *model)
{
    /* Megatron-core's int(kv_channels * rotary_percent); transformers' GLM-4.1V rotates half */
    return (uint64_t)((double)model->head_dim * model->rotary_percent);
}

/* A vision-language model's multimodal rope (Qwen2-VL's mrope): the head's rotary frequencies
 * given in sections to the temporal, height and width positions (mrope_section, which
 * transformers requires; Megatron's --mrope-section), covering half the head. */
static bool read_mrope(JsonObject *config, CkptfsModel *model, GError **error)
{
    static const char *const objects[] = {"rope_scaling", "rope_parameters"};
    const char *from = NULL;
    for (size_t o = 0; o < G_N_ELEMENTS(objects); o++) {
        g_autofree char *type_name = g_strdup_printf("%s.type", objects[o]);
        const char *type = ckptfs_json_member_string(config, type_name);
        if (type && strcmp(type, "mrope") != 0 && strcmp(type, "default") != 0)
            CONFIG_ERROR("%s '%s' is not mrope: %s's rotary embedding is multimodal", type_name, type,
                         model->arch->hf_architecture);
        g_autofree char *interleaved_name = g_strdup_printf("%s.mrope_interleaved", objects[o]);
        JsonNode *interleaved = ckptfs_json_member(config, interleaved_name);
        if (interleaved && model->arch->mrope_interleaved &&
            !(JSON_NODE_HOLDS_VALUE(interleaved) && json_node_get_value_type(interleaved) == G_TYPE_BOOLEAN &&
              json_node_get_boolean(interleaved)))
            CONFIG_ERROR("%s is not true: %s's rope hands out its sections interleaved whatever it says",
                         interleaved_name, model->arch->hf_architecture);
        g_autofree char *name = g_strdup_printf("%s.mrope_section", objects[o]);
        JsonNode *node = ckptfs_json_member(config, name);
        if (node == NULL)
            continue;
        JsonArray *list = JSON_NODE_HOLDS_ARRAY(node) ? json_node_get_array(node) : NULL;
        uint64_t section[3] = {0}, sum = 0;
        for (guint i = 0; list && i < json_array_get_length(list) && i < 3; i++) {
            gint64 v = 0;
            if (ckptfs_json_node_int(json_array_get_element(list, i), &v) && v > 0 && v <= (gint64)CKPTFS_MAX_MODEL_DIM)
                section[i] = (uint64_t)v, sum += (uint64_t)v;
        }
        if (list == NULL || json_array_get_length(list) != 3 || !section[0] || !section[1] || !section[2])
            CONFIG_ERROR("%s is not three positive integers (temporal, height, width)", name);
        uint64_t rotated = ckptfs_model_rotated_dim(model);
        if (sum * 2 != rotated)
            CONFIG_ERROR("%s sums to %" G_GUINT64_FORMAT ", not half the rotated head dim %" G_GUINT64_FORMAT, name,
                         sum, rotated);
        if (from && memcmp(section, model->mrope_section, sizeof section) != 0)
            CONFIG_ERROR("%s.mrope_section and %s disagree", from, name);
        memcpy(model->mrope_section, section, sizeof section);
        from = from ? from : objects[o];
    }
    if (from == NULL)
        CONFIG_ERROR("no mrope_section in rope_scaling or rope_parameters: %s's rotary embedding needs it",
                     model->arch->hf_architecture);
    if (model->arch->rotates_interleaved_pairs)
        CONFIG_ERROR("%s rotates interleaved pairs with its mrope sections taken by frequency; Megatron-core's "
                     "mrope pairs halves (rotary_interleaved false, as mbridge builds it) or takes the sections "
                     "over the interleaved dims (true): no args give its attention",
                     model->arch->hf_architecture);
    return true;
}

bool ckptfs_model_read_sizes(JsonObject *config, CkptfsModel *model, GError **error)
{
    model->mla = model->arch && model->arch->mla;
    model->linear_attention = model->arch && model->arch->hybrid_attention;
    return ckptfs_schema_read_config(config, model, error);
}

bool ckptfs_model_read_config(JsonObject *config, CkptfsModel *model, GError **error)
{
    if (!ckptfs_model_read_sizes(config, model, error))
        return false;
    if (model->mla && !check_mla(model, error))
        return false;
    if (model->qkv_bias && model->arch && model->arch->attention_bias_on_output)
        CONFIG_ERROR("attention_bias is true: %s puts a bias on o_proj too, which Megatron has only with "
                     "add_bias_linear (on every linear layer): no Megatron equivalent",
                     model->arch->hf_architecture);
    bool attention_bias = true;
    if (model->arch && model->arch->linear_biases &&
        ckptfs_json_member_bool(config, "attention_bias", &attention_bias) == CKPTFS_JSON_FOUND && !attention_bias)
        CONFIG_ERROR("attention_bias is false: %s's Megatron form (add_bias_linear) has a bias on o_proj and "
                     "every other linear layer", model->arch->hf_architecture);
    bool gemma = model->arch && model->arch->gemma_attention;
    if (gemma && model->rope_type != CKPTFS_ROPE_DEFAULT && model->rope_type != CKPTFS_ROPE_LINEAR)
        CONFIG_ERROR("the full-attention layers' rope_type is '%s': Megatron's Gemma 3 scales their rope linearly "
                     "or not at all", ckptfs_rope_type_name(model->rope_type));
    if (gemma && model->rope_local_type != CKPTFS_ROPE_DEFAULT)
        CONFIG_ERROR("the sliding layers' rope_type (rope_parameters.sliding_attention's, or rope_parameters' own) is "
                     "'%s': Megatron's Gemma 3 scales only the full-attention layers' rope",
                     ckptfs_rope_type_name(model->rope_local_type));
    if (model->mla && model->rope_type == CKPTFS_ROPE_YARN && !model->yarn_truncate)
        CONFIG_ERROR("rope truncate is false: Megatron's multi-latent attention rounds YaRN's correction range");
    gint64 given = 0;
    if (!model->mla && model->hidden % model->heads != 0 &&
        ckptfs_json_member_int(config, "head_dim", &given) != CKPTFS_JSON_FOUND)
        CONFIG_ERROR("hidden_size %" G_GUINT64_FORMAT " is not a multiple of num_attention_heads %"
                     G_GUINT64_FORMAT " and no head_dim is given",
                     model->hidden, model->heads);
    if (model->arch && model->arch->vision_part && !model->arch->text_rope && !read_mrope(config, model, error))
        return false;
    if (model->heads % model->kv_heads != 0)
        CONFIG_ERROR("num_attention_heads %" G_GUINT64_FORMAT
                     " is not a multiple of num_key_value_heads %" G_GUINT64_FORMAT,
                     model->heads, model->kv_heads);
    /* Reading the experts touches at most CKPTFS_MAX_LAYERS layers: limits are checked once,
     * with the experts' sizes. */
    if (model->arch && model->arch->moe && !ckptfs_model_read_moe(config, model, error))
        return false;
    if (model->arch && model->arch->hybrid_attention && !ckptfs_model_read_layer_kinds(config, model, error))
        return false;
    if (model->arch && model->arch->hybrid_attention && model->linear_value_heads % model->linear_key_heads != 0)
        CONFIG_ERROR("linear_num_value_heads %" G_GUINT64_FORMAT " is not a multiple of linear_num_key_heads %"
                     G_GUINT64_FORMAT, model->linear_value_heads, model->linear_key_heads);
    return true;
}

/* The vision part's list of block numbers (the architecture's CkptfsVisionBlocks): each below
 * depth, rising where their order numbers modules; absent, transformers' default list (a list of
 * full-attention blocks less those a shallower tower lacks). */
static bool read_vision_blocks(JsonObject *config, CkptfsModel *model, GError **error)
{
    const CkptfsVisionBlocks *blocks = model->arch->vision_blocks;
    if (blocks == NULL)
        return true;
    uint8_t *set = (uint8_t *)model + blocks->offset;
    g_autofree char *name = g_strdup_printf("%s.%s", model->arch->vision_part, blocks->member);
    JsonNode *node = ckptfs_json_member(config, name);
    JsonArray *list = node && JSON_NODE_HOLDS_ARRAY(node) ? json_node_get_array(node) : NULL;
    if (node != NULL && list == NULL)
        CONFIG_ERROR("%s is not a list of block numbers", name);
    guint n = list ? json_array_get_length(list) : blocks->n_defaults;
    gint64 previous = -1;
    for (guint i = 0; i < n; i++) {
        gint64 block = list ? -1 : (gint64)blocks->defaults[i];
        if (list && !ckptfs_json_node_int(json_array_get_element(list, i), &block))
            block = -1;
        /* transformers' default for a shallower tower: those blocks do not exist (a deepstack
         * list still has a merger each, which no block feeds: refused below) */
        if (list == NULL && !blocks->ascending && (uint64_t)block >= model->vision_depth)
            continue;
        if (block < 0 || (uint64_t)block >= model->vision_depth)
            CONFIG_ERROR("%s entry %u is not a block number below depth %" G_GUINT64_FORMAT, name, i,
                         model->vision_depth);
        if (blocks->ascending && block <= previous)
            CONFIG_ERROR("%s entry %u (%" G_GINT64_FORMAT ") does not follow %" G_GINT64_FORMAT
                         ": the rules take the blocks in rising order", name, i, block, previous);
        previous = block;
        set[block / 8] |= (uint8_t)(1u << (block % 8));
    }
    return true;
}

/* A tower whose projector pools each image's patches to IMAGE_TOKENS tokens (Gemma 3's: an
 * average pool over squares of patches): the image a whole number of patches a side, and the
 * tokens a square whose side divides it, or the pool's kernel is not whole. */
static bool check_image_tokens(const CkptfsModel *model, GError **error)
{
    const char *part = model->arch->vision_part;
    uint64_t side = 0, patches = model->vision_patch ? model->vision_image_size / model->vision_patch : 0;
    while ((side + 1) * (side + 1) <= model->vision_image_tokens)
        side++;
    if (patches == 0 || model->vision_image_size % model->vision_patch != 0)
        CONFIG_ERROR("%s.image_size %" G_GUINT64_FORMAT " is not a multiple of %s.patch_size %" G_GUINT64_FORMAT, part,
                     model->vision_image_size, part, model->vision_patch);
    if (side * side != model->vision_image_tokens || patches % side != 0)
        CONFIG_ERROR("mm_tokens_per_image %" G_GUINT64_FORMAT " is not the square of a side that divides the %"
                     G_GUINT64_FORMAT " patches a side of the image: the projector pools squares of patches",
                     model->vision_image_tokens, patches);
    return true;
}

/* A vision-language model's vision tower: its part of config.json, and rules to serve it in the
 * Megatron views (without them the language model alone would be a silently partial model);
 * its heads must divide its width. */
bool ckptfs_model_read_vision(JsonObject *config, CkptfsModel *model, GError **error)
{
    const CkptfsArchitecture *arch = model->arch;
    if (arch->vision_part == NULL)
        return true;
    if (!ckptfs_schema_read_vision(config, model, error) || !ckptfs_model_check_limits(model, "config.json", error) ||
        !read_vision_blocks(config, model, error))
        return false;
    for (uint64_t b = 0; b < model->vision_depth; b++)
        model->vision_deepstack_count += layer_in(model->vision_deepstack, b);
    if (model->vision_hidden % model->vision_heads != 0)
        CONFIG_ERROR("%s.hidden_size %" G_GUINT64_FORMAT " is not a multiple of num_heads %" G_GUINT64_FORMAT,
                     arch->vision_part, model->vision_hidden, model->vision_heads);
    if (model->vision_image_tokens > 0 && !check_image_tokens(model, error))
        return false;
    if (arch->vision == NULL) {
        bool deepstack_tower =
            arch->vision_blocks && arch->vision_blocks->offset == offsetof(CkptfsModel, vision_deepstack);
        g_autofree char *deepstack = deepstack_tower
            ? g_strdup_printf(", %" G_GUINT64_FORMAT " deepstack mergers", model->vision_deepstack_count)
            : g_strdup("");
        /* a tower that merges squares of patches, or one that pools whole images (SigLIP's) */
        g_autofree char *output = model->vision_image_tokens > 0
            ? g_strdup_printf("%" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " images in patches of %" G_GUINT64_FORMAT
                              ", pooled to %" G_GUINT64_FORMAT " tokens", model->vision_image_size,
                              model->vision_image_size, model->vision_patch, model->vision_image_tokens)
            : g_strdup_printf("merged %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " into %" G_GUINT64_FORMAT,
                              model->vision_merge, model->vision_merge, model->vision_out_hidden);
        CONFIG_ERROR("%s: its vision tower and merger (\"%s\": %" G_GUINT64_FORMAT " blocks of width %"
                     G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT " heads, ffn %" G_GUINT64_FORMAT
                     ", %s%s) have no Megatron rules yet; hf/ serves the whole model",
                     arch->hf_architecture, arch->vision_part, model->vision_depth, model->vision_hidden,
                     model->vision_heads, model->vision_ffn, output, deepstack);
    }
    return true;
}

void ckptfs_model_write_vision(const CkptfsModel *model, JsonObject *config)
{
    ckptfs_schema_write_vision(model, config);
    const CkptfsVisionBlocks *blocks = model->arch->vision_blocks;
    if (blocks == NULL)
        return;
    /* the architecture's list of blocks (full attention, deepstack), as its walk reads it */
    JsonObject *vision = ckptfs_json_member_object(config, model->arch->vision_part);
    const uint8_t *set = (const uint8_t *)model + blocks->offset;
    JsonArray *list = json_array_new();
    for (uint64_t b = 0; b < model->vision_depth; b++)
        if (layer_in(set, b))
            json_array_add_int_element(list, (gint64)b);
    json_object_set_array_member(vision, blocks->member, list);
}

bool ckptfs_model_check_vision_split(const CkptfsModel *model, unsigned tp, GError **error)
{
    /* mbridge's tower is split by TP: its heads, its MLP and the merger's MLP (BLOCKS: the sizes
     * a tower's split blocks need), and a pooling projector's rows (Gemma 3's) */
    const struct {
        const char *what;
        uint64_t value;
        bool blocks;
    } vision_split[] = {{"vision num_heads", model->vision_heads, true},
                        {"vision intermediate_size", model->vision_ffn, true},
                        {"vision hidden_size x spatial_merge_size^2 (the merger's width)",
                         model->vision_hidden * model->vision_merge * model->vision_merge, true},
                        {"hidden_size (the projector's output)", model->vision_image_tokens ? model->hidden : 0, false}};
    /* some towers are kept whole on every rank (transformers' module), their projector perhaps not */
    bool blocks_split = false, split = false;
    for (unsigned i = 0; model->arch->vision && i < model->arch->vision->family->n_rules; i++) {
        const CkptfsRule *rule = &model->arch->vision->family->rules[i];
        split = split || rule->split != CKPTFS_TP_REPLICATED;
        blocks_split = blocks_split || (rule->split != CKPTFS_TP_REPLICATED && rule->scope == CKPTFS_SCOPE_LAYER);
    }
    for (size_t i = 0; split && i < G_N_ELEMENTS(vision_split); i++)
        if ((blocks_split || !vision_split[i].blocks) && vision_split[i].value % tp != 0)
            return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "tp %u does not divide the %s %" G_GUINT64_FORMAT, tp,
                               vision_split[i].what, vision_split[i].value);
    return true;
}

bool ckptfs_model_from_config(JsonObject *config, const CkptfsCatalog *catalog, CkptfsModel *model,
                              GPtrArray **unused, GError **error)
{
    if (unused != NULL)
        *unused = NULL;
    memset(model, 0, sizeof *model);
    if (config == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "config.json is missing or broken; the Megatron views need it");
        return false;
    }
    model->arch = find_architecture(config, error);
    if (model->arch == NULL || !ckptfs_model_read_vision(config, model, error))
        return false;
    g_autoptr(JsonObject) text = ckptfs_schema_text_config(config, model->arch->text_part, error);
    if (text == NULL || !ckptfs_model_read_config(text, model, error))
        return false;
    if (!ckptfs_model_check_limits(model, "config.json", error))
        return false;
    /* Tied embeddings with an lm_head anyway: it must still be the embedding's shape. */
    if (model->tied_embeddings && ckptfs_catalog_find(catalog, "lm_head.weight") != NULL &&
        !expect_tensor(catalog, model, "lm_head.weight", 2, model->vocab, model->hidden, false, error))
        return false;
    g_autoptr(GPtrArray) left = g_ptr_array_new_with_free_func(g_free);
    if (!check_tensors(catalog, model, left, error) || !check_no_shared_expert(model, left, error))
        return false;
    if (unused != NULL)
        *unused = g_steal_pointer(&left);
    return true;
}

bool ckptfs_model_serve_mtp(CkptfsModel *model, const CkptfsCatalog *catalog, GError **error)
{
    if (model->mtp_layers == 0 || !ckptfs_family_has(model->arch->family, CKPTFS_NEED_MTP)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "config.json: no multi-token prediction layers (num_nextn_predict_layers, mtp_num_hidden_layers) in a model "
                    "with rules for them (DeepSeek-V3, GLM-4.5, MiMo, Qwen3-Next, Qwen3.5)");
        return false;
    }
    if (model->mtp_layers > 1 && model->arch->family->mtp_hf_block_prefix) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "config.json: %" G_GUINT64_FORMAT " multi-token prediction layers (mtp_num_hidden_layers) share "
                    "one %sfc and its norms in %s, but Megatron-core gives each layer its own: only 1 can be served",
                    model->mtp_layers, model->arch->family->mtp_hf_block_prefix, model->arch->hf_architecture);
        return false;
    }
    model->mtp = true;
    if (check_tensors(catalog, model, NULL, error))
        return true;
    model->mtp = false;
    return false;
}

bool ckptfs_model_use_bridge_names(CkptfsModel *model, const CkptfsCatalog *catalog, GError **error)
{
    const CkptfsArchitecture *mbridge = model->arch, *bridge = mbridge->megatron_bridge;
    if (bridge == NULL) {
        const char *why = mbridge->bridge_names_note ? mbridge->bridge_names_note
                                                     : "a text model: the option chooses between the Megatron trees "
                                                       "of vision-language models";
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "option megatron_names=bridge: %s: %s",
                           mbridge->hf_architecture, why);
    }
    model->arch = bridge;
    if (catalog == NULL || check_tensors(catalog, model, NULL, error))
        return true;
    model->arch = mbridge;
    return false;
}

bool ckptfs_model_check_limits(const CkptfsModel *model, const char *what, GError **error)
{
    const struct {
        const char *name;
        uint64_t value, limit;
    } dims[] = {
        {"hidden size", model->hidden, CKPTFS_MAX_MODEL_DIM},
        {"attention heads", model->heads, CKPTFS_MAX_MODEL_DIM},
        {"key/value heads", model->kv_heads, CKPTFS_MAX_MODEL_DIM},
        {"head dim", model->head_dim, CKPTFS_MAX_MODEL_DIM},
        {"ffn size", model->ffn, CKPTFS_MAX_MODEL_DIM},
        {"vocabulary", model->vocab, CKPTFS_MAX_VOCAB},
        {"expert ffn size", model->moe_ffn, CKPTFS_MAX_MODEL_DIM},
        {"shared expert ffn size", model->shared_ffn, CKPTFS_MAX_MODEL_DIM},
        {"q_lora_rank", model->q_lora, CKPTFS_MAX_MODEL_DIM},
        {"kv_lora_rank", model->kv_lora, CKPTFS_MAX_MODEL_DIM},
        {"qk head dim", model->qk_head_dim, CKPTFS_MAX_MODEL_DIM},
        {"qk rope head dim", model->qk_rope_dim, CKPTFS_MAX_MODEL_DIM},
        {"v head dim", model->v_head_dim, CKPTFS_MAX_MODEL_DIM},
        {"experts", model->experts, CKPTFS_MAX_EXPERTS},
        {"multi-token prediction layers", model->mtp_layers, 64},
        {"vision blocks", model->vision_depth, CKPTFS_MAX_VISION_DEPTH},
        {"vision hidden size", model->vision_hidden, CKPTFS_MAX_MODEL_DIM},
        {"vision attention heads", model->vision_heads, CKPTFS_MAX_MODEL_DIM},
        {"vision ffn size", model->vision_ffn, CKPTFS_MAX_MODEL_DIM},
        {"vision output size", model->vision_out_hidden, CKPTFS_MAX_MODEL_DIM},
        {"vision patch size", model->vision_patch, 4096},
        {"vision temporal patch size", model->vision_temporal_patch, 64},
        {"vision merge size", model->vision_merge, 64},
        {"vision window size", model->vision_window, 65536},
        {"vision channels", model->vision_channels, 64},
        /* products the tower's rules form (each factor bounded above, so none wraps) */
        {"vision merged width (hidden_size x spatial_merge_size^2)",
         model->vision_hidden * model->vision_merge * model->vision_merge, CKPTFS_MAX_MODEL_DIM},
        {"vision patch (channels x temporal_patch_size x patch_size^2)",
         model->vision_channels * model->vision_temporal_patch * model->vision_patch * model->vision_patch,
         CKPTFS_MAX_MODEL_DIM},
        {"layers", model->layers,
         MIN(CKPTFS_MAX_LAYERS, (CKPTFS_MAX_SOURCE_TENSORS - 3) / (CKPTFS_MAX_LAYER_TENSORS + 3 * MIN(model->experts, CKPTFS_MAX_EXPERTS)))},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(dims); i++)
        if (dims[i].value > dims[i].limit) {
            g_autofree char *why = i + 1 < G_N_ELEMENTS(dims) ? g_strdup("") : g_strdup_printf(
                " (a layer makes up to %u tensors and 3 per expert, a source holds at most %u)",
                CKPTFS_MAX_LAYER_TENSORS, CKPTFS_MAX_SOURCE_TENSORS);
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: %" G_GUINT64_FORMAT " %s is over the limit of %" G_GUINT64_FORMAT "%s",
                        what, dims[i].value, dims[i].name, dims[i].limit, why);
            return false;
        }
    return true;
}
