// The fields each forward mode's options type has (model/forward_options.h), as concepts: a combination of options
// that no mode has cannot be written at all, and the tests state that with static_asserts over these.
#pragma once

namespace archspace::testing {

template <typename Options>
concept TakesCache = requires(Options o) {
  o.cache;
};
template <typename Options>
concept TakesContextParallel = requires(Options o) {
  o.context_parallel;
};
template <typename Options>
concept TakesDocumentMasking = requires(Options o) {
  o.document_eos_id;
  o.first_position;
};
template <typename Options>
concept TakesFp8 = requires(Options o) {
  o.fp8;
};
template <typename Options>
concept TakesTrainingFields = requires(Options o) {
  o.activation_checkpointing;
  o.sparse_embedding_gradient;
  o.parameters;
  o.fp8;
};
template <typename Options>
concept TakesProbes = requires(Options o) {
  o.skip_layer;
  o.depth_weights;
};

}  // namespace archspace::testing
