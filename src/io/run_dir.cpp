#include "archspace/io/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/sha256.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// The run's step-N checkpoint names, oldest first (the zero-padded names sort by step). A directory gets its
// name by the rename that ends a save, after checksums.json was written, so each one was complete.
std::vector<std::string> step_checkpoints(const std::string& run_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && fs::exists(e.path() / "checksums.json")) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints", pointer = root / "latest";
  const std::vector<std::string> steps = step_checkpoints(run_dir);
  if (!fs::exists(pointer)) return steps.empty() ? "" : (root / steps.back()).string();
  std::string name;
  std::ifstream(pointer) >> name;
  const fs::path dir = root / name;
  if (name.empty() || !fs::is_directory(dir))
    throw Error(pointer.string() + ": names '" + name + "', which is not a checkpoint directory");
  if (!steps.empty() && name.rfind("step-", 0) == 0 && steps.back() > name) return (root / steps.back()).string();
  return dir.string();
}

std::string newest_intact_checkpoint(const std::string& run_dir, const std::string& except) {
  const std::vector<std::string> steps = step_checkpoints(run_dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const fs::path dir = fs::path(run_dir) / "checkpoints" / *it;
    if (!except.empty() && fs::equivalent(dir, except)) continue;
    try {
      verify_checkpoint(dir.string());
      return dir.string();
    } catch (const Error&) {
    }
  }
  return "";
}

std::string resolve_checkpoint(const std::string& run_dir, const std::string& spec) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (fs::is_directory(spec) && fs::exists(fs::path(spec) / "checksums.json")) return spec;
  std::string name = spec;
  if (!name.empty() && std::all_of(name.begin(), name.end(), ::isdigit)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "step-%08lld", std::stoll(name));
    name = buf;
  }
  if (name.find('/') == std::string::npos && fs::is_directory(root / name)) return (root / name).string();
  std::string have;
  for (const auto& n : step_checkpoints(run_dir)) have += (have.empty() ? "" : ", ") + n;
  throw Error("--resume-from " + spec + ": no such checkpoint in " + root.string() +
              " (it holds: " + (have.empty() ? std::string("none") : have) + ")");
}

void verify_checkpoint(const std::string& dir) {
  const fs::path sums_path = fs::path(dir) / "checksums.json";
  if (!fs::exists(sums_path)) throw Error(dir + ": no checksums.json (incomplete or not a checkpoint)");
  const json sums = read_json_file(sums_path.string());
  if (!sums.is_object()) throw Error(sums_path.string() + ": expected an object of file -> SHA-256");
  // Every file of the checkpoint must be listed, so that an emptied or trimmed checksums.json cannot
  // switch verification off.
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path() == sums_path) continue;
    const std::string rel = fs::relative(e.path(), dir).string();
    if (!sums.contains(rel)) {
      throw Error(sums_path.string() + ": does not list " + rel +
                  " of the checkpoint (edited or not the checkpoint's own)");
    }
  }
  for (auto it = sums.begin(); it != sums.end(); ++it) {
    const fs::path file = fs::path(dir) / it.key();
    if (!fs::exists(file)) throw Error(file.string() + ": missing from the checkpoint (listed in checksums.json)");
    if (!it.value().is_string()) throw Error(sums_path.string() + ": the SHA-256 of " + it.key() + " is not a string");
    const std::string actual = sha256_file(file.string());
    if (actual != it.value().get<std::string>()) {
      throw Error(file.string() + ": checksum mismatch (SHA-256 " + actual + ", checksums.json says " +
                  it.value().get<std::string>() + "): the checkpoint is corrupt");
    }
  }
}

std::string resolve_model_dir(const std::string& path) {
  const fs::path p(path), root = p / "checkpoints";
  if (fs::exists(root / "final")) {
    std::string name;
    std::ifstream(root / "final") >> name;
    const fs::path model = root / name / "model";
    if (name.empty() || name.find('/') != std::string::npos || !fs::exists(model / "config.json"))
      throw Error((root / "final").string() + ": names '" + name + "', which is not a checkpoint of the run");
    return model.string();
  }
  if (fs::exists(p / "model" / "config.json")) return (p / "model").string();
  if (fs::exists(p / "config.json")) return p.string();
  if (fs::is_directory(root)) {
    // A run directory without `final`: a run still training or stopped early, or one whose final save was cut short.
    const std::string newest = latest_checkpoint(path);
    if (newest.empty()) throw Error(path + ": a run directory with no checkpoint yet (checkpoints/ is empty)");
    throw Error(path + ": the run has not finished: checkpoints/final is missing (its newest checkpoint is " + newest +
                "). If it stopped at its last step (a final save cut short by a kill or a full disk), `archspace train "
                "--config CONFIG --resume` with the run's config (saved as " +
                newest + "/train_config.toml) completes it; or name that checkpoint to use it as it is");
  }
  throw Error(path + ": not a checkpoint, a finished run directory, or a model directory");
}

std::string intact_checkpoint_note(const std::string& checkpoint_dir) {
  const std::string run = run_dir_of_checkpoint(checkpoint_dir);
  if (run.empty()) return "";
  const std::string intact = newest_intact_checkpoint(run, checkpoint_dir);
  return intact.empty() ? "no other checkpoint of " + run + " verifies"
                        : "the newest intact checkpoint of the run is " + intact;
}

std::string model_dir_for_use(const std::string& path, bool verify_checksums, const std::string& skip_hint) {
  const std::string model_dir = resolve_model_dir(path);
  const std::string checkpoint = checkpoint_of_model_dir(model_dir);
  if (checkpoint.empty() || !verify_checksums) return model_dir;
  try {
    verify_checkpoint(checkpoint);
  } catch (const Error& e) {
    const std::string intact = intact_checkpoint_note(checkpoint);
    throw Error(std::string(e.what()) + (intact.empty() ? "" : "; " + intact) +
                (skip_hint.empty() ? "" : " (" + skip_hint + ")"));
  }
  return model_dir;
}

std::string checkpoint_of_model_dir(const std::string& model_dir) {
  fs::path dir = fs::path(model_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "ckpt/model/"
  const fs::path checkpoint = dir.parent_path();
  return fs::exists(checkpoint / "checksums.json") ? checkpoint.string() : "";
}

std::string run_dir_of_checkpoint(const std::string& checkpoint_dir) {
  fs::path dir = fs::path(checkpoint_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  return dir.parent_path().filename() == "checkpoints" ? dir.parent_path().parent_path().string() : "";
}

std::optional<int64_t> trained_sequence_length(const std::string& model_dir) {
  const std::string checkpoint = checkpoint_of_model_dir(model_dir);
  const fs::path state = fs::path(checkpoint) / "trainer_state.json";
  if (checkpoint.empty() || !fs::exists(state)) return std::nullopt;
  const json j = read_json_file(state.string());
  const auto it = j.find("sequence_length");
  if (it == j.end()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < 2)
    throw Error(state.string() + ": \"sequence_length\" is not an integer >= 2");
  return it->get<int64_t>();
}

RunDirLock::RunDirLock(const std::string& run_dir) {
  fs::create_directories(run_dir);
  const std::string path = (fs::path(run_dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot open the run directory's lock file");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
    throw Error(run_dir + ": another process (pid " + holder.substr(0, holder.find('\n')) +
                ") is training in this run directory; wait for it or choose another train.run_dir");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The lock holds without the pid; only the message of a second process would lack it.
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace archspace
