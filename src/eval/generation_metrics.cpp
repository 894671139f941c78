#include "archspace/eval/generation_metrics.h"

#include "archspace/eval/task_groups.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <locale.h>
#include <pcre2.h>
#include <wctype.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"

namespace archspace {

namespace genmetrics {

namespace {

// ---- UTF-8 -------------------------------------------------------------------------------------------------

std::vector<char32_t> decode(const std::string& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) {  // not UTF-8 (the JSON parser lets none through): kept byte for byte
      out.push_back(c);
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's str.isspace: the Unicode White_Space characters and the separators \x1c-\x1f.
bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Length in bytes of the UTF-8 character starting at s[i].
size_t char_length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  return std::min(n, s.size() - i);
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

const std::string kPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";  // Python string.punctuation
bool is_punct(char c) { return kPunctuation.find(c) != std::string::npos; }

std::string remove_punctuation(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (!is_punct(c)) out += c;
  }
  return out;
}

// ---- regular expressions (Python `re` on str patterns) ------------------------------------------------------

struct Match {
  size_t start = 0, end = 0;
  std::vector<std::optional<std::string>> groups;  // groups[0]: the whole match
};

class Regex {
 public:
  explicit Regex(const std::string& pattern) : pattern_(pattern) {
    std::unique_ptr<pcre2_compile_context, decltype(&pcre2_compile_context_free)> context(
        pcre2_compile_context_create(nullptr), &pcre2_compile_context_free);
    pcre2_set_newline(context.get(), PCRE2_NEWLINE_LF);  // `.` and `$` treat only \n as a line end, as Python
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                          &offset, context.get());
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw Error("regular expression \"" + pattern + "\": " + reinterpret_cast<const char*>(message) + " at " +
                  std::to_string(offset));
    }
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }

  // The match at or after `start` (options: PCRE2_ANCHORED, PCRE2_NOTEMPTY_ATSTART, PCRE2_ENDANCHORED).
  std::optional<Match> match(const std::string& s, size_t start, uint32_t options = 0) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, options, data_, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw Error("regular expression \"" + pattern_ + "\": " + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
    uint32_t groups = 0;
    pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &groups);
    Match m;
    m.start = ov[0];
    m.end = ov[1];
    for (uint32_t g = 0; g <= groups; ++g) {
      if (g < static_cast<uint32_t>(rc) && ov[2 * g] != PCRE2_UNSET) {
        m.groups.emplace_back(s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
      } else {
        m.groups.emplace_back(std::nullopt);
      }
    }
    return m;
  }

  // Every match from left to right as Python's finditer: an empty match may not start where the last empty
  // match was (it is retried there as non-empty, then one character further on).
  std::vector<Match> find_all(const std::string& s) const {
    std::vector<Match> out;
    size_t pos = 0;
    bool last_empty = false;
    while (pos <= s.size()) {
      std::optional<Match> m;
      if (last_empty) {
        m = match(s, pos, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED);
        if (!m) {
          if (pos >= s.size()) break;
          pos += char_length(s, pos);
          m = match(s, pos);
        }
      } else {
        m = match(s, pos);
      }
      if (!m) break;
      last_empty = m->start == m->end;
      pos = m->end;
      out.push_back(std::move(*m));
    }
    return out;
  }

  bool full_match(const std::string& s) const { return match(s, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED).has_value(); }

  size_t groups() const {
    uint32_t n = 0;
    pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &n);
    return n;
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

// Compiled once per pattern (the patterns are the registry's constants and the task config's).
const Regex& regex(const std::string& pattern) {
  static std::map<std::string, std::unique_ptr<Regex>> cache;
  auto& r = cache[pattern];
  if (!r) r = std::make_unique<Regex>(pattern);
  return *r;
}

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

// ---- Python str ----------------------------------------------------------------------------------------------

std::string py_lower(const std::string& s) {
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decode(s)) {
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE: Python's full mapping, two characters
      out += "i\xcc\x87";
    } else {
      append_utf8(out, utf8 ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), utf8)) : c);
    }
  }
  return out;
}

std::string py_strip(const std::string& s) {
  const std::vector<char32_t> cps = decode(s);
  size_t b = 0, e = cps.size();
  while (b < e && py_isspace(cps[b])) ++b;
  while (e > b && py_isspace(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) append_utf8(out, cps[i]);
  return out;
}

std::vector<std::string> py_split(const std::string& s) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  for (char32_t c : decode(s)) {
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

namespace {

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

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

// ---- lm-eval filters and exact_match -------------------------------------------------------------------------

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

bool exact_match(std::string prediction, std::string reference, const std::vector<std::string>& regexes_to_ignore,
                 bool ignore_case, bool ignore_punctuation) {
  for (const auto& r : regexes_to_ignore) {
    prediction = regex_sub(r, "", prediction);
    reference = regex_sub(r, "", reference);
  }
  if (ignore_case) {
    prediction = py_lower(prediction);
    reference = py_lower(reference);
  }
  if (ignore_punctuation) {
    prediction = remove_punctuation(prediction);
    reference = remove_punctuation(reference);
  }
  return prediction == reference;
}

// ---- gsm8k ---------------------------------------------------------------------------------------------------

const std::vector<std::string> kGsm8kRegexesToIgnore = {",", "\\$", "(?s).*#### ", "\\.$"};

std::string gsm8k_last_number(const std::string& generation) {
  const std::string text = regex_sub("(\\d),(\\d)", "\\1\\2", generation);
  const std::vector<Match> numbers = regex("[-+]?\\d*\\.\\d+|\\d+").find_all(text);
  return numbers.empty() ? text : *numbers.back().groups[0];
}

std::string gsm8k_flex(const std::string& generation) {
  return regex_filter("(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]", generation);
}

// ---- Minerva MATH ----------------------------------------------------------------------------------------------

std::string minerva_unnormalized_answer(const std::string& generation) {
  const std::optional<Match> m = regex("Final Answer: The final answer is(.*?). I hope it is correct.")
                                     .match(generation + "I hope it is correct.", 0);
  return m ? py_strip(m->groups[1].value_or("")) : "[invalidanswer]";
}

std::string minerva_normalize_final_answer(const std::string& answer) {
  static const std::vector<std::pair<std::string, std::string>> substitutions = {
      {"an ", ""}, {"a ", ""},       {".$", "$"},           {"\\$", ""},          {"\\ ", ""},
      {" ", ""},   {"mbox", "text"}, {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"}};
  static const std::vector<std::string> removed = {"square",       "ways",
                                                   "integers",     "dollars",
                                                   "mph",          "inches",
                                                   "ft",           "hours",
                                                   "km",           "units",
                                                   "\\ldots",      "sue",
                                                   "points",       "feet",
                                                   "minutes",      "digits",
                                                   "cents",        "degrees",
                                                   "cm",           "gm",
                                                   "pounds",       "meters",
                                                   "meals",        "edges",
                                                   "students",     "childrentickets",
                                                   "multiples",    "\\text{s}",
                                                   "\\text{.}",    "\\text{\ns}",
                                                   "\\text{}^2",   "\\text{}^3",
                                                   "\\text{\n}",   "\\text{}",
                                                   "\\mathrm{th}", "^\\circ",
                                                   "^{\\circ}",    "\\;",
                                                   ",\\!",         "{,}",
                                                   "\"",           "\\dots"};
  const auto is_alpha = [](const std::string& w) {
    return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; });
  };
  std::string s = answer.substr(answer.rfind('=') == std::string::npos ? 0 : answer.rfind('=') + 1);
  for (const auto& expr : removed) {
    if (is_alpha(expr)) s = regex_sub("(?<!\\\\)\\b" + expr + "\\b", "", s);
  }
  for (const auto& [before, after] : substitutions) replace_all(s, before, after);
  for (const auto& expr : removed) {
    if (is_alpha(expr)) {
      // re.split on LaTeX command names: the text between them loses the unit, the commands are kept.
      std::string out;
      size_t last = 0;
      for (const Match& m : regex("(\\\\[a-zA-Z]+)").find_all(s)) {
        std::string segment = s.substr(last, m.start - last);
        replace_all(segment, expr, "");
        out += segment + *m.groups[0];
        last = m.end;
      }
      std::string segment = s.substr(last);
      replace_all(segment, expr, "");
      s = out + segment;
    } else {
      replace_all(s, expr, "");
    }
  }
  s = regex_sub("(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", s);
  s = regex_sub("(\\\\text\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\textbf\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\overline\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\boxed\\{)(.*)(\\})", "\\2", s);
  s = regex_sub("(frac)([^{])(.)", "frac{\\2}{\\3}", s);
  s = regex_sub("(sqrt)(\\[[^\\]]*\\])(\\w)", "\\1\\2{\\3}", s);
  s = regex_sub("(sqrt)(?!\\[)([^{])", "sqrt{\\2}", s);
  replace_all(s, "$", "");
  if (regex("-?\\d{1,3}(,\\d{3})+").full_match(s)) replace_all(s, ",", "");
  return s;
}

// ---- DROP ------------------------------------------------------------------------------------------------------

std::string drop_normalize(const std::string& span) {
  // _tokenize: re.split(" |-"), then per token lower, punctuation (unless a number), number, articles, spaces.
  std::vector<std::string> tokens;
  size_t start = 0;
  for (size_t i = 0; i <= span.size(); ++i) {
    if (i == span.size() || span[i] == ' ' || span[i] == '-') {
      tokens.push_back(span.substr(start, i - start));
      start = i + 1;
    }
  }
  std::vector<std::string> kept;
  for (const auto& token : tokens) {
    std::string t = py_lower(token);
    if (!py_is_float(t)) t = remove_punctuation(t);
    if (py_is_float(t)) t = py_float_repr(t);
    t = regex_sub("\\b(a|an|the)\\b", " ", t);
    t = join_words(py_split(t));
    if (!py_strip(t).empty()) kept.push_back(t);
  }
  return py_strip(join_words(kept));
}

namespace {

using Bag = std::set<std::string>;

double bag_f1(const Bag& predicted, const Bag& gold) {
  size_t common = 0;
  for (const auto& w : gold) common += predicted.count(w);
  const double precision = predicted.empty() ? 1.0 : static_cast<double>(common) / predicted.size();
  const double recall = gold.empty() ? 1.0 : static_cast<double>(common) / gold.size();
  return precision == 0.0 && recall == 0.0 ? 0.0 : 2 * precision * recall / (precision + recall);
}

bool numbers_match_if_present(const Bag& gold, const Bag& predicted) {
  bool gold_has = false;
  for (const auto& w : gold) {
    if (!py_is_float(w)) continue;
    gold_has = true;
    if (predicted.count(w)) return true;
  }
  return !gold_has;
}

// The largest total of scores[g][p] over one-to-one assignments of gold rows to predicted columns (exact: a
// dynamic programme over the subsets of the smaller side; scipy's linear_sum_assignment in lm-eval).
double best_assignment(const std::vector<std::vector<double>>& scores, size_t rows, size_t cols) {
  const bool transpose = cols > rows;  // iterate over the larger side, subsets of the smaller
  const size_t outer = transpose ? cols : rows, inner = transpose ? rows : cols;
  if (inner > 20) throw Error("DROP: too many answer spans to align (" + std::to_string(inner) + ")");
  std::vector<double> best(size_t{1} << inner, -1.0);
  best[0] = 0.0;
  for (size_t o = 0; o < outer; ++o) {
    std::vector<double> next = best;
    for (size_t mask = 0; mask < best.size(); ++mask) {
      if (best[mask] < 0) continue;
      for (size_t i = 0; i < inner; ++i) {
        if (mask & (size_t{1} << i)) continue;
        const double s = transpose ? scores[i][o] : scores[o][i];
        next[mask | (size_t{1} << i)] = std::max(next[mask | (size_t{1} << i)], best[mask] + s);
      }
    }
    best = std::move(next);
  }
  return *std::max_element(best.begin(), best.end());
}

std::pair<double, double> drop_metrics(const std::vector<std::string>& predicted,
                                       const std::vector<std::string>& gold) {
  std::vector<std::string> p_spans, g_spans;
  std::vector<Bag> p_bags, g_bags;
  for (const auto& s : predicted) {
    p_spans.push_back(drop_normalize(s));
    const auto words = py_split(p_spans.back());
    p_bags.emplace_back(words.begin(), words.end());
  }
  for (const auto& s : gold) {
    g_spans.push_back(drop_normalize(s));
    const auto words = py_split(g_spans.back());
    g_bags.emplace_back(words.begin(), words.end());
  }
  const std::set<std::string> p_set(p_spans.begin(), p_spans.end()), g_set(g_spans.begin(), g_spans.end());
  const double em = p_set == g_set && p_spans.size() == g_spans.size() ? 1.0 : 0.0;
  std::vector<std::vector<double>> scores(g_bags.size(), std::vector<double>(p_bags.size(), 0.0));
  for (size_t g = 0; g < g_bags.size(); ++g) {
    for (size_t p = 0; p < p_bags.size(); ++p) {
      if (numbers_match_if_present(g_bags[g], p_bags[p])) scores[g][p] = bag_f1(p_bags[p], g_bags[g]);
    }
  }
  const double total = best_assignment(scores, g_bags.size(), p_bags.size());
  const double mean = total / static_cast<double>(std::max(g_bags.size(), p_bags.size()));
  return {em, std::nearbyint(mean * 100.0) / 100.0};  // numpy's round(x, 2): rint(x * 100) / 100
}

}  // namespace

std::pair<double, double> drop_em_f1(const std::string& prediction,
                                     const std::vector<std::vector<std::string>>& gold_answers) {
  double em = 0, f1 = 0;
  for (const auto& gold : gold_answers) {
    if (gold.empty()) throw Error("DROP: a gold answer with no spans");
    const auto [e, f] = drop_metrics({prediction}, gold);
    if (!py_strip(gold[0]).empty()) {
      em = std::max(em, e);
      f1 = std::max(f1, f);
    }
  }
  return {em, f1};
}

// ---- SQuAD-style (OLMES SQuADF1EMRecallMetric) ------------------------------------------------------------------

std::string squad_normalize(const std::string& s) {
  std::string t = remove_punctuation(py_lower(s));
  t = regex_sub("\\b(a|an|the)\\b", " ", t);
  return join_words(py_split(t));
}

double squad_f1(const std::string& prediction, const std::string& gold) {
  const std::vector<std::string> p = py_split(squad_normalize(prediction)), g = py_split(squad_normalize(gold));
  std::map<std::string, int64_t> counts;
  for (const auto& w : p) ++counts[w];
  int64_t common = 0;
  for (const auto& w : g) {
    auto it = counts.find(w);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / p.size(), recall = static_cast<double>(common) / g.size();
  return 2 * precision * recall / (precision + recall);
}

double squad_em(const std::string& prediction, const std::string& gold) {
  return squad_normalize(prediction) == squad_normalize(gold) ? 1.0 : 0.0;
}

double olmes_recall(const std::string& prediction, const std::vector<std::string>& golds) {
  const std::string p = py_lower(py_strip(prediction));
  for (const auto& g : golds) {
    if (p.find(py_lower(py_strip(g))) != std::string::npos) return 1.0;
  }
  return 0.0;
}

// ---- BBH (OLMES bbh:cot-v1) --------------------------------------------------------------------------------------

std::string py_capitalize(const std::string& s) {
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  const std::vector<char32_t> cps = decode(s);
  if (cps.empty()) return s;
  std::string out;
  const char32_t first = cps[0];
  if (first < 0x80) {
    out += static_cast<char>(first >= 'a' && first <= 'z' ? first - 32 : first);
  } else {
    append_utf8(out, utf8 ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(first), utf8)) : first);
  }
  std::string rest;
  for (size_t i = 1; i < cps.size(); ++i) append_utf8(rest, cps[i]);
  return out + py_lower(rest);
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

namespace {

// OLMES' BBH_ANSWER_REGEX (oe_eval/data/bbh_tasks.py): the answer's shape per subtask; "MC" a lettered choice.
const std::map<std::string, std::string>& bbh_patterns() {
  static const std::map<std::string, std::string> m = {
      {"boolean_expressions", "[tT]rue|[fF]alse"},
      {"causal_judgement", "[yY]es|[nN]o"},
      {"date_understanding", "MC"},
      {"disambiguation_qa", "MC"},
      {"dyck_languages", "[\\]\\)\\}\\> ]+"},
      {"formal_fallacies", "[iI]nvalid|[vV]alid"},
      {"geometric_shapes", "MC"},
      {"hyperbaton", "MC"},
      {"logical_deduction_five_objects", "MC"},
      {"logical_deduction_seven_objects", "MC"},
      {"logical_deduction_three_objects", "MC"},
      {"movie_recommendation", "MC"},
      {"multistep_arithmetic_two", "-?\\d+"},
      {"navigate", "[nN]o|[yY]es"},
      {"object_counting", "\\d+"},
      {"penguins_in_a_table", "MC"},
      {"reasoning_about_colored_objects", "MC"},
      {"ruin_names", "MC"},
      {"salient_translation_error_detection", "MC"},
      {"snarks", "MC"},
      {"sports_understanding", "[yY]es|[nN]o"},
      {"temporal_sequences", "MC"},
      {"tracking_shuffled_objects_five_objects", "MC"},
      {"tracking_shuffled_objects_seven_objects", "MC"},
      {"tracking_shuffled_objects_three_objects", "MC"},
      {"web_of_lies", "[yY]es|[nN]o"},
      {"word_sorting", "[a-z ]+"},
  };
  return m;
}

// re.findall(pattern, s)[-1] for a pattern with one group (its group), or nullopt when nothing matches.
std::optional<std::string> last_group(const std::string& pattern, const std::string& s) {
  const std::vector<Match> all = regex(pattern).find_all(s);
  if (all.empty()) return std::nullopt;
  return all.back().groups.size() > 1 ? all.back().groups[1].value_or("") : *all.back().groups[0];
}

}  // namespace

const std::string& bbh_answer_pattern(const std::string& subtask) {
  const auto it = bbh_patterns().find(subtask);
  if (it == bbh_patterns().end()) throw Error("unknown BBH subtask \"" + subtask + "\"");
  return it->second;
}

std::string bbh_extract_answer(const std::string& generation, const std::string& subtask) {
  std::string answer_regex = bbh_answer_pattern(subtask);
  const bool mc = answer_regex == "MC";
  if (mc) answer_regex = "\\([A-Z]\\)";
  std::vector<std::string> templates = {"(?i)So the answer is ($ANS$)\\.?", "(?i)answer is ($ANS$)",
                                        "(?i)answer:.*?($ANS$)", "(?i)answer\\b.*?($ANS$)", "($ANS$)"};
  // OLMES appends this "last resort" as the non-raw Python string "\b([A-Z])\b" (olmes 99cf8bb7,
  // oe_eval/tasks/oe_eval_tasks/bbh.py:236): its \b are backspace characters, so a bare option letter never matches
  // there. The published numbers are OLMES' as it runs, so the pattern is kept as OLMES compiles it.
  if (mc) templates.push_back("\x08([A-Z])\x08");
  templates.push_back("(?i)($ANS$)");
  std::string extracted;
  for (std::string t : templates) {
    replace_all(t, "$ANS$", answer_regex);
    if (const auto found = last_group(t, generation)) {
      extracted = *found;
      break;
    }
  }
  // Surrounding delimiters, each pair in turn, unless the answer itself may start with it.
  static const std::vector<std::pair<std::string, std::string>> delimiters = {
      {"$", "$"},     {"\\(", "\\)"}, {"(", ")"}, {"**", "**"}, {"***", "***"},
      {"\\[", "\\]"}, {"'", "'"},     {"`", "`"}, {"\"", "\""}};
  for (const auto& [left, right] : delimiters) {
    if (regex(answer_regex).match(left, 0, PCRE2_ANCHORED)) continue;  // re.match(answer_regex, left)
    extracted =
        py_strip(regex_sub("^" + py_regex_escape(left) + "(.*)" + py_regex_escape(right) + "$", "\\1", extracted));
  }
  if (mc && decode(extracted).size() == 1) extracted = "(" + extracted + ")";
  return extracted;
}

// ---- PopQA -----------------------------------------------------------------------------------------------------

bool popqa_match(const std::string& generation, const std::vector<std::string>& aliases) {
  for (const auto& a : aliases) {
    for (const std::string& form : {a, py_lower(a), py_capitalize(a)}) {
      if (generation.find(form) != std::string::npos) return true;
    }
  }
  return false;
}

std::string code_program(const GenerationTaskSpec& spec, const std::string& generation, const nlohmann::json& gold) {
  if (spec.gold_kind == "humaneval_tests")
    return gold["prompt"].get<std::string>() + generation + "\n" + gold["test"].get<std::string>() + "\ncheck(" +
           gold["entry_point"].get<std::string>() + ")";
  if (spec.gold_kind == "mbpp_tests") {
    std::string tests;
    for (const auto& t : gold["test_list"]) {
      if (!tests.empty()) tests += '\n';
      tests += t.get<std::string>();
    }
    return generation + "\n" + tests;
  }
  throw Error("code_program: task " + spec.task + " is not a code task");
}

}  // namespace genmetrics

// ---- the registry ----------------------------------------------------------------------------------------------

namespace {

const std::vector<std::string> kMinervaSubjects = {
    "minerva_math_algebra",       "minerva_math_counting_and_probability",
    "minerva_math_geometry",      "minerva_math_intermediate_algebra",
    "minerva_math_number_theory", "minerva_math_prealgebra",
    "minerva_math_precalculus"};

const std::vector<GenerationTaskSpec>& registry() {
  static const std::vector<GenerationTaskSpec> specs = [] {
    std::vector<GenerationTaskSpec> v;
    v.push_back({"gsm8k", "", {"exact_match", "exact_match_flex"}, "exact_match", "string"});
    for (const auto& s : kMinervaSubjects) v.push_back({s, "minerva_math", {"exact_match"}, "exact_match", "string"});
    v.push_back({"minerva_math_500", "", {"exact_match"}, "exact_match", "string"});
    v.push_back({"drop", "", {"f1", "exact_match"}, "f1", "span_lists"});
    for (const std::string t : {"naturalqs_open", "squad", "coqa", "jeopardy"})
      v.push_back({t, "", {"f1", "exact_match", "recall"}, "f1", "strings"});
    // The SFT table's tasks whose request files the user brings (OLMES --save-raw-requests).
    v.push_back({"ifeval",
                 "",
                 {"prompt_level_loose_acc", "prompt_level_strict_acc", "inst_level_loose_acc", "inst_level_strict_acc"},
                 "prompt_level_loose_acc",
                 "ifeval"});
    for (const auto& t : find_task_group("bbh")->members)
      v.push_back({t, "bbh", {"exact_match", "exact_match_simple"}, "exact_match", "string"});
    v.push_back({"popqa", "", {"exact_match"}, "exact_match", "strings"});
    v.push_back({"codex_humaneval", "", {"pass_at_1"}, "pass_at_1", "humaneval_tests"});
    v.push_back({"codex_mbpp", "", {"pass_at_1"}, "pass_at_1", "mbpp_tests"});
    return v;
  }();
  return specs;
}

std::vector<std::string> gold_strings(const nlohmann::json& gold) {
  if (gold.is_string()) return {gold.get<std::string>()};
  return gold.get<std::vector<std::string>>();
}

}  // namespace

const GenerationTaskSpec* find_generation_task(const std::string& task) {
  for (const auto& s : registry()) {
    if (s.task == task) return &s;
  }
  return nullptr;
}

std::vector<std::string> generation_task_names() {
  std::vector<std::string> names;
  for (const auto& s : registry()) names.push_back(s.task);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::pair<std::string, std::vector<std::string>>> generation_groups() {
  // The task-group registry's groups of generation tasks (eval/task_groups.h holds every group once).
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const TaskGroup& g : task_groups()) {
    if (!g.members.empty() && find_generation_task(g.members.front())) groups.emplace_back(g.name, g.members);
  }
  return groups;
}

void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) {
  const auto all_strings = [](const nlohmann::json& j) {
    return j.is_array() && !j.empty() && std::all_of(j.begin(), j.end(), [](const auto& x) { return x.is_string(); });
  };
  if (spec.gold_kind == "string") {
    if (!gold.is_string()) throw Error("field \"gold\" must be a string (task " + spec.task + ")");
  } else if (spec.gold_kind == "strings") {
    if (!gold.is_string() && !all_strings(gold))
      throw Error("field \"gold\" must be a string or a non-empty list of strings (task " + spec.task + ")");
  } else if (spec.gold_kind == "ifeval") {
    const auto bad = [&](const std::string& what) {
      throw Error("field \"gold\" must be an IFEval doc: " + what + " (task " + spec.task + ")");
    };
    if (!gold.is_object()) bad("an object");
    if (!gold.contains("instruction_id_list") || !all_strings(gold["instruction_id_list"]))
      bad("instruction_id_list, a non-empty list of strings");
    if (!gold.contains("kwargs") || !gold["kwargs"].is_array() ||
        gold["kwargs"].size() != gold["instruction_id_list"].size() ||
        !std::all_of(gold["kwargs"].begin(), gold["kwargs"].end(), [](const auto& k) { return k.is_object(); }))
      bad("kwargs, a list of objects, one per instruction");
    if (!gold.contains("prompt") || !gold["prompt"].is_string()) bad("prompt, a string");
  } else if (spec.gold_kind == "humaneval_tests") {
    for (const char* key : {"prompt", "test", "entry_point"}) {
      if (!gold.is_object() || !gold.contains(key) || !gold[key].is_string())
        throw Error(std::string("field \"gold\" must be an object with the strings \"prompt\", \"test\" and "
                                "\"entry_point\" (task ") +
                    spec.task + "): \"" + key + "\" is missing or not a string");
    }
    if (gold["entry_point"].get<std::string>().empty())
      throw Error("field \"gold\": \"entry_point\" is empty (task " + spec.task + ")");
  } else if (spec.gold_kind == "mbpp_tests") {
    if (!gold.is_object() || !gold.contains("test_list") || !all_strings(gold["test_list"]))
      throw Error("field \"gold\" must be an object with \"test_list\", a non-empty list of strings (task " +
                  spec.task + ")");
  } else {
    if (!gold.is_array() || gold.empty() ||
        !std::all_of(gold.begin(), gold.end(), [&](const auto& x) { return all_strings(x); }))
      throw Error(
          "field \"gold\" must be a non-empty list of gold answers, each a non-empty list of span strings "
          "(task " +
          spec.task + ")");
  }
}

std::vector<InstanceMetrics> score_generations(const std::vector<GenerationInstance>& instances,
                                               const AnswerEquivalence& equivalence,
                                               const InstructionCheck& instructions, const CodeExecutor& execute) {
  namespace gm = genmetrics;
  std::vector<InstanceMetrics> out(instances.size());
  // Minerva pairs whose strings differ go to `equivalence` together, each distinct pair once.
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> pending;
  std::vector<size_t> ifeval;         // instances whose instructions `instructions` checks
  std::vector<std::string> programs;  // the code tasks' programs, run together
  std::vector<size_t> program_of;
  for (size_t i = 0; i < instances.size(); ++i) {
    const GenerationInstance& x = instances[i];
    const GenerationTaskSpec* spec = find_generation_task(x.task);
    if (!spec) throw Error("unknown generation task \"" + x.task + "\"");
    auto& v = out[i].values;
    try {
      if (x.task == "gsm8k") {
        const std::string gold = x.gold.get<std::string>();
        const auto em = [&](const std::string& answer) {
          return gm::exact_match(answer, gold, gm::kGsm8kRegexesToIgnore, /*ignore_case=*/true,
                                 /*ignore_punctuation=*/false)
                     ? 1.0
                     : 0.0;
        };
        v.push_back({"exact_match", em(gm::gsm8k_last_number(x.generation))});
        v.push_back({"exact_match_flex", em(gm::gsm8k_flex(x.generation))});
      } else if (x.task.rfind("minerva_math", 0) == 0) {
        const std::string answer = gm::minerva_normalize_final_answer(gm::minerva_unnormalized_answer(x.generation));
        const std::string gold = x.gold.get<std::string>();
        v.push_back({"exact_match", 0.0});
        if (!answer.empty() && answer == gold) {
          v.back().second = 1.0;  // is_equiv's own first test: identical non-empty strings
        } else {
          pending[{answer, gold}].push_back(i);
        }
      } else if (x.task == "ifeval") {
        for (const auto& name : spec->metrics) v.push_back({name, 0.0});
        ifeval.push_back(i);
      } else if (spec->group == "bbh") {
        const std::string subtask = x.task.substr(4);  // bbh_<subtask>
        const std::string answer = gm::bbh_extract_answer(x.generation, subtask);
        const std::string gold = x.gold.get<std::string>();
        const bool em = gm::exact_match(answer, gold, {}, /*ignore_case=*/true,
                                        /*ignore_punctuation=*/subtask != "dyck_languages");
        v.push_back({"exact_match", em ? 1.0 : 0.0});
        v.push_back({"exact_match_simple", answer == gold ? 1.0 : 0.0});
      } else if (x.task == "popqa") {
        v.push_back({"exact_match", gm::popqa_match(x.generation, gold_strings(x.gold)) ? 1.0 : 0.0});
      } else if (x.task == "drop") {
        const auto [em, f1] = gm::drop_em_f1(x.generation, x.gold.get<std::vector<std::vector<std::string>>>());
        v.push_back({"f1", f1});
        v.push_back({"exact_match", em});
      } else if (spec->gold_kind == "humaneval_tests" || spec->gold_kind == "mbpp_tests") {
        v.push_back({"pass_at_1", 0.0});
        programs.push_back(gm::code_program(*spec, x.generation, x.gold));
        program_of.push_back(i);
      } else {
        const std::vector<std::string> golds = gold_strings(x.gold);
        double f1 = 0, em = 0;
        for (const auto& g : golds) {
          f1 = std::max(f1, gm::squad_f1(x.generation, g));
          em = std::max(em, gm::squad_em(x.generation, g));
        }
        v.push_back({"f1", f1});
        v.push_back({"exact_match", em});
        v.push_back({"recall", gm::olmes_recall(x.generation, golds)});
      }
    } catch (const std::exception& e) {  // this response scores 0, named; the others are still scored
      v.clear();
      for (const auto& name : spec->metrics) v.push_back({name, 0.0});
      out[i].scoring_errors.push_back(e.what());
    }
  }
  if (!pending.empty()) {
    if (!equivalence) throw Error("Minerva MATH answers need an equivalence check (is_equiv), and none was given");
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& [pair, users] : pending) pairs.push_back(pair);
    const std::vector<bool> equal = equivalence(pairs);
    if (equal.size() != pairs.size())
      throw Error("the equivalence check answered " + std::to_string(equal.size()) + " pairs for " +
                  std::to_string(pairs.size()));
    size_t k = 0;
    for (const auto& [pair, users] : pending) {
      for (size_t i : users) out[i].values[0].second = equal[k] ? 1.0 : 0.0;
      ++k;
    }
  }
  if (!ifeval.empty()) {
    if (!instructions) throw Error("IFEval responses need the instruction checks, and none were given");
    std::vector<std::pair<nlohmann::json, std::string>> pairs;
    for (size_t i : ifeval) pairs.emplace_back(instances[i].gold, instances[i].generation);
    const std::vector<InstructionResult> results = instructions(pairs);
    if (results.size() != pairs.size())
      throw Error("the instruction checks answered " + std::to_string(results.size()) + " responses for " +
                  std::to_string(pairs.size()));
    for (size_t k = 0; k < ifeval.size(); ++k) {
      const InstructionResult& r = results[k];
      const size_t n = instances[ifeval[k]].gold["instruction_id_list"].size();
      if (r.inst_strict.size() != n || r.inst_loose.size() != n)
        throw Error("the instruction checks answered " + std::to_string(r.inst_strict.size()) + " instructions for " +
                    std::to_string(n) + " (ifeval document " + instances[ifeval[k]].doc_id.dump() + ")");
      const auto fraction = [n](const std::vector<bool>& b) {
        return static_cast<double>(std::count(b.begin(), b.end(), true)) / static_cast<double>(n);
      };
      auto& v = out[ifeval[k]].values;  // the registry's order
      v[0].second = r.prompt_loose ? 1.0 : 0.0;
      v[1].second = r.prompt_strict ? 1.0 : 0.0;
      v[2].second = fraction(r.inst_loose);
      v[3].second = fraction(r.inst_strict);
      out[ifeval[k]].scoring_errors.insert(out[ifeval[k]].scoring_errors.end(), r.scoring_errors.begin(),
                                           r.scoring_errors.end());
    }
  }
  if (!programs.empty()) {
    if (!execute)
      throw Error(
          "code tasks (codex_humaneval, codex_mbpp) run their programs against the tests, and no executor "
          "(sandbox) was given");
    const std::vector<bool> passed = execute(programs);
    if (passed.size() != programs.size())
      throw Error("the code executor answered " + std::to_string(passed.size()) + " programs for " +
                  std::to_string(programs.size()));
    for (size_t k = 0; k < programs.size(); ++k) out[program_of[k]].values[0].second = passed[k] ? 1.0 : 0.0;
  }
  return out;
}

std::vector<TaskResult> generation_results(const std::vector<GenerationInstance>& instances,
                                           const std::vector<InstanceMetrics>& metrics,
                                           const std::vector<std::pair<std::string, int64_t>>& shots,
                                           std::vector<std::pair<std::string, std::vector<std::string>>>* macro_over) {
  if (metrics.size() != instances.size()) throw Error("generation_results: one metrics entry per instance expected");
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> by_task;
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!by_task.count(instances[i].task)) order.push_back(instances[i].task);
    by_task[instances[i].task].push_back(i);
  }
  std::vector<TaskResult> results;
  std::map<std::string, const TaskResult*> done;
  for (const auto& task : order) {
    const GenerationTaskSpec* spec = find_generation_task(task);
    TaskResult r;
    r.task = task;
    r.format = "gen";
    r.shots = -1;
    for (const auto& [t, n] : shots) {
      if (t == task) r.shots = n;
    }
    r.documents = static_cast<int64_t>(by_task[task].size());
    r.primary_metric = spec->primary_metric;
    for (size_t m = 0; m < spec->metrics.size(); ++m) {
      std::vector<double> xs;
      for (size_t i : by_task[task]) xs.push_back(metrics[i].values.at(m).second);
      MetricValue v = mean_with_stderr(spec->metrics[m], xs);
      if (spec->gold_kind == "ifeval" && spec->metrics[m].rfind("inst_level", 0) == 0) {
        // Over all instructions pooled: each document's fraction weighs its number of instructions.
        double followed = 0, total = 0;
        for (size_t i : by_task[task]) {
          const auto n = static_cast<double>(instances[i].gold["instruction_id_list"].size());
          followed += metrics[i].values.at(m).second * n;
          total += n;
        }
        v.value = followed / total;
        v.stderr_ = std::numeric_limits<double>::quiet_NaN();
      }
      v.primary = spec->metrics[m] == spec->primary_metric;
      r.metrics.push_back(v);
    }
    results.push_back(std::move(r));
  }
  for (const auto& r : results) done[r.task] = &r;
  if (macro_over) macro_over->clear();
  std::vector<TaskResult> groups;
  for (const auto& [group, members] : generation_groups()) {
    const bool micro = find_task_group(group)->primary_aggregate == "micro";
    std::vector<const TaskResult*> present;
    std::vector<std::string> names;
    for (const auto& m : members) {
      if (done.count(m)) {
        present.push_back(done[m]);
        names.push_back(m);
      }
    }
    if (present.empty()) continue;
    TaskResult g;
    g.task = group;
    g.format = "gen";
    g.shots = present[0]->shots;
    for (const auto* p : present) {
      if (p->shots != g.shots) g.shots = -1;
      g.documents += p->documents;
    }
    g.primary_metric = present[0]->primary_metric;
    g.members = static_cast<int64_t>(present.size());  // a group row, as eval/task_groups.h marks them
    for (size_t m = 0; m < present[0]->metrics.size(); ++m) {
      MetricValue v;
      v.name = present[0]->metrics[m].name;
      v.primary = present[0]->metrics[m].primary;
      v.aggregate = "macro";
      double var = 0;
      for (const auto* p : present) {
        v.value += p->metrics[m].value;
        var += p->metrics[m].stderr_ * p->metrics[m].stderr_;
      }
      const auto k = static_cast<double>(present.size());
      v.value /= k;
      v.stderr_ = std::sqrt(var) / k;
      if (micro) {
        // Every member document pooled, the group's primary (OLMES' suite primary_metric "micro").
        std::vector<double> pooled;
        for (const auto& name : names) {
          for (size_t i : by_task[name]) pooled.push_back(metrics[i].values.at(m).second);
        }
        MetricValue p = mean_with_stderr(v.name, pooled);
        p.primary = v.primary;
        p.aggregate = "micro";
        v.primary = false;
        g.metrics.push_back(p);
      }
      g.metrics.push_back(v);
    }
    groups.push_back(std::move(g));
    if (macro_over) macro_over->push_back({group, names});
  }
  results.insert(results.end(), groups.begin(), groups.end());
  return results;
}

namespace {

// ifeval: the doc's fields the checks read; popqa: the label, else doc.possible_answers (a list, or the JSON text
// of one as the HF dataset stores it).
std::optional<nlohmann::json> doc_gold(const GenerationTaskSpec& spec, const nlohmann::json& line) {
  const nlohmann::json* doc =
      line.is_object() && line.contains("doc") && line["doc"].is_object() ? &line["doc"] : nullptr;
  if (spec.gold_kind == "ifeval") {
    if (!doc) throw Error("missing field \"doc\" (the IFEval instructions of task ifeval)");
    nlohmann::json g = nlohmann::json::object();
    for (const char* key : {"key", "prompt", "instruction_id_list", "kwargs"}) {
      if (!doc->contains(key)) throw Error(std::string("missing field \"doc.") + key + "\" (task ifeval)");
      g[key] = (*doc)[key];
    }
    try {
      check_gold(spec, g);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc\": ") + e.what());
    }
    return g;
  }
  if (spec.task == "popqa" && doc && doc->contains("possible_answers") &&
      !(line.contains("label") && (line["label"].is_string() || line["label"].is_array()))) {
    nlohmann::json answers = (*doc)["possible_answers"];
    if (answers.is_string()) {
      check_json_depth(answers.get<std::string>(), "field \"doc.possible_answers\"");
      answers = nlohmann::json::parse(answers.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (answers.is_discarded()) throw Error("field \"doc.possible_answers\": a string that is not a JSON list");
    }
    try {
      check_gold(spec, answers);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc.possible_answers\": ") + e.what());
    }
    return answers;
  }
  return std::nullopt;
}

}  // namespace

nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& request_line) {
  if (auto g = doc_gold(spec, request_line)) return *g;
  if (spec.gold_kind == "humaneval_tests" || spec.gold_kind == "mbpp_tests") {
    const bool humaneval = spec.gold_kind == "humaneval_tests";
    const std::vector<std::string> keys =
        humaneval ? std::vector<std::string>{"prompt", "test", "entry_point"} : std::vector<std::string>{"test_list"};
    nlohmann::json gold = nlohmann::json::object();
    for (const auto& key : keys) {
      if (!request_line.is_object() || !request_line.contains("doc") || !request_line["doc"].is_object() ||
          !request_line["doc"].contains(key))
        throw Error("missing field \"doc." + key + "\" (the tests of task " + spec.task + ")");
      gold[key] = request_line["doc"][key];
    }
    try {
      check_gold(spec, gold);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc\": ") + e.what());
    }
    return gold;
  }
  const bool drop = spec.gold_kind == "span_lists";
  const char* field = drop ? "doc.answers" : "label";
  const nlohmann::json* gold = nullptr;
  if (drop && request_line.is_object() && request_line.contains("doc") && request_line["doc"].is_object() &&
      request_line["doc"].contains("answers")) {
    gold = &request_line["doc"]["answers"];
  } else if (!drop && request_line.is_object() && request_line.contains("label")) {
    gold = &request_line["label"];
  }
  if (!gold) throw Error(std::string("missing field \"") + field + "\" (the gold of task " + spec.task + ")");
  try {
    check_gold(spec, *gold);
  } catch (const Error& e) {
    throw Error(std::string("field \"") + field + "\": " + e.what());
  }
  return *gold;
}

nlohmann::json metrics_json(const InstanceMetrics& metrics) {
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [name, value] : metrics.values) m[name] = value;
  return m;
}

nlohmann::json generation_row(const GenerationInstance& instance, int64_t shots,
                              const std::vector<int64_t>& prompt_tokens, const InstanceMetrics& metrics) {
  nlohmann::json row = {{"task", instance.task},
                        {"format", "gen"},
                        {"shots", shots},
                        {"doc_id", instance.doc_id},
                        {"native_id", instance.native_id},
                        {"prompt_tokens", prompt_tokens},
                        {"generation", instance.generation},
                        {"gold", instance.gold},
                        {"metrics", metrics_json(metrics)}};
  if (!metrics.scoring_errors.empty()) row["scoring_errors"] = metrics.scoring_errors;
  return row;
}

RescoreFile read_rescore_file(const std::string& path) {
  RescoreFile f;
  std::map<std::pair<std::string, std::string>, std::string> seen;  // (task, doc_id) -> where
  std::map<std::string, std::pair<int64_t, std::string>> shots;     // task -> (shots, where)
  std::vector<std::string> shot_order;
  for_each_json_line(path, [&](const nlohmann::json& row, const std::string& where) {
    if (!row.is_object()) throw Error(where + ": a row must be a JSON object");
    f.rows.push_back(row);
    if (!row.contains("generation") && row.contains("loglikelihood")) {
      ++f.loglikelihood_rows;
      return;
    }
    for (const char* key : {"task", "doc_id", "generation", "gold"}) {
      if (!row.contains(key)) throw Error(where + ": missing field \"" + key + "\"");
    }
    if (!row["task"].is_string()) throw Error(where + ": field \"task\" must be a string");
    if (!row["generation"].is_string()) throw Error(where + ": field \"generation\" must be a string");
    if (!row["doc_id"].is_number_integer() && !row["doc_id"].is_string())
      throw Error(where + ": field \"doc_id\" must be an integer or a string");
    GenerationInstance x;
    x.task = row["task"].get<std::string>();
    const GenerationTaskSpec* spec = find_generation_task(x.task);
    if (!spec) {
      std::string known;
      for (const auto& t : generation_task_names()) known += (known.empty() ? "" : ", ") + t;
      throw Error(where + ": field \"task\": unknown generation task \"" + x.task + "\" (known: " + known + ")");
    }
    if (row.contains("format") && row["format"] != "gen")
      throw Error(where + ": field \"format\" must be \"gen\" in a generation row");
    try {
      check_gold(*spec, row["gold"]);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    if (row.contains("shots")) {
      if (!row["shots"].is_number_integer() || row["shots"].get<int64_t>() < 0)
        throw Error(where + ": field \"shots\" must be a non-negative integer");
      const int64_t n = row["shots"].get<int64_t>();
      auto it = shots.find(x.task);
      if (it == shots.end()) {
        shots[x.task] = {n, where};
        shot_order.push_back(x.task);
      } else if (it->second.first != n) {
        throw Error(where + ": field \"shots\": " + std::to_string(n) + " for task " + x.task + ", which has " +
                    std::to_string(it->second.first) + " at " + it->second.second);
      }
    }
    x.doc_id = row["doc_id"];
    x.native_id = row.contains("native_id") ? row["native_id"] : nlohmann::json();
    x.generation = row["generation"].get<std::string>();
    x.gold = row["gold"];
    const auto key = std::make_pair(x.task, x.doc_id.dump());
    if (auto it = seen.find(key); it != seen.end())
      throw Error(where + ": field \"doc_id\": document " + x.doc_id.dump() + " of task " + x.task + " is already at " +
                  it->second);
    seen[key] = where;
    f.instance_rows.push_back(f.rows.size() - 1);
    f.instances.push_back(std::move(x));
  });
  for (const auto& t : shot_order) f.shots.push_back({t, shots[t].first});
  return f;
}

}  // namespace archspace
