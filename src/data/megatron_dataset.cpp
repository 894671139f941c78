#include "archspace/data/megatron_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Megatron's DType codes; 6 and 7 are float64 and float32, which hold no token ids.
std::optional<TokenDtype> dtype_of_code(uint8_t code) {
  switch (code) {
    case 1:
      return TokenDtype::kUint8;
    case 2:
      return TokenDtype::kInt8;
    case 3:
      return TokenDtype::kInt16;
    case 4:
      return TokenDtype::kInt32;
    case 5:
      return TokenDtype::kInt64;
    case 8:
      return TokenDtype::kUint16;
    default:
      return std::nullopt;
  }
}

uint8_t code_of_dtype(TokenDtype d) {
  switch (d) {
    case TokenDtype::kUint8:
      return 1;
    case TokenDtype::kInt8:
      return 2;
    case TokenDtype::kInt16:
      return 3;
    case TokenDtype::kInt32:
      return 4;
    case TokenDtype::kInt64:
      return 5;
    case TokenDtype::kUint16:
      return 8;
    default:
      throw Error(std::string("Megatron datasets have no dtype ") + token_dtype_name(d));
  }
}

// A read-only mapping of a whole file, shared by the reader and its document check.
struct Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    size = static_cast<size_t>(fs::file_size(path));
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw Error(path + ": mmap failed: " + std::strerror(errno));
      }
      data = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n && std::fwrite(data, 1, n, f) != n) throw Error(path + ": write failed (disk full?)");
}

void close_file(std::FILE*& f, const std::string& path) {
  if (!f) return;
  const bool ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  f = nullptr;
  if (!ok || !closed) throw Error(path + ": write failed (disk full?)");
}

}  // namespace

int32_t MegatronIndex::length(uint64_t i) const { return load<int32_t>(bytes + kHeaderBytes + 4 * i); }
int64_t MegatronIndex::pointer(uint64_t i) const { return load<int64_t>(bytes + kHeaderBytes + 4 * sequences + 8 * i); }
int64_t MegatronIndex::document_index(uint64_t i) const {
  return load<int64_t>(bytes + kHeaderBytes + 12 * sequences + 8 * i);
}

MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path) {
  auto fail = [&](uint64_t offset, const std::string& what) {
    return Error(path + ": byte " + std::to_string(offset) + ": " + what);
  };
  if (size < MegatronIndex::kHeaderBytes) {
    throw fail(size, "truncated header: the file has " + std::to_string(size) + " bytes, a Megatron index header " +
                         std::to_string(MegatronIndex::kHeaderBytes));
  }
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
    throw fail(0, "wrong magic: not a Megatron index (expected \"MMIDIDX\\x00\\x00\")");
  const uint64_t version = load<uint64_t>(data + 9);
  if (version != 1) throw fail(9, "unknown version " + std::to_string(version) + " (only version 1 is defined)");
  const uint8_t code = data[17];
  const auto dtype = dtype_of_code(code);
  if (!dtype) {
    throw fail(17, "bad dtype code " + std::to_string(code) +
                       (code == 6 || code == 7 ? " (a float type, which holds no token ids)"
                                               : " (known: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)"));
  }
  MegatronIndex idx;
  idx.dtype = *dtype;
  idx.bytes = data;
  idx.sequences = load<uint64_t>(data + 18);
  idx.document_entries = load<uint64_t>(data + 26);
  // Counts against the file before any arithmetic that could overflow, and before any read.
  const uint64_t body = size - MegatronIndex::kHeaderBytes;
  if (idx.sequences > body / 12) {
    throw fail(18, "sequence count " + std::to_string(idx.sequences) + " needs " +
                       (idx.sequences > UINT64_MAX / 12 ? std::string("more") : std::to_string(12 * idx.sequences)) +
                       " bytes of lengths and pointers, but the file has " + std::to_string(body) +
                       " after its header");
  }
  const uint64_t after_sequences = body - 12 * idx.sequences;
  if (idx.document_entries > after_sequences / 8) {
    throw fail(26, "document count " + std::to_string(idx.document_entries) + " needs more than the " +
                       std::to_string(after_sequences) + " bytes left after the sequence arrays");
  }
  const uint64_t end = MegatronIndex::kHeaderBytes + 12 * idx.sequences + 8 * idx.document_entries;
  if (end != size) {
    throw fail(end, std::to_string(size - end) + " bytes after the document indices" +
                        (size - end == idx.sequences ? " (sequence modes: a multimodal dataset, not supported)" : ""));
  }
  if (idx.document_entries == 0) throw fail(26, "document count 0 (the document indices start with 0)");

  const int width = token_dtype_bytes(idx.dtype);
  const uint64_t lengths_at = MegatronIndex::kHeaderBytes, pointers_at = lengths_at + 4 * idx.sequences,
                 documents_at = pointers_at + 8 * idx.sequences;
  uint64_t expected = 0;  // the next sequence's byte offset in .bin
  for (uint64_t i = 0; i < idx.sequences; ++i) {
    const int32_t len = idx.length(i);
    if (len < 0) throw fail(lengths_at + 4 * i, "sequence_lengths[" + std::to_string(i) + "] is negative");
    const int64_t ptr = idx.pointer(i);
    if (ptr < 0 || static_cast<uint64_t>(ptr) != expected) {
      throw fail(pointers_at + 8 * i, "sequence_pointers[" + std::to_string(i) + "] is " + std::to_string(ptr) +
                                          " but the lengths before it put the sequence at byte " +
                                          std::to_string(expected) + " of .bin (pointer/length mismatch)");
    }
    expected += static_cast<uint64_t>(len) * width;  // < 2^34 per step, checked each step: no wrap-around
    idx.tokens += static_cast<uint64_t>(len);
    if (expected > static_cast<uint64_t>(INT64_MAX))
      throw fail(lengths_at + 4 * i, "the sequence lengths add up past 2^63 bytes");
  }
  int64_t previous = -1;
  for (uint64_t d = 0; d < idx.document_entries; ++d) {
    const int64_t v = idx.document_index(d);
    const bool ok = d == 0 ? v == 0 : v >= previous && static_cast<uint64_t>(v) <= idx.sequences;
    if (!ok) {
      throw fail(documents_at + 8 * d,
                 "document_indices[" + std::to_string(d) + "] is " + std::to_string(v) +
                     (d == 0 ? " (must be 0)"
                             : " (must rise from the previous, " + std::to_string(previous) +
                                   ", to at most the sequence count " + std::to_string(idx.sequences) + ")"));
    }
    previous = v;
  }
  if (static_cast<uint64_t>(previous) != idx.sequences) {
    throw fail(documents_at + 8 * (idx.document_entries - 1),
               "the last document index is " + std::to_string(previous) + ", not the sequence count " +
                   std::to_string(idx.sequences) + " (sequences after the last document)");
  }
  return idx;
}

std::vector<int32_t> megatron_sequence_lengths(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx";
  const Mapping mapping(idx_path);
  const MegatronIndex idx = parse_megatron_index(mapping.data, mapping.size, idx_path);
  std::vector<int32_t> lengths(idx.sequences);
  for (uint64_t i = 0; i < idx.sequences; ++i) lengths[i] = idx.length(i);
  return lengths;
}

std::shared_ptr<TokenShards> open_megatron_dataset(const std::string& prefix, int64_t vocab_size,
                                                   int64_t eos_token_id) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin", manifest_path = prefix + ".manifest.json";
  if (!fs::is_regular_file(idx_path)) throw Error(prefix + ": no Megatron index " + idx_path);
  if (!fs::is_regular_file(bin_path)) throw Error(prefix + ": no Megatron data file " + bin_path);
  auto mapping = std::make_shared<Mapping>(idx_path);
  const MegatronIndex idx = parse_megatron_index(mapping->data, mapping->size, idx_path);
  const uint64_t bin_bytes = fs::file_size(bin_path), width = token_dtype_bytes(idx.dtype);
  if (bin_bytes != idx.tokens * width) {
    throw Error(bin_path + ": " + std::to_string(bin_bytes) + " bytes, but " + idx_path + " describes " +
                std::to_string(idx.tokens) + " " + token_dtype_name(idx.dtype) + " tokens (" +
                std::to_string(idx.tokens * width) +
                " bytes): " + (bin_bytes < idx.tokens * width ? "truncated" : "trailing data"));
  }

  const std::string name = fs::path(bin_path).filename().string();
  ShardManifest m;
  if (fs::exists(manifest_path)) {
    m = ShardManifest::from_json(read_json_file(manifest_path), manifest_path);
    if (m.format != ShardManifest::kMegatronFormat)
      throw Error(manifest_path + ": field 'format' is not \"" + std::string(ShardManifest::kMegatronFormat) + "\"");
    if (m.shards.size() != 1 || m.shards[0].file != name)
      throw Error(manifest_path + ": field 'shards' must list " + name + " alone");
    if (m.dtype != idx.dtype || m.shards[0].tokens != idx.tokens || m.shards[0].documents != idx.documents()) {
      throw Error(manifest_path + ": says " + std::to_string(m.shards[0].tokens) + " " + token_dtype_name(m.dtype) +
                  " tokens in " + std::to_string(m.shards[0].documents) + " documents, but " + idx_path +
                  " describes " + std::to_string(idx.tokens) + " " + token_dtype_name(idx.dtype) + " tokens in " +
                  std::to_string(idx.documents()) + " (the manifest does not match its dataset)");
    }
  } else {
    if (vocab_size <= 0) {
      throw Error(prefix + ": a Megatron dataset without " + fs::path(manifest_path).filename().string() +
                  " needs the vocabulary size from the model");
    }
    m.format = ShardManifest::kMegatronFormat;
    m.dtype = idx.dtype;
    m.tokenizer_name = "unknown (Megatron dataset)";
    m.vocab_size = vocab_size;
    m.eos_token_id = eos_token_id;
    m.shards.push_back({name, idx.tokens, idx.documents(), ""});
  }

  TokenShards::Derived d;
  d.name = prefix;
  d.dir = fs::path(bin_path).parent_path().string();
  if (d.dir.empty()) d.dir = ".";
  d.manifest = m;
  d.depends = {idx_path};
  if (fs::exists(manifest_path)) d.depends.push_back(manifest_path);
  d.stamp = prefix + ".verified.json";
  d.tokenizer_file = prefix + ".tokenizer.json";
  // Each document's last token is EOS (Megatron's --append-eod), as in the engine's shards: without it,
  // documents would run together in training.
  d.check_documents = [mapping, idx, idx_path](const TokenShards& s) {
    const int64_t eos = s.manifest().eos_token_id;
    if (eos < 0) return std::vector<uint64_t>();
    uint64_t token_end = 0, seq = 0;  // tokens before sequence `seq`
    for (uint64_t doc = 0; doc < idx.documents(); ++doc) {
      const uint64_t last = static_cast<uint64_t>(idx.document_index(doc + 1));
      for (; seq < last; ++seq) token_end += static_cast<uint64_t>(idx.length(seq));
      if (last == static_cast<uint64_t>(idx.document_index(doc)) || token_end == 0) continue;  // empty document
      if (s.raw_token(0, token_end - 1) != static_cast<uint64_t>(eos)) {
        throw Error(s.shard_path(0) + ": byte " + std::to_string((token_end - 1) * token_dtype_bytes(idx.dtype)) +
                    ": document " + std::to_string(doc) + " (per " + idx_path + ") does not end with EOS (id " +
                    std::to_string(eos) + "); write the dataset with --append-eod");
      }
    }
    return std::vector<uint64_t>();
  };
  return TokenShards::over_files(std::move(d));
}

// ---- writer ---------------------------------------------------------------------------------------

MegatronWriter::MegatronWriter(std::string prefix, int64_t vocab_size)
    : prefix_(std::move(prefix)),
      dtype_(vocab_size < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32),
      hash_(std::make_unique<Sha256>()) {
  for (const char* ext : {".bin", ".idx", ".manifest.json"}) {
    if (fs::exists(prefix_ + ext)) throw Error(prefix_ + ext + ": already exists; choose a new prefix");
  }
  const fs::path parent = fs::path(prefix_).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  bin_ = std::fopen((prefix_ + ".bin.tmp").c_str(), "wb");
  lengths_ = std::fopen((prefix_ + ".lengths.tmp").c_str(), "w+b");
  if (!bin_ || !lengths_) throw Error(prefix_ + ".bin.tmp: cannot open for writing: " + std::strerror(errno));
}

MegatronWriter::~MegatronWriter() {
  std::error_code ec;
  if (bin_) std::fclose(bin_);
  if (lengths_) std::fclose(lengths_);
  fs::remove(prefix_ + ".lengths.tmp", ec);  // an unfinished writer leaves only PREFIX.bin.tmp behind
}

void MegatronWriter::add_document(const std::vector<uint32_t>& ids) {
  if (ids.size() > static_cast<size_t>(INT32_MAX))
    throw Error(prefix_ + ".bin: a document of " + std::to_string(ids.size()) + " tokens exceeds int32 lengths");
  const int width = token_dtype_bytes(dtype_);
  std::vector<uint8_t> buf(ids.size() * width);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (dtype_ == TokenDtype::kUint16) {
      const uint16_t v = static_cast<uint16_t>(ids[i]);
      std::memcpy(buf.data() + 2 * i, &v, 2);
    } else {
      const int32_t v = static_cast<int32_t>(ids[i]);
      std::memcpy(buf.data() + 4 * i, &v, 4);
    }
  }
  write_all(bin_, buf.data(), buf.size(), prefix_ + ".bin.tmp");
  hash_->update(buf.data(), buf.size());
  const int32_t len = static_cast<int32_t>(ids.size());
  write_all(lengths_, &len, 4, prefix_ + ".lengths.tmp");
  ++documents_;
  tokens_ += ids.size();
}

ShardManifest MegatronWriter::finish(ShardManifest manifest) {
  close_file(bin_, prefix_ + ".bin.tmp");
  const std::string idx_tmp = prefix_ + ".idx.tmp";
  std::FILE* idx = std::fopen(idx_tmp.c_str(), "wb");
  if (!idx) throw Error(idx_tmp + ": cannot open for writing: " + std::strerror(errno));
  try {
    const uint64_t version = 1, sequences = documents_, entries = documents_ + 1;
    const uint8_t code = code_of_dtype(dtype_);
    write_all(idx, kMagic, sizeof(kMagic), idx_tmp);
    write_all(idx, &version, 8, idx_tmp);
    write_all(idx, &code, 1, idx_tmp);
    write_all(idx, &sequences, 8, idx_tmp);
    write_all(idx, &entries, 8, idx_tmp);
    // Lengths, then pointers from the lengths, then document indices 0..n: streamed in blocks.
    std::vector<int32_t> block(1 << 16);
    for (int pass = 0; pass < 2; ++pass) {
      std::rewind(lengths_);
      int64_t pointer = 0;
      for (size_t n; (n = std::fread(block.data(), 4, block.size(), lengths_)) > 0;) {
        if (pass == 0) {
          write_all(idx, block.data(), 4 * n, idx_tmp);
          continue;
        }
        std::vector<int64_t> pointers(n);
        for (size_t i = 0; i < n; ++i) {
          pointers[i] = pointer;
          pointer += static_cast<int64_t>(block[i]) * token_dtype_bytes(dtype_);
        }
        write_all(idx, pointers.data(), 8 * n, idx_tmp);
      }
    }
    std::vector<int64_t> docs;
    for (uint64_t d = 0; d <= documents_; ++d) {
      docs.push_back(static_cast<int64_t>(d));
      if (docs.size() == block.size() || d == documents_) {
        write_all(idx, docs.data(), 8 * docs.size(), idx_tmp);
        docs.clear();
      }
    }
  } catch (...) {
    std::fclose(idx);
    throw;
  }
  close_file(idx, idx_tmp);
  std::fclose(lengths_);
  lengths_ = nullptr;
  fs::remove(prefix_ + ".lengths.tmp");
  fs::rename(prefix_ + ".bin.tmp", prefix_ + ".bin");
  fs::rename(idx_tmp, prefix_ + ".idx");
  manifest.format = ShardManifest::kMegatronFormat;
  manifest.dtype = dtype_;
  manifest.shards = {{fs::path(prefix_ + ".bin").filename().string(), tokens_, documents_, hash_->hex_digest()}};
  write_text_file_atomically(prefix_ + ".manifest.json", manifest.to_json().dump(2) + "\n");
  return manifest;
}

}  // namespace archspace
