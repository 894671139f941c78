// Memory plan of one training rank: what `archspace plan` prints. Pure arithmetic from a ModelConfig and
// the run's shape; nothing is allocated. Every figure is in bytes, per rank.
//
// Weights, gradients and AdamW's two moments are fp32 (the engine keeps fp32 master weights; bf16 is
// autocast). ZeRO-1 (sharding "optimizer") divides only the optimizer state by the world size; FSDP
// ("full") divides all three by the shard group's size (world / replicate_groups under HSDP) and adds the
// unsharded buffers of one unit at a time (train/fully_sharded.h).
//
// Activations are what autograd keeps alive after one micro-batch's forward and loss, before its
// backward: the tensors each op of THIS engine's forward saves (src/model/causal_lm.cpp, block.cpp, attention.cpp,
// depth_attention.cpp, rope.cpp, model/loss.cpp), counted once per storage; and for the chunked loss one
// chunk's working set, the loss's transient peak (MemoryPlan::loss_chunk). The per-op account is in
// src/train/plan.cpp; tests/unit/test_plan.cpp measures the real figure with a counting CPU allocator.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/config/choices.h"
#include "archspace/config/model_config.h"
#include "archspace/config/train_config.h"

namespace archspace {

struct PlanOptions {
  int64_t world = 1;                    // ranks (data-parallel x context-parallel)
  int64_t sequence_length = 0;          // tokens per instance
  int64_t micro_batch = 1;              // instances per micro-batch
  int64_t grad_accum = 1;               // micro-batches per optimizer step
  DType dtype = DType::kBf16;           // fp32, or bf16 autocast over fp32 master weights
  Sharding sharding = Sharding::kNone;  // train.sharding (--sharding; --shard-optimizer is "optimizer")
  int64_t replicate_groups = 1;         // train.replicate_groups (--replicate-groups): HSDP, with "full"
  int64_t shard_group() const { return sharding == Sharding::kFull ? world / replicate_groups : 1; }
  // train.reduce_each_micro_batch (--reduce-once-per-step sets it false): with "full" and grad_accum > 1, false
  // keeps each rank's unsharded fp32 gradients between micro-batches (counted in `gradients`).
  bool reduce_each_micro_batch = true;
  bool activation_checkpointing = false;  // train.activation_checkpointing: blocks recomputed in backward
  // CUDA: bf16 attention runs the flash kernel, which takes the window itself, so sliding layers keep no
  // masks (model/attention.h attention_path). CPU (and fp32 on CUDA): SDPA with masks, as counted below.
  bool cuda = false;
  // train.loss_chunk_tokens: the head and loss a chunk of this many tokens at a time when a micro-batch has
  // more (model/loss.h head_loss); 0: the whole micro-batch's logits at once.
  int64_t loss_chunk_tokens = kDefaultLossChunkTokens;
  // train.document_masking: attention within each document. Off the flash kernel each document runs alone
  // (model/attention.h kSdpaDocuments), so the masks of sliding layers are per row and per document, counted at
  // their worst case (the document lengths are the data's), and o_proj reads a concatenated copy of the
  // documents' outputs; the flash kernel takes the documents as offsets (one int32 per document boundary).
  bool document_masking = false;
  // train.context_parallel: each sequence split over this many ranks (of `world`), which read the same
  // instances. Activations are those of the last slice (the largest: its full layers attend to every key).
  int64_t context_parallel = 1;
  // train.fp8 (needs bf16): the block's linear layers through FP8 matmuls (kernels/fp8_linear.h). Each keeps
  // e4m3 copies of its input (one per input, shared by the layers that read it) and of its weight, 1 byte an
  // entry, for backward, in place of autocast's bf16 input copies and bf16 weight cache (src/train/plan.cpp).
  bool fp8 = false;
  // train.fused_kernels: RMSNorm, residual add + RMSNorm, the Q/K norm with RoPE and the SwiGLU through the fused
  // training kernels (kernels/fused_training.h). Each keeps its input itself (no fp32 copy, no normalised product)
  // and an fp32 rstd a row, the SwiGLU its gate and up (src/train/plan.cpp). fp32 or bf16, CPU or CUDA.
  bool fused_kernels = false;

  int64_t data_parallel() const { return world / context_parallel; }
  // Throws archspace::Error naming the flag (`--world`, ...) of the first value out of range.
  void validate() const;
};

struct MemoryPlan {
  int64_t parameter_count = 0;
  int64_t tokens_per_step = 0;  // micro_batch x grad_accum x data-parallel ranks x sequence_length

  int64_t parameters = 0;        // fp32 master weights (FSDP: this rank's shards)
  int64_t gradients = 0;         // fp32, one per parameter (FSDP: per shard element, plus the unsharded sums of
                                 // every unit's padded flat groups when gradients are reduced once per step)
  int64_t optimizer_state = 0;   // AdamW exp_avg + exp_avg_sq, fp32 (divided by world when sharded)
  int64_t autocast_weights = 0;  // bf16 copies of the matmul weights, held through a step (not FSDP; with fp8
                                 // the LM head's only: the block's e4m3 weights are per micro-batch activations)
  // FSDP: the unsharded buffers that exist at a time: the largest unit gathered (its matmul weights in the
  // autocast dtype, the rest fp32) with the whole gradients autograd forms for it in backward (the same dtypes),
  // and kFsdpReductionsInFlight packed fp32 gradients of the largest flat groups being reduce-scattered, each
  // with its 1/S reduced output (an upper bound: they exist together only in backward). 0 otherwise.
  int64_t sharding_buffers = 0;
  int64_t activations = 0;  // sum of the parts below

  // The parts of `activations`.
  int64_t layer_activations = 0;  // all blocks (with checkpointing: block inputs + one block's internals)
  // With checkpointing: the one block's internals that backward rebuilds at a time (the largest block),
  // part of layer_activations; what autograd keeps after the forward is activations - recompute.
  int64_t recompute = 0;
  int64_t attention_masks = 0;  // sliding-window masks built when T > window (O(T^2) for T <= 2 window)
  // Document masking: the per-document outputs' concatenation (all layers, off the flash kernel) and the
  // documents' offsets (flash: at most one per token, kept once), part of layer_activations.
  int64_t document_masking = 0;
  int64_t depth_attention = 0;  // Depth-Attention's stacked keys/values and weights (in layer_activations)
  int64_t head_and_loss = 0;    // final norm(s), LM-head input, logits [B, T, V] and the loss's tensors
  // Chunked loss: one chunk's logits working set, part of head_and_loss; it exists only while the loss's
  // forward or backward runs a chunk, so what autograd keeps between them is activations - recompute - loss_chunk.
  int64_t loss_chunk = 0;
  int64_t rope_tables = 0;  // cos/sin tables, sliding and full
  // Context parallelism: the keys and values the last slice's attention keeps beyond its own positions (the
  // gathered sequence at full layers, the window's halo at sliding ones); part of layer_activations.
  int64_t context_keys = 0;

  int64_t total() const {
    return parameters + gradients + optimizer_state + autocast_weights + sharding_buffers + activations;
  }
  nlohmann::json to_json() const;
};

MemoryPlan plan_memory(const ModelConfig& config, const PlanOptions& options);

// Bytes autograd keeps for layer `layer` of one micro-batch (no checkpointing); masks included.
int64_t layer_activation_bytes(const ModelConfig& config, const PlanOptions& options, int64_t layer);

// "1.23 GiB".
std::string human_bytes(int64_t bytes);

// A memory size as GPUs are sold and nvidia-smi prints them: "80GiB", "80 GB", "81920MiB", "80G" (binary units:
// G, GB and GiB all mean 2^30, as nvidia-smi's MiB), or bytes with "B". A bare number is an error that shows the
// accepted forms (a bare "80" meant 80 GiB to every user who typed it). Throws naming `flag`.
int64_t parse_memory_size(const std::string& text, const std::string& flag);

// Whether the plan fits in `capacity` bytes per rank, and if not the cheapest change among those the plan
// models that makes it fit, tried in this order (cheapest first): ZeRO-1 over the ranks there are (free but
// for the optimizer's gather); FSDP over them (parameters gathered twice a step, overlapping compute);
// activation checkpointing (one more forward per block, about +1/3 compute);
// a smaller micro-batch with grad_accum raised to keep the global batch (less work per kernel); the two
// together; then more ranks with ZeRO-1 (more GPUs), grad_accum lowered to keep the global batch.
struct FitAdvice {
  int64_t capacity = 0;
  int64_t margin = 0;  // capacity - total: what is left, negative when it does not fit
  bool fits() const { return margin >= 0; }
  bool found = false;  // for a plan that does not fit: whether a change below fits
  std::string change;  // the flags that change, e.g. "--activation-checkpointing --micro-batch 2 --grad-accum 4"
  PlanOptions changed;
  int64_t changed_total = 0;
};
FitAdvice advise_fit(const ModelConfig& config, const PlanOptions& options, int64_t capacity);

}  // namespace archspace
