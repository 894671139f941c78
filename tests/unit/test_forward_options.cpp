// model/forward_options.h: a forward's mode is checked when it is built, not inside CausalLM::forward. A
// combination no mode has cannot be written (each mode's options type has only its fields), and what one mode's
// fields cannot say alone is refused at construction with an error naming them.
#include <gtest/gtest.h>

#include "archspace/config/model_config.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/forward_options.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/trace.h"
#include "forward_option_fields.h"
#include "test_support.h"

namespace archspace {
namespace {

// A context-parallel hook that is never asked for keys: the refusals happen before any forward runs.
class NoSlices final : public ContextParallel {
 public:
  int64_t slice_start() const override { return 0; }
  Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t) override { return {k, v, 0}; }
};

// Each mode's options type has only its own fields, so a combination no mode has cannot be written: decoding has no
// training or analysis fields, the analyses none of training's, whole sequences no cache and no probes.
using testing::TakesCache;
using testing::TakesContextParallel;
using testing::TakesDocumentMasking;
using testing::TakesProbes;
using testing::TakesTrainingFields;
template <typename Options>
concept TakesPositions = TakesDocumentMasking<Options> && TakesContextParallel<Options>;

static_assert(TakesCache<DecodeOptions> && !TakesTrainingFields<DecodeOptions> && !TakesPositions<DecodeOptions> &&
              !TakesProbes<DecodeOptions>);
static_assert(!TakesCache<SequenceOptions> && TakesTrainingFields<SequenceOptions> && TakesPositions<SequenceOptions> &&
              !TakesProbes<SequenceOptions>);
static_assert(!TakesCache<AnalysisOptions> && !TakesTrainingFields<AnalysisOptions> &&
              !TakesPositions<AnalysisOptions> && TakesProbes<AnalysisOptions>);

// What the fields of one mode cannot say alone is checked when the mode is built.
TEST(ForwardModes, IllegalCombinationsAreRefusedAtConstruction) {
  NoSlices cp;
  SequenceOptions cp_at_a_position;
  cp_at_a_position.context_parallel = &cp;
  cp_at_a_position.first_position = 4;
  testing::expect_error([&] { (void)ForwardMode(cp_at_a_position); }, {"context_parallel", "first_position"});

  SequenceOptions cp_with_documents;
  cp_with_documents.context_parallel = &cp;
  cp_with_documents.document_eos_id = 2;
  testing::expect_error([&] { (void)ForwardMode(cp_with_documents); }, {"context_parallel", "document_eos_id"});

  SequenceOptions negative;
  negative.first_position = -1;
  testing::expect_error([&] { (void)ForwardMode(negative); }, {"first_position", ">= 0"});

  testing::expect_error([&] { (void)ForwardMode(DecodeOptions{}); }, {"DecodeOptions", "cache"});
}

TEST(ForwardModes, EachOptionsTypeSelectsItsMode) {
  KVCache cache(preset("tiny"));
  ActivationRecorder recorder;
  DecodeOptions decode;
  decode.cache = &cache;
  decode.recorder = &recorder;  // a recorder records a decoding call's positions
  decode.last_position_only = true;
  const ForwardMode decoding(decode);
  ASSERT_NE(decoding.decoding(), nullptr);
  EXPECT_EQ(decoding.cache(), &cache);
  EXPECT_EQ(decoding.recorder(), &recorder);
  EXPECT_TRUE(decoding.last_position_only());

  AnalysisOptions probe;
  probe.recorder = &recorder;
  probe.attention = AttentionImpl::kReference;
  const ForwardMode analysis(probe);
  ASSERT_NE(analysis.analysis(), nullptr);
  EXPECT_EQ(analysis.attention(), AttentionImpl::kReference);
  EXPECT_EQ(analysis.cache(), nullptr);
  EXPECT_EQ(analysis.recorder(), &recorder);

  SequenceOptions training;
  training.activation_checkpointing = true;
  training.final_hidden_only = true;
  const ForwardMode sequences(training);
  ASSERT_NE(sequences.sequences(), nullptr);
  EXPECT_TRUE(sequences.sequences()->activation_checkpointing);
  EXPECT_TRUE(sequences.final_hidden_only());
  EXPECT_EQ(sequences.recorder(), nullptr);
  EXPECT_NE(ForwardMode().sequences(), nullptr);  // the default: whole sequences, logits
}

}  // namespace
}  // namespace archspace
