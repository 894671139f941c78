// Small string helpers shared by the parsers of lists ("a,b,c" flags and keys, PATH-like "dir:dir") and the
// messages that list names or suggest one.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace archspace {

// The parts of `s` between `sep`s, empty parts dropped: "a,,b," -> {"a", "b"}; "" -> {}.
inline std::vector<std::string> split_nonempty(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The items with `sep` between them: {"a", "b"} -> "a, b".
inline std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// The first `shown` items joined, then "... (+K more)" for the rest: a table cell's list, whose whole list goes to
// the JSON. {"a", "b", "c", "d"}, 2 -> "a, b, ... (+2 more)".
inline std::string join_brief(const std::vector<std::string>& items, size_t shown, const std::string& sep = ", ") {
  if (items.size() <= shown) return join(items, sep);
  std::vector<std::string> head(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(shown));
  return join(head, sep) + sep + "... (+" + std::to_string(items.size() - shown) + " more)";
}

// printf into a string as long as the text needs: a fixed buffer cuts a long row, its newline with it, and the
// next row runs into it.
template <typename... Args>
std::string format_string(const char* format, Args... args) {
  const int n = std::snprintf(nullptr, 0, format, args...);
  if (n <= 0) return {};
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, format, args...);
  return out;
}

// Levenshtein distance (insertions, deletions, substitutions each 1), for "did you mean" suggestions.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace archspace
