#include "archspace/util/json_file.h"

#include <fstream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"

namespace archspace {

void check_json_depth(std::string_view text, const std::string& where, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        throw Error(where + ": JSON nested deeper than " + std::to_string(max_depth) + " levels (at byte " +
                    std::to_string(i) + ")");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  check_json_depth(text, where);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw Error(where + ": malformed JSON" + (text.empty() ? " (empty file)" : "") + ": " + e.what());
  }
}

}  // namespace archspace
