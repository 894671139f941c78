// 65,536-token validation: a small model with the real window (4096) and OLMo 3's YaRN (s=8, L0=8192)
// prefills 65,530 tokens in chunks and decodes the last 6 one at a time; the logits agree with one full
// forward over all 65,536 tokens beyond 8,192 and near the end, and the sliding layers' cache stays at
// window positions. (Slow: about a minute on 2 cores.)
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "tolerance.h"

using namespace archspace;

TEST(LongContext, Prefill65536InChunksAndDecodeMatchTheFullForward) {
  c10::InferenceMode inference;
  ModelConfig c = preset("tiny");  // 4 layers [S, S, S, F], d=64, 4 query / 2 kv heads, h=16
  c.vocab_size = c.padded_vocab_size = 256;
  c.sliding_window = 4096;
  c.max_position_embeddings = 65536;
  c.rope_scaling = YarnScaling{8.0, 8192, 32.0, 1.0, std::nullopt};
  CausalLM init = CausalLM::random_init(c, 11);
  at::manual_seed(11);
  NamedTensors p;
  for (const auto& [n, t] : init.parameters()) p.emplace_back(n, t.dim() == 1 ? t + 0.2 * at::randn_like(t) : t * 4);
  CausalLM model(c, p);

  const int64_t T = 65536, chunk = 8192, decoded = 6;
  at::Tensor ids = at::randint(0, c.vocab_size, {1, T}, at::kLong);
  at::Tensor full = model.forward(ids)[0];  // [T, V]

  KVCache cache(c);
  std::vector<at::Tensor> pieces;
  for (int64_t s = 0; s < T - decoded; s += chunk) {
    const int64_t n = std::min(chunk, T - decoded - s);
    pieces.push_back(model.forward(ids.narrow(1, s, n), DecodeOptions{&cache, AttentionImpl::kSdpa})[0]);
  }
  for (int64_t s = T - decoded; s < T; ++s)
    pieces.push_back(model.forward(ids.narrow(1, s, 1), DecodeOptions{&cache, AttentionImpl::kSdpa})[0]);
  at::Tensor incremental = at::cat(pieces, 0);
  ASSERT_EQ(incremental.size(0), T);

  // Two fp32 computations in other summation orders (chunks, the cache, the decode path): forward_bound at
  // each position's own length (its full layer sums over pos + 1 keys).
  for (int64_t pos : {int64_t(8191), int64_t(8192), int64_t(8200), int64_t(20000), int64_t(40000), T - 100,
                      T - decoded - 1, T - 3, T - 1}) {
    EXPECT_TRUE(tolerance::within(incremental[pos], full[pos], tolerance::forward_bound(model, pos + 1)))
        << "position " << pos;
  }
  EXPECT_TRUE(tolerance::within(incremental.narrow(0, 8192, T - 8192), full.narrow(0, 8192, T - 8192),
                                tolerance::forward_bound(model, T)));
  // Sliding layers: a ring of window positions whatever the length; the full layer holds all 65,536.
  EXPECT_EQ(cache.cached_positions(0), 4096);
  EXPECT_EQ(cache.cached_positions(3), T);
  EXPECT_EQ(cache.bytes(LayerType::kSliding), 3 * 2 * 2 * 4096 * 16 * 4);
}
