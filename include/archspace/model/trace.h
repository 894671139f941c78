// Named activations: every intermediate of a forward under a stable name, to find where two
// implementations (the engine and transformers, two commits, fp32 and bf16) first part.
//
// Names, in forward order (l = layer index; B batch, T time, d hidden, H query heads, G kv heads,
// D head_dim, V vocab). The same names come from the archs/ remote code (capture_activations) and, for
// transformers' Olmo3, from tests/python/trace_reference.py.
//
//   model.embeddings                 [B, T, d]     embedding lookup
//   per layer, prefix model.layers.{l}.
//     attn_input                     [B, T, d]     attention's input (reordered: the residual stream;
//                                                  SiameseNorm: RMS(Y) + scale * X; pre: RMS(x); ...)
//     q                              [B, H, T, D]  queries after q_norm and RoPE
//     k                              [B, G, T, D]  keys after k_norm and RoPE
//     v                              [B, G, T, D]  values (v_proj; then v_norm under the hybrid topology)
//     v_mixed                        [B, G, T, D]  Depth-Attention's mixed values (only with Depth-Attention)
//     attn_output                    [B, T, d]     attention output after o_proj (before any norm)
//     mlp_output                     [B, T, d]     MLP output after down_proj (before any norm)
//     hidden                         [B, T, d]     one-stream topologies: the residual stream after the block
//     dual                           [B, T, d]     residual (ResiDual): the unnormalised dual stream after the block
//     X, Y                           [B, T, d]     SiameseNorm topologies: the two streams after the block
//   model.final_hidden               [B, T, d]     after the final norm: the LM head's input
//   logits                           [B, T, V]     (trace_activations only)
//
// With a KV cache, q/k/v are this call's positions only (before they join the cache).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "archspace/model/causal_lm.h"
#include "archspace/util/tensors.h"

namespace archspace {

// Set the recorder of AnalysisOptions (or DecodeOptions) to collect the activations above. Tensors are kept as the
// forward made them (model dtype and device, autograd history if any); without a recorder the forward records nothing.
struct ActivationRecorder {
  NamedTensors tensors;  // forward order
  void record(std::string name, const at::Tensor& t) { tensors.emplace_back(std::move(name), t); }
};

// One forward of input_ids [B, T] without autograd: every named activation in forward order, then
// "logits", each as a contiguous fp32 CPU tensor (batch dimension kept), ready for save_safetensors.
NamedTensors trace_activations(const CausalLM& model, const at::Tensor& input_ids,
                               AttentionImpl attention = AttentionImpl::kSdpa);

}  // namespace archspace
