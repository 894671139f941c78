// Path -> token source: the one resolution that `[data] train`/`valid`, `eval ppl --data` (and any
// future mixture source's `path`) share. A path names
//   - a token shard directory (DIR/manifest.json of format archspace-token-shards/1),
//   - a Megatron-Core indexed dataset prefix DIR/NAME (NAME.bin + NAME.idx; NAME.idx or NAME.bin also work),
//   - OLMo-core token files: a directory of .npy files (optionally with archspace's manifest.json) or one .npy.
// Each opens as TokenShards, the interface InstanceLoader reads; the same tokens in any of the formats (in
// the same files) give the same instances.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "archspace/data/token_shards.h"

namespace archspace {

enum class TokenFormat { kShards, kMegatron, kOlmoCore };
const char* token_format_name(TokenFormat f);  // "shards", "megatron", "olmo-core"
TokenFormat parse_token_format(const std::string& text, const std::string& where);

// What stands in for a manifest when the files carry none (the model's vocabulary and EOS).
struct TokenSourceOptions {
  int64_t vocab_size = 0;
  int64_t eos_token_id = -1;        // -1: unknown (the EOS checks are skipped)
  std::optional<TokenDtype> dtype;  // OLMo-core files without a manifest; default: from vocab_size
};

// Which format `path` is in, or nothing when it names none of them (a text file, a missing path).
std::optional<TokenFormat> detect_token_format(const std::string& path);

// Opens `path` in the format it is in; an Error names what was looked for when it is in none.
std::shared_ptr<TokenShards> open_token_source(const std::string& path, const TokenSourceOptions& options = {});

// A writer of `format` at `out` (a directory; for Megatron the prefix DIR/NAME).
std::unique_ptr<TokenWriter> make_token_writer(TokenFormat format, const std::string& out, uint64_t file_tokens,
                                               int64_t vocab_size);

}  // namespace archspace
