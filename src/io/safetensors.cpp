#include "archspace/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archspace/util/error.h"
#include "archspace/util/file_writer.h"
#include "archspace/util/json_file.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A header larger than this is not a model file (the format's own reader uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  const char* name;
  at::ScalarType scalar;
  size_t bytes;
};

const std::vector<DTypeInfo>& dtype_table() {
  static const std::vector<DTypeInfo> table = {
      {"F32", at::kFloat, 4}, {"BF16", at::kBFloat16, 2}, {"F16", at::kHalf, 2}, {"F64", at::kDouble, 8},
      {"I64", at::kLong, 8},  {"I32", at::kInt, 4},       {"U8", at::kByte, 1},  {"BOOL", at::kBool, 1},
  };
  return table;
}

const DTypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : dtype_table())
    if (name == d.name) return &d;
  return nullptr;
}

const DTypeInfo& dtype_by_scalar(at::ScalarType s) {
  for (const auto& d : dtype_table())
    if (d.scalar == s) return d;
  throw Error(std::string("safetensors: cannot write tensors of dtype ") + c10::toString(s));
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->self_ = f;
  f->path_ = path;

  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open safetensors file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(errno));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw Error(path + ": not a safetensors file: " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw Error(path + ": mmap failed: " + std::strerror(errno));
  f->map_ = map;
  f->map_size_ = file_size;
  const auto* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > file_size - 8) {
    throw Error(path + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                std::to_string(file_size) + " bytes): truncated or not a safetensors file");
  }
  if (header_len > kMaxHeaderBytes)
    throw Error(path + ": header length " + std::to_string(header_len) + " is implausibly large");

  // As the safetensors library: the header starts with '{', and only spaces may pad it after the JSON.
  if (header_len == 0 || bytes[8] != '{')
    throw Error(path + ": the header does not start with '{': not a safetensors file");
  if (std::memchr(bytes + 8, 0, header_len)) {
    throw Error(path + ": the header holds a NUL byte (only spaces may pad it): corrupt or not a safetensors file");
  }
  check_json_depth(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_len), path + ": header");
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large (1e400)
    throw Error(path + ": malformed JSON header: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": the header is not a JSON object");

  const uint64_t data_size = file_size - 8 - header_len;
  f->data_ = bytes + 8 + header_len;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(path + ": '__metadata__' must be an object of strings");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) throw Error(path + ": '__metadata__." + m.key() + "' must be a string");
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return Error(path + ": tensor '" + name + "': " + what); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw bad("header entry must have dtype, shape and data_offsets");
    }
    TensorInfo info;
    info.name = name;
    if (!entry["dtype"].is_string()) throw bad("dtype must be a string");
    info.dtype = entry["dtype"].get<std::string>();
    const DTypeInfo* dt = dtype_by_name(info.dtype);
    if (!dt) throw bad("unsupported dtype '" + info.dtype + "'");
    if (!entry["shape"].is_array()) throw bad("shape must be a list");
    uint64_t numel = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        throw bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > UINT64_MAX / dim) throw bad("shape overflows");
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw bad("data_offsets must be two non-negative integers");
    }
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    if (info.end < info.begin)
      throw bad("data_offsets end " + std::to_string(info.end) + " is before begin " + std::to_string(info.begin));
    if (info.end > data_size) {
      throw bad("byte range [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                ") is out of bounds: the data section has " + std::to_string(data_size) + " bytes");
    }
    if (numel > UINT64_MAX / dt->bytes || info.end - info.begin != numel * dt->bytes) {
      throw bad("byte range holds " + std::to_string(info.end - info.begin) + " bytes but " + info.dtype + " " +
                shape_string(info.shape) + " needs " + std::to_string(numel * dt->bytes));
    }
    f->tensors_.push_back(std::move(info));
  }

  // Byte ranges must not overlap (an overlap means two tensors alias the same bytes: a corrupt file).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    const TensorInfo* cur = by_offset[i];
    if (cur->begin < prev->end) {
      throw Error(path + ": tensor '" + cur->name + "' byte range [" + std::to_string(cur->begin) + ", " +
                  std::to_string(cur->end) + ") overlaps tensor '" + prev->name + "' [" + std::to_string(prev->begin) +
                  ", " + std::to_string(prev->end) + ")");
    }
  }
  // The tensors must cover the data section exactly, as the safetensors library requires: a gap or trailing
  // bytes mean inserted or lost bytes, which would shift weights silently.
  uint64_t covered = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->begin != covered) {
      throw Error(path + ": tensor '" + t->name + "' starts at byte " + std::to_string(t->begin) +
                  " of the data section but the " + "previous tensor ends at " + std::to_string(covered) +
                  ": the file is not fully covered (corrupt)");
    }
    covered = t->end;
  }
  if (covered != data_size) {
    throw Error(path + ": the tensors cover " + std::to_string(covered) + " bytes of the data section but it has " +
                std::to_string(data_size) + ": trailing bytes (corrupt or appended to)");
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) throw Error(path_ + ": no tensor named '" + name + "'");
  const DTypeInfo* dt = dtype_by_name(info->dtype);
  auto options = at::TensorOptions().dtype(dt->scalar).device(at::kCPU);
  const uint8_t* ptr = data_ + info->begin;
  if (reinterpret_cast<uintptr_t>(ptr) % dt->bytes != 0) {
    // Misaligned for its dtype: copy into owned, aligned memory.
    at::Tensor out = at::empty(info->shape, options);
    std::memcpy(out.data_ptr(), ptr, info->end - info->begin);
    return out;
  }
  // Zero-copy view; the deleter holds the file (and so the mapping) alive. PROT_READ: never write to it.
  std::shared_ptr<const SafetensorsFile> keep = self_.lock();
  auto* holder = new std::shared_ptr<const SafetensorsFile>(keep);
  return at::from_blob(
      const_cast<uint8_t*>(ptr), info->shape, [holder](void*) { delete holder; }, options);
}

// ---- TensorStore ----------------------------------------------------------------------------------

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore s;
  s.files_.push_back(SafetensorsFile::open(path));
  for (const auto& t : s.files_[0]->tensors()) s.where_[t.name] = 0;
  return s;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw Error(index.string() + ": field 'weight_map' is missing or not an object");
    }
    TensorStore s;
    std::map<std::string, size_t> shard_ids;
    std::map<std::string, std::string> expected_shard;  // tensor -> shard per the index
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw Error(index.string() + ": weight_map['" + it.key() + "'] must be a file name");
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        throw Error(index.string() + ": weight_map['" + it.key() + "'] names '" + shard +
                    "', not a file in the directory");
      }
      expected_shard[it.key()] = shard;
      if (!shard_ids.count(shard)) {
        const fs::path shard_path = fs::path(dir) / shard;
        if (!fs::exists(shard_path)) {
          throw Error(index.string() + ": shard '" + shard + "' (holding '" + it.key() + "') is missing from " + dir);
        }
        shard_ids[shard] = s.files_.size();
        s.files_.push_back(SafetensorsFile::open(shard_path.string()));
      }
    }
    for (const auto& [name, shard] : expected_shard) {
      size_t id = shard_ids[shard];
      if (!s.files_[id]->find(name)) {
        throw Error(index.string() + ": tensor '" + name + "' is mapped to shard '" + shard +
                    "', which does not hold it");
      }
      s.where_[name] = id;
    }
    return s;
  }
  if (fs::exists(single)) return open_file(single.string());
  throw Error(dir + ": no model weights (neither model.safetensors nor model.safetensors.index.json)");
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, id] : where_) out.push_back(name);
  return out;
}

const TensorInfo& TensorStore::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("no tensor named '" + name + "' in the model weights");
  return *files_[it->second]->find(name);
}

const std::string& TensorStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("no tensor named '" + name + "' in the model weights");
  return files_[it->second]->path();
}

at::Tensor TensorStore::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("no tensor named '" + name + "' in the model weights");
  return files_[it->second]->tensor(name);
}

// ---- writing --------------------------------------------------------------------------------------

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> contiguous;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (header.contains(name)) throw Error(path + ": tensor '" + name + "' given twice");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const DTypeInfo& dt = dtype_by_scalar(c.scalar_type());
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * dt.bytes;
    header[name] = {{"dtype", dt.name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(c);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data section starts 8-byte aligned
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>((uint64_t(text.size()) >> (8 * i)) & 0xff);

  // Write beside the target and rename, so an interrupted write never leaves a half file under the name.
  const std::string tmp = path + ".tmp";
  try {
    FileWriter out(tmp);
    out.write(len_bytes, 8);
    out.write(text);
    for (const auto& c : contiguous) out.write(c.data_ptr(), c.numel() * c.element_size());
    out.finish();
    rename_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void save_model_weights(const std::string& dir, const NamedTensors& tensors, uint64_t max_shard_bytes) {
  fs::create_directories(dir);
  std::vector<NamedTensors> shards(1);
  uint64_t current = 0, total = 0;
  for (const auto& nt : tensors) {
    uint64_t bytes = static_cast<uint64_t>(nt.second.numel()) * nt.second.element_size();
    if (current > 0 && current + bytes > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(nt);
    current += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    save_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0]);
    return;
  }
  json weight_map = json::object();
  char name[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save_safetensors((fs::path(dir) / name).string(), shards[i]);
    for (const auto& nt : shards[i]) weight_map[nt.first] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace archspace
