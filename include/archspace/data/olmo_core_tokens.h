// OLMo-core token files, read in place as token shards and written by `tokenize --format olmo-core`:
// raw little-endian unsigned integers without a numpy header (what OLMo-core's NumpyDataset memory-maps,
// src/olmo_core/data/numpy_dataset.py), EOS after each document, and beside each FILE.npy an optional
// FILE.csv.gz of document boundaries, one "start,end[,...]" line per document in token offsets (the
// Dolma toolkit's metadata, read by olmo_core.data.utils.iter_document_indices).
//
// The files carry no dtype: it is the one given, else the one OLMo-core's NumpyDatasetConfig.get_dtype()
// picks, the smallest of uint8/16/32/64 that holds vocab_size - 1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "archspace/data/token_shards.h"

namespace archspace {

TokenDtype olmo_core_dtype_for_vocab(int64_t vocab_size);

// Calls row(start, end) for each line of a .csv.gz document-boundary file, after checking that the rows
// tile [0, tokens) in order (each starts where the previous ended, and is not empty). Errors name the
// file and line.
void read_olmo_core_metadata(const std::string& csv_gz, uint64_t tokens,
                             const std::function<void(uint64_t start, uint64_t end)>& row);

// A directory (every *.npy below it, in sorted order) or one .npy file. DIR/manifest.json, when
// archspace wrote the files, gives the files, dtype, tokenizer and checksums; otherwise `dtype` (or the
// vocabulary's) and the model's `vocab_size` and `eos_token_id` stand in.
std::shared_ptr<TokenShards> open_olmo_core_tokens(const std::string& path, int64_t vocab_size, int64_t eos_token_id,
                                                   std::optional<TokenDtype> dtype);

// DIR/part-00000.npy, ... rolling over at max_file_tokens exactly as ShardWriter does (so the same
// tokens make the same windows), each with its part-NNNNN.csv.gz; a document that spans two files has a
// row in each. manifest.json (format olmo-core-numpy/1) records the rest.
class OlmoCoreWriter : public TokenWriter {
 public:
  OlmoCoreWriter(std::string dir, uint64_t max_file_tokens, int64_t vocab_size);
  ~OlmoCoreWriter() override;
  void add_document(const std::vector<uint32_t>& ids_with_eos) override;
  ShardManifest finish(ShardManifest manifest) override;
  std::string tokenizer_file() const override;

 private:
  void open_next();
  void close_current();
  std::string dir_;
  uint64_t max_tokens_;
  TokenDtype dtype_;
  std::FILE* file_ = nullptr;
  void* csv_ = nullptr;  // gzFile
  std::vector<ShardEntry> done_;
  ShardEntry current_;
  std::unique_ptr<class Sha256> hash_;
};

}  // namespace archspace
