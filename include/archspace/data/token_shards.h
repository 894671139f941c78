// Token shards: flat little-endian uint32 files without header (OLMo-core's .npy memmap layout), one
// EOS after each document, plus manifest.json (tokenizer id and hash, counts, sources, checksums).
// TokenShards is also the read side of the other token file formats (data/megatron_dataset,
// data/olmo_core_tokens): each maps its files and derives a manifest; data/token_source picks the reader.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace archspace {

// The element type of a token file. The engine writes uint32; Megatron's .bin and OLMo-core's .npy
// files hold narrower or signed integers.
enum class TokenDtype { kUint8, kInt8, kUint16, kInt16, kUint32, kInt32, kUint64, kInt64 };
int token_dtype_bytes(TokenDtype d);
const char* token_dtype_name(TokenDtype d);  // numpy's name: "uint16", "int32", ...
std::optional<TokenDtype> parse_token_dtype(const std::string& name);

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
  // The manifests archspace writes beside Megatron and OLMo-core files it writes (same fields).
  static constexpr const char* kMegatronFormat = "megatron-indexed/1";
  static constexpr const char* kOlmoCoreFormat = "olmo-core-numpy/1";
  std::string format = kFormat;
  TokenDtype dtype = TokenDtype::kUint32;
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

// Where `tokenize` writes documents (ShardWriter; the Megatron and OLMo-core writers).
class TokenWriter {
 public:
  virtual ~TokenWriter() = default;
  virtual void add_document(const std::vector<uint32_t>& ids_with_eos) = 0;
  // Writes the manifest (with `manifest`'s tokenizer and source fields) and returns the final one.
  virtual ShardManifest finish(ShardManifest manifest) = 0;
  // Where the tokenizer.json used travels with the files (copied there before finish()).
  virtual std::string tokenizer_file() const = 0;
};

// Appends documents to part-00000.npy, part-00001.npy, ... rolling over at max_shard_tokens (a document
// may span two shards, as in OLMo's concatenated streams). Files are written under temporary names and
// renamed, with the manifest, by finish().
class ShardWriter : public TokenWriter {
 public:
  ShardWriter(std::string dir, uint64_t max_shard_tokens);
  ~ShardWriter() override;
  void add_document(const std::vector<uint32_t>& ids_with_eos) override;
  // Writes manifest.json (with `manifest`'s tokenizer and source fields) and returns the final manifest.
  ShardManifest finish(ShardManifest manifest) override;
  std::string tokenizer_file() const override;

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

  // For the format readers: maps `manifest.shards` (file names relative to `dir`, each holding
  // `tokens` elements of `manifest.dtype`; a size that disagrees is an error naming the file).
  // `name` is what errors call the source (a directory, a Megatron prefix, a file). `check_documents`
  // runs in verify(): the format's document boundaries against its metadata and EOS; it returns the
  // documents per shard when it counted them (the manifest takes them), else nothing. `depends` are
  // further files whose change invalidates verify_cached()'s stamp, kept at `stamp`.
  struct Derived {
    std::string name, dir;
    ShardManifest manifest;
    std::function<std::vector<uint64_t>(const TokenShards&)> check_documents;
    std::vector<std::string> depends;
    std::string stamp;
    std::string tokenizer_file;
  };
  static std::shared_ptr<TokenShards> over_files(Derived derived);
  ~TokenShards();

  const ShardManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return name_; }  // the source as named (a directory, prefix or file)
  // The tokenizer.json that travels with the files (it may not exist).
  const std::string& tokenizer_file() const { return tokenizer_file_; }
  std::string shard_path(size_t shard) const;
  // Element `index` of a shard as stored (no vocabulary check), for the format readers' EOS checks.
  uint64_t raw_token(size_t shard, uint64_t index) const;
  size_t num_shards() const { return maps_.size(); }
  uint64_t shard_tokens(size_t shard) const { return manifest_.shards[shard].tokens; }
  // Token ids [offset, offset + n) of one shard; every id is checked against the vocabulary.
  void read(size_t shard, uint64_t offset, uint64_t n, uint32_t* out) const;
  // Every token of every shard, in order (evaluation sets; not for training-sized data).
  std::vector<int64_t> read_all() const;
  // Full check: SHA-256 of each shard against the manifest (a derived manifest without checksums
  // records them), every id below vocab_size, and the format's document check.
  void verify() const;
  // verify() once per content: after a full check, SHARD_DIR/.verified.json records the manifest's SHA-256
  // and each shard's size and modification time; later calls skip the check while those are unchanged
  // (training calls it at start-up). Returns true when the full check ran. A read-only directory just
  // checks every time.
  bool verify_cached() const;

 private:
  void map_shards(const std::string& manifest_name);
  std::string dir_, name_, tokenizer_file_, stamp_;
  mutable ShardManifest manifest_;  // verify() fills a derived manifest's checksums
  std::function<std::vector<uint64_t>(const TokenShards&)> check_documents_;
  std::vector<std::string> depends_;
  struct Map {
    const uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<Map> maps_;
};

}  // namespace archspace
