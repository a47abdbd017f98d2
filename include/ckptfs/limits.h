/* What a source may make the daemon read or allocate. Each cap is far above what real
 * checkpoints need (the figure in the comment) and refused with an error naming the file when
 * exceeded, so a hostile or broken source cannot exhaust memory. docs/user-guide.md lists them. */
#ifndef CKPTFS_LIMITS_H
#define CKPTFS_LIMITS_H

/* A tracker file (latest_checkpointed_iteration.txt: "release" or a number). */
#define CKPTFS_MAX_TRACKER_BYTES 4096
/* Any JSON file read whole: config.json, model.safetensors.index.json (DeepSeek-V3's: 8.9 MB),
 * metadata.json, generation_config.json, fsdp_config.json. */
#define CKPTFS_MAX_JSON_BYTES (64u << 20)
/* Nesting of JSON arrays and objects (HF configs: 3). */
#define CKPTFS_MAX_JSON_DEPTH 64

/* A safetensors header, refused by its length prefix before any allocation (real ones: a few
 * MB; the safetensors library's own limit is 100,000,000 bytes). */
#define CKPTFS_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)
/* Tensors in one safetensors header (DeepSeek-V3 671B: 91,000 in all its 163 shards, so at
 * most that in one file), counted before the header is parsed into a tree. */
#define CKPTFS_MAX_HEADER_TENSORS (1u << 18)
/* Tensors in one source, every file together (DeepSeek-V3 671B: 91,000). Also bounds the
 * layers a Megatron source's args may declare: each makes a dozen Hugging Face tensors. */
#define CKPTFS_MAX_SOURCE_TENSORS (1u << 19)
/* Sizes of a model a source declares (config.json, Megatron args), so that no product of
 * three of them wraps 64 bits (largest real ones: ffn 53,248 for Llama 3.1 405B, hidden 16,384;
 * vocabulary 262,144 for Gemma 3), and the Hugging Face tensors one layer makes at most (14 with
 * q/k/v biases and q/k norms). */
#define CKPTFS_MAX_MODEL_DIM (1u << 20)
#define CKPTFS_MAX_VOCAB (1u << 24)
#define CKPTFS_MAX_LAYER_TENSORS 16u
/* A torch_dist `.metadata` pickle, refused by its size before it is read (Megatron's for a big
 * MoE with optimizer state: tens of MB; tp2pp2 Llama test checkpoint: 129 KB). */
#define CKPTFS_MAX_DCP_METADATA_BYTES (128ull << 20)
/* data.pkl of a legacy rank file (model_optim_rng.pt; tensors are separate records, so even
 * with optimizer state it holds structure only: a few MB). */
#define CKPTFS_MAX_RANK_PICKLE_BYTES (128ull << 20)
/* data.pkl of common.pt or of one torch_dist chunk archive (~50 KB and ~300 bytes). */
#define CKPTFS_MAX_ARCHIVE_PICKLE_BYTES (64ull << 20)
/* Objects one pickle may create, and its memo entries. Megatron's own .metadata makes an
 * object per ~10 bytes and a memo entry per ~11 (None, booleans, ints 0..255 and () are shared,
 * not counted), so these admit an ~85 MB one. While a source is opened the daemon holds ~120
 * bytes per object at worst, containers included (measured: 4 M one-item tuples, 475 MB; a
 * real-looking 50 MB .metadata of 3.2 M objects, 380 MB), plus 8 per memo entry: ~1.2 GB at
 * the caps. */
#define CKPTFS_MAX_PICKLE_OBJECTS (1u << 23)
#define CKPTFS_MAX_PICKLE_MEMO (1u << 23)
/* Depth of the pickle VM's stack and of its MARKs (real pickles: tens). */
#define CKPTFS_MAX_PICKLE_STACK (1u << 22)
#define CKPTFS_MAX_PICKLE_MARKS 1024
/* Entries and bytes of a zip central directory, read whole (a torch.save file has one record
 * per storage: a Megatron rank file a few hundred, a whole 671B model in one file 91,000, whose
 * directory is ~11 MB). */
#define CKPTFS_MAX_ZIP_ENTRIES (1u << 20)
#define CKPTFS_MAX_ZIP_DIRECTORY_BYTES (64u << 20)

#endif
