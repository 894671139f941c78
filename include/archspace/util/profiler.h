// Op-level profiles with LibTorch's Kineto profiler (the one torch.profiler drives in Python): every ATen op
// the process runs between start and finish, written as a Chrome trace JSON that Perfetto
// (ui.perfetto.dev), chrome://tracing and TensorBoard's profiler plugin open, plus a table of the ops that
// took the most self time (time in the op minus the ops it called).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace archspace {

struct OpTime {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0, total_ms = 0;  // total: the op's own time plus the ops it called
};

struct ProfileSummary {
  std::string trace_path, table_path;
  double wall_ms = 0;           // from start to finish
  int64_t page_faults = 0;      // the process's page faults from start to finish (process_page_faults)
  std::vector<OpTime> top_ops;  // by self time, largest first
  std::string table;            // top_ops as text (what table_path holds)
};

// One profiled region. Starting a second while one runs is an error (Kineto has one global session).
class OpProfiler {
 public:
  // Checks that `trace_path` can be written (its directory is created) before starting, so a bad path fails
  // before the work, not after it.
  explicit OpProfiler(std::string trace_path);
  ~OpProfiler();  // stops without writing if finish() was not called
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  // Stops, writes the trace and TRACE_PATH.top-ops.txt (the `top` ops by self time), returns the summary.
  ProfileSummary finish(int top = 25);

  // Throws archspace::Error naming the path when a trace could not be written there (creates its directory).
  static void check_trace_path(const std::string& trace_path);

 private:
  std::string trace_path_;
  int64_t start_ns_ = 0;
  int64_t start_page_faults_ = 0;
  bool running_ = false;
};

// Self time per op name from (name, thread, start, end) intervals: an interval's children are the intervals
// of the same thread inside it, and its self time is its length minus its direct children's.
struct OpInterval {
  std::string name;
  uint64_t thread = 0;
  uint64_t start_ns = 0, end_ns = 0;
};
std::vector<OpTime> op_self_times(std::vector<OpInterval> intervals);

// The table's last line sums up the region: op kinds, self time, wall time and its page faults.
std::string format_op_table(const std::vector<OpTime>& ops, double wall_ms, size_t top, int64_t page_faults = 0);

// Page faults (minor + major) of the whole process so far, from getrusage. A traced region's count shows what
// tracing costs besides the ops' own time: the profiler keeps its records in the heap, and where they take the
// place a freed large tensor would have been given again, that tensor lands on new pages, which fault on first
// touch (docs/commands.md "Profiling").
int64_t process_page_faults();

}  // namespace archspace
