// Incremental decoding with the KV cache equals the full forward (fp32, within tolerance::forward_bound: the
// same maths in other summation orders), for both variants,
// past the sliding window and with YaRN on full layers; batches of sequences of different lengths equal
// each sequence run alone; sliding layers' cache stays bounded by the window.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "archspace/util/error.h"
#include "decoding_models.h"
#include "tolerance.h"

using namespace archspace;

namespace {

ModelConfig config_for(Variant v) { return archspace::testing::decoding_config(v); }
CausalLM random_model(const ModelConfig& c, uint64_t seed) { return archspace::testing::perturbed_model(c, seed); }

}  // namespace

class IncrementalDecoding : public ::testing::TestWithParam<Variant> {};

TEST_P(IncrementalDecoding, ChunkedPrefillThenTokensEqualFullForward) {
  const ModelConfig c = config_for(GetParam());
  CausalLM model = random_model(c, 1);
  at::Tensor ids = at::randint(0, c.vocab_size, {1, 40}, at::kLong);  // 5x the window of 8
  at::Tensor full = model.forward(ids);
  KVCache cache(c);
  std::vector<at::Tensor> pieces;
  int64_t pos = 0;
  for (int64_t chunk : {13, 5, 1, 1, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {  // prefill chunks, then single tokens
    pieces.push_back(model.forward(ids.narrow(1, pos, chunk), DecodeOptions{&cache, AttentionImpl::kSdpa}));
    pos += chunk;
  }
  ASSERT_EQ(pos, 40);
  EXPECT_EQ(cache.length(), 40);
  EXPECT_TRUE(tolerance::within(at::cat(pieces, 1), full, tolerance::forward_bound(model, 40)));
  EXPECT_GT(full.abs().max().item<double>(), 1.0);  // logits of a real scale, not all near zero
  // Sliding layers hold the last window positions (a ring); full layers hold everything.
  EXPECT_EQ(cache.cached_positions(0), c.sliding_window);
  EXPECT_EQ(cache.cached_positions(3), 40);
}

TEST_P(IncrementalDecoding, BatchedDecodingEqualsEachRowAlone) {
  const ModelConfig c = config_for(GetParam());
  CausalLM model = random_model(c, 2);
  at::Tensor ids = at::randint(0, c.vocab_size, {3, 20}, at::kLong);
  KVCache batch_cache(c);
  at::Tensor batched = at::cat({model.forward(ids.narrow(1, 0, 12), DecodeOptions{&batch_cache, AttentionImpl::kSdpa}),
                                model.forward(ids.narrow(1, 12, 8), DecodeOptions{&batch_cache, AttentionImpl::kSdpa})},
                               1);
  for (int64_t b = 0; b < 3; ++b) {
    KVCache row_cache(c);
    at::Tensor row = ids.narrow(0, b, 1);
    at::Tensor alone = at::cat({model.forward(row.narrow(1, 0, 12), DecodeOptions{&row_cache, AttentionImpl::kSdpa}),
                                model.forward(row.narrow(1, 12, 8), DecodeOptions{&row_cache, AttentionImpl::kSdpa})},
                               1);
    EXPECT_TRUE(tolerance::within(batched[b], alone[0], tolerance::forward_bound(model, 20))) << "row " << b;
  }
}

// Three prompts of different lengths (shorter than, about, and past the window of 8), left-padded into one
// batch, prefilled in chunks and decoded token by token: every row's logits equal that row run alone.
TEST_P(IncrementalDecoding, DifferentLengthsInOneBatchEqualEachRowAlone) {
  const ModelConfig c = config_for(GetParam());
  CausalLM model = random_model(c, 4);
  const std::vector<int64_t> lengths = {3, 9, 21};
  const int64_t longest = 21, decode_steps = 12, pad_id = 5;
  std::vector<at::Tensor> prompts, continuations;
  for (int64_t n : lengths) {
    prompts.push_back(at::randint(0, c.vocab_size, {n}, at::kLong));
    continuations.push_back(at::randint(0, c.vocab_size, {decode_steps}, at::kLong));
  }
  std::vector<int64_t> padding;
  std::vector<at::Tensor> rows;
  for (size_t b = 0; b < lengths.size(); ++b) {
    padding.push_back(longest - lengths[b]);
    rows.push_back(at::cat({at::full({padding.back()}, pad_id, at::kLong), prompts[b]}));
  }
  at::Tensor batch = at::stack(rows);  // [3, 21], left-padded

  for (AttentionImpl impl : {AttentionImpl::kSdpa, AttentionImpl::kReference}) {
    KVCache cache(c, padding);
    std::vector<at::Tensor> prefill;
    for (int64_t s = 0; s < longest; s += 8) {
      const int64_t n = std::min<int64_t>(8, longest - s);
      prefill.push_back(model.forward(batch.narrow(1, s, n), DecodeOptions{&cache, impl}));
    }
    at::Tensor prefill_logits = at::cat(prefill, 1);  // [3, 21, V]
    std::vector<at::Tensor> decoded;
    for (int64_t step = 0; step < decode_steps; ++step) {
      at::Tensor next =
          at::stack({continuations[0][step], continuations[1][step], continuations[2][step]}).view({3, 1});
      decoded.push_back(model.forward(next, DecodeOptions{&cache, impl}));
    }
    at::Tensor decode_logits = at::cat(decoded, 1);              // [3, 12, V]
    ASSERT_FALSE(at::isnan(prefill_logits).any().item<bool>());  // padding rows stay finite

    for (size_t b = 0; b < lengths.size(); ++b) {
      // Alone: no padding, the full forward over prompt + continuation.
      at::Tensor alone = model.forward(at::cat({prompts[b], continuations[b]}).unsqueeze(0), SequenceOptions{impl})[0];
      at::Tensor batched = at::cat({prefill_logits[b].narrow(0, padding[b], lengths[b]), decode_logits[b]}, 0);
      EXPECT_TRUE(tolerance::within(batched, alone, tolerance::forward_bound(model, longest + decode_steps)))
          << "row " << b << " (length " << lengths[b] << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothVariants, IncrementalDecoding, ::testing::Values(Variant::kBase, Variant::kSiameseDepth));

// A decode step writes its one position with a row copy per batch row and head (KVCache's fast path for T = 1):
// keys and values as the attention block makes them ([B, T, G, h] in memory, viewed [B, G, T, h]), fp32 and bf16,
// land where copy_ puts them: the full layer holds every position in order, the sliding layer's ring slot s % window
// holds position s.
TEST(KVCache, OnePositionStepsHoldWhatWasAppended) {
  const ModelConfig c = config_for(Variant::kBase);  // layer 0 sliding (window 8), layer 3 full; G = 2, h = 16
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    KVCache cache(c);
    std::vector<at::Tensor> ks, vs;
    auto step = [&](int64_t T) {
      const at::Tensor k = at::randn({2, T, 2, 16}).to(dtype).transpose(1, 2);
      const at::Tensor v = at::randn({2, T, 2, 16}).to(dtype).transpose(1, 2);
      ks.push_back(k);
      vs.push_back(v);
      const KVCache::View full = cache.append(3, k, v);
      const KVCache::View sliding = cache.append(0, k, v);
      cache.advance(T);
      return std::pair{full, sliding};
    };
    step(3);  // a prefill chunk, then single positions well past the window
    for (int64_t s = 3; s < 21; ++s) {
      auto [full, sliding] = step(1);
      EXPECT_TRUE(at::equal(full.k, at::cat(ks, 2)) && at::equal(full.v, at::cat(vs, 2))) << dtype << " step " << s;
      const int64_t slot = s % c.sliding_window;
      EXPECT_TRUE(at::equal(sliding.k.narrow(2, slot, 1), ks.back())) << dtype << " step " << s;
      EXPECT_TRUE(at::equal(sliding.v.narrow(2, slot, 1), vs.back())) << dtype << " step " << s;
    }
  }
}

TEST(KVCache, SlidingMemoryIsBoundedByTheWindow) {
  ModelConfig c = config_for(Variant::kBase);
  CausalLM model = random_model(c, 3);
  KVCache cache(c);
  int64_t sliding_bytes_at_window = 0;
  for (int64_t step = 0; step < 60; ++step) {
    model.forward(at::randint(0, c.vocab_size, {1, 1}, at::kLong), DecodeOptions{&cache, AttentionImpl::kSdpa});
    if (step == c.sliding_window) sliding_bytes_at_window = cache.bytes(LayerType::kSliding);
  }
  EXPECT_EQ(cache.bytes(LayerType::kSliding), sliding_bytes_at_window);  // no growth after the window
  // 7 layers [S, S, S, F, S, S, S]: 6 sliding layers x (k + v) x G=2 x window x h=16 x 4 bytes.
  EXPECT_EQ(cache.bytes(LayerType::kSliding), 6 * 2 * 2 * c.sliding_window * 16 * 4);
  // The full layer grows with the length, doubling its buffer: 16, 32, then 64 positions for 60.
  EXPECT_EQ(cache.cached_positions(3), 60);
  EXPECT_EQ(cache.bytes(LayerType::kFull), 1 * 2 * 2 * 64 * 16 * 4);
}

TEST(KVCache, FullLayerGrowthStopsAtTheModelsMaximum) {
  ModelConfig c = config_for(Variant::kBase);
  c.max_position_embeddings = 40;
  CausalLM model = random_model(c, 5);
  KVCache cache(c);
  for (int64_t step = 0; step < 40; ++step)
    model.forward(at::randint(0, c.vocab_size, {1, 1}, at::kLong), DecodeOptions{&cache, AttentionImpl::kSdpa});
  EXPECT_EQ(cache.cached_positions(3), 40);
  EXPECT_EQ(cache.bytes(LayerType::kFull), 1 * 2 * 2 * 40 * 16 * 4);  // 16, 32, then 40 rather than 64
}

// Continuous batching: sequences prefilled alone join a running batch (append_rows) and leave it
// (keep_rows) between decode steps; every row's logits at every step equal that sequence decoded alone
// (fp32, within tolerance::forward_bound), for sliding (window 8, rings wrapped and not) and full layers, both
// variants.
TEST_P(IncrementalDecoding, JoiningAndLeavingABatchEqualsEachSequenceAlone) {
  const ModelConfig c = config_for(GetParam());
  CausalLM model = random_model(c, 6);
  // Prompt lengths: shorter than the window, past it, and far past it (its ring wraps during prefill).
  const std::vector<int64_t> lengths = {3, 11, 25, 6};
  const int64_t steps = 16;
  std::vector<at::Tensor> prompts, feeds;  // feeds: the token each sequence is given at each decode step
  for (int64_t n : lengths) {
    prompts.push_back(at::randint(0, c.vocab_size, {1, n}, at::kLong));
    feeds.push_back(at::randint(0, c.vocab_size, {steps}, at::kLong));
  }
  // Alone: each sequence's decode-step logits with its own unpadded cache.
  std::vector<std::vector<at::Tensor>> alone(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) {
    KVCache cache(c);
    model.forward(prompts[s], DecodeOptions{&cache, AttentionImpl::kSdpa});
    for (int64_t t = 0; t < steps; ++t)
      alone[s].push_back(model.forward(feeds[s][t].view({1, 1}), DecodeOptions{&cache, AttentionImpl::kSdpa})[0][0]);
  }
  // Batched: when each sequence joins (the decode step) and leaves (the step after its last).
  const std::vector<int64_t> joins = {0, 0, 3, 5}, leaves = {9, 16, 12, 16};
  KVCache batch(c);
  std::vector<int64_t> rows;       // sequence of each batch row
  std::vector<int64_t> fed(4, 0);  // decode steps each sequence has had
  double worst = 0;
  const double bound = tolerance::forward_bound(model, 25 + steps);
  for (int64_t t = 0; t < 16; ++t) {
    // Leave first (the longest sequence leaves at 12: the slots only it needed are dropped), then join.
    std::vector<int64_t> keep, kept_seq;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (leaves[rows[r]] > t) {
        keep.push_back(static_cast<int64_t>(r));
        kept_seq.push_back(rows[r]);
      }
    }
    if (keep.size() != rows.size()) {
      batch.keep_rows(keep);
      rows = kept_seq;
    }
    for (size_t s = 0; s < lengths.size(); ++s) {
      if (joins[s] != t) continue;
      KVCache joining(c);
      model.forward(prompts[s], DecodeOptions{&joining, AttentionImpl::kSdpa});
      batch.append_rows(joining);
      rows.push_back(static_cast<int64_t>(s));
    }
    std::vector<at::Tensor> next;
    for (int64_t s : rows) next.push_back(feeds[s][fed[s]]);
    at::Tensor logits = model.forward(at::stack(next).view({-1, 1}), DecodeOptions{&batch, AttentionImpl::kSdpa});
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t s = rows[r];
      const double diff = (logits[r][0] - alone[s][fed[s]]).abs().max().item<double>();
      worst = std::max(worst, diff);
      EXPECT_TRUE(tolerance::within(logits[r][0], alone[s][fed[s]], bound))
          << "sequence " << s << " at its decode step " << fed[s] << " (batch step " << t << ")";
      ++fed[s];
    }
  }
  EXPECT_EQ(fed, (std::vector<int64_t>{9, 16, 9, 11}));    // every sequence decoded while others came and went
  EXPECT_GT(alone[2][0].abs().max().item<double>(), 1.0);  // logits of a real scale
  // The batch ends with sequences 1 and 3 only: its length is the longer one's, 11 + 16.
  EXPECT_EQ(batch.length(), 11 + 16);
  std::printf("worst difference batched vs alone: %.3g (bound %.3g)\n", worst, bound);
}

// Several sequences joining in one call (the scheduler's admissions of one turn), into a running batch and into an
// empty one: every row's logits at every later step equal that sequence decoded alone (fp32, forward bound).
TEST_P(IncrementalDecoding, SeveralJoiningAtOnceEqualEachAlone) {
  const ModelConfig c = config_for(GetParam());
  CausalLM model = random_model(c, 7);
  const std::vector<int64_t> lengths = {5, 12, 3, 26};  // shorter than the window of 8, past it, far past it
  const int64_t steps = 6;
  std::vector<at::Tensor> prompts, feeds;
  for (int64_t n : lengths) {
    prompts.push_back(at::randint(0, c.vocab_size, {1, n}, at::kLong));
    feeds.push_back(at::randint(0, c.vocab_size, {steps + 2}, at::kLong));
  }
  std::vector<std::vector<at::Tensor>> alone(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) {
    KVCache cache(c);
    model.forward(prompts[s], DecodeOptions{&cache, AttentionImpl::kSdpa});
    for (int64_t t = 0; t < steps + 2; ++t)
      alone[s].push_back(model.forward(feeds[s][t].view({1, 1}), DecodeOptions{&cache, AttentionImpl::kSdpa})[0][0]);
  }
  const double bound = tolerance::forward_bound(model, 26 + steps + 2);
  auto prefilled = [&](size_t s) {
    auto cache = std::make_unique<KVCache>(c);
    model.forward(prompts[s], DecodeOptions{cache.get(), AttentionImpl::kSdpa});
    return cache;
  };
  for (bool running_first : {true, false}) {
    // Sequence 0 runs two steps alone first (or not at all); then the others join in one call.
    KVCache batch(c);
    std::vector<int64_t> fed(lengths.size(), 0), rows;
    if (running_first) {
      model.forward(prompts[0], DecodeOptions{&batch, AttentionImpl::kSdpa});
      for (int64_t t = 0; t < 2; ++t)
        model.forward(feeds[0][fed[0]++].view({1, 1}), DecodeOptions{&batch, AttentionImpl::kSdpa});
      rows.push_back(0);
    }
    std::vector<std::unique_ptr<KVCache>> joining;
    std::vector<const KVCache*> caches;
    for (size_t s = running_first ? 1 : 0; s < lengths.size(); ++s) {
      joining.push_back(prefilled(s));
      caches.push_back(joining.back().get());
      rows.push_back(static_cast<int64_t>(s));
    }
    batch.append_rows(caches);
    EXPECT_EQ(batch.batch_size(), 4);
    for (int64_t t = 0; t < steps; ++t) {
      std::vector<at::Tensor> next;
      for (int64_t s : rows) next.push_back(feeds[s][fed[s]]);
      const at::Tensor logits =
          model.forward(at::stack(next).view({-1, 1}), DecodeOptions{&batch, AttentionImpl::kSdpa});
      for (size_t r = 0; r < rows.size(); ++r) {
        const int64_t s = rows[r];
        EXPECT_TRUE(tolerance::within(logits[r][0], alone[s][fed[s]], bound))
            << "sequence " << s << " step " << fed[s] << (running_first ? " (joined a running batch)" : "");
        ++fed[s];
      }
    }
  }
}

TEST(KVCache, KeepRowsChecksTheRows) {
  const ModelConfig c = config_for(Variant::kBase);
  KVCache cache(c, {0, 1});
  EXPECT_THROW(cache.keep_rows({2}), Error);
  cache.keep_rows({});
  EXPECT_EQ(cache.batch_size(), 0);
  EXPECT_EQ(cache.length(), 0);
}
