// Python `re` on str patterns, over PCRE2 in UTF and Unicode-property mode (\w \d \b over Unicode as Python's str
// patterns; only \n ends a line for `.` and `$`): findall/finditer's treatment of empty matches, re.sub's
// template syntax for \1..\9, re.escape, and lm-eval's RegexFilter built on them.
//
// Not thread-safe: the compiled patterns are cached (regex()) and share their match data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace archspace::text {

struct Match {
  size_t start = 0, end = 0;
  std::vector<std::optional<std::string>> groups;  // groups[0]: the whole match; an unmatched group is nullopt
};

class Regex {
 public:
  // Throws Error naming the pattern when it does not compile.
  explicit Regex(const std::string& pattern);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  std::optional<Match> search(const std::string& s, size_t start = 0) const;  // re.search from `start`
  std::optional<Match> match(const std::string& s, size_t start = 0) const;   // re.match: anchored at `start`
  bool full_match(const std::string& s) const;                                // re.fullmatch
  // Every match from left to right as finditer: an empty match may not start where the last empty match was
  // (it is retried there as non-empty, then one character further on).
  std::vector<Match> find_all(const std::string& s) const;
  size_t groups() const;  // the number of capturing groups

 private:
  struct Compiled;
  std::optional<Match> run(const std::string& s, size_t start, uint32_t options) const;
  std::unique_ptr<Compiled> compiled_;
};

// The compiled pattern, compiled once per pattern (the patterns are the metrics' constants and task configs').
const Regex& regex(const std::string& pattern);

// re.sub(pattern, template, s) with Python's template syntax for \1..\9 (other characters literal).
std::string regex_sub(const std::string& pattern, const std::string& replacement, const std::string& s);

// re.findall(pattern, s)[-1] for a pattern with at most one group (its group, else the match), or nullopt.
std::optional<std::string> last_group(const std::string& pattern, const std::string& s);

std::string py_regex_escape(const std::string& s);  // a pattern matching s literally (re.escape)

// lm-eval's RegexFilter: findall, the group_select'th match (negative: from the end), a tuple match's first
// non-empty group, stripped; `fallback` when nothing matches.
std::string regex_filter(const std::string& pattern, int group_select, const std::string& fallback,
                         const std::string& s);

}  // namespace archspace::text
