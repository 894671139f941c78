// How CausalLM::forward runs, one type per mode, each holding only the fields its mode uses:
//   DecodeOptions    the input continues a KV cache (generate, serve, scoring over shared prefixes)
//   SequenceOptions  whole sequences without a cache: training and validation (activation checkpointing, document
//                    masking, sparse embedding gradients, the FSDP and context-parallel hooks), scoring, perplexity
//   AnalysisOptions  whole sequences with the analyses' probes (archspace analyze and trace): a pruned layer,
//                    Depth-Attention's mixing weights, named activations
// ForwardMode is one of them, checked when it is built: forward itself checks no combination of options. A
// combination no mode has (context parallelism with a KV cache, a pruned layer in training, ...) is refused there,
// with an error naming the fields, or cannot be written at all: each mode's type has only its own fields.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <variant>
#include <vector>

#include "archspace/kernels/dispatch.h"
#include "archspace/model/attention.h"

namespace archspace {

struct ActivationRecorder;  // model/trace.h
class ContextParallel;      // model/context_parallel.h
class KVCache;              // model/kv_cache.h
class ParameterSource;      // model/parameter_source.h

// Incremental decoding: the input continues the cached positions, and this call's keys and (mixed) values are
// added to the cache. New per-row state of the cache belongs in KVCache, not here: a decoding step reads its rows'
// positions and masks from the cache it is given.
struct DecodeOptions {
  KVCache* cache = nullptr;  // required
  AttentionImpl attention = AttentionImpl::kSdpa;
  // Only the last position's logits (prefill for generation: the head is the largest matmul).
  bool last_position_only = false;
  // The final normalised hidden states [B, T, d] instead of logits.
  bool final_hidden_only = false;
  // Receives every named intermediate of this call's positions (model/trace.h); null: nothing is recorded.
  ActivationRecorder* recorder = nullptr;
};

// Whole sequences from position first_position (no cache): training, validation, scoring, perplexity.
struct SequenceOptions {
  AttentionImpl attention = AttentionImpl::kSdpa;
  bool last_position_only = false;
  // The final normalised hidden states [B, T, d] instead of logits (the loss and scoring apply the head to the
  // positions they need, a chunk at a time: all logits of a long batch would not fit).
  bool final_hidden_only = false;
  // Autograd keeps each block's inputs only and backward recomputes the block (model/activation_checkpoint.h).
  // Applies only when grad mode is on.
  bool activation_checkpointing = false;
  // Intra-document masking (train.document_masking; model/documents.h): attention stays within the documents
  // that this EOS id ends in each row, as if each ran alone; positions still run across the row, as in
  // OLMo-core when OLMo 3 was trained. -1: off.
  int64_t document_eos_id = -1;
  // The position of the first input token (0: the start). A document of a packed instance runs alone at the
  // positions it had there (tests of document masking). >= 0.
  int64_t first_position = 0;
  // The embedding lookup's gradient as sparse rows (one per input token) that autograd adds into the table's
  // dense gradient, which the caller keeps allocated and zeroes row by row (train/embedding_gradient.h): no [V, d] zero
  // fill per backward. The caller must have set the dense gradient before backward.
  bool sparse_embedding_gradient = false;
  // Each unit's weights from this source instead of the model's own tensors (model/parameter_source.h: FSDP's
  // gathered shards, bf16 casts); it must outlive the backward of this forward. Null: the model's own.
  ParameterSource* parameters = nullptr;
  // Context parallelism: input_ids are one slice of each sequence, its positions and the other slices' keys and
  // values come from this hook (model/context_parallel.h). Not with first_position or document masking.
  ContextParallel* context_parallel = nullptr;
  // The block's linear layers (q/k/v/o, gate/up/down) through FP8 matmuls (train.fp8; kernels/fp8_linear.h): e4m3
  // operands with tensorwise dynamic scaling, bf16 results. The embedding and the LM head stay as they are.
  bool fp8 = false;
  // The block's norms, Q/K norm + RoPE and SwiGLU through the fused training kernels (train.fused_kernels;
  // kernels/fused_training.h) where they apply.
  bool fused_kernels = false;
};

// Whole sequences from position 0 with the analyses' probes; no gradients are kept for them.
struct AnalysisOptions {
  AttentionImpl attention = AttentionImpl::kSdpa;
  bool last_position_only = false;
  bool final_hidden_only = false;
  // Run without block `skip_layer` (-1: none; layer pruning): it leaves its streams as they are.
  int64_t skip_layer = -1;
  // Receives each layer's Depth-Attention mixing weights [B, G, T, sources + 1] (undefined for layers without
  // the mix).
  std::vector<at::Tensor>* depth_weights = nullptr;
  // Receives every named intermediate (model/trace.h lists the names).
  ActivationRecorder* recorder = nullptr;
};

// One forward's mode, checked at construction (archspace::Error naming the fields of a combination no mode has).
// Implicit from each mode's options type, so forward(ids, options) takes any of them.
class ForwardMode {
 public:
  ForwardMode() : mode_(SequenceOptions{}) {}
  ForwardMode(const DecodeOptions& options);    // NOLINT(google-explicit-constructor)
  ForwardMode(const SequenceOptions& options);  // NOLINT(google-explicit-constructor)
  ForwardMode(const AnalysisOptions& options);  // NOLINT(google-explicit-constructor)

  const DecodeOptions* decoding() const { return std::get_if<DecodeOptions>(&mode_); }
  const SequenceOptions* sequences() const { return std::get_if<SequenceOptions>(&mode_); }
  const AnalysisOptions* analysis() const { return std::get_if<AnalysisOptions>(&mode_); }

  // What every mode has (its default where a mode lacks the field).
  AttentionImpl attention() const;
  bool last_position_only() const;
  bool final_hidden_only() const;
  KVCache* cache() const;
  ActivationRecorder* recorder() const;
  ContextParallel* context_parallel() const;
  ParameterSource* parameters() const;
  bool fp8() const;  // SequenceOptions::fp8 (false in the other modes)
  // The run's kernel choices (kernels/dispatch.h): SequenceOptions::fused_kernels and fp8 (none in the other modes).
  KernelChoices kernels() const;

 private:
  std::variant<SequenceOptions, DecodeOptions, AnalysisOptions> mode_;
};

}  // namespace archspace
