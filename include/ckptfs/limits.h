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

#endif
