// util/profiler: self times from nested intervals (checked against sums done by hand), and a real Kineto
// session whose trace names the engine's own spans.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archspace/model/linear.h"
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
