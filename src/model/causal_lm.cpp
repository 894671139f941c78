#include "archspace/model/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/model/init.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/trace.h"
#include "archspace/util/error.h"

namespace archspace {

std::vector<int64_t> ParamShape::resolve(const ModelConfig& c) const {
  auto size = [&](Dim dim) -> int64_t {
    switch (dim) {
      case Dim::kHidden:
        return c.hidden_size;
      case Dim::kQueryWidth:
        return c.num_attention_heads * c.head_dim;
      case Dim::kKvWidth:
        return c.num_key_value_heads * c.head_dim;
      case Dim::kIntermediate:
        return c.intermediate_size;
      case Dim::kVocab:
        return c.vocab_size;
    }
    throw Error("unknown parameter dimension");
  };
  std::vector<int64_t> shape;
  for (int i = 0; i < rank; ++i) shape.push_back(size(dims[i]));
  return shape;
}

std::vector<ParamSpec> parameter_specs(const ModelConfig& c) {
  using namespace param_tables;
  std::vector<ParamSpec> specs;
  auto add = [&](const auto& row, const std::string& prefix) {
    specs.push_back({prefix + row.name, row.shape.resolve(c), row.kind});
  };
  for (const auto& row : kEmbeddingRows) add(row, "");
  const auto norm_rows = block_norm_rows(c);
  // DeepNet's init: v_proj, o_proj and the MLP weights drawn times beta (SPEC.md section 7).
  const double beta = c.topology() == NormTopology::kDeepNorm ? c.deepnorm_beta() : 1.0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const auto& row : kAttentionMlpRows) {
      add(row, layer_prefix(l));
      const bool scaled = row.member != &LayerWeights::q_proj && row.member != &LayerWeights::k_proj &&
                          row.member != &LayerWeights::q_norm && row.member != &LayerWeights::k_norm;
      if (scaled) specs.back().init_scale = beta;
    }
    for (const auto* row : norm_rows) add(*row, layer_prefix(l));
  }
  for (const auto* row : final_norm_rows(c)) add(*row, "");
  for (const auto& row : kHeadRows) add(row, "");
  return specs;
}

int64_t parameter_count(const ModelConfig& config) {
  int64_t n = 0;
  for (const auto& s : parameter_specs(config)) {
    int64_t numel = 1;
    for (int64_t dim : s.shape) numel *= dim;
    n += numel;
  }
  return n;
}

CausalLM::CausalLM(ModelConfig config, NamedTensors params) : config_(std::move(config)), params_(std::move(params)) {
  config_.validate();
  const auto specs = parameter_specs(config_);
  if (params_.size() != specs.size()) {
    throw Error("CausalLM: got " + std::to_string(params_.size()) + " parameters, the model has " +
                std::to_string(specs.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, t] = params_[i];
    if (name != specs[i].name || t.sizes().vec() != specs[i].shape) {
      throw Error("CausalLM: parameter " + std::to_string(i) + " is '" + name + "' " + shape_string(t.sizes().vec()) +
                  ", expected '" + specs[i].name + "' " + shape_string(specs[i].shape));
    }
    if (is_int8_weight(t)) {  // --quantization int8: matmul weights only, on the CPU, zero points 0
      if (specs[i].kind != ParamKind::kLinear || !params_[0].second.device().is_cpu() ||
          !at::equal(t.q_per_channel_zero_points(), at::zeros({t.size(0)}, at::kLong))) {
        throw Error("CausalLM: parameter '" + name +
                    "' is int8, which only a matmul weight of a CPU model (zero points 0) may be");
      }
    } else if (t.scalar_type() != params_[0].second.scalar_type() || t.device() != params_[0].second.device()) {
      throw Error("CausalLM: parameter '" + name + "' differs in dtype or device from the others");
    }
    index_[name] = i;
  }
  using namespace param_tables;
  auto lookup = [this](const std::string& name) { return parameter(name); };
  bind_parameters(weights_, kEmbeddingRows, "", lookup);
  bind_parameters(weights_, kHeadRows, "", lookup);
  const auto norm_rows = block_norm_rows(config_);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    BlockWeights& layer = layers_.emplace_back();
    bind_parameters(layer, kAttentionMlpRows, layer_prefix(l), lookup);
    bind_parameters(layer, norm_rows, layer_prefix(l), lookup);
  }
  bind_parameters(final_norms_, final_norm_rows(config_), "", lookup);
  sliding_rope_ = rope_for(config_, LayerType::kSliding);
  full_rope_ = rope_for(config_, LayerType::kFull);
}

const at::Tensor& CausalLM::parameter(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error("the model has no parameter '" + name + "'");
  return params_[it->second].second;
}

CausalLM CausalLM::random_init(const ModelConfig& config, uint64_t seed, at::ScalarType dtype, at::Device device) {
  const double std_dev = 0.02, cut = config.truncated_normal_factor;
  // Truncated normal by inverse CDF, as torch.nn.init.trunc_normal_ does: uniform in [Phi(-cut), Phi(cut)]
  // mapped through sqrt(2) * erfinv(2u - 1).
  const double lo = std::erf(-cut / std::sqrt(2.0)), hi = std::erf(cut / std::sqrt(2.0));
  return model_from_draws(config, seed, dtype, device, [&](at::Tensor& t, const ParamSpec&, at::Generator& gen) {
    t.uniform_(lo, hi, gen).erfinv_().mul_(std_dev * std::sqrt(2.0)).clamp_(-cut * std_dev, cut * std_dev);
  });
}

std::vector<at::Tensor> CausalLM::block_parameters(int64_t l) const {
  const std::string prefix = layer_prefix(l);
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : params_)
    if (name.rfind(prefix, 0) == 0) params.push_back(p);
  return params;
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, const ForwardMode& mode) const {
  if (input_ids.dim() != 2)
    throw Error("forward: input_ids must be [batch, time], got " + shape_string(input_ids.sizes().vec()));
  const int64_t T = input_ids.size(1);
  const at::Tensor ids = input_ids.to(device(), at::kLong);
  const RopeTables rope = rope_tables(mode, first_position(mode, T), T);
  // Documents found once per forward; a batch whose rows are each one document needs no masking.
  std::shared_ptr<const Documents> documents;
  if (const SequenceOptions* s = mode.sequences(); s && s->document_eos_id >= 0) {
    auto found = std::make_shared<Documents>(find_documents(ids, s->document_eos_id));
    if (!found->whole_rows()) documents = std::move(found);
  }
  Streams streams = initial_streams(embed(ids, mode));
  run_blocks(streams, mode, rope, documents);
  return output(streams, mode, T);
}

int64_t CausalLM::first_position(const ForwardMode& mode, int64_t T) const {
  int64_t first = 0;
  if (const KVCache* cache = mode.cache()) {
    first = cache->length();
  } else if (const ContextParallel* cp = mode.context_parallel()) {
    first = cp->slice_start();
  } else if (const SequenceOptions* s = mode.sequences()) {
    first = s->first_position;
  }
  // Positions past max_position_embeddings were never trained (and YaRN is defined up to it).
  if (first + T > config_.max_position_embeddings) {
    throw Error("forward: " + std::to_string(first + T) + " positions, more than the model's max_position_embeddings " +
                std::to_string(config_.max_position_embeddings));
  }
  return first;
}

CausalLM::RopeTables CausalLM::rope_tables(const ForwardMode& mode, int64_t first, int64_t T) const {
  const int64_t end = first + T;
  const KVCache* cache = mode.cache();
  // [T], or [B, T] for a left-padded batch (each row counts positions from its first real token).
  // A context-parallel slice: global positions, so RoPE (plain or YaRN) sees the whole sequence's.
  // Decoding an unpadded batch reads positions first .. end - 1 as rows of the kept tables (Rope::cached_rows).
  // A fixed-shape step (KVCache::fix_shapes) takes its positions from the cache's device slot instead.
  const bool fixed = cache && cache->fixed_shapes();
  const bool consecutive = cache && !cache->padded() && !fixed;
  at::Tensor positions = consecutive ? at::Tensor()
                         : cache     ? cache->positions(T, device())
                                     : at::arange(first, end, at::TensorOptions().dtype(at::kLong).device(device()));
  // With a cache (decoding, prefill into it) positions run late and repeat across calls: look the tables up.
  const int64_t max_pos = config_.max_position_embeddings;
  // Fixed shapes: the kept tables cover every slot the cache was fixed for from the first step on, so a replayed
  // step never looks up rows past them.
  const int64_t table_end = fixed ? std::max(end, cache->fixed_end()) : end;
  auto tables = [&](const Rope& rope) {
    if (consecutive) return rope.cached_rows(first, end, max_pos, device());
    return cache ? rope.cached_tables(positions, table_end, max_pos) : rope.tables(positions);
  };
  RopeTables t;
  std::tie(t.sliding_cos, t.sliding_sin) = tables(sliding_rope_);
  std::tie(t.full_cos, t.full_sin) = tables(full_rope_);
  if (positions.defined() && positions.dim() == 2) {  // broadcast over heads: [B, 1, T, h]
    for (at::Tensor* table : {&t.sliding_cos, &t.sliding_sin, &t.full_cos, &t.full_sin}) *table = table->unsqueeze(1);
  }
  return t;
}

at::Tensor CausalLM::embed(const at::Tensor& ids, const ForwardMode& mode) const {
  const bool sparse = mode.sequences() && mode.sequences()->sparse_embedding_gradient;
  at::Tensor x;
  if (ParameterSource* source = mode.parameters()) {
    x = at::embedding(source->embedding(), ids, -1, false, sparse);
    source->embedding_done();
  } else {
    x = at::embedding(weights_.embed_tokens, ids, -1, false, sparse);
  }
  if (ActivationRecorder* recorder = mode.recorder()) recorder->record("model.embeddings", x);
  return x;
}

void CausalLM::run_blocks(Streams& streams, const ForwardMode& mode, const RopeTables& rope,
                          const std::shared_ptr<const Documents>& documents) const {
  std::optional<DepthAttentionState> depth;
  if (uses_depth_attention()) {
    depth.emplace(config_.num_hidden_layers, config_.depth_attention_stride, config_.depth_attention_recent_window);
  }
  // Layer pruning (analysis): the dropped block leaves its stream(s) as they are and is no Depth-Attention source.
  const AnalysisOptions* analysis = mode.analysis();
  const int64_t skip_layer = analysis ? analysis->skip_layer : -1;
  if (skip_layer >= config_.num_hidden_layers) {
    throw Error("skip_layer " + std::to_string(skip_layer) + ": needs a layer below " +
                std::to_string(config_.num_hidden_layers));
  }
  if (analysis && analysis->depth_weights) analysis->depth_weights->assign(config_.num_hidden_layers, at::Tensor());
  const SequenceOptions* sequences = mode.sequences();
  const bool checkpoint = sequences && sequences->activation_checkpointing && c10::GradMode::is_enabled();
  ParameterSource* source = mode.parameters();
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (l == skip_layer) {
      if (depth) depth->drop(l);
      continue;
    }
    const bool sliding = config_.layer_types[l] == LayerType::kSliding;
    const LayerContext ctx{l,
                           sliding ? config_.sliding_window : 0,
                           sliding ? rope.sliding_cos : rope.full_cos,
                           sliding ? rope.sliding_sin : rope.full_sin,
                           mode,
                           depth ? &*depth : nullptr,
                           documents.get()};
    if (checkpoint) {
      streams = checkpointed_block(ctx, streams, documents);
    } else {
      block(source ? source->block(l) : layers_[l], streams, ctx);
    }
    if (source) {  // the source may free block l's weights and hand back streams whose backward brings them back
      std::vector<at::Tensor> outputs = {streams.x, streams.y, streams.dual};
      source->block_done(l, outputs, checkpoint);
      streams = {outputs[0], outputs[1], outputs[2]};
    }
    record_streams(streams, ctx);
  }
}

at::Tensor CausalLM::output(const Streams& streams, const ForwardMode& mode, int64_t T) const {
  ParameterSource* source = mode.parameters();
  HeadWeights sourced;
  if (source) sourced = source->head();
  at::Tensor x = last_hidden(streams, source ? sourced.final_norms : final_norms_, mode.kernels());
  if (KVCache* cache = mode.cache()) cache->advance(T);
  if (mode.last_position_only()) x = x.narrow(1, T - 1, 1);
  x = rms_norm(x, source ? sourced.norm : weights_.norm, config_.rms_norm_eps, mode.kernels());
  if (ActivationRecorder* recorder = mode.recorder()) recorder->record("model.final_hidden", x);
  if (mode.final_hidden_only()) return x;
  return source ? archspace::linear(x, sourced.lm_head) : head(x);
}

at::Tensor CausalLM::head(const at::Tensor& final_hidden) const {
  return archspace::linear(final_hidden, weights_.lm_head);
}

}  // namespace archspace
