// model/forward_options.h: a forward's mode is checked when it is built, not inside CausalLM::forward. A
// combination no mode has is refused at construction with an error naming its fields; the typed options of each
// mode and the flat ForwardOptions that selects the same mode run the same forward.
#include <gtest/gtest.h>

#include "archspace/config/model_config.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/forward_options.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/trace.h"
#include "test_support.h"

namespace archspace {
namespace {

// A context-parallel hook that is never asked for keys: the refusals happen before any forward runs.
class NoSlices final : public ContextParallel {
 public:
  int64_t slice_start() const override { return 0; }
  Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t) override { return {k, v, 0}; }
};

TEST(ForwardModes, IllegalCombinationsAreRefusedAtConstruction) {
  KVCache cache(preset("tiny"));
  NoSlices cp;
  ActivationRecorder recorder;
  std::vector<at::Tensor> depth_weights;
  ForwardOptions decode_with_cp;
  decode_with_cp.cache = &cache;
  decode_with_cp.context_parallel = &cp;
  testing::expect_error([&] { (void)ForwardMode(decode_with_cp); }, {"context_parallel", "cache"});

  ForwardOptions decode_with_checkpointing;
  decode_with_checkpointing.cache = &cache;
  decode_with_checkpointing.activation_checkpointing = true;
  testing::expect_error([&] { (void)ForwardMode(decode_with_checkpointing); },
                        {"activation_checkpointing", "KV cache"});

  ForwardOptions decode_pruned;
  decode_pruned.cache = &cache;
  decode_pruned.skip_layer = 1;
  testing::expect_error([&] { (void)ForwardMode(decode_pruned); }, {"skip_layer", "KV cache"});

  ForwardOptions probe_in_training;
  probe_in_training.recorder = &recorder;
  probe_in_training.sparse_embedding_gradient = true;
  testing::expect_error([&] { (void)ForwardMode(probe_in_training); }, {"recorder", "sparse_embedding_gradient"});

  ForwardOptions pruned_with_documents;
  pruned_with_documents.depth_weights = &depth_weights;
  pruned_with_documents.document_eos_id = 2;
  testing::expect_error([&] { (void)ForwardMode(pruned_with_documents); }, {"depth_weights", "document_eos_id"});

  SequenceOptions cp_at_a_position;
  cp_at_a_position.context_parallel = &cp;
  cp_at_a_position.first_position = 4;
  testing::expect_error([&] { (void)ForwardMode(cp_at_a_position); }, {"context_parallel", "first_position"});

  SequenceOptions negative;
  negative.first_position = -1;
  testing::expect_error([&] { (void)ForwardMode(negative); }, {"first_position", ">= 0"});

  testing::expect_error([&] { (void)ForwardMode(DecodeOptions{}); }, {"DecodeOptions", "cache"});
}

TEST(ForwardModes, FlatOptionsSelectTheirMode) {
  KVCache cache(preset("tiny"));
  ActivationRecorder recorder;
  ForwardOptions decode;
  decode.cache = &cache;
  decode.recorder = &recorder;  // a recorder records a decoding call's positions
  decode.last_position_only = true;
  const ForwardMode decoding(decode);
  ASSERT_NE(decoding.decoding(), nullptr);
  EXPECT_EQ(decoding.cache(), &cache);
  EXPECT_EQ(decoding.recorder(), &recorder);
  EXPECT_TRUE(decoding.last_position_only());

  ForwardOptions probe;
  probe.recorder = &recorder;
  probe.attention = AttentionImpl::kReference;
  const ForwardMode analysis(probe);
  ASSERT_NE(analysis.analysis(), nullptr);
  EXPECT_EQ(analysis.attention(), AttentionImpl::kReference);
  EXPECT_EQ(analysis.cache(), nullptr);

  ForwardOptions training;
  training.activation_checkpointing = true;
  training.final_hidden_only = true;
  const ForwardMode sequences(training);
  ASSERT_NE(sequences.sequences(), nullptr);
  EXPECT_TRUE(sequences.sequences()->activation_checkpointing);
  EXPECT_TRUE(sequences.final_hidden_only());
  EXPECT_NE(ForwardMode().sequences(), nullptr);  // the default: whole sequences, logits
}

// The typed decoding options and the flat form of the same call: the same logits, prefill and step.
TEST(ForwardModes, TypedAndFlatOptionsRunTheSameForward) {
  const CausalLM model = CausalLM::random_init(preset("tiny"), 3);
  const at::Tensor prompt = at::randint(0, 512, {2, 6}, at::kLong), next = at::randint(0, 512, {2, 1}, at::kLong);
  KVCache typed_cache(model.config()), flat_cache(model.config());
  const DecodeOptions typed{&typed_cache, AttentionImpl::kSdpa, /*last_position_only=*/true};
  ForwardOptions flat;
  flat.cache = &flat_cache;
  flat.last_position_only = true;
  EXPECT_TRUE(at::equal(model.forward(prompt, typed), model.forward(prompt, flat)));
  EXPECT_TRUE(at::equal(model.forward(next, typed), model.forward(next, flat)));
  EXPECT_EQ(typed_cache.length(), 7);
}

}  // namespace
}  // namespace archspace
