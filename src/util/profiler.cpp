#include "archspace/util/profiler.h"

#include <ATen/Context.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "archspace/util/error.h"

namespace archspace {

namespace fs = std::filesystem;
namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {

std::atomic<bool> g_session_running{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::set<ActivityType> activities() {
  std::set<ActivityType> a = {ActivityType::CPU};
  if (at::hasCUDA()) a.insert(ActivityType::CUDA);  // kernels on the GPU's timeline, as torch.profiler shows them
  return a;
}

// Every thread's ops, not only the starting thread's: `serve` and `eval downstream` decode on the scheduler's
// own thread.
ProfilerConfig config() {
  torch::profiler::impl::ExperimentalConfig experimental(/*profiler_metrics=*/{}, /*profiler_measure_per_kernel=*/false,
                                                         /*verbose=*/false, /*performance_events=*/{},
                                                         /*enable_cuda_sync_events=*/false,
                                                         /*adjust_profiler_step=*/false,
                                                         /*disable_external_correlation=*/false,
                                                         /*profile_all_threads=*/true);
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true, false, false, false, false, experimental);
}

}  // namespace

std::vector<OpTime> op_self_times(std::vector<OpInterval> intervals) {
  // Per thread, by start time (an enclosing interval before the ones inside it): a stack of the open
  // intervals finds each one's parent.
  std::sort(intervals.begin(), intervals.end(), [](const OpInterval& a, const OpInterval& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;
  });
  std::vector<double> self(intervals.size());
  std::vector<size_t> open;
  for (size_t i = 0; i < intervals.size(); ++i) {
    const OpInterval& op = intervals[i];
    while (!open.empty() &&
           (intervals[open.back()].thread != op.thread || intervals[open.back()].end_ns <= op.start_ns))
      open.pop_back();
    const double length = static_cast<double>(op.end_ns - op.start_ns);
    self[i] = length;
    if (!open.empty()) self[open.back()] -= length;
    open.push_back(i);
  }
  std::map<std::string, OpTime> by_name;
  for (size_t i = 0; i < intervals.size(); ++i) {
    OpTime& t = by_name[intervals[i].name];
    t.name = intervals[i].name;
    t.calls += 1;
    t.self_ms += std::max(0.0, self[i]) / 1e6;
    t.total_ms += static_cast<double>(intervals[i].end_ns - intervals[i].start_ns) / 1e6;
  }
  std::vector<OpTime> ops;
  for (auto& [name, t] : by_name) ops.push_back(t);
  std::sort(ops.begin(), ops.end(), [](const OpTime& a, const OpTime& b) {
    return a.self_ms != b.self_ms ? a.self_ms > b.self_ms : a.name < b.name;
  });
  return ops;
}

int64_t process_page_faults() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_minflt) + static_cast<int64_t>(usage.ru_majflt);
}

std::string format_op_table(const std::vector<OpTime>& ops, double wall_ms, size_t top, int64_t page_faults) {
  double all_self = 0;
  for (const OpTime& op : ops) all_self += op.self_ms;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-48s %8s %11s %7s %11s\n", "op (by self time)", "calls", "self ms", "self %",
                "total ms");
  out += line;
  for (size_t i = 0; i < std::min(top, ops.size()); ++i) {
    const OpTime& op = ops[i];
    const std::string name = op.name.size() > 48 ? op.name.substr(0, 45) + "..." : op.name;
    std::snprintf(line, sizeof(line), "%-48s %8lld %11.3f %6.1f%% %11.3f\n", name.c_str(),
                  static_cast<long long>(op.calls), op.self_ms, all_self > 0 ? 100 * op.self_ms / all_self : 0.0,
                  op.total_ms);
    out += line;
  }
  std::snprintf(line, sizeof(line), "%zu op kinds, %.3f ms self time in ops over %.3f ms wall, %lld page faults\n",
                ops.size(), all_self, wall_ms, static_cast<long long>(page_faults));
  out += line;
  return out;
}

void OpProfiler::check_trace_path(const std::string& trace_path) {
  if (trace_path.empty()) throw Error("profile: the trace path is empty");
  const fs::path parent = fs::path(trace_path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) throw Error("profile: cannot create the directory of " + trace_path + ": " + ec.message());
  if (fs::is_directory(trace_path)) throw Error("profile: " + trace_path + " is a directory, not a trace file");
  std::ofstream probe(trace_path, std::ios::app);
  if (!probe) throw Error("profile: cannot write " + trace_path);
}

OpProfiler::OpProfiler(std::string trace_path) : trace_path_(std::move(trace_path)) {
  check_trace_path(trace_path_);
  // Kineto's own "enabled" is per thread; this process-wide flag is what keeps a second session out.
  if (g_session_running.exchange(true))
    throw Error("profile: another profile is running in this process (Kineto has one session at a time)");
  // Without a GPU, Kineto logs "gpuGetDeviceCount failed" as an ERROR on every trace; it is not one. Its log
  // level is read from the environment when it initialises (a value the user set wins).
  if (!at::hasCUDA()) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  try {
    kineto::prepareProfiler(config(), activities());
    kineto::enableProfiler(config(), activities());
  } catch (...) {
    g_session_running = false;
    throw;
  }
  start_ns_ = now_ns();
  start_page_faults_ = process_page_faults();
  running_ = true;
}

OpProfiler::~OpProfiler() {
  if (running_) {
    try {
      kineto::disableProfiler();
    } catch (...) {  // a destructor during unwinding must not throw; the trace is lost either way
    }
    g_session_running = false;
  }
}

ProfileSummary OpProfiler::finish(int top) {
  if (!running_) throw Error("profile: finish() called twice for " + trace_path_);
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  running_ = false;
  g_session_running = false;
  ProfileSummary summary;
  summary.wall_ms = static_cast<double>(now_ns() - start_ns_) / 1e6;
  summary.page_faults = process_page_faults() - start_page_faults_;
  summary.trace_path = trace_path_;
  summary.table_path = trace_path_ + ".top-ops.txt";
  result->save(trace_path_);
  std::vector<OpInterval> intervals;
  for (const kineto::KinetoEvent& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.isAsync() || e.endNs() < e.startNs()) continue;
    intervals.push_back({e.name(), e.startThreadId(), e.startNs(), e.endNs()});
  }
  summary.top_ops = op_self_times(std::move(intervals));
  summary.table =
      format_op_table(summary.top_ops, summary.wall_ms, static_cast<size_t>(std::max(top, 1)), summary.page_faults);
  std::ofstream table(summary.table_path);
  table << summary.table;
  if (!table) throw Error("profile: cannot write " + summary.table_path);
  if (summary.top_ops.size() > static_cast<size_t>(top)) summary.top_ops.resize(top);
  return summary;
}

}  // namespace archspace
