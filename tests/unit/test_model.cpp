// Whole-model invariants: init statistics, causality, batch = rows, save/load, bf16 and attention paths.
#include <gtest/gtest.h>

#include <filesystem>

#include "archspace/model/causal_lm.h"
#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "tolerance.h"

using namespace archspace;
namespace fs = std::filesystem;

TEST(Init, TruncatedNormalAndOnes) {
  ModelConfig c = preset("tiny");
  CausalLM m = CausalLM::random_init(c, 7);
  at::Tensor w = m.parameter("model.layers.0.mlp.gate_proj.weight");
  EXPECT_LE(w.abs().max().item<float>(), 3 * 0.02 + 1e-7);
  EXPECT_NEAR(w.std().item<float>(), 0.02 * 0.9866, 0.0015);  // std of N(0,1) truncated at +-3 sigma is 0.9866
  EXPECT_NEAR(w.mean().item<float>(), 0.0, 0.001);
  EXPECT_TRUE(at::equal(m.parameter("model.norm.weight"), at::ones({c.hidden_size})));
  // Deterministic in the seed.
  EXPECT_TRUE(at::equal(w, CausalLM::random_init(c, 7).parameter("model.layers.0.mlp.gate_proj.weight")));
  EXPECT_FALSE(at::equal(w, CausalLM::random_init(c, 8).parameter("model.layers.0.mlp.gate_proj.weight")));
}

TEST(Forward, IsCausal) {
  CausalLM m = CausalLM::random_init(preset("tiny"), 1);
  at::Tensor ids = at::randint(0, 512, {1, 24}, at::kLong);
  at::Tensor changed = ids.clone();
  changed[0][15] = (ids[0][15].item<int64_t>() + 1) % 512;
  at::Tensor a = m.forward(ids), b = m.forward(changed);
  EXPECT_TRUE(at::equal(a.narrow(1, 0, 15), b.narrow(1, 0, 15)));
  EXPECT_GT((a.narrow(1, 15, 9) - b.narrow(1, 15, 9)).abs().max().item<float>(), 1e-4);
}

TEST(Forward, BatchEqualsRows) {
  CausalLM m = CausalLM::random_init(preset("tiny"), 2);
  at::Tensor ids = at::randint(0, 512, {3, 20}, at::kLong);
  at::Tensor batch = m.forward(ids);
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(tolerance::within(batch[b], m.forward(ids.narrow(0, b, 1))[0], tolerance::forward_bound(m, 20)));
  }
}

TEST(Forward, SdpaEqualsReferencePath) {
  ModelConfig c = preset("tiny");
  c.rope_scaling = YarnScaling{8.0, 16, 32.0, 1.0, std::nullopt};
  CausalLM m = CausalLM::random_init(c, 3);
  at::Tensor ids = at::randint(0, 512, {2, 40}, at::kLong);
  at::Tensor fast = m.forward(ids, SequenceOptions{AttentionImpl::kSdpa}),
             ref = m.forward(ids, SequenceOptions{AttentionImpl::kReference});
  EXPECT_TRUE(tolerance::within(fast, ref, tolerance::forward_bound(m, 40)));
}

TEST(Forward, Bf16TracksFp32) {
  // bf16 keeps 8 mantissa bits: per-op relative error ~4e-3; through 4 layers the logits of this tiny
  // model (|logit| ~ 1) stay within a few hundredths of fp32.
  ModelConfig c = preset("tiny");
  CausalLM m32 = CausalLM::random_init(c, 4);
  NamedTensors bf;
  for (const auto& [n, t] : m32.parameters()) bf.emplace_back(n, t.to(at::kBFloat16));
  CausalLM m16(c, bf);
  at::Tensor ids = at::randint(0, 512, {1, 32}, at::kLong);
  at::Tensor a = m32.forward(ids), b = m16.forward(ids).to(at::kFloat);
  EXPECT_EQ(m16.forward(ids).scalar_type(), at::kBFloat16);
  EXPECT_LT((a - b).abs().max().item<float>(), 0.05);
}

TEST(ModelIo, SaveLoadRoundTripSingleAndSharded) {
  ModelConfig c = preset("tiny");
  CausalLM m = CausalLM::random_init(c, 5);
  at::Tensor ids = at::randint(0, 512, {1, 16}, at::kLong);
  for (uint64_t shard : {uint64_t(5) << 30, uint64_t(200000)}) {
    fs::path dir =
        fs::temp_directory_path() / ("archspace_modelio_" + std::to_string(shard) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    save_model(m, dir.string(), at::kFloat, shard);
    CausalLM back = load_model(dir.string());
    EXPECT_TRUE(at::equal(m.forward(ids), back.forward(ids)));
    EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), shard < 1000000);
  }
}

TEST(ModelIo, MissingConfigAndMissingWeights) {
  fs::path dir = fs::temp_directory_path() / ("archspace_empty_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_THROW(load_model(dir.string()), Error);
  preset("tiny").save((dir / "config.json").string());
  try {
    load_model(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model weights"), std::string::npos) << e.what();
  }
}
