#include "archspace/util/json_file.h"

#include <fstream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"

namespace archspace {

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw Error(where + ": malformed JSON" + (text.empty() ? " (empty file)" : "") + ": " + e.what());
  }
}

}  // namespace archspace
