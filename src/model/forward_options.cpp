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

}  // namespace

ForwardMode::ForwardMode(const DecodeOptions& options) : mode_(options) {
  check(options.cache != nullptr, "DecodeOptions needs a KV cache (cache is null)");
}

ForwardMode::ForwardMode(const SequenceOptions& options) : mode_(options) { check_sequences(options); }

ForwardMode::ForwardMode(const AnalysisOptions& options) : mode_(options) {}

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

KernelChoices ForwardMode::kernels() const {
  if (!sequences()) return {};
  return {sequences()->fused_kernels, sequences()->fp8};
}

}  // namespace archspace
