// JSON Lines input (chat data, prompt files): one JSON value per line, blank lines skipped, and every
// error names the file and line.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace archspace {

// One line's value; nullopt for a blank line. A malformed line is an Error naming `where` ("PATH:LINE").
std::optional<nlohmann::json> parse_json_line(const std::string& line, const std::string& where);

// Calls fn(value, "PATH:LINE") for each non-blank line of `path`, in order; returns how many there were.
// A file that cannot be opened or a malformed line is an Error naming it.
int64_t for_each_json_line(const std::string& path,
                           const std::function<void(const nlohmann::json&, const std::string&)>& fn);

}  // namespace archspace
