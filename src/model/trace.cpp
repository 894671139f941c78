#include "archspace/model/trace.h"

#include <c10/core/InferenceMode.h>

namespace archspace {

NamedTensors trace_activations(const CausalLM& model, const at::Tensor& input_ids, AttentionImpl attention) {
  c10::InferenceMode inference;
  ActivationRecorder recorder;
  AnalysisOptions options;
  options.attention = attention;
  options.recorder = &recorder;
  at::Tensor logits = model.forward(input_ids, options);
  NamedTensors out;
  for (auto& [name, t] : recorder.tensors) out.emplace_back(name, t.to(at::kCPU, at::kFloat).contiguous());
  out.emplace_back("logits", logits.to(at::kCPU, at::kFloat).contiguous());
  return out;
}

}  // namespace archspace
