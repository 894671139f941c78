#include "archspace/data/token_source.h"

#include <filesystem>

#include "archspace/data/megatron_dataset.h"
#include "archspace/data/olmo_core_tokens.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

// A Megatron prefix may be written with either extension.
std::string megatron_prefix(const std::string& path) {
  const fs::path p(path);
  if ((p.extension() == ".idx" || p.extension() == ".bin") && fs::is_regular_file(path))
    return (p.parent_path() / p.stem()).string();
  return path;
}

bool has_npy(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".npy") return true;
  }
  return false;
}

}  // namespace

const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::kShards:
      return "shards";
    case TokenFormat::kMegatron:
      return "megatron";
    case TokenFormat::kOlmoCore:
      return "olmo-core";
  }
  return "?";
}

TokenFormat parse_token_format(const std::string& text, const std::string& where) {
  for (TokenFormat f : {TokenFormat::kShards, TokenFormat::kMegatron, TokenFormat::kOlmoCore})
    if (text == token_format_name(f)) return f;
  throw Error(where + ": unknown token format '" + text + "' (shards, megatron or olmo-core)");
}

std::optional<TokenFormat> detect_token_format(const std::string& path) {
  std::error_code ec;
  const std::string prefix = megatron_prefix(path);
  if (fs::is_regular_file(prefix + ".idx", ec) || fs::is_regular_file(prefix + ".bin", ec))
    return TokenFormat::kMegatron;
  if (fs::is_directory(path, ec)) {
    const fs::path manifest = fs::path(path) / "manifest.json";
    if (fs::exists(manifest, ec)) {
      // The directory's manifest says which layout it describes; an unreadable one is the shard reader's to report.
      try {
        if (read_json_file(manifest.string()).value("format", "") == ShardManifest::kOlmoCoreFormat)
          return TokenFormat::kOlmoCore;
      } catch (const std::exception&) {
      }
      return TokenFormat::kShards;
    }
    if (has_npy(path)) return TokenFormat::kOlmoCore;
    return std::nullopt;
  }
  if (fs::is_regular_file(path, ec) && fs::path(path).extension() == ".npy") return TokenFormat::kOlmoCore;
  return std::nullopt;
}

std::shared_ptr<TokenShards> open_token_source(const std::string& path, const TokenSourceOptions& o) {
  const auto format = detect_token_format(path);
  if (!format) {
    throw Error(path + ": not a token source: no DIR/manifest.json (token shards), no " + path + ".idx/.bin " +
                "(Megatron prefix), no .npy file or directory of them (OLMo-core)");
  }
  switch (*format) {
    case TokenFormat::kShards:
      return TokenShards::open(path);
    case TokenFormat::kMegatron:
      return open_megatron_dataset(megatron_prefix(path), o.vocab_size, o.eos_token_id);
    case TokenFormat::kOlmoCore:
      return open_olmo_core_tokens(path, o.vocab_size, o.eos_token_id, o.dtype);
  }
  return nullptr;
}

std::unique_ptr<TokenWriter> make_token_writer(TokenFormat format, const std::string& out, uint64_t file_tokens,
                                               int64_t vocab_size) {
  switch (format) {
    case TokenFormat::kShards:
      return std::make_unique<ShardWriter>(out, file_tokens);
    case TokenFormat::kMegatron:
      return std::make_unique<MegatronWriter>(out, vocab_size);
    case TokenFormat::kOlmoCore:
      return std::make_unique<OlmoCoreWriter>(out, file_tokens, vocab_size);
  }
  return nullptr;
}

}  // namespace archspace
