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
#include "archspace/model/context_parallel.h"
#include "archspace/model/depth_attention.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/layers.h"
#include "archspace/model/parameter_source.h"
#include "archspace/model/parameters.h"
#include "archspace/model/rope.h"
#include "archspace/util/tensors.h"

namespace archspace {

struct ActivationRecorder;  // model/trace.h

struct ForwardOptions {
  AttentionImpl attention = AttentionImpl::kSdpa;
  // Incremental decoding: the input continues the cached positions, and this call's keys and (mixed)
  // values are added to the cache.
  KVCache* cache = nullptr;
  // Only the last position's logits (prefill for generation: the head is the largest matmul).
  bool last_position_only = false;
  // Returns the final normalised hidden states [B, T, d] instead of logits (scoring applies head() to the
  // positions it needs, a chunk at a time: all logits of a long batch would not fit).
  bool final_hidden_only = false;
  // Analysis (archspace analyze): run without block `skip_layer` (-1: none; not with a cache), and receive each
  // layer's Depth-Attention mixing weights [B, G, T, sources + 1] (undefined for layers without the mix).
  int64_t skip_layer = -1;
  std::vector<at::Tensor>* depth_weights = nullptr;
  // Receives every named intermediate (model/trace.h lists the names); null: nothing is recorded.
  ActivationRecorder* recorder = nullptr;
  // Training: autograd keeps each block's inputs only and backward recomputes the block
  // (model/activation_checkpoint.h). Applies only when grad mode is on, without cache or recorder.
  bool activation_checkpointing = false;
  // Intra-document masking (train.document_masking; model/documents.h): attention stays within the documents
  // that this EOS id ends in each row, as if each ran alone; positions still run across the row, as in
  // OLMo-core when OLMo 3 was trained. -1: off. Not with a cache.
  int64_t document_eos_id = -1;
  // The position of the first input token when there is no cache (0: the start). A document of a packed
  // instance runs alone at the positions it had there (tests of document masking).
  int64_t first_position = 0;
  // Training: the embedding lookup's gradient as sparse rows (one per input token) that autograd adds into the
  // table's dense gradient, which the caller keeps allocated and zeroes row by row (train/trainer.cpp): no
  // [V, d] zero fill per backward. The caller must have set the dense gradient before backward.
  bool sparse_embedding_gradient = false;
  // Each unit's weights from this source instead of the model's own tensors (model/parameter_source.h:
  // FSDP's gathered shards); it must outlive the backward of this forward. Null: the model's own.
  ParameterSource* parameters = nullptr;
  // Context parallelism (training): input_ids are one slice of each sequence, its positions and the other
  // slices' keys and values come from this hook (model/context_parallel.h). Not with a cache.
  ContextParallel* context_parallel = nullptr;
};

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

  // input_ids [B, T] (int64) -> logits [B, T, vocab_size] in the model's dtype.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& options = {}) const;
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
    const ForwardOptions& options;
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

  at::Tensor attention(const BlockWeights& layer, const at::Tensor& x, const LayerContext& ctx) const;
  at::Tensor mlp(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const;
  // model/norm_topology.cpp: one block of the config's topology (SPEC.md section 7), updating the streams.
  Streams initial_streams(const at::Tensor& embeddings) const;
  void block(const BlockWeights& layer, Streams& streams, const LayerContext& ctx) const;
  void record_streams(const Streams& streams, const LayerContext& ctx) const;
  // The last hidden state the final norm reads (SiameseNorm and ResiDual fuse their streams here).
  at::Tensor last_hidden(const Streams& streams, const FinalNorms& norms) const;
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
