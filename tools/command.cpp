#include "command.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "archspace/util/error.h"

extern char** environ;

namespace archspace::cli {

namespace {

const char* script_python() {
  const char* python = std::getenv("ARCHSPACE_PYTHON");
  return python ? python : ARCHSPACE_PLOT_PYTHON;
}

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

int run_python_script(const std::string& script, const std::vector<std::string>& args) {
  std::vector<std::string> words = {script_python(), script};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::cout.flush();  // the script writes to the same terminal: our lines first
  std::fflush(stdout);
  pid_t pid = 0;
  // posix_spawnp reports a python that cannot start as an error number, unlike fork + exec's child.
  if (const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ); err != 0) {
    throw Error(std::string("cannot run ") + words[0] + " " + script + ": " + std::strerror(err) +
                " (scripts/setup.sh installs it; ARCHSPACE_PYTHON overrides it)");
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) throw Error(std::string("waiting for ") + script + ": " + std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void plot_or_warn(const std::string& script, const std::vector<std::string>& args, const std::string& what) {
  std::string why;
  try {
    const int status = run_python_script(script, args);
    if (status == 0) return;
    why = "exit status " + std::to_string(status);
  } catch (const Error& e) {
    why = e.what();
  }
  std::cerr << "warning: " << what << " was not drawn (" << script_python() << " " << script << ": " << why << ")\n";
}

}  // namespace archspace::cli
