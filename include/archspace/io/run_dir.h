// Where things live in a run directory: RUN_DIR/checkpoints/step-NNNNNNNN/{model/, checksums.json, ...}
// with `latest` and `final` naming the newest and the finished checkpoint. Training writes this layout
// (train/checkpoint); export, generation and evaluation find a model in it with these functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace archspace {

// The newest checkpoint: the one `latest` names, or a newer step-N directory when a kill came between its
// rename (which publishes a complete checkpoint) and the update of `latest`; "" when the run has none.
std::string latest_checkpoint(const std::string& run_dir);

// The newest step-N checkpoint other than `except` that passes verify_checkpoint, or "".
std::string newest_intact_checkpoint(const std::string& run_dir, const std::string& except = "");

// `--resume-from`: "step-N" (or N) in the run's checkpoints/, or a checkpoint directory's path. Throws
// naming the run's checkpoints when there is no such checkpoint.
std::string resolve_checkpoint(const std::string& run_dir, const std::string& spec);

// Throws naming the file whose SHA-256 does not match checksums.json.
void verify_checkpoint(const std::string& checkpoint_dir);

// A model directory from: a checkpoint (its model/), a run directory (its final checkpoint), or a Hugging
// Face model directory itself.
std::string resolve_model_dir(const std::string& path);

// One training process per run directory: an OS lock on RUN_DIR/.lock (released when the process dies, however
// it dies). A second process fails at once, naming the holder's pid.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// The checkpoint directory holding `model_dir` (a checkpoint's model/), or "" for a plain model directory.
std::string checkpoint_of_model_dir(const std::string& model_dir);

// The run directory of a checkpoint in the layout above (RUN/checkpoints/step-N -> RUN), else "".
std::string run_dir_of_checkpoint(const std::string& checkpoint_dir);

// The sequence length the model was trained at, as the checkpoint holding `model_dir` records it
// (trainer_state.json's "sequence_length"); nullopt for a plain model directory or a state without it.
std::optional<int64_t> trained_sequence_length(const std::string& model_dir);

}  // namespace archspace
