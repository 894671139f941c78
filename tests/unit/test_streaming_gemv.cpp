// src/kernels/streaming_gemv.h's prefetch plan (private to the model's kernels, so included by path): which
// block a four-row block asks for, and that the paced requests cover that block's lines once each, in order,
// never past it, keeping pace with the bytes the kernel has read. The kernels' results are tested in
// test_linear.cpp and test_int8_weights.cpp; a prefetch changes only their speed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "../../src/kernels/streaming_gemv.h"

#if defined(__x86_64__)
using namespace archspace::streaming_gemv;

namespace {
struct Recorder {
  std::vector<const char*>* lines;
  void operator()(const char* p) const { lines->push_back(p); }
};
}  // namespace

TEST(StreamingGemvPrefetch, TheBlockAskedForIsAtLeast64KBAheadWithinTheRange) {
  std::vector<char> W(1);
  const char* base = W.data();
  // fp32, K = 768: 3,072-byte rows; 64 KB is 21.3 rows, so 24 (a multiple of four rows, past 64 KB).
  const WeightPrefetch plan(768, 4);
  const PacedPrefetch p = plan.block(base, 8, 36);
  EXPECT_EQ(p.block(), base + (8 + 24) * 3072);
  EXPECT_EQ(p.block_bytes(), 4 * 3072);
  EXPECT_EQ(plan.block(base, 8, 35).block(), nullptr);  // the block ahead would end past this thread's rows
  EXPECT_EQ(plan.block(base, 8, 35).block_bytes(), 0);
  // Rows wider than 64 KB: the next block.
  EXPECT_EQ(WeightPrefetch(40000, 2).block(base, 0, 100).block(), base + 4 * 80000);
}

TEST(StreamingGemvPrefetch, PastItsRowsAThreadAsksForTheMatrixItGoesOnWith) {
  std::vector<char> W(1), next(1);
  const char* base = W.data();
  const WeightPrefetch plan(768, 4);  // 3,072-byte rows, 24 rows ahead
  // Row 8 of a thread's rows ending at 20: the block ahead (rows 32-35) is 12 rows past them, so 12 rows into
  // the next matrix.
  const PacedPrefetch p = plan.block(base, 8, 20, next.data());
  EXPECT_EQ(p.block(), next.data() + 12 * 3072);
  EXPECT_EQ(p.block_bytes(), 4 * 3072);
  EXPECT_EQ(plan.block(base, 8, 20).block(), nullptr);  // no next matrix: nothing
}

TEST(StreamingGemvPrefetch, PacedRequestsCoverTheBlockOnceInStepWithTheReads) {
  for (int64_t step : {32, 64, 256, 100}) {
    std::vector<char> block(4 * 777);
    std::vector<const char*> lines;
    BasicPacedPrefetch<Recorder> p(block.data(), static_cast<int64_t>(block.size()), Recorder{&lines});
    int64_t read = 0;
    for (int i = 0; i < 5; ++i) {
      p.advance(step);
      read += step;
      // Every line that starts before the bytes read so far, and no other.
      EXPECT_EQ(static_cast<int64_t>(lines.size()), (read + 63) / 64) << "step " << step;
    }
    p.finish();
    p.advance(step);  // a second pass over the block asks for nothing more
    ASSERT_EQ(static_cast<int64_t>(lines.size()), (static_cast<int64_t>(block.size()) + 63) / 64) << "step " << step;
    for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i], block.data() + 64 * i) << "step " << step;
  }
  // Several passes over the current block (8 rows of x as two passes of 4): the block ahead is spread over all of
  // them, a line for every `passes` lines read, and the last pass's end has asked for all of it.
  for (int64_t passes : {2, 3}) {
    const int64_t block_bytes = 4 * 768;
    std::vector<char> block(block_bytes);
    std::vector<const char*> lines;
    BasicPacedPrefetch<Recorder> p(block.data(), block_bytes, Recorder{&lines}, passes);
    int64_t read = 0;
    for (int64_t pass = 0; pass < passes; ++pass) {
      for (int64_t k = 0; k < block_bytes; k += 128) {
        p.advance(128);
        read += 128;
        EXPECT_EQ(static_cast<int64_t>(lines.size()), (read / passes + 63) / 64) << passes << " passes";
      }
    }
    EXPECT_EQ(static_cast<int64_t>(lines.size()), block_bytes / 64) << passes << " passes";
    for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i], block.data() + 64 * i);
  }
  std::vector<const char*> none;
  BasicPacedPrefetch<Recorder> nothing(nullptr, 4096, Recorder{&none});  // no block ahead
  nothing.advance(64);
  nothing.finish();
  EXPECT_TRUE(none.empty());
}
#endif
