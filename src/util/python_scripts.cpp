#include "archspace/util/python_scripts.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "archspace/util/error.h"

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

}  // namespace archspace
