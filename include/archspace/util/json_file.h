// The one way to read a JSON file: every failure names the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace archspace {

// The file's JSON value. Throws archspace::Error "PATH: cannot open" or "PATH: malformed JSON: ...".
nlohmann::json read_json_file(const std::string& path);

// JSON already read into memory (to hash the same bytes, say); errors name `where`.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);

}  // namespace archspace
