// Text to token shards: plain-text files (one document each) and JSONL (one document per line, from a
// string field), encoded in parallel, each document followed by EOS, written in input order.
#pragma once

#include <string>
#include <vector>

#include "archspace/data/token_source.h"

namespace archspace {

enum class InvalidUtf8Policy {
  kError,    // stop with the file, line and byte offset (default: bad bytes usually mean a wrong encoding)
  kReplace,  // replace each invalid sequence with U+FFFD, count them in the manifest
};

struct TokenizeOptions {
  std::string tokenizer = "dolma2";
  std::string out_dir;  // a directory; for TokenFormat::kMegatron the prefix DIR/NAME
  TokenFormat format = TokenFormat::kShards;
  std::vector<std::string> inputs;     // files or directories (recursively, sorted); *.jsonl is JSONL
  int threads = 0;                     // 0: all cores
  uint64_t shard_tokens = 1ull << 28;  // 1 GiB of uint32 per shard (per OLMo-core file; Megatron: one .bin)
  InvalidUtf8Policy invalid_utf8 = InvalidUtf8Policy::kError;
  std::string text_field = "text";
  bool verify_roundtrip = false;  // check decode(encode(doc)) == doc for every document
  bool progress = true;
};

ShardManifest tokenize_to_shards(const TokenizeOptions& options);

}  // namespace archspace
