// infer/score: batched, padded, chunked scoring equals each sequence's own full forward (log_softmax of
// its logits), for both variants; bad requests are refused naming the request.
#include <gtest/gtest.h>

#include <cmath>

#include "archspace/infer/score.h"
#include "test_support.h"
#include "tolerance.h"

using namespace archspace;
using archspace::testing::expect_error;

namespace {

// log p(ids[t] | ids[<t]) from one unpadded forward of the sequence alone.
at::Tensor reference_logprobs(const CausalLM& m, const std::vector<uint32_t>& ids) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  at::Tensor x = at::tensor(v, at::kLong).unsqueeze(0);
  return at::log_softmax(m.forward(x)[0].to(at::kFloat), -1);  // [T, V]
}

std::vector<uint32_t> random_ids(int64_t n, int64_t vocab) {
  at::Tensor t = at::randint(0, vocab, {n}, at::kLong);
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<uint32_t>(t[i].item<int64_t>()));
  return out;
}

void check_variant(Variant variant) {
  at::manual_seed(11);
  ModelConfig c = preset("tiny", variant);
  CausalLM m = CausalLM::random_init(c, 5);
  // Lengths around the sliding window and of every size ordering, so batches pad differently.
  std::vector<ScoreRequest> requests;
  const std::vector<int64_t> lengths = {3, 40, 17, 1, 29, 40, 2, 33};
  for (size_t i = 0; i < lengths.size(); ++i) {
    ScoreRequest r;
    r.ids = random_ids(lengths[i], c.vocab_size);
    r.first_scored = lengths[i] > 4 ? lengths[i] / 2 : 1;
    r.next_token = i % 2 == 0;
    if (lengths[i] == 1) r.first_scored = 1;  // nothing scored; only the next-token distribution
    requests.push_back(r);
  }
  ScoreOptions options;
  options.top_logprobs = 3;
  options.max_batch_tokens = 90;  // several batches of 2-5 rows
  options.head_chunk = 7;         // chunk boundaries inside sequences
  int64_t last_done = 0;
  const auto scores = score_sequences(m, requests, options, [&](int64_t done, int64_t total) {
    EXPECT_GT(done, last_done);
    EXPECT_EQ(total, 8);
    last_done = done;
  });
  EXPECT_EQ(last_done, 8);
  ASSERT_EQ(scores.size(), requests.size());
  // Batched, padded, chunked scoring and the sequence's own forward: two fp32 computations of each logit
  // (forward_bound at the longest length), then of its log_softmax.
  const double logit_bound = tolerance::forward_bound(m, 40);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const at::Tensor ref = reference_logprobs(m, r.ids);
    const double bound = tolerance::logprob_bound(logit_bound, c.vocab_size, tolerance::magnitude(ref));
    const auto n = static_cast<int64_t>(r.ids.size());
    ASSERT_EQ(static_cast<int64_t>(scores[i].tokens.size()), n - r.first_scored) << "request " << i;
    double sum = 0;
    for (int64_t t = r.first_scored; t < n; ++t) {
      const TokenLogprob& s = scores[i].tokens[t - r.first_scored];
      const at::Tensor row = ref[t - 1];
      const float expected = row[r.ids[t]].item<float>();
      EXPECT_NEAR(s.logprob, expected, bound) << "request " << i << " token " << t;
      sum += expected;
      EXPECT_EQ(s.greedy, row.argmax().item<int64_t>() == static_cast<int64_t>(r.ids[t]));
      auto [values, ids] = row.topk(3);
      ASSERT_EQ(s.top.size(), 3u);
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(s.top[j].first, ids[j].item<int64_t>());
        EXPECT_NEAR(s.top[j].second, values[j].item<float>(), bound);
      }
    }
    // n terms, each within `bound`, summed in double on both sides.
    EXPECT_NEAR(scores[i].sum_logprob(), sum, static_cast<double>(n) * bound);
    if (r.next_token) {
      ASSERT_TRUE(scores[i].next_logprobs.defined());
      EXPECT_TRUE(tolerance::within(scores[i].next_logprobs, ref[n - 1], bound));
    } else {
      EXPECT_FALSE(scores[i].next_logprobs.defined());
    }
  }
}

}  // namespace

TEST(Score, EqualsEachSequencesOwnForwardBase) { check_variant(Variant::kBase); }
TEST(Score, EqualsEachSequencesOwnForwardSiameseDepth) { check_variant(Variant::kSiameseDepth); }

TEST(Score, GreedyFlagFollowsTheArgmax) {
  CausalLM m = CausalLM::random_init(preset("tiny"), 6);
  // Extend a prompt by its own argmax token: that token is greedy, and a different one is not.
  ScoreRequest probe{{5, 9, 2}, 1, true};
  const auto next = score_sequences(m, {probe})[0].next_logprobs;
  const auto best = static_cast<uint32_t>(next.argmax().item<int64_t>());
  const auto other = (best + 1) % static_cast<uint32_t>(m.config().vocab_size);
  const auto scores = score_sequences(m, {ScoreRequest{{5, 9, 2, best}, 3}, ScoreRequest{{5, 9, 2, other}, 3}});
  EXPECT_TRUE(scores[0].all_greedy());
  EXPECT_FALSE(scores[1].all_greedy());
  // One sequence scored twice (length 3, then 4): the same logits up to summation order.
  const double bound =
      tolerance::logprob_bound(tolerance::forward_bound(m, 4), m.config().vocab_size, tolerance::magnitude(next));
  EXPECT_NEAR(scores[0].tokens[0].logprob, next[best].item<float>(), bound);
}

TEST(Score, BadRequestsNameTheRequest) {
  CausalLM m = CausalLM::random_init(preset("tiny"), 7);
  const auto vocab = static_cast<uint32_t>(m.config().vocab_size);
  expect_error(
      [&] {
        score_sequences(m, {ScoreRequest{{1, 2}, 1}, ScoreRequest{{}, 1}});
      },
      {"scoring request 1", "no tokens"});
  expect_error([&] { score_sequences(m, {ScoreRequest{{1, 2}, 0}}); }, {"request 0", "outside [1, 2]"});
  expect_error(
      [&] {
        score_sequences(m, {ScoreRequest{{1, vocab}, 1}});
      },
      {"token id " + std::to_string(vocab), "vocabulary"});
  // Without next_token the last token is only a target: max_position_embeddings + 1 tokens fit, one more does
  // not; with next_token every token is run.
  const int64_t max_pos = m.config().max_position_embeddings;
  std::vector<uint32_t> fits(max_pos + 1, 1), too_long(max_pos + 2, 1);
  const auto scored = score_sequences(m, {ScoreRequest{fits, max_pos}});
  ASSERT_EQ(scored[0].tokens.size(), 1u);
  EXPECT_TRUE(std::isfinite(scored[0].tokens[0].logprob));
  expect_error([&] { score_sequences(m, {ScoreRequest{too_long, 1}}); }, {"max_position_embeddings"});
  expect_error([&] { score_sequences(m, {ScoreRequest{fits, 1, /*next_token=*/true}}); }, {"max_position_embeddings"});
}
