// How a command joins the `archspace` CLI: each command is one file in tools/ that, at start-up,
// registers a function adding its CLI11 subcommand (flags, checks, help line) and returning what to run.
// Commands gather arguments and call the library; policy (formats, defaults, checks) lives in the library.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "archspace/config/choices.h"
#include "archspace/infer/decode_step.h"
#include "archspace/util/profiler.h"
#include "archspace/util/python_scripts.h"  // run_python_script, for the commands that draw

namespace archspace::cli {

// What a registered command adds to the app: its subcommand and the action to run when it was chosen.
struct Command {
  CLI::App* app;
  std::function<int()> run;
  // Whether it runs tensor ops: only then does start-up choose LibTorch's thread count (a 50 ms sample).
  bool computes = true;
};
using AddCommand = Command (*)(CLI::App& parent);

// `order` places the command in `archspace --help`; returns true so it can initialise a static.
bool register_command(int order, AddCommand add);
std::vector<AddCommand> registered_commands();  // by order

// A CLI11 check that runs a library parse function (its error, listing the valid choices, is the message).
CLI::Validator choice_validator(std::function<void(const std::string&)> parse, const std::string& choices);

// Shared flag helpers: each adds the option with CLI11's check of the valid choices, listed in --help.
CLI::Option* add_dtype_option(CLI::App* app, std::string& value, const std::string& what);
CLI::Option* add_device_option(CLI::App* app, std::string& value);
// --quantization none|int8 (default none): weight-only int8 matmul weights for inference (kernels/int8_weights.h).
CLI::Option* add_quantization_option(CLI::App* app, std::string& value);

// --decode-steps eager|fixed-shapes|cuda-graph (default eager): how the decoding engine runs its steps
// (infer/decode_step.h). decode_mode_for parses it against the command's --device (cuda-graph needs a CUDA one).
CLI::Option* add_decode_steps_option(CLI::App* app, std::string& value);
DecodeMode decode_mode_for(const std::string& decode_steps, const std::string& device);

// --profile FILE: a Kineto trace of the command's work (util/profiler.h). CommandProfile starts it (nothing
// when the path is empty) and finish() writes the trace and prints the top ops by self time on stderr.
CLI::Option* add_profile_option(CLI::App* app, std::string& path);
class CommandProfile {
 public:
  explicit CommandProfile(const std::string& path);
  void finish();

 private:
  std::optional<OpProfiler> profiler_;
};

// "1 2 3" or "1,2,3" -> ids, each checked against [0, vocab_size); errors name `flag`.
std::vector<int64_t> parse_token_ids(const std::string& text, int64_t vocab_size, const std::string& flag);

// The model a command runs, accepted as --model MODEL and positionally (`archspace generate runs/demo`, as
// vLLM's `serve MODEL`); giving both is an error. `required`: one of them must be there.
void add_model_option(CLI::App* app, std::string& model, const std::string& what, bool required = true);

// --skip-checksums: a checkpoint's files are verified against its checksums.json before its model is used (as
// `train --resume` does) unless this is given; verification reads every byte once more (docs/faults.md has its cost).
void add_skip_checksums_option(CLI::App* app, bool& skip);

// The model directory a command uses (io/run_dir.h's model_dir_for_use); says on stderr when a checkpoint goes
// unverified because of --skip-checksums.
std::string model_dir_to_use(const std::string& model, bool skip_checksums);

// The flags as users of transformers, lm-eval and vLLM type them, before CLI11 reads them: every flag that the
// command it follows does not know is tried with dashes for underscores (--batch_size) and then as a synonym
// with the same meaning (lm-eval's --num_fewshot is --shots, --output_path is --out; --model_path,
// --model_name_or_path and --pretrained are --model; vLLM's --max-tokens is generate's --max-new-tokens).
// Returns the arguments (argv[1..]) rewritten; the flags still unknown are recorded for explain_unknown_flags.
struct NormalizedArgs {
  std::vector<std::string> args;
  struct Unknown {
    std::string flag;                // as typed
    std::string command;             // "archspace eval downstream"
    std::vector<std::string> known;  // the command's long flags, without dashes
  };
  std::vector<Unknown> unknown;
};
NormalizedArgs normalize_flags(CLI::App& app, int argc, const char* const* argv);

// "unknown flag --shotz for `archspace eval downstream` (did you mean --shots?)", one line per unknown flag: the
// nearest flag by edit distance (dashes and underscores alike), or a hint for flags of other tools whose meaning
// differs here (lm-eval's --model_args); empty when there is none.
std::string explain_unknown_flags(const NormalizedArgs& normalized);

// Whether this process speaks for the run: outside torchrun, or rank 0 under it (RANK, WORLD_SIZE).
bool speaks_for_run();

// Prints "LABEL: MESSAGE" once for the whole run. Under torchrun, an error raised before the ranks joined a
// process group is the same on every rank (same config, same files): rank 0 prints it alone (and the first
// rank of each other machine, labelled, since its files may differ); afterwards each failing rank prints
// its own, labelled "rank R of W" unless the message already names it. A leading "error: " is not doubled.
void report_error(const std::string& message, const std::string& label = "error");

// 1234567 -> "1.2M".
std::string human_count(int64_t n);

// A plot drawn as a by-product of a command (sweep.png, analysis.png): a failure is a warning naming `what`,
// because the command's results are already written.
void plot_or_warn(const std::string& script, const std::vector<std::string>& args, const std::string& what);

}  // namespace archspace::cli

#define ARCHSPACE_COMMAND(order, add) \
  static const bool archspace_command_registered_##add = ::archspace::cli::register_command(order, add)
