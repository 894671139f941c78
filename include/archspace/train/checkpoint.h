// Training checkpoints: RUN_DIR/checkpoints/step-NNNNNNNN/ holding model/ (a Hugging Face model
// directory, with the run's tokenizer.json when it has one), optimizer.safetensors, trainer_state.json,
// the run's TOML, and checksums.json (SHA-256 of every file, verified on load). Written into a temporary
// directory, fsynced, then renamed, so a crash or a full disk never leaves a half checkpoint under a real
// name; `latest` and `final` name the newest.
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

// Returns the checkpoint directory. Keeps the newest `keep_last` step checkpoints (never the final one).
std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& contents,
                            int64_t keep_last, bool is_final);

nlohmann::json read_trainer_state(const std::string& checkpoint_dir);

}  // namespace archspace
