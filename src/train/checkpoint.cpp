#include "archspace/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "archspace/io/model_io.h"
#include "archspace/util/error.h"
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
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
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
void maybe_crash(int64_t step) {
  const char* env = std::getenv("ARCHSPACE_TEST_KILL_DURING_CHECKPOINT");
  if (env && std::atoll(env) == step) ::raise(SIGKILL);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& c, int64_t keep_last, bool is_final) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = step_name(step);
  const fs::path final_dir = root / name, tmp = root / (".tmp-" + name);
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    save_model(*c.model, (tmp / "model").string(), at::kFloat);
    maybe_crash(step);
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer_state);
    write_text(tmp / "trainer_state.json", c.trainer_state.dump(2) + "\n");
    if (!c.config_toml.empty()) fs::copy_file(c.config_toml, tmp / "train_config.toml", fs::copy_options::overwrite_existing);
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

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "checkpoints" / "latest";
  if (!fs::exists(pointer)) return "";
  std::string name;
  std::ifstream(pointer) >> name;
  const fs::path dir = fs::path(run_dir) / "checkpoints" / name;
  if (name.empty() || !fs::is_directory(dir)) throw Error(pointer.string() + ": names '" + name + "', which is not a checkpoint directory");
  return dir.string();
}

void verify_checkpoint(const std::string& dir) {
  const fs::path sums_path = fs::path(dir) / "checksums.json";
  if (!fs::exists(sums_path)) throw Error(dir + ": no checksums.json (incomplete or not a checkpoint)");
  json sums;
  try {
    sums = json::parse(std::ifstream(sums_path));
  } catch (const json::parse_error& e) {
    throw Error(sums_path.string() + ": malformed JSON: " + e.what());
  }
  for (auto it = sums.begin(); it != sums.end(); ++it) {
    const fs::path file = fs::path(dir) / it.key();
    if (!fs::exists(file)) throw Error(file.string() + ": missing from the checkpoint (listed in checksums.json)");
    const std::string actual = sha256_file(file.string());
    if (actual != it.value().get<std::string>()) {
      throw Error(file.string() + ": checksum mismatch (SHA-256 " + actual + ", checksums.json says " + it.value().get<std::string>() +
                  "): the checkpoint is corrupt");
    }
  }
}

json read_trainer_state(const std::string& dir) {
  const fs::path p = fs::path(dir) / "trainer_state.json";
  try {
    return json::parse(std::ifstream(p));
  } catch (const json::parse_error& e) {
    throw Error(p.string() + ": malformed JSON: " + e.what());
  }
}

std::string resolve_model_dir(const std::string& path) {
  const fs::path p(path);
  if (fs::exists(p / "checkpoints" / "final")) {
    std::string name;
    std::ifstream(p / "checkpoints" / "final") >> name;
    return (p / "checkpoints" / name / "model").string();
  }
  if (fs::exists(p / "model" / "config.json")) return (p / "model").string();
  if (fs::exists(p / "config.json")) return p.string();
  throw Error(path + ": not a checkpoint, a finished run directory, or a model directory");
}

}  // namespace archspace
