#include "command.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "archspace/util/error.h"

namespace archspace::cli {

namespace {

std::vector<std::pair<int, AddCommand>>& registry() {
  static std::vector<std::pair<int, AddCommand>> commands;  // a function-local static: safe during static init
  return commands;
}

}  // namespace

bool register_command(int order, AddCommand add) {
  registry().emplace_back(order, add);
  return true;
}

std::vector<AddCommand> registered_commands() {
  auto sorted = registry();
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AddCommand> out;
  for (const auto& [order, add] : sorted) out.push_back(add);
  return out;
}

CLI::Validator choice_validator(std::function<void(const std::string&)> parse, const std::string& choices) {
  return CLI::Validator(
      [parse](std::string& s) {
        try {
          parse(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      choices);
}

CLI::Option* add_dtype_option(CLI::App* app, std::string& value, const std::string& what) {
  return app->add_option("--dtype", value, what)
      ->check(choice_validator([](const std::string& s) { parse_dtype(s, ""); }, "fp32|bf16"))
      ->capture_default_str();
}

CLI::Option* add_device_option(CLI::App* app, std::string& value) {
  return app->add_option("--device", value, "compute device")
      ->check(choice_validator([](const std::string& s) { parse_device(s, ""); }, "cpu|cuda[:N]"))
      ->capture_default_str();
}

std::vector<int64_t> parse_token_ids(const std::string& text, int64_t vocab_size, const std::string& flag) {
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  std::istringstream in(normalized);
  std::vector<int64_t> ids;
  for (std::string word; in >> word;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) throw Error(flag + ": '" + word + "' is not an integer token id");
    if (id < 0 || id >= vocab_size)
      throw Error(flag + ": token id " + word + " is out of range [0, " + std::to_string(vocab_size) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) throw Error(flag + ": no token ids given");
  return ids;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1000000)
    std::snprintf(buf, sizeof(buf), "%.1fM", n / 1e6);
  else if (n >= 1000)
    std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  return buf;
}

}  // namespace archspace::cli
