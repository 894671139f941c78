// Token shards: flat little-endian uint32 files without header (OLMo-core's .npy memmap layout), one
// EOS after each document, plus manifest.json (tokenizer id and hash, counts, sources, checksums).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace archspace {

struct ShardEntry {
  std::string file;  // relative to the shard directory
  uint64_t tokens = 0;
  uint64_t documents = 0;
  std::string sha256;
};

struct SourceEntry {
  std::string path;
  uint64_t bytes = 0;
  uint64_t documents = 0;
};

struct ShardManifest {
  static constexpr const char* kFormat = "archspace-token-shards/1";
  std::string tokenizer_name, tokenizer_sha256;
  int64_t vocab_size = 0;
  int64_t eos_token_id = -1;
  std::vector<ShardEntry> shards;
  std::vector<SourceEntry> sources;
  uint64_t invalid_utf8_replacements = 0;

  uint64_t total_tokens() const;
  uint64_t total_documents() const;
  nlohmann::json to_json() const;
  static ShardManifest from_json(const nlohmann::json& j, const std::string& source);
  static ShardManifest load(const std::string& dir);  // DIR/manifest.json
  void save(const std::string& dir) const;
};

// Appends documents to part-00000.npy, part-00001.npy, ... rolling over at max_shard_tokens (a document
// may span two shards, as in OLMo's concatenated streams). Files are written under temporary names and
// renamed, with the manifest, by finish().
class ShardWriter {
 public:
  ShardWriter(std::string dir, uint64_t max_shard_tokens);
  ~ShardWriter();
  void add_document(const std::vector<uint32_t>& ids_with_eos);
  // Writes manifest.json (with `manifest`'s tokenizer and source fields) and returns the final manifest.
  ShardManifest finish(ShardManifest manifest);

 private:
  void open_next();
  void close_current();
  std::string dir_;
  uint64_t max_tokens_;
  std::FILE* file_ = nullptr;
  std::vector<ShardEntry> done_;
  ShardEntry current_;
  std::unique_ptr<class Sha256> hash_;
};

// Read side: memory-maps every shard listed in the manifest, after checking that each exists and holds
// exactly the manifest's token count (so a size not a multiple of 4 or a stale manifest is an error).
class TokenShards {
 public:
  static std::shared_ptr<TokenShards> open(const std::string& dir);
  ~TokenShards();

  const ShardManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  size_t num_shards() const { return maps_.size(); }
  uint64_t shard_tokens(size_t shard) const { return manifest_.shards[shard].tokens; }
  // Token ids [offset, offset + n) of one shard; every id is checked against the vocabulary.
  void read(size_t shard, uint64_t offset, uint64_t n, uint32_t* out) const;
  // Every token of every shard, in order (evaluation sets; not for training-sized data).
  std::vector<int64_t> read_all() const;
  // Full check: SHA-256 of each shard against the manifest and every id below vocab_size.
  void verify() const;
  // verify() once per content: after a full check, SHARD_DIR/.verified.json records the manifest's SHA-256
  // and each shard's size and modification time; later calls skip the check while those are unchanged
  // (training calls it at start-up). Returns true when the full check ran. A read-only directory just
  // checks every time.
  bool verify_cached() const;

 private:
  std::string dir_;
  ShardManifest manifest_;
  struct Map {
    const uint32_t* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<Map> maps_;
};

}  // namespace archspace
