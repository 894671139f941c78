// Training checkpoints: RUN_DIR/checkpoints/step-NNNNNNNN/ holding model/ (a Hugging Face model
// directory, with the run's tokenizer.json when it has one), optimizer.safetensors, trainer_state.json,
// the run's TOML, and checksums.json (SHA-256 of every file, verified on load). Written into a temporary
// directory, fsynced, then renamed, so a crash or a full disk never leaves a half checkpoint under a real
// name; `latest` and `final` name the newest. Every write error names the file and the system's reason.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/io/run_dir.h"
#include "archspace/io/safetensors.h"
#include "archspace/model/causal_lm.h"

namespace archspace {

struct CheckpointContents {
  const CausalLM* model;
  NamedTensors optimizer_state;
  nlohmann::json trainer_state;  // step, tokens, data position, seed, ...
  std::string config_text;       // the run's TOML as run, written as train_config.toml
  std::string tokenizer_file;    // copied to model/tokenizer.json when not empty
};

// Writes the checkpoint of `step` and publishes it (below). Returns the checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& contents,
                            int64_t keep_last, bool is_final);

// Publishes a checkpoint already written under its name (checkpoints/NAME): `latest` (and with is_final `final`)
// name it, then the step checkpoints beyond the newest `keep_last` go (never the final one), and leftovers of
// interrupted saves and prunings with them. Idempotent: a run interrupted anywhere in here is completed by calling it
// again (train --resume does, for a run that reached its last step). Returns what it changed, for the message
// ("latest", "final", "removed step-00000016", ...); empty when the checkpoint was published already.
std::vector<std::string> publish_checkpoint(const std::string& run_dir, const std::string& name, int64_t keep_last,
                                            bool is_final);

// "step-00000042"
std::string checkpoint_name(int64_t step);

nlohmann::json read_trainer_state(const std::string& checkpoint_dir);

}  // namespace archspace
