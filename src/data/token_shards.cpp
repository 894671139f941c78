#include "archspace/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian; this host is not");

// ---- element types --------------------------------------------------------------------------------

namespace {
struct DtypeInfo {
  TokenDtype dtype;
  const char* name;
  int bytes;
};
constexpr DtypeInfo kDtypes[] = {{TokenDtype::kUint8, "uint8", 1},   {TokenDtype::kInt8, "int8", 1},
                                 {TokenDtype::kUint16, "uint16", 2}, {TokenDtype::kInt16, "int16", 2},
                                 {TokenDtype::kUint32, "uint32", 4}, {TokenDtype::kInt32, "int32", 4},
                                 {TokenDtype::kUint64, "uint64", 8}, {TokenDtype::kInt64, "int64", 8}};
const DtypeInfo& info(TokenDtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i;
  throw Error("unknown token dtype");
}

// Element i of a little-endian array of `d` (unaligned: a Megatron .bin's sequences need not be).
int64_t element(const uint8_t* p, TokenDtype d, uint64_t i, bool* negative_or_huge) {
  switch (d) {
    case TokenDtype::kUint8:
      return p[i];
    case TokenDtype::kInt8:
      return static_cast<int8_t>(p[i]);
    case TokenDtype::kUint16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case TokenDtype::kInt16: {
      int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case TokenDtype::kUint32: {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case TokenDtype::kInt32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case TokenDtype::kUint64: {
      uint64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      if (v > uint64_t(INT64_MAX)) *negative_or_huge = true;
      return static_cast<int64_t>(v & uint64_t(INT64_MAX));
    }
    case TokenDtype::kInt64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
  return 0;
}
}  // namespace

int token_dtype_bytes(TokenDtype d) { return info(d).bytes; }
const char* token_dtype_name(TokenDtype d) { return info(d).name; }
std::optional<TokenDtype> parse_token_dtype(const std::string& name) {
  for (const auto& i : kDtypes)
    if (name == i.name) return i.dtype;
  return std::nullopt;
}

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
  return {{"format", format},
          {"dtype", token_dtype_name(dtype)},
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
    ShardManifest m;
    m.format = j.value("format", "");
    if (m.format != kFormat && m.format != kMegatronFormat && m.format != kOlmoCoreFormat)
      throw fail("field 'format' is not \"" + std::string(kFormat) + "\"");
    const auto dtype = parse_token_dtype(j.value("dtype", ""));
    if (!dtype || (m.format == kFormat && *dtype != TokenDtype::kUint32))
      throw fail("field 'dtype' must be \"uint32\"" +
                 std::string(m.format == kFormat ? "" : " or another integer type"));
    m.dtype = *dtype;
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

std::string ShardWriter::tokenizer_file() const { return (fs::path(dir_) / "tokenizer.json").string(); }

ShardManifest ShardWriter::finish(ShardManifest manifest) {
  close_current();
  manifest.shards = done_;
  manifest.save(dir_);
  return manifest;
}

// ---- reader ---------------------------------------------------------------------------------------

std::shared_ptr<TokenShards> TokenShards::open(const std::string& dir) {
  std::shared_ptr<TokenShards> s(new TokenShards());
  s->dir_ = s->name_ = dir;
  s->manifest_ = ShardManifest::load(dir);
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  if (s->manifest_.format != ShardManifest::kFormat) {
    throw Error(manifest_path + ": describes " + s->manifest_.format +
                " files, not token shards (open the directory as a token source)");
  }
  s->tokenizer_file_ = (fs::path(dir) / "tokenizer.json").string();
  s->stamp_ = (fs::path(dir) / ".verified.json").string();
  s->map_shards(manifest_path);
  return s;
}

std::shared_ptr<TokenShards> TokenShards::over_files(Derived d) {
  std::shared_ptr<TokenShards> s(new TokenShards());
  s->dir_ = d.dir;
  s->name_ = d.name;
  s->manifest_ = std::move(d.manifest);
  s->check_documents_ = std::move(d.check_documents);
  s->depends_ = std::move(d.depends);
  s->stamp_ = d.stamp;
  s->tokenizer_file_ = d.tokenizer_file;
  s->map_shards(d.name);
  return s;
}

void TokenShards::map_shards(const std::string& manifest_name) {
  if (manifest_.shards.empty()) throw Error(manifest_name + ": lists no shards");
  const int width = token_dtype_bytes(manifest_.dtype);
  for (const auto& entry : manifest_.shards) {
    const fs::path path = fs::path(dir_) / entry.file;
    if (!fs::exists(path)) throw Error(manifest_name + ": shard '" + entry.file + "' is missing");
    const uint64_t bytes = fs::file_size(path);
    if (bytes % width != 0) {
      throw Error(path.string() + ": size " + std::to_string(bytes) + " bytes is not a multiple of " +
                  std::to_string(width) + " (" + token_dtype_name(manifest_.dtype) +
                  " tokens): truncated or not a token file of that type");
    }
    if (bytes / width != entry.tokens) {
      throw Error(path.string() + ": holds " + std::to_string(bytes / width) + " tokens but " + manifest_name +
                  " says " + std::to_string(entry.tokens) + " (the manifest does not match its shards)");
    }
    Map m;
    m.bytes = bytes;
    if (bytes > 0) {
      int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
      void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw Error(path.string() + ": mmap failed: " + std::strerror(errno));
      m.data = static_cast<const uint8_t*>(p);
    }
    maps_.push_back(m);
  }
}

TokenShards::~TokenShards() {
  for (auto& m : maps_)
    if (m.data) ::munmap(const_cast<uint8_t*>(m.data), m.bytes);
}

std::string TokenShards::shard_path(size_t shard) const {
  return (fs::path(dir_) / manifest_.shards.at(shard).file).string();
}

uint64_t TokenShards::raw_token(size_t shard, uint64_t index) const {
  bool huge = false;
  const int64_t v = element(maps_.at(shard).data, manifest_.dtype, index, &huge);
  return huge || v < 0 ? UINT64_MAX : static_cast<uint64_t>(v);
}

namespace {
// Copies n elements of type T from `src` (possibly unaligned) to `out`, returning the index of the first id
// outside [0, vocab), or n. One loop per type, so the engine's uint32 shards read as fast as before.
template <typename T>
uint64_t convert(const uint8_t* src, uint64_t n, int64_t vocab, uint32_t* out) {
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    if constexpr (std::is_signed_v<T>) {
      if (v < 0 || static_cast<int64_t>(v) >= vocab) return i;
    } else {
      if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(vocab)) return i;
    }
    out[i] = static_cast<uint32_t>(v);
  }
  return n;
}
}  // namespace

void TokenShards::read(size_t shard, uint64_t offset, uint64_t n, uint32_t* out) const {
  const ShardEntry& entry = manifest_.shards.at(shard);
  if (offset > entry.tokens || n > entry.tokens - offset) {
    throw Error(shard_path(shard) + ": read of [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                ") past its " + std::to_string(entry.tokens) + " tokens");
  }
  const TokenDtype dtype = manifest_.dtype;
  const int width = token_dtype_bytes(dtype);
  const uint8_t* src = maps_[shard].data + offset * width;
  const int64_t vocab = manifest_.vocab_size;
  if (vocab <= 0) throw Error(dir() + ": vocabulary size " + std::to_string(vocab) + " (its manifest) admits no id");
  uint64_t bad = n;
  switch (dtype) {
    case TokenDtype::kUint8:
      bad = convert<uint8_t>(src, n, vocab, out);
      break;
    case TokenDtype::kInt8:
      bad = convert<int8_t>(src, n, vocab, out);
      break;
    case TokenDtype::kUint16:
      bad = convert<uint16_t>(src, n, vocab, out);
      break;
    case TokenDtype::kInt16:
      bad = convert<int16_t>(src, n, vocab, out);
      break;
    case TokenDtype::kUint32:
      bad = convert<uint32_t>(src, n, vocab, out);
      break;
    case TokenDtype::kInt32:
      bad = convert<int32_t>(src, n, vocab, out);
      break;
    case TokenDtype::kUint64:
      bad = convert<uint64_t>(src, n, vocab, out);
      break;
    case TokenDtype::kInt64:
      bad = convert<int64_t>(src, n, vocab, out);
      break;
  }
  if (bad < n) {
    const uint64_t at = offset + bad;
    bool huge = false;
    const int64_t id = element(maps_[shard].data, dtype, at, &huge);
    throw Error(shard_path(shard) + ": token " + std::to_string(at) + " is id " +
                (huge ? std::string("above 2^63") : std::to_string(id)) + " (byte " + std::to_string(at * width) +
                "), not below the vocabulary size " + std::to_string(vocab));
  }
}

void TokenShards::verify() const {
  for (size_t i = 0; i < maps_.size(); ++i) {
    ShardEntry& entry = manifest_.shards[i];
    const std::string digest = sha256_bytes(maps_[i].data, maps_[i].bytes);
    if (entry.sha256.empty() && check_documents_) {
      entry.sha256 = digest;  // a manifest derived from the files records what it read
    } else if (digest != entry.sha256) {
      throw Error(shard_path(i) + ": SHA-256 " + digest + " does not match " +
                  (check_documents_ ? "its manifest" : "manifest.json") + " (" + entry.sha256 + ")");
    }
    std::vector<uint32_t> buf(std::min<uint64_t>(entry.tokens, 1 << 20));
    for (uint64_t off = 0; off < entry.tokens; off += buf.size()) {
      read(i, off, std::min<uint64_t>(buf.size(), entry.tokens - off), buf.data());
    }
  }
  if (check_documents_) {
    const std::vector<uint64_t> documents = check_documents_(*this);
    for (size_t i = 0; i < documents.size() && i < manifest_.shards.size(); ++i)
      manifest_.shards[i].documents = documents[i];
  }
}

bool TokenShards::verify_cached() const {
  const fs::path stamp = stamp_;
  auto file_state = [](const fs::path& path, const std::string& name) {
    return json{{"file", name},
                {"bytes", fs::file_size(path)},
                {"mtime", fs::last_write_time(path).time_since_epoch().count()}};
  };
  json state = {{"shards", json::array()}};
  if (!check_documents_) {
    state["manifest_sha256"] = sha256_file((fs::path(dir_) / "manifest.json").string());
  } else {
    // A derived manifest is its files: their sizes and times, and what the manifest says of them.
    ShardManifest m = manifest_;
    for (auto& e : m.shards) e.sha256.clear();
    state["manifest"] = m.to_json();
    state["depends"] = json::array();
    for (const auto& d : depends_) state["depends"].push_back(file_state(d, d));
  }
  for (const auto& entry : manifest_.shards)
    state["shards"].push_back(file_state(fs::path(dir_) / entry.file, entry.file));
  std::error_code ec;
  if (fs::exists(stamp, ec)) {
    // A stamp that does not parse (or nests too deep) is stale: verify again.
    json recorded;
    try {
      recorded = parse_json_text(read_text_file(stamp.string()), stamp.string());
    } catch (const Error&) {
    }
    // What verify() derived (checksums, counted documents) comes back from the stamp.
    json derived = recorded.is_object() && recorded.contains("derived") ? recorded["derived"] : json();
    if (recorded.is_object()) recorded.erase("derived");
    if (recorded == state) {
      if (check_documents_ && derived.is_array() && derived.size() == manifest_.shards.size()) {
        for (size_t i = 0; i < derived.size(); ++i) {
          const json& e = derived[i];
          if (!e.is_object() || !e.contains("sha256") || !e["sha256"].is_string() || !e.contains("documents") ||
              !e["documents"].is_number_unsigned())
            break;
          manifest_.shards[i].sha256 = e["sha256"].get<std::string>();
          manifest_.shards[i].documents = e["documents"].get<uint64_t>();
        }
      }
      return false;
    }
  }
  verify();
  if (check_documents_) {
    state["derived"] = json::array();
    for (const auto& e : manifest_.shards)
      state["derived"].push_back({{"sha256", e.sha256}, {"documents", e.documents}});
  }
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
