// Small string helpers shared by the parsers of lists ("a,b,c" flags and keys, PATH-like "dir:dir") and the
// messages that list names.
#pragma once

#include <algorithm>
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

}  // namespace archspace
