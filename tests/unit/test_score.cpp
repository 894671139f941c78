// infer/score: batched, padded, chunked scoring equals each sequence's own full forward (log_softmax of
// its logits), for both variants, whole or with shared prefixes run once (infer/prefix_groups); bad requests are
// refused naming the request.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "archspace/infer/prefix_groups.h"
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

// Each request's scores against its sequence's own forward: two fp32 computations of each logit (forward_bound
// at the longest length), then of its log_softmax.
void expect_equal_to_own_forwards(const CausalLM& m, const std::vector<ScoreRequest>& requests,
                                  const std::vector<SequenceScore>& scores, int64_t longest) {
  const ModelConfig& c = m.config();
  ASSERT_EQ(scores.size(), requests.size());
  const double logit_bound = tolerance::forward_bound(m, longest);
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
      ASSERT_TRUE(scores[i].next_logprobs.defined()) << "request " << i;
      EXPECT_TRUE(tolerance::within(scores[i].next_logprobs, ref[n - 1], bound)) << "request " << i;
    } else {
      EXPECT_FALSE(scores[i].next_logprobs.defined());
    }
  }
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
  expect_equal_to_own_forwards(m, requests, scores, 40);
}

// Multiple-choice shaped requests: documents whose choices share a context (lengths around and beyond the tiny
// preset's 8-token window), continuations of 1-6 tokens, some wanting the next token; one context shared across
// documents (as the unconditional "Answer:" requests are); duplicates; requests alone with their prefix; one
// that scores nothing.
std::vector<ScoreRequest> choice_requests(int64_t vocab) {
  std::vector<ScoreRequest> requests;
  auto add = [&](const std::vector<uint32_t>& context, int64_t continuation, bool next_token) {
    ScoreRequest r;
    r.ids = context;
    const std::vector<uint32_t> tail = random_ids(continuation, vocab);
    r.ids.insert(r.ids.end(), tail.begin(), tail.end());
    r.first_scored = static_cast<int64_t>(context.size());
    r.next_token = next_token;
    requests.push_back(r);
  };
  const std::vector<uint32_t> shared = random_ids(2, vocab);
  int64_t k = 0;
  for (int64_t context : {3, 7, 8, 9, 20, 33, 1}) {
    const std::vector<uint32_t> ids = random_ids(context, vocab);
    for (int64_t choice = 0; choice < 2 + context % 3; ++choice, ++k) add(ids, 1 + (k * 5) % 6, k % 4 == 1);
    add(shared, 1 + k % 3, false);
  }
  add(random_ids(12, vocab), 4, true);  // alone
  add(random_ids(5, vocab), 1, false);  // alone
  requests.push_back(requests[3]);      // a duplicate of a member
  ScoreRequest nothing = requests[0];   // scores nothing, wants nothing: runs its prefix alone
  nothing.ids.resize(static_cast<size_t>(nothing.first_scored));
  requests.push_back(nothing);
  ScoreRequest next_only = requests[0];  // scores nothing, wants the next token: its prefix's last row
  next_only.ids.resize(static_cast<size_t>(next_only.first_scored));
  next_only.next_token = true;
  requests.push_back(next_only);
  return requests;
}

void check_shared_prefixes(Variant variant) {
  at::manual_seed(12);
  ModelConfig c = preset("tiny", variant);
  CausalLM m = CausalLM::random_init(c, 8);
  const std::vector<ScoreRequest> requests = choice_requests(c.vocab_size);
  const auto total = static_cast<int64_t>(requests.size());
  for (const int64_t sequences : {int64_t{0}, int64_t{3}}) {
    ScoreOptions options;
    options.top_logprobs = 3;
    options.max_batch_tokens = 100;  // the 20-token context's four choices: a group of three, one alone
    options.max_batch_sequences = sequences;
    options.head_chunk = 5;
    const PrefixPlan plan = plan_prefix_sharing(requests, options.max_batch_tokens, sequences);
    ASSERT_GE(plan.batches.size(), 2u);  // the test is about shared prefixes: they must be there
    int64_t last_done = 0;
    const auto scores = score_sequences(m, requests, options, [&](int64_t done, int64_t all) {
      EXPECT_GT(done, last_done);
      EXPECT_EQ(all, total);
      last_done = done;
    });
    EXPECT_EQ(last_done, total);
    expect_equal_to_own_forwards(m, requests, scores, 40);
  }
}

}  // namespace

TEST(Score, EqualsEachSequencesOwnForwardBase) { check_variant(Variant::kBase); }
TEST(Score, EqualsEachSequencesOwnForwardSiameseDepth) { check_variant(Variant::kSiameseDepth); }
TEST(Score, SharedPrefixesEqualEachSequencesOwnForwardBase) { check_shared_prefixes(Variant::kBase); }
TEST(Score, SharedPrefixesEqualEachSequencesOwnForwardSiameseDepth) { check_shared_prefixes(Variant::kSiameseDepth); }

// The plan: every request once; a group's members share exactly their unscored prefix; no batch over its budgets
// (rows x (longest prefix + longest suffix) and prefixes x longest prefix padded tokens, rows); longest first.
TEST(Score, PrefixPlanKeepsEveryRequestOnceWithinTheBudgets) {
  at::manual_seed(13);
  const std::vector<ScoreRequest> requests = choice_requests(512);
  // Alone, besides the two requests with prefixes of their own and the one that scores nothing: at 100 tokens the
  // 20-token context's fourth choice (4 x 26 > 100); at 3 rows also the fourth member of the 7-, 8- and 20-token
  // contexts' groups and the seventh of the shared one's; at 30 tokens the 33- and 20-token contexts' choices.
  const std::vector<std::tuple<int64_t, int64_t, size_t>> cases = {{100, 0, 4}, {100, 3, 7}, {8192, 0, 3}, {30, 0, 9}};
  for (const auto& [tokens, sequences, alone] : cases) {
    const PrefixPlan plan = plan_prefix_sharing(requests, tokens, sequences);
    EXPECT_EQ(plan.alone.size(), alone) << tokens << " tokens, " << sequences << " sequences";
    std::vector<int> seen(requests.size(), 0);
    for (size_t i : plan.alone) ++seen[i];
    int64_t previous_prefix = std::numeric_limits<int64_t>::max();
    for (const auto& batch : plan.batches) {
      ASSERT_FALSE(batch.empty());
      int64_t prefix = 0, suffix = 0, rows = 0;
      for (const PrefixGroup& g : batch) {
        EXPECT_LE(g.prefix, previous_prefix);
        previous_prefix = g.prefix;
        ASSERT_GE(g.members.size(), 2u);
        prefix = std::max(prefix, g.prefix);
        rows += static_cast<int64_t>(g.members.size());
        int64_t longest = 0;
        for (size_t i : g.members) {
          ++seen[i];
          const ScoreRequest& q = requests[i];
          EXPECT_EQ(q.first_scored, g.prefix);
          EXPECT_TRUE(std::equal(q.ids.begin(), q.ids.begin() + g.prefix, requests[g.members[0]].ids.begin()));
          longest = std::max(longest, q.run_length() - g.prefix);
        }
        EXPECT_EQ(g.longest_suffix, longest);
        suffix = std::max(suffix, longest);
      }
      EXPECT_LE(static_cast<int64_t>(batch.size()) * prefix, tokens);
      EXPECT_LE(rows * (prefix + suffix), tokens);
      if (sequences > 0) EXPECT_LE(rows, sequences);
    }
    for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(seen[i], 1) << "request " << i;
  }
  // With room, each context runs once: the requests that share one are in one group.
  const PrefixPlan roomy = plan_prefix_sharing(requests, 1 << 20, 0);
  size_t groups = 0;
  for (const auto& batch : roomy.batches) groups += batch.size();
  EXPECT_EQ(groups, 8u);  // seven documents' contexts and the shared two-token one
}

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
