#include "archspace/data/olmo_core_tokens.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/gzip_lines.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

std::string metadata_path(const std::string& npy) {
  const fs::path p(npy);
  return (p.parent_path() / (p.stem().string() + ".csv.gz")).string();
}

bool is_npy(const fs::path& p) { return p.extension() == ".npy"; }

// Strict non-negative decimal: the whole field, no sign, no spaces.
std::optional<uint64_t> parse_offset(const std::string& s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

TokenDtype olmo_core_dtype_for_vocab(int64_t vocab_size) {
  if (vocab_size <= 0) throw Error("OLMo-core token files: the dtype needs the vocabulary size");
  const uint64_t max_id = static_cast<uint64_t>(vocab_size) - 1;
  if (max_id <= 0xFFu) return TokenDtype::kUint8;
  if (max_id <= 0xFFFFu) return TokenDtype::kUint16;
  if (max_id <= 0xFFFFFFFFu) return TokenDtype::kUint32;
  return TokenDtype::kUint64;
}

void read_olmo_core_metadata(const std::string& path, uint64_t tokens,
                             const std::function<void(uint64_t, uint64_t)>& row) {
  uint64_t expected = 0;
  // A document row is a few numbers and names: a line within 1 MiB; the file as long as it is.
  for_each_gzip_line(path, GzipLineLimits{size_t{1} << 20, UINT64_MAX}, [&](const std::string& text, int64_t line) {
    const std::string where = path + ":" + std::to_string(line);
    const size_t c1 = text.find(',');
    const size_t c2 = c1 == std::string::npos ? std::string::npos : text.find(',', c1 + 1);
    const auto start = c1 == std::string::npos ? std::nullopt : parse_offset(text.substr(0, c1));
    const auto end = c1 == std::string::npos ? std::nullopt : parse_offset(text.substr(c1 + 1, c2 - c1 - 1));
    if (!start || !end) throw Error(where + ": expected \"start,end[,...]\" token offsets");
    if (*start != expected) {
      throw Error(where + ": document starts at token " + std::to_string(*start) + ", not where the previous ended (" +
                  std::to_string(expected) + ")");
    }
    if (*end <= *start || *end > tokens) {
      throw Error(where + ": document end " + std::to_string(*end) + " is not in (" + std::to_string(*start) + ", " +
                  std::to_string(tokens) + "] (the token file's size)");
    }
    expected = *end;
    row(*start, *end);
    return true;
  });
  if (expected != tokens) {
    throw Error(path + ": the documents end at token " + std::to_string(expected) + " but the token file holds " +
                std::to_string(tokens) + " (a wrong dtype, or metadata of another file)");
  }
}

std::shared_ptr<TokenShards> open_olmo_core_tokens(const std::string& path, int64_t vocab_size, int64_t eos_token_id,
                                                   std::optional<TokenDtype> dtype) {
  TokenShards::Derived d;
  d.name = path;
  ShardManifest m;
  const fs::path manifest_path = fs::path(path) / "manifest.json";
  if (fs::is_directory(path) && fs::exists(manifest_path)) {
    m = ShardManifest::from_json(read_json_file(manifest_path.string()), manifest_path.string());
    if (m.format != ShardManifest::kOlmoCoreFormat) {
      throw Error(manifest_path.string() + ": field 'format' is not \"" + std::string(ShardManifest::kOlmoCoreFormat) +
                  "\"");
    }
    if (dtype && *dtype != m.dtype) {
      throw Error(path + ": token dtype " + token_dtype_name(*dtype) + " was given, but " + manifest_path.string() +
                  " says " + token_dtype_name(m.dtype));
    }
    d.dir = path;
    d.depends.push_back(manifest_path.string());
  } else {
    std::vector<std::string> files;
    if (fs::is_directory(path)) {
      d.dir = path;
      for (const auto& e : fs::recursive_directory_iterator(path)) {
        if (e.is_regular_file() && is_npy(e.path())) files.push_back(fs::relative(e.path(), path).string());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) throw Error(path + ": no .npy token files in the directory");
    } else if (fs::is_regular_file(path) && is_npy(path)) {
      d.dir = fs::path(path).parent_path().string();
      if (d.dir.empty()) d.dir = ".";
      files.push_back(fs::path(path).filename().string());
    } else {
      throw Error(path + ": not an OLMo-core token file (.npy) or directory of them");
    }
    if (vocab_size <= 0)
      throw Error(path + ": OLMo-core token files without a manifest.json need the vocabulary size from the model");
    m.format = ShardManifest::kOlmoCoreFormat;
    m.dtype = dtype ? *dtype : olmo_core_dtype_for_vocab(vocab_size);
    m.tokenizer_name = "unknown (OLMo-core token files)";
    m.vocab_size = vocab_size;
    m.eos_token_id = eos_token_id;
    const int width = token_dtype_bytes(m.dtype);
    for (const auto& f : files) {
      const std::string full = (fs::path(d.dir) / f).string();
      const uint64_t bytes = fs::file_size(full);
      if (bytes % width != 0) {
        throw Error(full + ": size " + std::to_string(bytes) + " bytes is not a multiple of " + std::to_string(width) +
                    " (" + token_dtype_name(m.dtype) + (dtype ? ", as given" : ", from the vocabulary size") +
                    "): truncated, or another dtype");
      }
      uint64_t documents = 0;
      const std::string meta = metadata_path(full);
      if (fs::exists(meta)) read_olmo_core_metadata(meta, bytes / width, [&](uint64_t, uint64_t) { ++documents; });
      m.shards.push_back({f, bytes / width, documents, ""});
    }
  }
  for (const auto& e : m.shards) {
    const std::string meta = metadata_path((fs::path(d.dir) / e.file).string());
    if (fs::exists(meta)) d.depends.push_back(meta);
  }
  const bool single_file = !fs::is_directory(path);
  d.stamp = single_file ? (fs::path(d.dir) / (fs::path(path).stem().string() + ".verified.json")).string()
                        : (fs::path(path) / ".verified.json").string();
  d.tokenizer_file = (fs::path(d.dir) / "tokenizer.json").string();
  d.manifest = m;
  // Against each file's metadata: every document ends with EOS, except one that ends with its file and
  // goes on in the next. Without metadata, the documents are the EOS tokens.
  const bool own_manifest = !m.shards.empty() && !m.shards[0].sha256.empty();
  d.check_documents = [own_manifest](const TokenShards& s) {
    const ShardManifest& m = s.manifest();
    std::vector<uint64_t> counted;
    if (m.eos_token_id < 0) return counted;
    const auto eos = static_cast<uint64_t>(m.eos_token_id);
    bool continues = false;  // the previous file's last document goes on in this one
    for (size_t f = 0; f < s.num_shards(); ++f) {
      const std::string file = s.shard_path(f), meta = metadata_path(file);
      const uint64_t tokens = s.shard_tokens(f);
      uint64_t documents = 0;
      if (fs::exists(meta)) {
        bool first = true;
        read_olmo_core_metadata(meta, tokens, [&](uint64_t, uint64_t end) {
          if (!(first && continues)) ++documents;
          first = false;
          const bool ends = s.raw_token(f, end - 1) == eos;
          continues = !ends;
          if (!ends && !(end == tokens && f + 1 < s.num_shards())) {
            throw Error(file + ": byte " + std::to_string((end - 1) * token_dtype_bytes(m.dtype)) +
                        ": the document ending at token " + std::to_string(end) + " (per " + meta +
                        ") does not end with EOS (id " + std::to_string(eos) + ")");
          }
        });
        if (tokens == 0) continues = false;
      } else {
        for (uint64_t i = 0; i < tokens; ++i) documents += s.raw_token(f, i) == eos;
        continues = false;
      }
      counted.push_back(documents);
    }
    // A derived manifest counts what it found; archspace's own manifest must agree.
    for (size_t f = 0; f < counted.size(); ++f) {
      if (own_manifest && m.shards[f].documents != counted[f]) {
        throw Error(s.shard_path(f) + ": holds " + std::to_string(counted[f]) + " documents but its manifest says " +
                    std::to_string(m.shards[f].documents));
      }
    }
    return counted;
  };
  return TokenShards::over_files(std::move(d));
}

// ---- writer ---------------------------------------------------------------------------------------

OlmoCoreWriter::OlmoCoreWriter(std::string dir, uint64_t max_file_tokens, int64_t vocab_size)
    : dir_(std::move(dir)), max_tokens_(max_file_tokens), dtype_(olmo_core_dtype_for_vocab(vocab_size)) {
  if (max_tokens_ == 0) throw Error("file size must be at least one token");
  fs::create_directories(dir_);
  if (fs::exists(fs::path(dir_) / "manifest.json"))
    throw Error(dir_ + ": already holds token files (manifest.json); choose a new directory");
}

OlmoCoreWriter::~OlmoCoreWriter() {
  if (file_) std::fclose(file_);
  if (csv_) gzclose(static_cast<gzFile>(csv_));
}

std::string OlmoCoreWriter::tokenizer_file() const { return (fs::path(dir_) / "tokenizer.json").string(); }

void OlmoCoreWriter::open_next() {
  char name[32];
  std::snprintf(name, sizeof(name), "part-%05zu", done_.size());
  current_ = ShardEntry{std::string(name) + ".npy", 0, 0, ""};
  const std::string tmp = (fs::path(dir_) / (current_.file + ".tmp")).string();
  file_ = std::fopen(tmp.c_str(), "wb");
  if (!file_) throw Error(tmp + ": cannot open for writing: " + std::strerror(errno));
  const std::string csv_tmp = (fs::path(dir_) / (std::string(name) + ".csv.gz.tmp")).string();
  csv_ = gzopen(csv_tmp.c_str(), "wb");
  if (!csv_) throw Error(csv_tmp + ": cannot open for writing");
  hash_ = std::make_unique<Sha256>();
}

void OlmoCoreWriter::close_current() {
  if (!file_) return;
  const std::string base = current_.file.substr(0, current_.file.size() - 4);
  const fs::path tmp = fs::path(dir_) / (current_.file + ".tmp"), csv_tmp = fs::path(dir_) / (base + ".csv.gz.tmp");
  const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  const bool csv_ok = gzclose(static_cast<gzFile>(csv_)) == Z_OK;
  csv_ = nullptr;
  if (!ok || !closed || !csv_ok) throw Error(tmp.string() + ": write failed (disk full?)");
  current_.sha256 = hash_->hex_digest();
  fs::rename(csv_tmp, fs::path(dir_) / (base + ".csv.gz"));
  fs::rename(tmp, fs::path(dir_) / current_.file);
  done_.push_back(current_);
}

void OlmoCoreWriter::add_document(const std::vector<uint32_t>& ids) {
  const int width = token_dtype_bytes(dtype_);
  size_t written = 0;
  bool counted = false;
  std::vector<uint8_t> buf;
  while (written < ids.size()) {
    if (!file_) open_next();
    const size_t n = std::min<uint64_t>(ids.size() - written, max_tokens_ - current_.tokens);
    buf.resize(n * width);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t v = ids[written + i];
      std::memcpy(buf.data() + i * width, &v, width);  // little-endian: the low bytes first
    }
    if (std::fwrite(buf.data(), 1, buf.size(), file_) != buf.size())
      throw Error(dir_ + "/" + current_.file + ".tmp: write failed (disk full?)");
    hash_->update(buf.data(), buf.size());
    const std::string row = std::to_string(current_.tokens) + "," + std::to_string(current_.tokens + n) + "\n";
    if (gzwrite(static_cast<gzFile>(csv_), row.data(), static_cast<unsigned>(row.size())) !=
        static_cast<int>(row.size()))
      throw Error(dir_ + "/" + current_.file + ": metadata write failed");
    if (!counted) {
      ++current_.documents;  // a document counts in the file where it starts
      counted = true;
    }
    current_.tokens += n;
    written += n;
    if (current_.tokens == max_tokens_) close_current();
  }
}

ShardManifest OlmoCoreWriter::finish(ShardManifest manifest) {
  close_current();
  manifest.format = ShardManifest::kOlmoCoreFormat;
  manifest.dtype = dtype_;
  manifest.shards = done_;
  write_text_file_atomically((fs::path(dir_) / "manifest.json").string(), manifest.to_json().dump(2) + "\n");
  return manifest;
}

}  // namespace archspace
