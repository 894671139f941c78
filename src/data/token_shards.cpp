#include "archspace/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian uint32; this host is not");

// ---- manifest -------------------------------------------------------------------------------------

uint64_t ShardManifest::total_tokens() const {
  uint64_t n = 0;
  for (const auto& s : shards) n += s.tokens;
  return n;
}

uint64_t ShardManifest::total_documents() const {
  uint64_t n = 0;
  for (const auto& s : shards) n += s.documents;
  return n;
}

json ShardManifest::to_json() const {
  json shards_j = json::array(), sources_j = json::array();
  for (const auto& s : shards)
    shards_j.push_back({{"file", s.file}, {"tokens", s.tokens}, {"documents", s.documents}, {"sha256", s.sha256}});
  for (const auto& s : sources) sources_j.push_back({{"path", s.path}, {"bytes", s.bytes}, {"documents", s.documents}});
  return {{"format", kFormat},
          {"dtype", "uint32"},
          {"byte_order", "little"},
          {"tokenizer",
           {{"name", tokenizer_name},
            {"sha256", tokenizer_sha256},
            {"vocab_size", vocab_size},
            {"eos_token_id", eos_token_id}}},
          {"total_tokens", total_tokens()},
          {"total_documents", total_documents()},
          {"invalid_utf8_replacements", invalid_utf8_replacements},
          {"shards", shards_j},
          {"sources", sources_j}};
}

ShardManifest ShardManifest::from_json(const json& j, const std::string& source) {
  auto fail = [&](const std::string& what) { return Error(source + ": " + what); };
  try {
    if (j.value("format", "") != kFormat) throw fail("field 'format' is not \"" + std::string(kFormat) + "\"");
    if (j.value("dtype", "") != "uint32") throw fail("field 'dtype' must be \"uint32\"");
    ShardManifest m;
    const json& t = j.at("tokenizer");
    m.tokenizer_name = t.at("name").get<std::string>();
    m.tokenizer_sha256 = t.at("sha256").get<std::string>();
    m.vocab_size = t.at("vocab_size").get<int64_t>();
    m.eos_token_id = t.at("eos_token_id").get<int64_t>();
    m.invalid_utf8_replacements = j.value("invalid_utf8_replacements", uint64_t(0));
    for (const json& s : j.at("shards")) {
      m.shards.push_back({s.at("file").get<std::string>(), s.at("tokens").get<uint64_t>(),
                          s.at("documents").get<uint64_t>(), s.at("sha256").get<std::string>()});
      const std::string& f = m.shards.back().file;
      if (f.empty() || f.find('/') != std::string::npos || f == "..")
        throw fail("shard file '" + f + "' is not a file name");
    }
    for (const json& s : j.value("sources", json::array())) {
      m.sources.push_back(
          {s.at("path").get<std::string>(), s.at("bytes").get<uint64_t>(), s.at("documents").get<uint64_t>()});
    }
    if (j.contains("total_tokens") && j["total_tokens"].get<uint64_t>() != m.total_tokens()) {
      throw fail("field 'total_tokens' (" + j["total_tokens"].dump() + ") is not the sum over its shards (" +
                 std::to_string(m.total_tokens()) + ")");
    }
    return m;
  } catch (const json::exception& e) {
    throw fail(std::string("malformed manifest: ") + e.what());
  }
}

ShardManifest ShardManifest::load(const std::string& dir) {
  const fs::path path = fs::path(dir) / "manifest.json";
  if (!fs::exists(path))
    throw Error(dir + ": no manifest.json (not a token shard directory; make one with `archspace tokenize`)");
  return from_json(read_json_file(path.string()), path.string());
}

void ShardManifest::save(const std::string& dir) const {
  const fs::path path = fs::path(dir) / "manifest.json", tmp = fs::path(dir) / "manifest.json.tmp";
  {
    std::ofstream out(tmp);
    out << to_json().dump(2) << "\n";
    if (!out) throw Error(tmp.string() + ": write failed");
  }
  fs::rename(tmp, path);
}

// ---- writer ---------------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string dir, uint64_t max_shard_tokens)
    : dir_(std::move(dir)), max_tokens_(max_shard_tokens) {
  if (max_tokens_ == 0) throw Error("shard size must be at least one token");
  fs::create_directories(dir_);
  if (fs::exists(fs::path(dir_) / "manifest.json")) {
    throw Error(dir_ + ": already holds token shards (manifest.json); choose a new directory");
  }
}

ShardWriter::~ShardWriter() {
  if (file_) std::fclose(file_);  // an unfinished writer leaves only *.tmp files behind
}

void ShardWriter::open_next() {
  char name[32];
  std::snprintf(name, sizeof(name), "part-%05zu.npy", done_.size());
  current_ = ShardEntry{name, 0, 0, ""};
  const std::string tmp = (fs::path(dir_) / (current_.file + ".tmp")).string();
  file_ = std::fopen(tmp.c_str(), "wb");
  if (!file_) throw Error(tmp + ": cannot open for writing: " + std::strerror(errno));
  hash_ = std::make_unique<Sha256>();
}

void ShardWriter::close_current() {
  if (!file_) return;
  const std::string tmp = (fs::path(dir_) / (current_.file + ".tmp")).string();
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0 || std::fclose(file_) != 0) {
    file_ = nullptr;
    throw Error(tmp + ": write failed (disk full?)");
  }
  file_ = nullptr;
  current_.sha256 = hash_->hex_digest();
  fs::rename(tmp, fs::path(dir_) / current_.file);
  done_.push_back(current_);
}

void ShardWriter::add_document(const std::vector<uint32_t>& ids) {
  size_t written = 0;
  bool counted = false;
  while (written < ids.size()) {
    if (!file_) open_next();
    const size_t n = std::min<uint64_t>(ids.size() - written, max_tokens_ - current_.tokens);
    if (std::fwrite(ids.data() + written, sizeof(uint32_t), n, file_) != n) {
      throw Error(dir_ + "/" + current_.file + ".tmp: write failed (disk full?)");
    }
    hash_->update(ids.data() + written, n * sizeof(uint32_t));
    if (!counted) {
      ++current_.documents;  // a document counts in the shard where it starts
      counted = true;
    }
    current_.tokens += n;
    written += n;
    if (current_.tokens == max_tokens_) close_current();
  }
}

ShardManifest ShardWriter::finish(ShardManifest manifest) {
  close_current();
  manifest.shards = done_;
  manifest.save(dir_);
  return manifest;
}

// ---- reader ---------------------------------------------------------------------------------------

std::shared_ptr<TokenShards> TokenShards::open(const std::string& dir) {
  std::shared_ptr<TokenShards> s(new TokenShards());
  s->dir_ = dir;
  s->manifest_ = ShardManifest::load(dir);
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  if (s->manifest_.shards.empty()) throw Error(manifest_path + ": lists no shards");
  for (const auto& entry : s->manifest_.shards) {
    const fs::path path = fs::path(dir) / entry.file;
    if (!fs::exists(path)) throw Error(manifest_path + ": shard '" + entry.file + "' is missing");
    const uint64_t bytes = fs::file_size(path);
    if (bytes % 4 != 0) {
      throw Error(path.string() + ": size " + std::to_string(bytes) +
                  " bytes is not a multiple of 4 (uint32 tokens): truncated or not a token shard");
    }
    if (bytes / 4 != entry.tokens) {
      throw Error(path.string() + ": holds " + std::to_string(bytes / 4) + " tokens but manifest.json says " +
                  std::to_string(entry.tokens) + " (the manifest does not match its shards)");
    }
    Map m;
    m.bytes = bytes;
    if (bytes > 0) {
      int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
      void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw Error(path.string() + ": mmap failed: " + std::strerror(errno));
      m.data = static_cast<const uint32_t*>(p);
    }
    s->maps_.push_back(m);
  }
  return s;
}

TokenShards::~TokenShards() {
  for (auto& m : maps_)
    if (m.data) ::munmap(const_cast<uint32_t*>(m.data), m.bytes);
}

void TokenShards::read(size_t shard, uint64_t offset, uint64_t n, uint32_t* out) const {
  const ShardEntry& entry = manifest_.shards.at(shard);
  if (offset + n > entry.tokens) {
    throw Error(dir_ + "/" + entry.file + ": read of [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                ") past its " + std::to_string(entry.tokens) + " tokens");
  }
  const uint32_t* src = maps_[shard].data + offset;
  const uint32_t vocab = static_cast<uint32_t>(manifest_.vocab_size);
  for (uint64_t i = 0; i < n; ++i) {
    if (src[i] >= vocab) {
      throw Error(dir_ + "/" + entry.file + ": token " + std::to_string(offset + i) + " is id " +
                  std::to_string(src[i]) + ", not below the vocabulary size " + std::to_string(vocab));
    }
  }
  std::memcpy(out, src, n * sizeof(uint32_t));
}

void TokenShards::verify() const {
  for (size_t i = 0; i < maps_.size(); ++i) {
    const ShardEntry& entry = manifest_.shards[i];
    const std::string digest = sha256_bytes(maps_[i].data, maps_[i].bytes);
    if (digest != entry.sha256) {
      throw Error(dir_ + "/" + entry.file + ": SHA-256 " + digest + " does not match manifest.json (" + entry.sha256 +
                  ")");
    }
    std::vector<uint32_t> buf(std::min<uint64_t>(entry.tokens, 1 << 20));
    for (uint64_t off = 0; off < entry.tokens; off += buf.size()) {
      read(i, off, std::min<uint64_t>(buf.size(), entry.tokens - off), buf.data());
    }
  }
}

bool TokenShards::verify_cached() const {
  const fs::path stamp = fs::path(dir_) / ".verified.json";
  json state = {{"manifest_sha256", sha256_file((fs::path(dir_) / "manifest.json").string())},
                {"shards", json::array()}};
  for (const auto& entry : manifest_.shards) {
    const fs::path path = fs::path(dir_) / entry.file;
    state["shards"].push_back({{"file", entry.file},
                               {"bytes", fs::file_size(path)},
                               {"mtime", fs::last_write_time(path).time_since_epoch().count()}});
  }
  std::error_code ec;
  if (fs::exists(stamp, ec)) {
    // A stamp that does not parse (or nests too deep) is stale: verify again.
    json recorded;
    try {
      recorded = parse_json_text(read_text_file(stamp.string()), stamp.string());
    } catch (const Error&) {
    }
    if (recorded == state) return false;
  }
  verify();
  std::ofstream out(stamp.string() + ".tmp");
  out << state.dump() << "\n";
  out.close();
  if (out)
    fs::rename(stamp.string() + ".tmp", stamp, ec);  // best effort: a read-only directory checks each time
  else
    fs::remove(stamp.string() + ".tmp", ec);
  return true;
}

std::vector<int64_t> TokenShards::read_all() const {
  std::vector<int64_t> tokens;
  for (size_t s = 0; s < num_shards(); ++s) {
    std::vector<uint32_t> buf(shard_tokens(s));
    read(s, 0, buf.size(), buf.data());
    tokens.insert(tokens.end(), buf.begin(), buf.end());
  }
  return tokens;
}

}  // namespace archspace
