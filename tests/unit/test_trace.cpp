// Named activations (model/trace.h): the names in forward order for each block kind and switch, their
// documented shapes, and that recording leaves the forward's result bit for bit as it is.
#include <gtest/gtest.h>

#include "archspace/kernels/linear.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/trace.h"
#include "tolerance.h"

using namespace archspace;

namespace {

ModelConfig three_layers(Variant variant, bool siamese = true, bool depth = true) {
  ModelConfig c = preset("tiny", variant);  // d 64, H 4, G 2, D 16, vocab 512
  c.num_hidden_layers = 3;
  c.layer_types = default_layer_types(3);
  c.depth_attention_stride = 1;
  c.use_siamese_norm = siamese;
  c.use_depth_attention = depth;
  return c;
}

std::vector<std::string> expected_names(int64_t layers, bool siamese, bool depth) {
  std::vector<std::string> names = {"model.embeddings"};
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<std::string> per_layer = {"attn_input", "q", "k", "v"};
    if (depth) per_layer.push_back("v_mixed");
    for (const char* n : {"attn_output", "mlp_output"}) per_layer.push_back(n);
    if (siamese) {
      per_layer.push_back("X");
      per_layer.push_back("Y");
    } else {
      per_layer.push_back("hidden");
    }
    for (const auto& n : per_layer) names.push_back(layer_prefix(l) + n);
  }
  names.push_back("model.final_hidden");
  return names;
}

std::vector<std::string> names_of(const NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n);
  return names;
}

const at::Tensor& find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw std::runtime_error("no activation " + name);
}

}  // namespace

TEST(Trace, NamesInForwardOrderForEveryBlockKindAndSwitch) {
  struct Case {
    Variant variant;
    bool siamese, depth;
  };
  for (Case k : {Case{Variant::kBase, false, false}, Case{Variant::kSiameseDepth, true, true},
                 Case{Variant::kSiameseDepth, true, false}, Case{Variant::kSiameseDepth, false, true},
                 Case{Variant::kSiameseDepth, false, false}}) {
    const ModelConfig c = three_layers(k.variant, k.siamese, k.depth);
    const CausalLM m = CausalLM::random_init(c, 1);
    ActivationRecorder recorder;
    AnalysisOptions options;
    options.recorder = &recorder;
    m.forward(at::randint(0, 512, {2, 7}, at::kLong), options);
    const bool variant = k.variant == Variant::kSiameseDepth;
    EXPECT_EQ(names_of(recorder.tensors), expected_names(3, variant && k.siamese, variant && k.depth))
        << "siamese=" << k.siamese << " depth=" << k.depth;
  }
}

TEST(Trace, ShapesAreTheDocumentedLayouts) {
  const ModelConfig c = three_layers(Variant::kSiameseDepth);
  const CausalLM m = CausalLM::random_init(c, 2);
  const int64_t B = 2, T = 7, H = c.num_attention_heads, G = c.num_key_value_heads, D = c.head_dim, d = c.hidden_size;
  ASSERT_NE(H, G);  // so that [B, H, T, D] and [B, G, T, D] are told apart
  const NamedTensors trace = trace_activations(m, at::randint(0, 512, {B, T}, at::kLong));
  using S = std::vector<int64_t>;
  EXPECT_EQ(find(trace, "model.layers.1.q").sizes().vec(), (S{B, H, T, D}));
  for (const char* n : {"k", "v", "v_mixed"})
    EXPECT_EQ(find(trace, layer_prefix(1) + n).sizes().vec(), (S{B, G, T, D})) << n;
  for (const char* n : {"attn_input", "attn_output", "mlp_output", "X", "Y"})
    EXPECT_EQ(find(trace, layer_prefix(2) + n).sizes().vec(), (S{B, T, d})) << n;
  EXPECT_EQ(trace.back().first, "logits");
  EXPECT_EQ(trace.back().second.sizes().vec(), (S{B, T, c.vocab_size}));
  for (const auto& [n, t] : trace) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << n;
    EXPECT_TRUE(t.is_contiguous()) << n;
  }
}

TEST(Trace, RecordingLeavesTheLogitsBitForBit) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    const CausalLM m = CausalLM::random_init(three_layers(v), 3);
    const at::Tensor ids = at::randint(0, 512, {2, 9}, at::kLong);
    for (AttentionImpl impl : {AttentionImpl::kSdpa, AttentionImpl::kReference}) {
      SequenceOptions plain;
      plain.attention = impl;
      const at::Tensor without = m.forward(ids, plain);
      ActivationRecorder recorder;
      AnalysisOptions recording;
      recording.attention = impl;
      recording.recorder = &recorder;
      EXPECT_TRUE(at::equal(m.forward(ids, recording), without));
      EXPECT_FALSE(recorder.tensors.empty());
      // trace_activations' logits are the same forward, converted to fp32 (already fp32 here).
      EXPECT_TRUE(at::equal(trace_activations(m, ids, impl).back().second, without));
    }
  }
}

TEST(Trace, ActivationsAreWhatTheirNamesSay) {
  // Identities between the names that hold only if each is recorded at the documented point.
  const CausalLM m = CausalLM::random_init(three_layers(Variant::kBase), 4);
  const NamedTensors t = trace_activations(m, at::randint(0, 512, {1, 8}, at::kLong), AttentionImpl::kReference);
  EXPECT_TRUE(at::equal(find(t, "model.embeddings"), find(t, "model.layers.0.attn_input")));
  EXPECT_TRUE(at::equal(find(t, "model.layers.0.hidden"), find(t, "model.layers.1.attn_input")));
  // logits = lm_head(final_hidden) bit for bit (the engine's own linear, as the forward calls it): the
  // recorded head input is the one the head read.
  EXPECT_TRUE(
      at::equal(archspace::linear(find(t, "model.final_hidden"), m.parameter("lm_head.weight")), find(t, "logits")));
  // v = v_proj(attn_input), split into kv heads.
  const at::Tensor v =
      at::linear(find(t, "model.layers.2.attn_input"), m.parameter("model.layers.2.self_attn.v_proj.weight"));
  // The engine's projection and at::linear here: two fp32 orders of the same dot products.
  const at::Tensor bound = 2 * tolerance::linear_bound(find(t, "model.layers.2.attn_input"),
                                                       m.parameter("model.layers.2.self_attn.v_proj.weight"));
  EXPECT_TRUE(tolerance::within(find(t, "model.layers.2.v"), v.view({1, 8, -1, 16}).transpose(1, 2),
                                bound.view({1, 8, -1, 16}).transpose(1, 2)));
}

TEST(Trace, WithKvCacheRecordsThisCallsPositions) {
  const ModelConfig c = three_layers(Variant::kSiameseDepth);
  const CausalLM m = CausalLM::random_init(c, 5);
  KVCache cache(c);
  DecodeOptions options;
  options.cache = &cache;
  m.forward(at::randint(0, 512, {1, 5}, at::kLong), options);
  ActivationRecorder recorder;
  options.recorder = &recorder;
  m.forward(at::randint(0, 512, {1, 1}, at::kLong), options);
  EXPECT_EQ(find(recorder.tensors, "model.layers.2.k").size(2), 1);
  EXPECT_EQ(names_of(recorder.tensors), expected_names(3, true, true));
}
