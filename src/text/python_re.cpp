#include "archspace/text/python_re.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <map>

#include "archspace/text/python_str.h"
#include "archspace/text/utf8.h"
#include "archspace/util/error.h"

namespace archspace::text {

struct Regex::Compiled {
  std::string pattern;
  pcre2_code* code = nullptr;
  pcre2_match_data* data = nullptr;
  ~Compiled() {
    pcre2_match_data_free(data);
    pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  compiled_->pattern = pattern;
  std::unique_ptr<pcre2_compile_context, decltype(&pcre2_compile_context_free)> context(
      pcre2_compile_context_create(nullptr), &pcre2_compile_context_free);
  pcre2_set_newline(context.get(), PCRE2_NEWLINE_LF);  // `.` and `$` treat only \n as a line end, as Python
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                  &error, &offset, context.get());
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error("regular expression \"" + pattern + "\": " + reinterpret_cast<const char*>(message) + " at " +
                std::to_string(offset));
  }
  compiled_->data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
}

Regex::~Regex() = default;

std::optional<Match> Regex::run(const std::string& s, size_t start, uint32_t options) const {
  const int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, options,
                             compiled_->data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw Error("regular expression \"" + compiled_->pattern + "\": " + reinterpret_cast<const char*>(message));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(compiled_->data);
  const auto n = static_cast<uint32_t>(groups());
  Match m;
  m.start = ov[0];
  m.end = ov[1];
  for (uint32_t g = 0; g <= n; ++g) {
    if (g < static_cast<uint32_t>(rc) && ov[2 * g] != PCRE2_UNSET) {
      m.groups.emplace_back(s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
    } else {
      m.groups.emplace_back(std::nullopt);
    }
  }
  return m;
}

std::optional<Match> Regex::search(const std::string& s, size_t start) const { return run(s, start, 0); }

std::optional<Match> Regex::match(const std::string& s, size_t start) const { return run(s, start, PCRE2_ANCHORED); }

bool Regex::full_match(const std::string& s) const { return run(s, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED).has_value(); }

std::vector<Match> Regex::find_all(const std::string& s) const {
  std::vector<Match> out;
  size_t pos = 0;
  bool last_empty = false;
  while (pos <= s.size()) {
    std::optional<Match> m;
    if (last_empty) {
      m = run(s, pos, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED);
      if (!m) {
        if (pos >= s.size()) break;
        pos += utf8_char_length(s, pos);
        m = run(s, pos, 0);
      }
    } else {
      m = run(s, pos, 0);
    }
    if (!m) break;
    last_empty = m->start == m->end;
    pos = m->end;
    out.push_back(std::move(*m));
  }
  return out;
}

size_t Regex::groups() const {
  uint32_t n = 0;
  pcre2_pattern_info(compiled_->code, PCRE2_INFO_CAPTURECOUNT, &n);
  return n;
}

const Regex& regex(const std::string& pattern) {
  static std::map<std::string, std::unique_ptr<Regex>> cache;
  auto& r = cache[pattern];
  if (!r) r = std::make_unique<Regex>(pattern);
  return *r;
}

namespace {

std::string expand(const std::string& replacement, const Match& m) {
  std::string out;
  for (size_t i = 0; i < replacement.size(); ++i) {
    if (replacement[i] == '\\' && i + 1 < replacement.size() && replacement[i + 1] >= '0' &&
        replacement[i + 1] <= '9') {
      const size_t g = static_cast<size_t>(replacement[++i] - '0');
      if (g < m.groups.size() && m.groups[g]) out += *m.groups[g];  // an unmatched group is empty (Python 3.5+)
    } else {
      out += replacement[i];
    }
  }
  return out;
}

}  // namespace

std::string regex_sub(const std::string& pattern, const std::string& replacement, const std::string& s) {
  std::string out;
  size_t last = 0;
  for (const Match& m : regex(pattern).find_all(s)) {
    out.append(s, last, m.start - last);
    out += expand(replacement, m);
    last = m.end;
  }
  out.append(s, last, std::string::npos);
  return out;
}

std::optional<std::string> last_group(const std::string& pattern, const std::string& s) {
  const std::vector<Match> all = regex(pattern).find_all(s);
  if (all.empty()) return std::nullopt;
  return all.back().groups.size() > 1 ? all.back().groups[1].value_or("") : *all.back().groups[0];
}

std::string py_regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && c != '_') out += '\\';  // PCRE2 and Python: \<punct> is the character
    out += c;
  }
  return out;
}

std::string regex_filter(const std::string& pattern, int group_select, const std::string& fallback,
                         const std::string& s) {
  const Regex& r = regex(pattern);
  const std::vector<Match> matches = r.find_all(s);
  if (matches.empty()) return fallback;
  const long n = static_cast<long>(matches.size());
  const long k = group_select < 0 ? n + group_select : group_select;
  if (k < 0 || k >= n) throw Error("regex filter: group_select " + std::to_string(group_select) + " out of range");
  const Match& m = matches[static_cast<size_t>(k)];
  std::string value;
  const size_t groups = r.groups();
  if (groups == 0) {
    value = *m.groups[0];
  } else if (groups == 1) {
    value = m.groups[1].value_or("");
  } else {  // findall gives a tuple: its first non-empty group, else the fallback
    value = fallback;
    for (size_t g = 1; g <= groups; ++g) {
      if (m.groups[g] && !m.groups[g]->empty()) {
        value = *m.groups[g];
        break;
      }
    }
  }
  return py_strip(value);
}

}  // namespace archspace::text
