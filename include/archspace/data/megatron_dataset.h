// Megatron-Core indexed datasets (PREFIX.bin + PREFIX.idx), read in place as token shards and written by
// `tokenize --format megatron`. The layout is the one of Megatron-LM's
// megatron/core/datasets/indexed_dataset.py (_IndexWriter / _IndexReader):
//   .idx: "MMIDIDX\x00\x00" (9 bytes), version uint64 = 1, dtype code uint8 (1 uint8, 2 int8, 3 int16,
//         4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), sequence count uint64, document count uint64
//         (34 bytes), then sequence lengths int32[sequences], sequence pointers int64[sequences] (byte
//         offsets into .bin), document indices int64[documents] (0, then the sequence index ending each
//         document), all little-endian;
//   .bin: the sequences' token ids in that dtype, one after another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "archspace/data/token_shards.h"

namespace archspace {

// A parsed .idx over its bytes (which must outlive it). The arrays are read through accessors, since
// they sit at unaligned offsets.
struct MegatronIndex {
  static constexpr size_t kHeaderBytes = 34;
  TokenDtype dtype = TokenDtype::kInt32;
  uint64_t sequences = 0;
  uint64_t document_entries = 0;  // the header's document count: documents + 1
  uint64_t tokens = 0;            // sum of the sequence lengths
  const uint8_t* bytes = nullptr;

  int32_t length(uint64_t i) const;
  int64_t pointer(uint64_t i) const;
  int64_t document_index(uint64_t i) const;
  uint64_t documents() const { return document_entries - 1; }
};

// Checks the header, that the counts fit the file before anything is read, and every entry: lengths
// non-negative, pointers contiguous from 0 (each the previous plus its length in bytes), document
// indices rising from 0 to the sequence count. Errors name `path` and the field's byte offset.
MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path);

// PREFIX.idx and PREFIX.bin, with PREFIX.manifest.json when archspace wrote them (tokenizer, checksums).
// Without it, `vocab_size` and `eos_token_id` (the model's) stand in for the tokenizer's.
std::shared_ptr<TokenShards> open_megatron_dataset(const std::string& prefix, int64_t vocab_size, int64_t eos_token_id);

// The sequence lengths of PREFIX.idx (checked as parse_megatron_index checks them): the documents of Megatron's
// GPTDataset.
std::vector<int32_t> megatron_sequence_lengths(const std::string& prefix);

// One sequence per document (as Megatron's preprocess_data.py writes without sentence splitting, with
// --append-eod), in the dtype Megatron picks for the vocabulary (uint16 below 65500 ids, else int32).
// Memory stays bounded: the lengths go to a temporary file until finish() writes the index.
class MegatronWriter : public TokenWriter {
 public:
  MegatronWriter(std::string prefix, int64_t vocab_size);
  ~MegatronWriter() override;
  void add_document(const std::vector<uint32_t>& ids_with_eos) override;
  ShardManifest finish(ShardManifest manifest) override;
  std::string tokenizer_file() const override { return prefix_ + ".tokenizer.json"; }

 private:
  std::string prefix_;
  TokenDtype dtype_;
  std::FILE* bin_ = nullptr;
  std::FILE* lengths_ = nullptr;
  uint64_t documents_ = 0, tokens_ = 0;
  std::unique_ptr<class Sha256> hash_;
};

}  // namespace archspace
