#include "archspace/model/forward_options.h"

#include <string>

#include "archspace/util/error.h"

namespace archspace {

namespace {

void check(bool ok, const std::string& message) {
  if (!ok) throw Error("forward: " + message);
}

void check_sequences(const SequenceOptions& o) {
  check(o.first_position >= 0, "first_position must be >= 0, got " + std::to_string(o.first_position));
  check(!o.context_parallel || (o.first_position == 0 && o.document_eos_id < 0),
        "context parallelism takes its positions from its slice and does not mask documents (context_parallel "
        "with first_position or document_eos_id)");
}

// Training's fields of `o` that are set (with `positions`: first_position, document masking and context
// parallelism besides), listed by name: what a decoding or analysis call was given that its mode does not have.
std::string training_fields_set(const ForwardOptions& o, bool positions) {
  std::string set;
  auto add = [&](bool is_set, const char* name) {
    if (is_set) set += std::string(set.empty() ? "" : ", ") + name;
  };
  add(o.activation_checkpointing, "activation_checkpointing");
  add(o.sparse_embedding_gradient, "sparse_embedding_gradient");
  add(o.parameters != nullptr, "parameters");
  add(o.fp8, "fp8");
  if (positions) {
    add(o.context_parallel != nullptr, "context_parallel");
    add(o.first_position != 0, "first_position");
    add(o.document_eos_id >= 0, "document_eos_id");
  }
  return set;
}

}  // namespace

ForwardMode::ForwardMode(const DecodeOptions& options) : mode_(options) {
  check(options.cache != nullptr, "DecodeOptions needs a KV cache (cache is null)");
}

ForwardMode::ForwardMode(const SequenceOptions& options) : mode_(options) { check_sequences(options); }

ForwardMode::ForwardMode(const AnalysisOptions& options) : mode_(options) {}

ForwardMode::ForwardMode(const ForwardOptions& o) {
  if (o.cache) {
    check(o.first_position == 0 && o.document_eos_id < 0,
          "first_position and document masking are for forwards without a KV cache");
    check(!o.context_parallel,
          "context parallelism is for training: it does not run with a KV cache (inference; context_parallel with "
          "cache)");
    check(o.skip_layer < 0 && !o.depth_weights,
          "skip_layer and depth_weights are for analyses without a KV cache (skip_layer " +
              std::to_string(o.skip_layer) + ")");
    const std::string training = training_fields_set(o, false);
    check(training.empty(), training + ": for training, not for decoding with a KV cache");
    mode_ = DecodeOptions{o.cache, o.attention, o.last_position_only, o.final_hidden_only, o.recorder};
    return;
  }
  if (o.skip_layer >= 0 || o.depth_weights || o.recorder) {
    const std::string training = training_fields_set(o, true);
    check(training.empty(),
          "the analyses' probes (skip_layer, depth_weights, recorder) run whole sequences from "
          "position 0 without training's options, given " +
              training);
    mode_ = AnalysisOptions{o.attention,  o.last_position_only, o.final_hidden_only,
                            o.skip_layer, o.depth_weights,      o.recorder};
    return;
  }
  SequenceOptions s;
  s.attention = o.attention;
  s.last_position_only = o.last_position_only;
  s.final_hidden_only = o.final_hidden_only;
  s.activation_checkpointing = o.activation_checkpointing;
  s.document_eos_id = o.document_eos_id;
  s.first_position = o.first_position;
  s.sparse_embedding_gradient = o.sparse_embedding_gradient;
  s.parameters = o.parameters;
  s.context_parallel = o.context_parallel;
  s.fp8 = o.fp8;
  check_sequences(s);
  mode_ = s;
}

AttentionImpl ForwardMode::attention() const {
  return std::visit([](const auto& o) { return o.attention; }, mode_);
}

bool ForwardMode::last_position_only() const {
  return std::visit([](const auto& o) { return o.last_position_only; }, mode_);
}

bool ForwardMode::final_hidden_only() const {
  return std::visit([](const auto& o) { return o.final_hidden_only; }, mode_);
}

KVCache* ForwardMode::cache() const { return decoding() ? decoding()->cache : nullptr; }

ActivationRecorder* ForwardMode::recorder() const {
  if (decoding()) return decoding()->recorder;
  return analysis() ? analysis()->recorder : nullptr;
}

ContextParallel* ForwardMode::context_parallel() const { return sequences() ? sequences()->context_parallel : nullptr; }

ParameterSource* ForwardMode::parameters() const { return sequences() ? sequences()->parameters : nullptr; }

bool ForwardMode::fp8() const { return sequences() && sequences()->fp8; }

}  // namespace archspace
