// archspace: the command line. Every command lives in a file of its own in tools/ and registers itself
// (tools/command.h); this file builds the app from them, applies the global flags and reports errors.
#include <ATen/Parallel.h>

#include <iostream>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/util/error.h"
#include "archspace/util/malloc_policy.h"
#include "archspace/util/threads.h"
#include "command.h"

using namespace archspace;

int main(int argc, char** argv) {
  use_huge_pages_for_large_tensors();  // before LibTorch's first allocation, which reads the setting
  CLI::App app{"archspace: train, evaluate, serve and export OLMo 3 and its SiameseNorm + Depth-Attention variant"};
  app.name("archspace");  // usage lines name the program: "Usage: archspace train [OPTIONS]"
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for tensor ops (default: the cores that are idle now; see docs/commands.md)")
      ->check(CLI::Range(1, 1024));

  std::vector<cli::Command> commands;
  for (cli::AddCommand add : cli::registered_commands()) commands.push_back(add(app));

  // Other tools' spellings of our flags are read as ours (tools/command.h); the rest CLI11 reports.
  cli::NormalizedArgs normalized = cli::normalize_flags(app, argc, argv);
  try {
    std::vector<std::string> reversed(normalized.args.rbegin(), normalized.args.rend());  // CLI11's order
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // Bad flags are errors like any other: "error: ..." and status 1 (the README's contract). Unknown flags are
    // named with the nearest valid one instead of CLI11's "The following arguments were not expected", and alone:
    // what else CLI11 says then is often their consequence (an unknown flag's value taken for a positional).
    std::string message = cli::explain_unknown_flags(normalized);
    if (message.empty()) message = e.what();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    cli::report_error(message + "\n(run with --help for the valid flags and choices)");
    return 1;
  }
  try {
    for (const auto& command : commands) {
      if (!command.app->parsed()) continue;
      if (threads > 0)
        at::set_num_threads(threads);
      else if (command.computes)
        at::set_num_threads(default_thread_count());
      // Said once, before any work, where it changes the speed of bf16 runs (docs/reference.md).
      if (command.computes && bf16_matmuls_widened()) std::cerr << bf16_matmuls_line() << "\n";
      return command.run();
    }
  } catch (const Error& e) {
    cli::report_error(e.what());
    return 1;
  } catch (const c10::Error& e) {
    cli::report_error(e.what_without_backtrace(), "error (LibTorch)");
    return 1;
  } catch (const std::exception& e) {
    cli::report_error(e.what());
    return 1;
  }
  return 0;
}
