// The OLMo 3 causal language model on LibTorch: parameters named exactly as in Hugging Face checkpoints,
// one device-agnostic forward for CPU and CUDA, fp32 or bf16.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/model/attention.h"
#include "archspace/model/context_parallel.h"
#include "archspace/model/depth_attention.h"
#include "archspace/model/forward_options.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/parameter_source.h"
#include "archspace/model/parameters.h"
#include "archspace/model/rope.h"
#include "archspace/util/tensors.h"

namespace archspace {

class CausalLM {
 public:
  // `params` must hold exactly parameter_specs(config), all of one dtype and device.
  CausalLM(ModelConfig config, NamedTensors params);

  // Fresh weights per SPEC.md section 1: truncated normal(0, 0.02) cut at +-3 std for linears and the
  // embedding, ones for norms. Deterministic in `seed`.
  static CausalLM random_init(const ModelConfig& config, uint64_t seed, at::ScalarType dtype = at::kFloat,
                              at::Device device = at::kCPU);

  const ModelConfig& config() const { return config_; }
  const NamedTensors& parameters() const { return params_; }
  // The parameters of block l (named model.layers.<l>.*), in parameters() order: what activation checkpointing
  // differentiates a recomputed block through.
  std::vector<at::Tensor> block_parameters(int64_t l) const;
  const at::Tensor& parameter(const std::string& name) const;
  at::ScalarType dtype() const { return params_.front().second.scalar_type(); }
  at::Device device() const { return params_.front().second.device(); }

  // input_ids [B, T] (int64) -> logits [B, T, vocab_size] in the model's dtype. `mode`: decoding, whole
  // sequences or analysis (model/forward_options.h; any of its options types converts).
  at::Tensor forward(const at::Tensor& input_ids, const ForwardMode& mode = {}) const;
  // The output head: final normalised hidden states [..., d] -> logits [..., vocab_size].
  at::Tensor head(const at::Tensor& final_hidden) const;
  // The head's weight [vocab_size, d]: what model/loss.h multiplies a chunk of rows at a time.
  const at::Tensor& head_weight() const { return weights_.lm_head; }

  // Each layer's weights as its block reads them, bound from parameters() through the tables of
  // model/parameters.h (the norms of the config's topology; the others are undefined).
  const std::vector<BlockWeights>& layers() const { return layers_; }
  const FinalNorms& final_norms() const { return final_norms_; }

 private:
  bool uses_depth_attention() const { return config_.variant == Variant::kSiameseDepth && config_.use_depth_attention; }

  // What one layer needs besides its weights and input.
  struct LayerContext {
    int64_t index;
    int64_t window;  // sliding window, 0 for full attention
    const at::Tensor& cos;
    const at::Tensor& sin;
    const ForwardMode& mode;
    DepthAttentionState* depth;  // null: no Depth-Attention
    const Documents* documents;  // null: attention across the whole row
    // Records `name` under this layer's prefix when the forward has a recorder.
    void record(const char* name, const at::Tensor& t) const;
  };

  // The residual streams between blocks: x (SiameseNorm's X), y (SiameseNorm's Y), dual (ResiDual's
  // unnormalised stream); y and dual are undefined where the topology has none.
  struct Streams {
    at::Tensor x, y, dual;
  };

  // The rotary tables of one forward's positions, [T, h] or [B, 1, T, h] (a left-padded batch).
  struct RopeTables {
    at::Tensor sliding_cos, sliding_sin, full_cos, full_sin;
  };
  // The steps of forward(), in order.
  int64_t first_position(const ForwardMode& mode, int64_t T) const;  // checked against max_position_embeddings
  RopeTables rope_tables(const ForwardMode& mode, int64_t first, int64_t T) const;
  at::Tensor embed(const at::Tensor& ids, const ForwardMode& mode) const;
  void run_blocks(Streams& streams, const ForwardMode& mode, const RopeTables& rope,
                  const std::shared_ptr<const Documents>& documents) const;
  at::Tensor output(const Streams& streams, const ForwardMode& mode, int64_t T) const;

  at::Tensor attention(const BlockWeights& layer, const at::Tensor& x, const LayerContext& ctx) const;
  at::Tensor mlp(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const;
  // model/block.cpp: one block of the config's topology (SPEC.md section 7), updating the streams.
  Streams initial_streams(const at::Tensor& embeddings) const;
  void block(const BlockWeights& layer, Streams& streams, const LayerContext& ctx) const;
  void record_streams(const Streams& streams, const LayerContext& ctx) const;
  // The last hidden state the final norm reads (SiameseNorm and ResiDual fuse their streams here).
  at::Tensor last_hidden(const Streams& streams, const FinalNorms& norms, KernelChoices kernels) const;
  double siamese_scale(int64_t layer) const;  // c_l of SPEC.md section 3.1 (1 without depth-wise scaling)
  // One block through activation checkpointing: its residual streams in and out. The Depth-Attention values
  // it reads are inputs of the checkpoint and the pair it records an output, so gradients flow between
  // blocks through them as through the streams.
  Streams checkpointed_block(const LayerContext& ctx, const Streams& streams,
                             const std::shared_ptr<const Documents>& documents) const;

  ModelConfig config_;
  NamedTensors params_;
  std::map<std::string, size_t> index_;
  ModelWeights weights_;
  FinalNorms final_norms_;  // the topology's rows bound, the others undefined
  std::vector<BlockWeights> layers_;
  Rope sliding_rope_, full_rope_;
};

}  // namespace archspace
