#include "archspace/util/json_lines.h"

#include <fstream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"

namespace archspace {

std::optional<nlohmann::json> parse_json_line(const std::string& line, const std::string& where) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return std::nullopt;
  check_json_depth(line, where);
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw Error(where + ": malformed JSON line: " + e.what());
  }
}

int64_t for_each_json_line(const std::string& path,
                           const std::function<void(const nlohmann::json&, const std::string&)>& fn) {
  check_readable_file(path);
  std::ifstream in(path);
  int64_t count = 0;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number);
    if (std::optional<nlohmann::json> value = parse_json_line(line, where)) {
      fn(*value, where);
      ++count;
    }
  }
  return count;
}

}  // namespace archspace
