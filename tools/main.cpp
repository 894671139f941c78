// archspace: the command line. Every command lives in a file of its own in tools/ and registers itself
// (tools/command.h); this file builds the app from them, applies the global flags and reports errors.
#include <ATen/Parallel.h>

#include <iostream>

#include "archspace/util/error.h"
#include "archspace/util/threads.h"
#include "command.h"

using namespace archspace;

int main(int argc, char** argv) {
  CLI::App app{"archspace: train, evaluate, serve and export OLMo 3 and its SiameseNorm + Depth-Attention variant"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for tensor ops (default: the cores that are idle now; see docs/commands.md)")
      ->check(CLI::Range(1, 1024));

  std::vector<cli::Command> commands;
  for (cli::AddCommand add : cli::registered_commands()) commands.push_back(add(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // Bad flags are errors like any other: "error: ..." and status 1 (the README's contract).
    std::cerr << "error: " << e.what() << "\n(run with --help for the valid flags and choices)\n";
    return 1;
  }
  try {
    for (const auto& command : commands) {
      if (!command.app->parsed()) continue;
      if (threads > 0)
        at::set_num_threads(threads);
      else if (command.computes)
        at::set_num_threads(default_thread_count());
      return command.run();
    }
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "error (LibTorch): " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
