// Which tokenizer.json a run's checkpoints carry (in model/), so that a checkpoint's model directory
// serves `generate` and `export-hf` alone. Chat data names its tokenizer (data.tokenizer); token shards
// carry theirs as SHARD_DIR/tokenizer.json (written by `archspace tokenize`).
#pragma once

#include <string>

#include "archspace/data/token_shards.h"

namespace archspace {

struct RunTokenizer {
  std::string file;  // a tokenizer.json to copy into checkpoints, or "" for none
  std::string note;  // when none: why (for the run's log)
};

// SHARD_DIR/tokenizer.json when present (its SHA-256 must equal the manifest's tokenizer_sha256, else
// Error naming both); else, for shard directories written before tokenize copied it, the built-in dolma2
// file when the manifest names allenai/dolma2 with the same SHA-256; else none.
RunTokenizer shard_tokenizer(const std::string& shard_dir, const ShardManifest& manifest);
// The same for any token source: its tokenizer_file() (PREFIX.tokenizer.json for a Megatron dataset).
RunTokenizer source_tokenizer(const TokenShards& source);

}  // namespace archspace
