#include "archspace/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_text(const fs::path& p, const std::string& text) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) throw Error(p.string() + ": cannot open for writing");
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) throw Error(p.string() + ": write failed (disk full?)");
}

// Replaces `name` in `dir` with a file holding `text`, atomically.
void write_pointer(const fs::path& dir, const std::string& name, const std::string& text) {
  write_text(dir / (name + ".tmp"), text + "\n");
  fs::rename(dir / (name + ".tmp"), dir / name);
  fsync_path(dir);
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

// Test hook: die (SIGKILL, no cleanup) half-way through writing the checkpoint of this step.
// Tests of crash safety: ARCHSPACE_TEST_KILL_DURING_CHECKPOINT=N kills the process (SIGKILL) while step N's
// checkpoint is half written; N:published, after its rename and before `latest` names it.
void maybe_crash(int64_t step, bool published) {
  const char* env = std::getenv("ARCHSPACE_TEST_KILL_DURING_CHECKPOINT");
  if (!env || std::atoll(env) != step) return;
  if ((std::string(env).find(":published") != std::string::npos) == published) ::raise(SIGKILL);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& c, int64_t keep_last,
                            bool is_final) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = step_name(step);
  const fs::path final_dir = root / name, tmp = root / (".tmp-" + name);
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    save_model(*c.model, (tmp / "model").string(), at::kFloat);
    if (!c.tokenizer_file.empty()) fs::copy_file(c.tokenizer_file, tmp / "model" / "tokenizer.json");
    maybe_crash(step, false);
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer_state);
    write_text(tmp / "trainer_state.json", c.trainer_state.dump(2) + "\n");
    if (!c.config_text.empty()) write_text(tmp / "train_config.toml", c.config_text);
    json sums = json::object();
    for (const auto& e : fs::recursive_directory_iterator(tmp)) {
      if (e.is_regular_file()) sums[fs::relative(e.path(), tmp).string()] = sha256_file(e.path().string());
    }
    write_text(tmp / "checksums.json", sums.dump(2) + "\n");
    fsync_path(tmp / "model");
    fsync_path(tmp);
    fs::remove_all(final_dir);  // a re-run of the same step (after a resume) replaces it
    fs::rename(tmp, final_dir);
    fsync_path(root);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // leave the previous checkpoints exactly as they were
    throw;
  }
  maybe_crash(step, true);
  write_pointer(root, "latest", name);
  if (is_final) write_pointer(root, "final", name);

  // Keep the newest keep_last step checkpoints, plus whatever `final` names.
  std::string final_name;
  if (fs::exists(root / "final")) std::ifstream(root / "final") >> final_name;
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep_last < steps.size(); ++i) {
    if (steps[i] != final_name && steps[i] != name) fs::remove_all(root / steps[i]);
  }
  return final_dir.string();
}

json read_trainer_state(const std::string& dir) {
  return read_json_file((fs::path(dir) / "trainer_state.json").string());
}

}  // namespace archspace
