// util/profiler: self times from nested intervals (checked against sums done by hand), and a real Kineto
// session whose trace names the engine's own spans.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archspace/kernels/linear.h"
#include "archspace/train/step_profiler.h"
#include "archspace/util/error.h"
#include "archspace/util/profiler.h"

using namespace archspace;

namespace {
const OpTime& find(const std::vector<OpTime>& ops, const std::string& name) {
  for (const OpTime& op : ops)
    if (op.name == name) return op;
  throw std::runtime_error("no op " + name);
}
}  // namespace

TEST(Profiler, SelfTimeIsLengthMinusDirectChildrenPerThread) {
  // thread 1: A [0, 100) holds B [10, 40) (which holds C [20, 30)) and B [50, 60); thread 2: A [5, 25) alone,
  // overlapping thread 1's intervals in time but not nested in them.
  const auto ms = [](uint64_t x) { return x * 1000000; };
  std::vector<OpInterval> in = {{"B", 1, ms(50), ms(60)},
                                {"C", 1, ms(20), ms(30)},
                                {"A", 1, ms(0), ms(100)},
                                {"B", 1, ms(10), ms(40)},
                                {"A", 2, ms(5), ms(25)}};
  const std::vector<OpTime> ops = op_self_times(in);
  const OpTime &a = find(ops, "A"), &b = find(ops, "B"), &c = find(ops, "C");
  EXPECT_EQ(a.calls, 2);
  EXPECT_DOUBLE_EQ(a.self_ms, (100 - 30 - 10) + 20);  // thread 1: minus both B; thread 2: all of it
  EXPECT_DOUBLE_EQ(a.total_ms, 100 + 20);
  EXPECT_EQ(b.calls, 2);
  EXPECT_DOUBLE_EQ(b.self_ms, (30 - 10) + 10);
  EXPECT_DOUBLE_EQ(b.total_ms, 40);
  EXPECT_DOUBLE_EQ(c.self_ms, 10);
  EXPECT_EQ(ops.front().name, "A");  // largest self time first
  // Self times add up to the top-level intervals' lengths: nothing counted twice or lost.
  double self = 0;
  for (const OpTime& op : ops) self += op.self_ms;
  EXPECT_DOUBLE_EQ(self, 100 + 20);
  const std::string table = format_op_table(ops, 150, 2);
  EXPECT_NE(table.find("A"), std::string::npos);
  EXPECT_EQ(table.find("\nC "), std::string::npos);  // only the top 2 rows
}

TEST(Profiler, TraceOfRealOpsNamesTheStreamingKernelAndUserSpans) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("archspace-profiler-" + std::to_string(::getpid()));
  const std::string path = (dir / "sub" / "t.pt.trace.json").string();  // the directory is created
  ProfileSummary s;
  {
    OpProfiler profiler(path);
    EXPECT_THROW(OpProfiler second(dir / "other.json"), Error);  // one Kineto session at a time
    at::AutoGradMode no_grad(false);
    at::Tensor w = at::randn({64, 32});
    RECORD_USER_SCOPE("archspace::test_region");
    for (int i = 0; i < 3; ++i) archspace::linear(at::randn({1, 32}), w);
    at::matmul(at::randn({8, 8}), at::randn({8, 8}));
    s = profiler.finish();
  }
  nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
  int64_t regions = 0, kernels = 0, mm = 0;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    regions += name == "archspace::test_region";
    kernels += name == "archspace::streaming_linear";
    mm += name == "aten::mm";
  }
  EXPECT_EQ(regions, 1);
  EXPECT_EQ(kernels, uses_streaming_linear(at::randn({1, 32}), at::randn({64, 32})) ? 3 : 0);
  EXPECT_GE(mm, 1);
  EXPECT_TRUE(fs::exists(s.table_path));
  EXPECT_NE(s.table.find("aten::"), std::string::npos);
  EXPECT_GT(s.wall_ms, 0);
  fs::remove_all(dir);
}

TEST(Profiler, UnwritablePathFailsBeforeStarting) {
  EXPECT_THROW(OpProfiler::check_trace_path(""), Error);
  EXPECT_THROW(OpProfiler::check_trace_path("/proc/archspace-no/trace.json"), Error);
  EXPECT_THROW(OpProfiler::check_trace_path(std::filesystem::temp_directory_path().string()), Error);  // a directory
  // and a failed start leaves no session behind: the next one starts
  EXPECT_THROW(OpProfiler p("/proc/archspace-no/trace.json"), Error);
  const std::string ok = (std::filesystem::temp_directory_path() / "archspace-profiler-ok.json").string();
  OpProfiler p(ok);
  p.finish();
  std::filesystem::remove(ok);
  std::filesystem::remove(ok + ".top-ops.txt");
}

TEST(Profiler, CountsThePageFaultsOfTheRegion) {
  // 64 MiB of fresh anonymous memory, written once per page inside the region: at least one fault per 4 KiB
  // page (no huge pages for it, which would fault once per 2 MiB; a larger base page only lowers the count,
  // so the bound is taken from the page size).
  constexpr size_t kBytes = size_t{64} << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* region = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  ::madvise(region, kBytes, MADV_NOHUGEPAGE);
  const std::string path = (std::filesystem::temp_directory_path() / "archspace-profiler-faults.json").string();
  OpProfiler profiler(path);
  for (size_t i = 0; i < kBytes; i += page) static_cast<volatile char*>(region)[i] = 1;
  const ProfileSummary s = profiler.finish();
  ::munmap(region, kBytes);
  EXPECT_GE(s.page_faults, static_cast<int64_t>(kBytes / page));
  const std::string last_line = s.table.substr(s.table.rfind('\n', s.table.size() - 2) + 1);
  EXPECT_NE(last_line.find(" " + std::to_string(s.page_faults) + " page faults"), std::string::npos) << last_line;
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".top-ops.txt");
}

TEST(Profiler, TracedStepsAreComparedWithTheUntracedStepsBeforeThem) {
  // Medians: of an odd count the middle value, of an even count the mean of the two middle ones.
  const std::vector<StepCost> traced = {{2.5, 75000}, {2.7, 76000}, {2.6, 1000}};
  const std::vector<StepCost> before = {{3.0, 800000}, {2.2, 0}, {2.1, 10}, {2.3, 0}};
  EXPECT_EQ(traced_step_comparison(6, 8, traced, before),
            "traced steps 6-8: 2.600 s and 75000 page faults a step (median); the 4 untraced steps before them: "
            "2.250 s and 5 page faults");
  EXPECT_EQ(traced_step_comparison(1, 1, {{2.5, 7}}, {}), "traced steps 1-1: 2.500 s and 7 page faults");
  EXPECT_EQ(traced_step_comparison(2, 2, {{2.5, 7}}, {{3.5, 9}}),
            "traced steps 2-2: 2.500 s and 7 page faults; the 1 untraced step before them: 3.500 s and 9 page faults");
  EXPECT_EQ(traced_step_comparison(2, 3, {}, {}), "");  // nothing traced (the run stopped before the window)
}

TEST(Profiler, StepProfilerTracesItsWindowAndMeasuresEveryStepBeforeIt) {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / ("archspace-step-profiler-" + std::to_string(::getpid()));
  StepProfiler profiler({3, 4}, run.string(), 0);
  std::optional<ProfileSummary> closed;
  for (int64_t step = 0; step < 5; ++step) {
    profiler.before_step(step);
    at::matmul(at::randn({8, 8}), at::randn({8, 8}));
    auto summary = profiler.after_step(step, 0.5 + static_cast<double>(step));
    if (step != 3) EXPECT_FALSE(summary.has_value()) << step;
    if (summary) closed = std::move(summary);
  }
  ASSERT_TRUE(closed.has_value());  // the window [3, 4] closes after the 0-based step 3
  EXPECT_TRUE(fs::exists(closed->trace_path));
  const std::string text = profiler.comparison();
  // Steps 3 and 4 (0.5 + 2, 0.5 + 3 s) traced; steps 1 and 2 (0.5, 1.5 s) before them; step 5 after, in neither.
  EXPECT_EQ(text.rfind("traced steps 3-4: 3.000 s and ", 0), 0u) << text;
  EXPECT_NE(text.find("; the 2 untraced steps before them: 1.000 s and "), std::string::npos) << text;
  fs::remove_all(run);
}

TEST(Profiler, StepProfilerKeepsTheLastTwentyUntracedSteps) {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / ("archspace-step-profiler-late-" + std::to_string(::getpid()));
  StepProfiler profiler({31, 31}, run.string(), 0);
  for (int64_t step = 0; step < 31; ++step) {
    profiler.before_step(step);
    profiler.after_step(step, step < 10 ? 100.0 : 1.0);  // ten slow steps, then twenty at 1 s
  }
  const std::string text = profiler.comparison();
  EXPECT_NE(text.find("; the 20 untraced steps before them: 1.000 s"), std::string::npos) << text;
  fs::remove_all(run);
}
