#include "archspace/text/python_str.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <unordered_map>

#include "archspace/text/utf8.h"
#include "archspace/util/error.h"

namespace archspace::text {

namespace {

// The case data Python's str.lower and str.capitalize apply (scripts/python_case_tables.py).
struct CaseRun {
  char32_t first, last;
  int stride;
  int32_t delta;
};
struct CaseMapping {
  char32_t c;
  const char* utf8;
};
struct CodePointRange {
  char32_t first, last;
};
#include "python_case_tables.inc"

using CaseMap = std::unordered_map<char32_t, std::string>;

template <size_t R, size_t L>
CaseMap case_map(const CaseRun (&runs)[R], const CaseMapping (&long_mappings)[L]) {
  CaseMap map;
  for (const CaseRun& r : runs) {
    for (char32_t c = r.first; c <= r.last; c += static_cast<char32_t>(r.stride)) {
      std::string s;
      append_utf8(s, static_cast<char32_t>(static_cast<int64_t>(c) + r.delta));
      map[c] = s;
    }
  }
  for (const CaseMapping& m : long_mappings) map[m.c] = m.utf8;
  return map;
}

const CaseMap& lower_map() {
  static const CaseMap map = case_map(kPyLowerRuns, kPyLowerLong);
  return map;
}

const CaseMap& title_map() {
  static const CaseMap map = case_map(kPyTitleRuns, kPyTitleLong);
  return map;
}

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t c) {
  const auto* it = std::upper_bound(std::begin(ranges), std::end(ranges), c,
                                    [](char32_t x, const CodePointRange& r) { return x < r.first; });
  return it != std::begin(ranges) && c <= (it - 1)->last;
}

// CPython's handle_capital_sigma (Unicode's Final_Sigma): the capital sigma at `i` lowers to the final form when a
// cased letter precedes it and none follows, case-ignorable characters skipped both ways.
bool final_sigma(const std::vector<char32_t>& cps, size_t i) {
  size_t j = i;
  while (j > 0 && in_ranges(kPyCaseIgnorable, cps[j - 1])) --j;
  if (j == 0 || !in_ranges(kPyCased, cps[j - 1])) return false;
  size_t k = i + 1;
  while (k < cps.size() && in_ranges(kPyCaseIgnorable, cps[k])) ++k;
  return k == cps.size() || !in_ranges(kPyCased, cps[k]);
}

void append_lower(std::string& out, const std::vector<char32_t>& cps, size_t i) {
  const char32_t c = cps[i];
  if (c < 0x80) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (c == 0x3A3) {
    append_utf8(out, final_sigma(cps, i) ? 0x3C2 : 0x3C3);
  } else if (const auto it = lower_map().find(c); it != lower_map().end()) {
    out += it->second;
  } else {
    append_utf8(out, c);
  }
}

}  // namespace

// The Unicode White_Space characters and the separators \x1c-\x1f.
bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_lower(const std::string& s) {
  const std::vector<char32_t> cps = decode_utf8(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) append_lower(out, cps, i);
  return out;
}

std::string py_capitalize(const std::string& s) {
  const std::vector<char32_t> cps = decode_utf8(s);
  if (cps.empty()) return s;
  std::string out;
  out.reserve(s.size());
  if (const auto it = title_map().find(cps[0]); it != title_map().end()) {
    out += it->second;  // the full titlecase mapping: "ß" -> "Ss", "ǆ" -> "ǅ"
  } else {
    append_utf8(out, cps[0]);
  }
  for (size_t i = 1; i < cps.size(); ++i) append_lower(out, cps, i);  // the sigma rule sees the whole string
  return out;
}

std::string py_strip(const std::string& s) {
  const std::vector<char32_t> cps = decode_utf8(s);
  size_t b = 0, e = cps.size();
  while (b < e && py_isspace(cps[b])) ++b;
  while (e > b && py_isspace(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) append_utf8(out, cps[i]);
  return out;
}

namespace {

// Whether the character of s at byte i (utf8_char_length(s, i) bytes) is whitespace.
bool space_at(const std::string& s, size_t i) {
  const std::vector<char32_t> c = decode_utf8(s.substr(i, utf8_char_length(s, i)));
  return c.size() == 1 && py_isspace(c[0]);
}

}  // namespace

// The two keep the bytes of s that remain (a byte that starts no UTF-8 character is not whitespace).
std::string py_lstrip(const std::string& s) {
  size_t b = 0;
  while (b < s.size() && space_at(s, b)) b += utf8_char_length(s, b);
  return s.substr(b);
}

std::string py_rstrip(const std::string& s) {
  size_t end = 0;  // the end of the last character that is not whitespace
  for (size_t i = 0; i < s.size(); i += utf8_char_length(s, i)) {
    if (!space_at(s, i)) end = i + utf8_char_length(s, i);
  }
  return s.substr(0, end);
}

std::vector<std::string> py_split(const std::string& s) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  for (char32_t c : decode_utf8(s)) {
    if (py_isspace(c)) {
      if (in_word) out.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      append_utf8(word, c);
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(word));
  return out;
}

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

const std::string kPyPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

std::string remove_punctuation(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (kPyPunctuation.find(c) == std::string::npos) out += c;
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t start = 0;
  for (size_t pos; (pos = s.find(from, start)) != std::string::npos; start = pos + from.size()) {
    out.append(s, start, pos - start);
    out += to;
  }
  out.append(s, start, std::string::npos);
  s = std::move(out);
}

namespace {

// Python float(s) without its surrounding whitespace: the digits with their underscores removed, or nullopt.
std::optional<std::string> float_literal(const std::string& text) {
  const std::string s = py_strip(text);
  size_t i = 0;
  std::string out;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
  std::string rest = py_lower(s.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") return out + rest;
  // digitpart: digit (["_"] digit)*
  const auto digits = [&](size_t& k) {
    const size_t begin = k;
    while (k < s.size() && s[k] >= '0' && s[k] <= '9') {
      out += s[k++];
      if (k + 1 < s.size() && s[k] == '_' && s[k + 1] >= '0' && s[k + 1] <= '9') ++k;
    }
    return k > begin;
  };
  const bool int_part = digits(i);
  bool frac_part = false;
  if (i < s.size() && s[i] == '.') {
    out += s[i++];
    frac_part = digits(i);
  }
  if (!int_part && !frac_part) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    out += s[i++];
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
    if (!digits(i)) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return out;
}

}  // namespace

bool py_is_float(const std::string& s) { return float_literal(s).has_value(); }

std::string py_float_repr(const std::string& s) {
  const auto literal = float_literal(s);
  if (!literal) throw Error("py_float_repr: \"" + s + "\" is not a float");
  const double v = std::strtod(literal->c_str(), nullptr);  // literal: C syntax now (no underscores)
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // repr: the shortest digits that round-trip, fixed notation for 1e-4 <= |v| < 1e16, else d.ddde+XX.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exponent + 1;  // v = 0.DIGITS x 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return sign + digits + std::string(decpt - n, '0') + ".0";
    return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  std::string out = sign + digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int a = std::abs(exponent);
  out += std::string("e") + (exponent < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
  return out;
}

}  // namespace archspace::text
