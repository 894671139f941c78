#include "archspace/train/trackers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "archspace/train/tensorboard_events.h"
#include "archspace/util/error.h"

extern char** environ;

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void flatten_into(const std::string& prefix, const json& v, json& out) {
  if (v.is_object() || v.is_array()) {
    size_t i = 0;
    for (auto it = v.begin(); it != v.end(); ++it, ++i) {
      const std::string key = v.is_object() ? it.key() : std::to_string(i);
      flatten_into(prefix.empty() ? key : prefix + "/" + key, *it, out);
    }
  } else if (!v.is_null()) {
    out[prefix] = v;
  }
}

// ---- TensorBoard ------------------------------------------------------------------------------------

class TensorBoardTracker : public Tracker {
 public:
  TensorBoardTracker(const std::string& dir, int64_t start_step) : writer_(dir, start_step > 0 ? start_step + 1 : 0) {}
  std::string name() const override { return "TensorBoard (" + writer_.path() + ")"; }
  void write(const json& record) override {
    const int64_t step = record.at("step").get<int64_t>();
    const double wall = now_seconds();
    const json flat = flatten_record(record);
    for (const auto& [tag, v] : flat.items()) {
      // Scalars only: strings (batch_hash, a task's metric name) have no place on a TensorBoard chart. A key that
      // two lines of a step share ("tokens" of the step and of its validation line) is one point.
      if (!(v.is_number() || v.is_boolean())) continue;
      auto [last, fresh] = last_step_.try_emplace(tag, step);
      if (!fresh && last->second >= step) continue;
      last->second = step;
      writer_.scalar(tag, v.is_boolean() ? float(v.get<bool>()) : v.get<float>(), step, wall);
    }
    writer_.flush();
  }

 private:
  TensorBoardWriter writer_;
  std::map<std::string, int64_t> last_step_;  // per tag, the last step written
};

// ---- Weights & Biases, through a Python sidecar ---------------------------------------------------------

// The W&B SDK is Python-only: scripts/wandb_sidecar.py reads JSON lines on its stdin (a socket, so that a
// dead reader is an EPIPE error rather than a SIGPIPE that would end training) and calls wandb.init, log
// and finish. Sending never blocks training: lines wait in `pending_` while the sidecar is busy (wandb.init
// takes seconds), bounded so that a hung sidecar is given up rather than grown into.
class WandbTracker : public Tracker {
 public:
  WandbTracker(const WandbConfig& cfg, const TrackingContext& context) : run_dir_(context.run_dir) {
    const fs::path dir = fs::path(run_dir_) / "wandb";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot create (" + ec.message() + ")");
    log_path_ = (dir / "archspace-sidecar.log").string();
    spawn(script_path());
    json config = json::object();
    try {
      std::ostringstream os;
      os << toml::json_formatter(toml::parse(context.config_text));
      config = json::parse(os.str());
    } catch (const std::exception&) {
      // The config was parsed to get here; without its text (tests build configs in code) it stays empty.
    }
    send({{"init",
           {{"project", cfg.project},
            {"name", cfg.name.empty() ? fs::path(run_dir_).filename().string() : cfg.name},
            {"mode", cfg.mode},
            {"run_dir", fs::absolute(run_dir_).string()},
            {"start_step", context.start_step},
            {"config", config},
            {"run", context.run_info}}}});
  }
  ~WandbTracker() override {
    if (fd_ >= 0) ::close(fd_);  // end of input without "finish": the sidecar marks the run as failed
    if (pid_ > 0) wait_exit(std::chrono::seconds(30));
  }
  std::string name() const override { return "W&B"; }
  void write(const json& record) override {
    json flat = flatten_record(record);
    flat["step"] = record.at("step");
    send({{"record", flat}});
  }
  void finish() override {
    send({{"finish", true}});
    drain(std::chrono::seconds(30));
    ::shutdown(fd_, SHUT_WR);
    // wandb.finish writes the offline run (online: uploads what is left); bounded, as training is over.
    if (!wait_exit(std::chrono::seconds(kFinishSeconds))) {
      ::kill(pid_, SIGKILL);
      wait_exit(std::chrono::seconds(5));
      throw Error("the sidecar did not finish within " + std::to_string(kFinishSeconds) +
                  " s and was stopped; `wandb sync " + run_dir_ + "/wandb` uploads what it wrote (log: " + log_path_ +
                  ")");
    }
    ::close(fd_);
    fd_ = -1;
    if (status_ != 0) throw Error(exit_cause());
  }

 private:
  static constexpr int kFinishSeconds = 120;
  static constexpr size_t kMaxPending = size_t(64) << 20;

  static std::string script_path() {
    if (const char* s = std::getenv("ARCHSPACE_WANDB_SIDECAR")) return s;
    return ARCHSPACE_WANDB_SIDECAR;
  }
  static std::string python() {
    if (const char* p = std::getenv("ARCHSPACE_PYTHON")) return p;
    const std::string built = ARCHSPACE_TRACKING_PYTHON;  // the build's (.venv/bin/python, else python3)
    return built.find('/') == std::string::npos || fs::exists(built) ? built : "python3";
  }

  void spawn(const std::string& script) {
    if (!fs::exists(script))
      throw Error("the sidecar script " + script + " does not exist (ARCHSPACE_WANDB_SIDECAR names another)");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error(std::string("socketpair: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // nothing of the trainer's (sockets, locks) leaks in
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setpgroup(&attr, 0);  // its own group: a Ctrl-C for the trainer (which then saves) is not for it
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    std::string py = python();
    std::vector<std::string> words = {py, script};
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const int err = ::posix_spawnp(&pid_, py.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(sv[1]);
    if (err != 0) {
      ::close(sv[0]);
      pid_ = 0;
      throw Error("cannot run " + py + " " + script + ": " + std::strerror(err) +
                  " (ARCHSPACE_PYTHON names a python with wandb)");
    }
    fd_ = sv[0];
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }

  void send(const json& message) {
    pending_ += message.dump() + "\n";
    drain(std::chrono::seconds(0));
    if (pending_.size() > kMaxPending)
      throw Error("the sidecar has not read " + std::to_string(pending_.size() >> 20) +
                  " MiB of records (hung?) (log: " + log_path_ + ")");
  }

  // Sends what the socket takes, waiting up to `patience` for it to take all.
  void drain(std::chrono::seconds patience) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!pending_.empty()) {
      const ssize_t n = ::send(fd_, pending_.data(), pending_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        pending_.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return;
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, static_cast<int>(left.count()));
        continue;
      }
      const int err = errno;
      wait_exit(std::chrono::seconds(5));
      throw Error(pid_ == 0 ? exit_cause() : std::string("cannot write to the sidecar: ") + std::strerror(err));
    }
  }

  // Whether the sidecar ended within `patience` (its status in status_, pid_ then 0).
  bool wait_exit(std::chrono::seconds patience) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) {
        status_ = r == pid_ ? status : 0;
        pid_ = 0;
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  // "the sidecar exited with status 3: <its last line>" (the sidecar prints its cause last).
  std::string exit_cause() const {
    std::string why = WIFEXITED(status_)     ? "exited with status " + std::to_string(WEXITSTATUS(status_))
                      : WIFSIGNALED(status_) ? "was killed by signal " + std::to_string(WTERMSIG(status_))
                                             : "stopped reading";
    std::ifstream in(log_path_);
    std::string last;
    for (std::string line; std::getline(in, line);) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
    }
    if (last.size() > 300) last = last.substr(0, 300) + "...";
    return "the sidecar " + python() + " " + script_path() + " " + why + (last.empty() ? "" : ": " + last) +
           " (log: " + log_path_ + ")";
  }

  std::string run_dir_, log_path_, pending_;
  int fd_ = -1;
  pid_t pid_ = 0;
  int status_ = 0;
};

}  // namespace

json flatten_record(const json& record) {
  json out = json::object();
  for (const auto& [k, v] : record.items()) {
    if (k != "step") flatten_into(k, v, out);
  }
  return out;
}

std::vector<std::unique_ptr<Tracker>> make_trackers(const LogConfig& log, const TrackingContext& context,
                                                    const std::function<void(const std::string&)>& warn) {
  std::vector<std::unique_ptr<Tracker>> trackers;
  auto start = [&](const char* what, auto build) {
    try {
      trackers.push_back(build());
    } catch (const std::exception& e) {
      warn(std::string(what) + " tracking is off: " + e.what() + "; metrics.jsonl stays the record");
    }
  };
  if (!log.tensorboard.empty())
    start("TensorBoard", [&] { return std::make_unique<TensorBoardTracker>(log.tensorboard, context.start_step); });
  if (log.wandb.enabled && log.wandb.mode != "disabled")
    start("W&B", [&] { return std::make_unique<WandbTracker>(log.wandb, context); });
  return trackers;
}

}  // namespace archspace
