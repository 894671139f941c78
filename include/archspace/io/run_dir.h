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
// Face model directory itself. A run directory without `final` is refused, saying how to complete it.
std::string resolve_model_dir(const std::string& path);

// resolve_model_dir for a command that uses the model (eval, generate, serve, init_from): the checkpoint holding it
// is verified against its checksums.json first, unless verify_checksums is false (--skip-checksums); a plain model
// directory (a Hugging Face export) has none and loads as it is. A mismatch names the file and the run's newest
// intact checkpoint, and `skip_hint` (how the command skips verification) where given.
std::string model_dir_for_use(const std::string& path, bool verify_checksums = true, const std::string& skip_hint = "");

// "the newest intact checkpoint of the run is RUN/checkpoints/step-N" (or that none verifies), for the message of a
// checkpoint that failed verification; "" for a checkpoint outside a run directory.
std::string intact_checkpoint_note(const std::string& checkpoint_dir);

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
