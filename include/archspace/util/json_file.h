// The one way to read a JSON file: every failure names the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace archspace {

// The deepest nesting of arrays and objects the engine parses. nlohmann::json copies, compares, dumps and
// (in some versions) destroys values recursively, so an attacker's 100,000-deep body would overflow the stack.
inline constexpr int kMaxJsonDepth = 256;

// Throws archspace::Error "WHERE: JSON nested deeper than MAX levels (at byte N)" when `text` opens more than
// `max_depth` arrays/objects at once. A scan of the bytes (strings skipped) before any parse, so every parse
// site calls it first; it says nothing else about validity (the parser does).
void check_json_depth(std::string_view text, const std::string& where, int max_depth = kMaxJsonDepth);

// The file's JSON value. Throws archspace::Error "PATH: cannot open" or "PATH: malformed JSON: ...".
nlohmann::json read_json_file(const std::string& path);

// JSON already read into memory (to hash the same bytes, say); errors name `where`. Depth-checked.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);

}  // namespace archspace
