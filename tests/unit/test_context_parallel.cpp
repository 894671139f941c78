// Context parallelism without communication: the halo plan's arithmetic, and the model side of the hook
// (model/context_parallel.h) run as slices one after another in one process, against the whole sequence.
// The ranks' exchanges themselves (dist/sequence_exchange.h) run in tests/python/test_context_parallel.py.
#include <gtest/gtest.h>

#include <map>

#include "archspace/dist/sequence_exchange.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "forward_option_fields.h"
#include "test_support.h"
#include "tolerance.h"

namespace archspace {
namespace {

// Every rank's plan for N ranks of S positions, `count` wanted before each slice.
std::vector<HaloPlan> plans(int N, int64_t S, int64_t count) {
  std::vector<HaloPlan> p;
  for (int r = 0; r < N; ++r) p.push_back(halo_plan(r, N, S, count));
  return p;
}

TEST(HaloPlan, ReceivesTheWindowBeforeTheSliceFromItsOwners) {
  // 4 ranks of 8 positions, 11 wanted: rank 3 (positions 24..31) needs 13..23: 13..15 of rank 1 (its 5..7),
  // 16..23 of rank 2 (all of it).
  const HaloPlan p = halo_plan(3, 4, 8, 11);
  EXPECT_EQ(p.halo, 11);
  ASSERT_EQ(p.receives.size(), 2u);
  EXPECT_EQ(p.receives[0].peer, 1);
  EXPECT_EQ(p.receives[0].start, 5);
  EXPECT_EQ(p.receives[0].length, 3);
  EXPECT_EQ(p.receives[0].offset, 0);
  EXPECT_EQ(p.receives[1].peer, 2);
  EXPECT_EQ(p.receives[1].start, 0);
  EXPECT_EQ(p.receives[1].length, 8);
  EXPECT_EQ(p.receives[1].offset, 3);
  EXPECT_TRUE(p.sends.empty());
  // The start of the sequence cuts the halo: rank 1 gets all of rank 0's 8, rank 0 nothing.
  EXPECT_EQ(halo_plan(1, 4, 8, 11).halo, 8);
  EXPECT_EQ(halo_plan(0, 4, 8, 11).halo, 0);
  EXPECT_TRUE(halo_plan(0, 4, 8, 11).receives.empty());
  // A window of one position (itself) needs nothing from anyone.
  for (const HaloPlan& q : plans(4, 8, 0)) EXPECT_TRUE(q.receives.empty() && q.sends.empty() && q.halo == 0);
}

TEST(HaloPlan, EverySendMatchesTheReceiveItFeeds) {
  for (int N : {2, 3, 4, 8}) {
    for (int64_t S : {1, 5, 8}) {
      for (int64_t count : {0, 1, 3, 7, 8, 9, 20, 100}) {
        const std::vector<HaloPlan> p = plans(N, S, count);
        for (int r = 0; r < N; ++r) {
          int64_t covered = 0;
          for (const HaloPiece& in : p[r].receives) {
            EXPECT_EQ(in.offset, covered) << "pieces tile the halo in order";
            covered += in.length;
            int matches = 0;
            for (const HaloPiece& out : p[in.peer].sends) {
              if (out.peer != r) continue;
              ++matches;
              EXPECT_EQ(out.start, in.start);
              EXPECT_EQ(out.length, in.length);
              EXPECT_EQ(out.offset, in.offset);
            }
            EXPECT_EQ(matches, 1) << "N " << N << " S " << S << " count " << count << " rank " << r;
          }
          EXPECT_EQ(covered, p[r].halo);
          EXPECT_EQ(p[r].halo, std::min<int64_t>(count, r * S));
          size_t sends_to_me = 0;
          for (int q = 0; q < N; ++q)
            for (const HaloPiece& out : p[q].sends) sends_to_me += out.peer == r;
          EXPECT_EQ(sends_to_me, p[r].receives.size());
        }
      }
    }
  }
}

// The slices of one sequence run one after another: slice r's attention reads the keys and values slices
// 0..r recorded at the same layer (layers call the hook in order), narrowed as ContextParallelism narrows what
// the ranks' exchanges deliver: the whole prefix for full layers, window - 1 positions before the slice for
// sliding ones. Earlier slices' tensors stay in their graphs, so one backward over every slice's loss sends
// each key's gradient back to the slice that made it, as the exchanges' backward does across ranks.
class SequentialSlices final : public ContextParallel {
 public:
  explicit SequentialSlices(int64_t slice_length) : S_(slice_length) {}
  void begin(int64_t slice) {
    slice_ = slice;
    layer_ = 0;
  }
  int64_t slice_start() const override { return slice_ * S_; }
  Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t window) override {
    auto& [keys, values] = seen_[layer_++];
    keys.push_back(k);
    values.push_back(v);
    const at::Tensor all_k = at::cat(keys, 2), all_v = at::cat(values, 2);
    const int64_t start = slice_start();
    const int64_t halo = window > 0 ? std::min(window - 1, start) : start;
    return {all_k.narrow(2, start - halo, halo + S_), all_v.narrow(2, start - halo, halo + S_), halo};
  }

 private:
  int64_t S_, slice_ = 0, layer_ = 0;
  std::map<int64_t, std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> seen_;
};

struct SlicedRun {
  at::Tensor logits;
  std::vector<at::Tensor> grads;
};

// logits and the gradients of sum(logits * weights): the whole sequence at once, or in `slices` slices.
SlicedRun run(const CausalLM& model, const at::Tensor& ids, const at::Tensor& weights, int64_t slices) {
  for (const auto& [name, p] : model.parameters()) p.mutable_grad().reset();
  const int64_t T = ids.size(1), S = T / slices;
  SequentialSlices cp(S);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < slices; ++r) {
    SequenceOptions options;
    if (slices > 1) {
      cp.begin(r);
      options.context_parallel = &cp;
    }
    parts.push_back(model.forward(ids.narrow(1, r * S, S), options));
  }
  SlicedRun out;
  out.logits = at::cat(parts, 1);
  (out.logits * weights).sum().backward();
  for (const auto& [name, p] : model.parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

// Bounds (tolerance.h): the sliced and the whole forward compute the same values in other orders (SDPA over a
// slice's queries with a mask against the whole causal kernel; each slice's own matmuls), so each logit is
// within forward_bound. Each parameter's gradient sums the same per-position terms in another order, through
// the transposed chain: gradient_bound relative to the largest entry, as tests/python/tolerances.py states it.
TEST(ContextParallelModel, SlicesOneAfterAnotherEqualTheWholeSequence) {
  struct Case {
    Variant variant;
    int64_t window;  // against slices of 8 positions: shorter, longer than a slice, longer than two
    bool yarn;
  };
  for (const Case& c : {Case{Variant::kBase, 5, false}, Case{Variant::kBase, 12, true},
                        Case{Variant::kSiameseDepth, 5, true}, Case{Variant::kSiameseDepth, 20, false}}) {
    ModelConfig config = preset("tiny", c.variant);
    config.sliding_window = c.window;
    config.depth_attention_stride = 2;
    if (c.yarn) config.rope_scaling = YarnScaling{4.0, 16, 32.0, 1.0, std::nullopt};
    CausalLM model = CausalLM::random_init(config, 5);
    for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
    const int64_t T = 32;
    at::manual_seed(c.window);
    const at::Tensor ids = at::randint(config.vocab_size, {2, T}, at::kLong);
    const at::Tensor weights = at::randn({2, T, config.vocab_size});
    const SlicedRun whole = run(model, ids, weights, 1);
    for (int64_t slices : {2, 4}) {
      const SlicedRun sliced = run(model, ids, weights, slices);
      const std::string what = std::string(variant_name(c.variant)) + " window " + std::to_string(c.window) +
                               (c.yarn ? " yarn" : "") + ", " + std::to_string(slices) + " slices";
      EXPECT_TRUE(tolerance::within(sliced.logits, whole.logits, tolerance::forward_bound(model, T))) << what;
      double scale = 0, worst = 0;
      for (size_t i = 0; i < whole.grads.size(); ++i) {
        scale = std::max(scale, tolerance::magnitude(whole.grads[i]));
        worst = std::max(worst, tolerance::magnitude(sliced.grads[i] - whole.grads[i]));
      }
      const double bound = tolerance::gradient_bound(config, T, 2 * T * config.vocab_size, scale);
      std::printf("%s: gradients differ by %.3g (bound %.3g, largest entry %.3g)\n", what.c_str(), worst, bound, scale);
      EXPECT_LE(worst, bound) << what;
      EXPECT_GT(scale, 0);
    }
  }
}

// Local positions instead of global ones would leave the full layers' scores (and RoPE) wrong: the same model
// run on a slice without the hook differs from the sliced run by far more than the bound above (the test
// above can fail).
TEST(ContextParallelModel, TheHookChangesTheResult) {
  ModelConfig config = preset("tiny");
  CausalLM model = CausalLM::random_init(config, 5);
  const at::Tensor ids = at::randint(config.vocab_size, {1, 16}, at::kLong);
  SequentialSlices cp(8);
  SequenceOptions options;
  options.context_parallel = &cp;
  cp.begin(0);
  model.forward(ids.narrow(1, 0, 8), options);
  cp.begin(1);
  const at::Tensor second = model.forward(ids.narrow(1, 8, 8), options);
  const at::Tensor alone = model.forward(ids.narrow(1, 8, 8));
  EXPECT_GT((second - alone).abs().max().item<double>(), 100 * tolerance::forward_bound(model, 16));
}

// Context parallelism is a field of whole-sequence forwards only (model/forward_options.h): a decoding call, the
// one that holds a KV cache, has no such field to be given, and a whole-sequence call has no cache.
using testing::TakesCache;
using testing::TakesContextParallel;

TEST(ContextParallelModel, RefusedWithAKvCache) {
  static_assert(TakesContextParallel<SequenceOptions> && !TakesCache<SequenceOptions>);
  static_assert(TakesCache<DecodeOptions> && !TakesContextParallel<DecodeOptions>);
  static_assert(!TakesContextParallel<AnalysisOptions>);
}

}  // namespace
}  // namespace archspace
