// Fixed-shape decoding (KVCache::fix_shapes, infer/decode_step.h), the CPU reference of decoding with CUDA graphs:
// the cache reserved once after the prefill, each step writing at slot % capacity from a device slot and reading
// the whole buffer under a device mask. Its logits equal eager decoding (fp32, within tolerance::forward_bound: the
// same maths, with masked keys adding exact zeros) for both variants, left-padded batches, sliding rings that wrap
// and ones that never fill, rows that join and leave the batch (per-row slots), and steps over a bucket of the first
// rows with rows moved down; every step launches the same ops on the same memory; misuse is refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "archspace/infer/decode_step.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "archspace/util/error.h"
#include "decoding_models.h"
#include "tolerance.h"

using namespace archspace;

namespace {

ModelConfig config_for(Variant v) { return archspace::testing::decoding_config(v); }
CausalLM random_model(const ModelConfig& c, uint64_t seed) { return archspace::testing::perturbed_model(c, seed); }

// Prefill `batch` (left-padded by `padding`) into a fresh cache, then feed `feeds` [B, steps] one column a step
// through DecodeSteps in `mode`: each step's logits [B, V].
std::vector<at::Tensor> decode(const CausalLM& model, const at::Tensor& batch, const std::vector<int64_t>& padding,
                               const at::Tensor& feeds, DecodeMode mode, int64_t end_slot) {
  KVCache cache(model.config(), padding);
  model.forward(batch, DecodeOptions{&cache, AttentionImpl::kSdpa});
  DecodeSteps steps(model, cache, mode, end_slot);
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < feeds.size(1); ++t) {
    const at::Tensor column = feeds.select(1, t).contiguous();
    out.push_back(
        steps.step(std::vector<int64_t>(column.data_ptr<int64_t>(), column.data_ptr<int64_t>() + column.numel())));
  }
  return out;
}

// The greedy token of one row's logits.
int64_t greedy_token(const at::Tensor& logits) { return logits.reshape({-1}).argmax().item<int64_t>(); }

// Prefills `prompt` alone into `cache`; its first greedy token.
int64_t prefill_greedy(const CausalLM& model, KVCache& cache, const std::vector<int64_t>& prompt) {
  return greedy_token(
      model.forward(at::tensor(prompt, at::kLong).view({1, -1}), DecodeOptions{&cache, AttentionImpl::kSdpa, true}));
}

// The first n greedy tokens of `prompt` decoded alone, eagerly: what a row of a batch must give.
std::vector<int64_t> greedy_alone(const CausalLM& model, const std::vector<int64_t>& prompt, int64_t n) {
  KVCache cache(model.config());
  std::vector<int64_t> out = {prefill_greedy(model, cache, prompt)};
  while (static_cast<int64_t>(out.size()) < n)
    out.push_back(greedy_token(
        model.forward(at::tensor({out.back()}, at::kLong).view({1, 1}), DecodeOptions{&cache, AttentionImpl::kSdpa})));
  return out;
}

std::vector<int64_t> random_prompt(const ModelConfig& c, int64_t n) {
  const at::Tensor ids = at::randint(0, c.vocab_size, {n}, at::kLong);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
}

}  // namespace

class FixedShapeDecoding : public ::testing::TestWithParam<Variant> {};

// Three prompts (3, 9 and 21 tokens: shorter than, about and past the window of 8) left-padded into one batch, 14
// steps: the sliding rings wrap during the steps and the full layer reads a buffer longer than it holds.
TEST_P(FixedShapeDecoding, LeftPaddedBatchEqualsEagerDecoding) {
  const ModelConfig c = config_for(GetParam());
  const CausalLM model = random_model(c, 11);
  const std::vector<int64_t> lengths = {3, 9, 21}, padding = {18, 12, 0};
  std::vector<at::Tensor> rows;
  for (size_t b = 0; b < lengths.size(); ++b)
    rows.push_back(
        at::cat({at::full({padding[b]}, 5, at::kLong), at::randint(0, c.vocab_size, {lengths[b]}, at::kLong)}));
  const at::Tensor batch = at::stack(rows);
  const int64_t steps = 14;
  const at::Tensor feeds = at::randint(0, c.vocab_size, {3, steps}, at::kLong);
  const auto eager = decode(model, batch, padding, feeds, DecodeMode::kEager, 21 + steps);
  // The end slot past what the steps fill: the buffers hold more than is ever written, masked.
  const auto fixed = decode(model, batch, padding, feeds, DecodeMode::kFixedShapes, 21 + steps + 5);
  const double bound = tolerance::forward_bound(model, 21 + steps);
  double worst = 0;
  for (int64_t t = 0; t < steps; ++t) {
    worst = std::max(worst, (fixed[t] - eager[t]).abs().max().item<double>());
    EXPECT_TRUE(tolerance::within(fixed[t], eager[t], bound)) << "step " << t;
  }
  EXPECT_GT(eager[0].abs().max().item<double>(), 1.0);  // logits of a real scale
  std::printf("worst difference fixed shapes vs eager: %.3g (bound %.3g)\n", worst, bound);
}

// One unpadded row whose steps end before the window fills: the sliding layers' buffers never wrap (capacity
// below the window), and the end slot is exactly what the steps fill.
TEST_P(FixedShapeDecoding, ShortUnpaddedRunEqualsEagerDecoding) {
  const ModelConfig c = config_for(GetParam());
  const CausalLM model = random_model(c, 12);
  const at::Tensor prompt = at::randint(0, c.vocab_size, {1, 2}, at::kLong);
  const at::Tensor feeds = at::randint(0, c.vocab_size, {1, 4}, at::kLong);
  const auto eager = decode(model, prompt, {}, feeds, DecodeMode::kEager, 6);
  const auto fixed = decode(model, prompt, {}, feeds, DecodeMode::kFixedShapes, 6);
  for (size_t t = 0; t < eager.size(); ++t)
    EXPECT_TRUE(tolerance::within(fixed[t], eager[t], tolerance::forward_bound(model, 6))) << "step " << t;
}

// Rows join and leave a fixed-shape batch without reshaping it (KVCache::leave_row, place_row: per-row slots and
// masks): two prompts (11 tokens, past the window of 8, and 3) start the batch; the short one leaves after 4 tokens,
// its row idles two steps, then a third prompt (5 tokens) takes it. Every row's greedy tokens equal eager decoding
// of its prompt alone, token for token, and the buffers keep their memory throughout.
TEST_P(FixedShapeDecoding, RowsJoinAndLeaveAFixedBatchAsEagerDecodingAlone) {
  const ModelConfig c = config_for(GetParam());
  const CausalLM model = random_model(c, 15);
  auto argmax = [](const at::Tensor& logits) { return greedy_token(logits); };
  auto prefill = [&](KVCache& cache, const std::vector<int64_t>& prompt) {
    return prefill_greedy(model, cache, prompt);
  };
  auto alone = [&](const std::vector<int64_t>& prompt, int64_t n) { return greedy_alone(model, prompt, n); };
  auto prompt_of = [&](int64_t n) { return random_prompt(c, n); };
  const std::vector<std::vector<int64_t>> prompts = {prompt_of(11), prompt_of(3), prompt_of(5)};
  const std::vector<int64_t> wanted = {18, 4, 10};

  KVCache first(c), second(c), third(c);
  std::vector<std::vector<int64_t>> tokens = {{prefill(first, prompts[0])}, {prefill(second, prompts[1])}, {}};
  KVCache batch(c);
  batch.append_rows({&first, &second});
  DecodeSteps steps(model, batch, DecodeMode::kFixedShapes, 11 + 20);
  std::vector<const void*> buffers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) buffers.push_back(batch.key_buffer(l).const_data_ptr());
  std::vector<int64_t> in_row = {0, 1};  // which prompt each batch row decodes (-1: idle)
  int64_t left_at = -1;
  for (int64_t t = 0; in_row[0] >= 0 || in_row[1] >= 0; ++t) {
    if (in_row[1] < 0 && left_at >= 0 && t == left_at + 3 && tokens[2].empty()) {  // the third prompt joins
      tokens[2].push_back(prefill(third, prompts[2]));
      ASSERT_TRUE(batch.fits(third, wanted[2] - 1));
      batch.place_row(1, third);
      in_row[1] = 2;
    }
    std::vector<int64_t> feed;
    for (int64_t p : in_row) feed.push_back(p >= 0 ? tokens[p].back() : 0);
    const at::Tensor logits = steps.step(feed);
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t p = in_row[b];
      if (p < 0) continue;
      tokens[p].push_back(argmax(logits[b]));
      if (static_cast<int64_t>(tokens[p].size()) == wanted[p]) {
        batch.leave_row(b);
        EXPECT_TRUE(batch.is_idle(b));
        in_row[b] = -1;
        if (p == 1) left_at = t;
      }
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      ASSERT_EQ(batch.key_buffer(l).const_data_ptr(), buffers[l]) << "layer " << l << " step " << t;
    ASSERT_LT(t, 40) << "the rows never finished";
  }
  ASSERT_EQ(tokens[2].size(), static_cast<size_t>(wanted[2]));  // the third prompt joined and finished
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(tokens[p], alone(prompts[p], wanted[p])) << "prompt " << p;
  // An idle row takes a prefilled one, once; a row whose steps would pass the end slot does not fit.
  batch.place_row(0, third);
  EXPECT_FALSE(batch.is_idle(0));
  EXPECT_THROW(batch.place_row(0, third), Error);
  EXPECT_TRUE(batch.fits(first, 20));  // 11 + 20 slots: exactly the end slot
  EXPECT_FALSE(batch.fits(first, 21));
}

// A fixed-shape batch of 4 rows holding 3 prompts (6, 4 and 9 tokens; row 3 idle from the start) computes a bucket
// of its first rows (decode_rows_bucket: 4, then 2, then 1) as its rows finish and the last one in use moves down
// into the idle row below it (KVCache::move_row). Every prompt's greedy tokens equal eager decoding of it alone,
// token for token, the buffers keep their memory, and the steps ran with each bucket.
TEST_P(FixedShapeDecoding, BucketsOfTheFirstRowsAndRowsMovedDownDecodeAsAlone) {
  const ModelConfig c = config_for(GetParam());
  const CausalLM model = random_model(c, 16);
  auto argmax = [](const at::Tensor& logits) { return greedy_token(logits); };
  auto prefill = [&](KVCache& cache, const std::vector<int64_t>& prompt) {
    return prefill_greedy(model, cache, prompt);
  };
  auto alone = [&](const std::vector<int64_t>& prompt, int64_t n) { return greedy_alone(model, prompt, n); };
  auto prompt_of = [&](int64_t n) { return random_prompt(c, n); };
  const std::vector<std::vector<int64_t>> prompts = {prompt_of(6), prompt_of(4), prompt_of(9)};
  const std::vector<int64_t> wanted = {9, 3, 14};  // row 1 finishes first, then row 0, then row 2 (moved to 0)

  KVCache caches[3] = {KVCache(c), KVCache(c), KVCache(c)};
  std::vector<std::vector<int64_t>> tokens;
  for (size_t p = 0; p < prompts.size(); ++p) tokens.push_back({prefill(caches[p], prompts[p])});
  KVCache batch(c);
  batch.append_rows({&caches[0], &caches[1], &caches[2]});
  DecodeSteps steps(model, batch, DecodeMode::kFixedShapes, 9 + 16, /*rows=*/4);
  ASSERT_EQ(batch.batch_size(), 4);
  EXPECT_TRUE(batch.is_idle(3));
  EXPECT_EQ(batch.rows_in_use(), 3);
  std::vector<const void*> buffers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) buffers.push_back(batch.key_buffer(l).const_data_ptr());
  std::vector<int64_t> in_row = {0, 1, 2, -1};  // which prompt each batch row decodes (-1: idle)
  for (int64_t t = 0; batch.rows_in_use() > 0; ++t) {
    ASSERT_LT(t, 40) << "the rows never finished";
    const int64_t rows = decode_rows_bucket(batch.rows_in_use(), 4);
    std::vector<int64_t> feed;
    for (int64_t b = 0; b < rows; ++b) feed.push_back(in_row[b] >= 0 ? tokens[in_row[b]].back() : 0);
    const at::Tensor logits = steps.step(feed);
    ASSERT_EQ(logits.size(0), rows);
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t p = in_row[b];
      if (p < 0) continue;
      tokens[p].push_back(argmax(logits[b]));
      if (static_cast<int64_t>(tokens[p].size()) == wanted[p]) {
        batch.leave_row(b);
        in_row[b] = -1;
      }
    }
    // The highest row in use moves into the lowest idle row below it.
    for (int64_t to = 0; to < batch.rows_in_use() - 1; ++to) {
      if (in_row[to] >= 0) continue;
      const int64_t from = batch.rows_in_use() - 1;
      batch.move_row(from, to);
      std::swap(in_row[to], in_row[from]);
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      ASSERT_EQ(batch.key_buffer(l).const_data_ptr(), buffers[l]) << "layer " << l << " step " << t;
  }
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(tokens[p], alone(prompts[p], wanted[p])) << "prompt " << p;
  EXPECT_EQ(steps.steps_by_rows().size(), 3u);
  for (int64_t rows : {4, 2, 1}) EXPECT_GT(steps.steps_by_rows().count(rows), 0u) << rows << " rows";
  // Misuse: fewer ids than the rows in use, a row moved onto one in use.
  KVCache again(c);
  prefill(again, prompts[0]);
  KVCache two(c);
  two.append_rows({&again, &again});
  DecodeSteps more(model, two, DecodeMode::kFixedShapes, 20, 4);
  EXPECT_THROW(more.step({1}), Error);
  EXPECT_THROW(two.move_row(1, 0), Error);
  EXPECT_THROW(two.set_active_rows(5), Error);
}

INSTANTIATE_TEST_SUITE_P(BothVariants, FixedShapeDecoding, ::testing::Values(Variant::kBase, Variant::kSiameseDepth));

// What a graph replays must not move: every layer's buffers keep their memory and size from the first step to the
// last, and the steps' positions past the window still give eager decoding's logits (checked above).
TEST(FixedShapeDecoding, StepsKeepTheirMemory) {
  const ModelConfig c = config_for(Variant::kBase);
  const CausalLM model = random_model(c, 13);
  KVCache cache(c);
  model.forward(at::randint(0, c.vocab_size, {1, 5}, at::kLong), DecodeOptions{&cache, AttentionImpl::kSdpa});
  DecodeSteps steps(model, cache, DecodeMode::kFixedShapes, 30);
  const int64_t bytes = cache.bytes();
  std::vector<const void*> buffers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) buffers.push_back(cache.key_buffer(l).const_data_ptr());
  EXPECT_EQ(cache.key_buffer(0).size(2), c.sliding_window);  // 30 slots: the ring of the window
  EXPECT_EQ(cache.key_buffer(3).size(2), 30);                // the full layer: every slot to the end
  for (int64_t t = 0; t < 25; ++t) {
    steps.step({7});
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      ASSERT_EQ(cache.key_buffer(l).const_data_ptr(), buffers[l]) << "layer " << l << " step " << t;
  }
  EXPECT_EQ(cache.bytes(), bytes);
  EXPECT_EQ(cache.length(), 30);
}

TEST(FixedShapeDecoding, MisuseIsRefused) {
  const ModelConfig c = config_for(Variant::kBase);
  const CausalLM model = random_model(c, 14);
  KVCache empty(c);
  EXPECT_THROW(
      {
        try {
          empty.fix_shapes(10);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("prefill first"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  KVCache cache(c);
  model.forward(at::randint(0, c.vocab_size, {1, 4}, at::kLong), DecodeOptions{&cache, AttentionImpl::kSdpa});
  EXPECT_THROW(cache.fix_shapes(4), Error);                              // nothing left to fill
  EXPECT_THROW(cache.fix_shapes(c.max_position_embeddings + 1), Error);  // past the model's positions
  cache.fix_shapes(7);
  // A step whose slot was not written: refused, not run at a stale slot.
  try {
    model.forward(at::tensor({3}, at::kLong).view({1, 1}), DecodeOptions{&cache, AttentionImpl::kSdpa});
    ADD_FAILURE() << "a step without begin_fixed_step ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("begin_fixed_step"), std::string::npos) << e.what();
  }
  cache.begin_fixed_step();
  EXPECT_THROW(model.forward(at::tensor({3, 4}, at::kLong).view({1, 2}), DecodeOptions{&cache, AttentionImpl::kSdpa}),
               Error);
  EXPECT_THROW(cache.keep_rows({0}), Error);
  KVCache other(c);
  EXPECT_THROW(cache.append_rows(other), Error);
  // Three steps fill slots 4, 5 and 6; a fourth would be past the end slot.
  for (int64_t t = 0; t < 3; ++t) {
    if (t > 0) cache.begin_fixed_step();
    model.forward(at::tensor({3}, at::kLong).view({1, 1}), DecodeOptions{&cache, AttentionImpl::kSdpa});
  }
  EXPECT_THROW(cache.begin_fixed_step(), Error);
  EXPECT_THROW(parse_decode_mode("graph"), Error);
  EXPECT_EQ(parse_decode_mode("fixed-shapes"), DecodeMode::kFixedShapes);
  EXPECT_STREQ(decode_mode_name(DecodeMode::kCudaGraph), "cuda-graph");
  // CUDA graphs on a CPU model: an error naming the device, whatever the build.
  KVCache again(c);
  model.forward(at::randint(0, c.vocab_size, {1, 4}, at::kLong), DecodeOptions{&again, AttentionImpl::kSdpa});
  try {
    DecodeSteps graph(model, again, DecodeMode::kCudaGraph, 8);
    ADD_FAILURE() << "CUDA graphs accepted a CPU model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need a GPU"), std::string::npos) << e.what();
  }
}
