// Byte-level BPE from a Hugging Face tokenizer.json, encoding and decoding exactly as `tokenizers` does:
// added/special tokens split out first (leftmost-longest), a Split pre-tokenizer regex (PCRE2, JIT),
// GPT-2 byte-to-unicode mapping, then BPE merges by rank. Thread-safe: encode() may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace archspace {

// The first invalid byte offset of `text` as UTF-8, or nullopt if it is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);
// Replaces each maximal invalid UTF-8 sequence with U+FFFD, as Rust's from_utf8_lossy (and so
// `tokenizers`' decoder) does. Returns the number of replacements through `replaced` if given.
std::string utf8_lossy(std::string_view bytes, size_t* replaced = nullptr);

// "dolma2" (the OLMo 3 tokenizer installed by setup), a directory holding tokenizer.json, or a file.
std::string resolve_tokenizer_path(const std::string& spec);

class Tokenizer;

// The one rule for which tokenizer goes with a model directory (generate, eval, export): `explicit_spec`
// when given; else the tokenizer.json the directory carries (export-hf and training checkpoints write
// one); else `fallback` (export-hf ships dolma2 by default; generate and eval have none and throw, naming
// the directory). Throws when the tokenizer has more ids than `vocab_size` (if > 0), naming both.
std::shared_ptr<const Tokenizer> model_tokenizer(const std::string& model_dir, const std::string& explicit_spec,
                                                 int64_t vocab_size, const std::string& fallback = "");

// A whole text file as token ids (evaluation text, `encode --file`); errors name the file.
std::vector<uint32_t> encode_text_file(const Tokenizer& tokenizer, const std::string& path);

class Tokenizer {
 public:
  static std::shared_ptr<const Tokenizer> load(const std::string& spec);
  ~Tokenizer();

  // Text must be valid UTF-8 (throws archspace::Error naming the byte offset otherwise).
  std::vector<uint32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const { return vocab_size_; }  // highest id + 1
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(uint32_t id) const;
  bool is_special(uint32_t id) const { return id < is_special_.size() && is_special_[id]; }  // an added special token
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }  // of the tokenizer.json file
  // A short name: "allenai/dolma2" for the OLMo 3 tokenizer, else the file name.
  const std::string& name() const { return name_; }

 private:
  Tokenizer() = default;
  struct Regex;
  struct AddedToken {
    std::string content;
    uint32_t id;
    bool special;
  };

  void encode_segment(std::string_view text, std::vector<uint32_t>& out) const;  // no added tokens inside
  void bpe(std::string_view word, std::vector<uint32_t>& out) const;

  std::string path_, sha256_, name_;
  int64_t vocab_size_ = 0;
  std::unordered_map<std::string, uint32_t> vocab_;  // byte-level token string -> id
  std::vector<std::string> id_to_bytes_;             // id -> raw bytes the token stands for
  std::vector<bool> is_special_;
  std::vector<AddedToken> added_;                                       // sorted by content length, longest first
  std::vector<std::vector<size_t>> added_by_first_byte_;                // first byte -> indices into added_
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  uint32_t byte_ids_[256] = {};                                         // id of each single byte's token
  bool ignore_merges_ = false;
  std::unique_ptr<Regex> regex_;
  bool keep_gaps_ = false;  // Split behaviour Isolated (keep non-matching text too) vs Removed with invert
};

}  // namespace archspace
