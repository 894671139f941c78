#include "archspace/util/python_scripts.h"

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"

extern char** environ;

namespace archspace {

std::string scripts_python() {
  const char* python = std::getenv("ARCHSPACE_PYTHON");
  return python ? python : ARCHSPACE_SCRIPTS_PYTHON;
}

int run_python_script(const std::string& script, const std::vector<std::string>& args) {
  std::vector<std::string> words = {scripts_python(), script};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::cout.flush();  // the script writes to the same terminal: our lines first
  std::fflush(stdout);
  pid_t pid = 0;
  // posix_spawnp reports a python that cannot start as an error number, unlike fork + exec's child.
  if (const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ); err != 0) {
    throw Error("cannot run " + words[0] + " " + script + ": " + std::strerror(err) +
                " (scripts/setup.sh installs it; ARCHSPACE_PYTHON overrides it)");
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error("waiting for " + script + ": " + std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

nlohmann::json run_python_json(const char* script, const std::string& input, const std::string& what) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "archspace-script-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw Error("cannot create a scratch directory: " + what);
  const fs::path dir(tmpl);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  const std::string in_path = (dir / "input.json").string(), out_path = (dir / "output.json").string();
  write_text_file_atomically(in_path, input);
  const int status = run_python_script(script, {in_path, out_path});
  if (status != 0) {
    std::string reason;
    std::error_code ec;
    if (fs::exists(out_path, ec)) {
      try {
        const nlohmann::json answer = parse_json_text(read_text_file(out_path), out_path);
        if (answer.is_object() && answer.contains("error") && answer["error"].is_string())
          reason = ": " + answer["error"].get<std::string>();
      } catch (const Error&) {
      }
    }
    throw Error(std::string(script) + " failed (exit status " + std::to_string(status) + "): " + what + reason);
  }
  return parse_json_text(read_text_file(out_path), out_path);
}

}  // namespace archspace
