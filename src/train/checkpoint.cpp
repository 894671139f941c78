#include "archspace/train/checkpoint.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "archspace/util/file_writer.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The points of a save where the kill hook below can stop the process, in the order a save reaches them.
constexpr const char* kSaveStages[] = {
    "model",      // model/ and its tokenizer written (the default: "N" alone)
    "optimizer",  // optimizer.safetensors written
    "state",      // trainer_state.json and train_config.toml written
    "checksums",  // checksums.json written, the directory not yet renamed
    "published",  // renamed to step-N, `latest` not yet written
    "latest",     // `latest` names it, `final` not yet written
    "final",      // `final` names it, older checkpoints not yet pruned
    "pruning",    // the first checkpoint to prune moved aside, not yet removed
};

// Tests of crash safety: ARCHSPACE_TEST_KILL_DURING_CHECKPOINT=N[:STAGE] kills the process (SIGKILL, no cleanup) at
// STAGE of step N's save (kSaveStages; "model" when no stage is named). A stage it does not know is an error, so that
// a test cannot pass by never killing.
void maybe_crash(int64_t step, const char* stage) {
  const char* env = std::getenv("ARCHSPACE_TEST_KILL_DURING_CHECKPOINT");
  if (!env) return;
  const std::string spec = env;
  const size_t colon = spec.find(':');
  const std::string wanted = colon == std::string::npos ? "model" : spec.substr(colon + 1);
  if (std::none_of(std::begin(kSaveStages), std::end(kSaveStages), [&](const char* s) { return wanted == s; })) {
    std::string known;
    for (const char* s : kSaveStages) known += (known.empty() ? "" : ", ") + std::string(s);
    throw Error("ARCHSPACE_TEST_KILL_DURING_CHECKPOINT=" + spec + ": no save stage '" + wanted + "' (" + known + ")");
  }
  if (std::atoll(spec.c_str()) == step && wanted == stage) ::raise(SIGKILL);
}

std::string read_pointer(const fs::path& p) {
  std::string name;
  if (fs::exists(p)) std::ifstream(p) >> name;
  return name;
}

// Replaces `name` in `dir` with a file holding `text`, atomically; unchanged when it holds it already.
bool write_pointer(const fs::path& dir, const std::string& name, const std::string& text) {
  if (read_pointer(dir / name) == text) return false;
  const fs::path tmp = dir / (name + ".tmp");
  write_file(tmp.string(), text + "\n");
  rename_file(tmp.string(), (dir / name).string());
  sync_directory(dir.string());
  return true;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& c, int64_t keep_last,
                            bool is_final) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = checkpoint_name(step);
  const fs::path final_dir = root / name, tmp = root / (".tmp-" + name);
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    save_model(*c.model, (tmp / "model").string(), at::kFloat);
    if (!c.tokenizer_file.empty()) copy_file_contents(c.tokenizer_file, (tmp / "model" / "tokenizer.json").string());
    maybe_crash(step, "model");
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer_state);
    maybe_crash(step, "optimizer");
    write_file((tmp / "trainer_state.json").string(), c.trainer_state.dump(2) + "\n");
    if (!c.config_text.empty()) write_file((tmp / "train_config.toml").string(), c.config_text);
    maybe_crash(step, "state");
    json sums = json::object();
    for (const auto& e : fs::recursive_directory_iterator(tmp)) {
      if (e.is_regular_file()) sums[fs::relative(e.path(), tmp).string()] = sha256_file(e.path().string());
    }
    write_file((tmp / "checksums.json").string(), sums.dump(2) + "\n");
    sync_directory((tmp / "model").string());
    sync_directory(tmp.string());
    maybe_crash(step, "checksums");
    fs::remove_all(final_dir);  // a re-run of the same step (after a resume) replaces it
    fs::rename(tmp, final_dir);
    sync_directory(root.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // leave the previous checkpoints exactly as they were
    throw;
  }
  maybe_crash(step, "published");
  publish_checkpoint(run_dir, name, keep_last, is_final);
  return final_dir.string();
}

std::vector<std::string> publish_checkpoint(const std::string& run_dir, const std::string& name, int64_t keep_last,
                                            bool is_final) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root / name)) throw Error((root / name).string() + ": no such checkpoint to publish");
  const int64_t step = std::atoll(name.c_str() + std::min<size_t>(name.size(), 5));
  std::vector<std::string> changed;
  if (write_pointer(root, "latest", name)) changed.push_back("latest");
  maybe_crash(step, "latest");
  if (is_final && write_pointer(root, "final", name)) changed.push_back("final");
  maybe_crash(step, "final");

  // Keep the newest keep_last step checkpoints, plus whatever `final` names. A checkpoint is moved aside before it
  // is removed, so that a kill half-way through leaves no half checkpoint under a real name.
  const std::string final_name = read_pointer(root / "final");
  std::vector<std::string> steps, leftovers;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (n.rfind("step-", 0) == 0) steps.push_back(n);
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".pruned-", 0) == 0) leftovers.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(leftovers.begin(), leftovers.end());
  for (size_t i = 0; i + keep_last < steps.size(); ++i) {
    if (steps[i] == final_name || steps[i] == name) continue;
    const fs::path aside = root / (".pruned-" + steps[i]);
    fs::rename(root / steps[i], aside);
    maybe_crash(step, "pruning");
    fs::remove_all(aside);
    changed.push_back("removed " + steps[i]);
  }
  // An interrupted save's .tmp-* (one process writes a run directory at a time: none is being written now) and an
  // interrupted pruning's .pruned-*.
  for (const auto& n : leftovers) {
    fs::remove_all(root / n);
    changed.push_back("removed " + n);
  }
  if (!changed.empty()) sync_directory(root.string());
  return changed;
}

json read_trainer_state(const std::string& dir) {
  return read_json_file((fs::path(dir) / "trainer_state.json").string());
}

}  // namespace archspace
