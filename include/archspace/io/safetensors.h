// safetensors, our own reader and writer: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw bytes. Reading memory-maps the file and
// validates every offset and size before any tensor is touched.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "archspace/util/tensors.h"

namespace archspace {

struct TensorInfo {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", "F16", "F64", "I64", "I32", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range relative to the start of the data section
  uint64_t end = 0;
};

// One memory-mapped .safetensors file. Tensors returned by tensor() are read-only views into the
// mapping (copied only if misaligned) that keep the mapping alive.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  at::Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// The weights of a model directory: `model.safetensors`, or the shards named by
// `model.safetensors.index.json`. Every shard is opened and checked against the index up front.
class TensorStore {
 public:
  static TensorStore open_dir(const std::string& dir);
  static TensorStore open_file(const std::string& path);

  std::vector<std::string> names() const;  // sorted
  const TensorInfo& info(const std::string& name) const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  at::Tensor tensor(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes one file (tensors are made contiguous and written in their own dtype, F32/BF16/F16/...).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes `model.safetensors` if everything fits in max_shard_bytes, else shards
// `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`, as save_pretrained does.
void save_model_weights(const std::string& dir, const NamedTensors& tensors, uint64_t max_shard_bytes = 5ull << 30);

}  // namespace archspace
