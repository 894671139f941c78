#include "archspace/model/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/model/activation_checkpoint.h"
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
  config.validate();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_dev = 0.02, cut = config.truncated_normal_factor;
  // Truncated normal by inverse CDF, as torch.nn.init.trunc_normal_ does: uniform in [Phi(-cut), Phi(cut)]
  // mapped through sqrt(2) * erfinv(2u - 1).
  const double lo = std::erf(-cut / std::sqrt(2.0)), hi = std::erf(cut / std::sqrt(2.0));
  NamedTensors params;
  for (const auto& spec : parameter_specs(config)) {
    at::Tensor t;
    if (spec.kind == ParamKind::kNorm) {
      t = at::ones(spec.shape, at::kFloat);
    } else {
      t = at::empty(spec.shape, at::kFloat);
      t.uniform_(lo, hi, gen).erfinv_().mul_(std_dev * std::sqrt(2.0)).clamp_(-cut * std_dev, cut * std_dev);
      if (spec.init_scale != 1.0) t.mul_(spec.init_scale);
    }
    params.emplace_back(spec.name, t.to(device, dtype));
  }
  return CausalLM(config, std::move(params));
}

std::vector<at::Tensor> CausalLM::block_parameters(int64_t l) const {
  const std::string prefix = layer_prefix(l);
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : params_)
    if (name.rfind(prefix, 0) == 0) params.push_back(p);
  return params;
}

void CausalLM::LayerContext::record(const char* name, const at::Tensor& t) const {
  if (options.recorder) options.recorder->record(layer_prefix(index) + name, t);
}

at::Tensor CausalLM::attention(const BlockWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  ctx.record("attn_input", x);
  const int64_t B = x.size(0), T = x.size(1), h = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  // Q/K RMSNorm over the whole projection width, before splitting into heads.
  std::vector<at::Tensor> qkv = linear_many(x, {layer.q_proj, layer.k_proj, layer.v_proj});
  at::Tensor q_BHTD = rms_norm_rope(qkv[0], layer.q_norm, eps, ctx.cos, ctx.sin, h);
  at::Tensor k_BGTD = rms_norm_rope(qkv[1], layer.k_norm, eps, ctx.cos, ctx.sin, h);
  at::Tensor v = std::move(qkv[2]);
  if (layer.v_norm.defined()) v = rms_norm(v, layer.v_norm, eps);  // HybridNorm's QKV norm
  at::Tensor v_BGTD = v.view({B, T, -1, h}).transpose(1, 2);
  ctx.record("q", q_BHTD);
  ctx.record("k", k_BGTD);
  ctx.record("v", v_BGTD);
  // Depth-Attention replaces the values with their cross-layer mix; token attention reads the mix.
  if (ctx.depth) {
    at::Tensor* weights = ctx.options.depth_weights ? &(*ctx.options.depth_weights)[ctx.index] : nullptr;
    v_BGTD = ctx.depth->mix(ctx.index, q_BHTD, k_BGTD, v_BGTD, weights);
    ctx.record("v_mixed", v_BGTD);
  }
  int64_t q_offset = 0;
  at::Tensor padding_mask;
  if (ctx.options.context_parallel) {  // keys and values of the earlier slices this layer's window reaches
    ContextParallel::Keys keys = ctx.options.context_parallel->attention_keys(k_BGTD, v_BGTD, ctx.window);
    k_BGTD = keys.k;
    v_BGTD = keys.v;
    q_offset = keys.q_offset;
  }
  if (ctx.options.cache) {
    KVCache::View view = ctx.options.cache->append(ctx.index, k_BGTD, v_BGTD);
    k_BGTD = view.k;
    v_BGTD = view.v;
    q_offset = view.q_offset;
    padding_mask = view.padding_mask;
  }
  at::Tensor o = causal_attention(q_BHTD, k_BGTD, v_BGTD, ctx.window, q_offset, ctx.options.attention, padding_mask,
                                  ctx.documents);
  at::Tensor out = archspace::linear(o.transpose(1, 2).reshape({B, T, -1}), layer.o_proj);
  ctx.record("attn_output", out);
  return out;
}

at::Tensor CausalLM::mlp(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  at::Tensor out = swiglu_mlp(x, layer.gate_proj, layer.up_proj, layer.down_proj);
  ctx.record("mlp_output", out);
  return out;
}

CausalLM::Streams CausalLM::checkpointed_block(const LayerContext& ctx, const Streams& streams,
                                               const std::shared_ptr<const Documents>& documents) const {
  const int64_t l = ctx.index;
  // The streams (x; X and Y; x and ResiDual's dual) go in and come out as one list. ResiDual's dual stream
  // starts undefined (d = 0) and the first block creates it, so it enters as zeros (0 + o == o exactly).
  const bool has_y = streams.y.defined();
  const bool has_dual = streams.dual.defined() || config_.topology() == NormTopology::kResidual;
  std::vector<at::Tensor> inputs = {streams.x};
  if (has_y) inputs.push_back(streams.y);
  if (has_dual) inputs.push_back(streams.dual.defined() ? streams.dual : at::zeros_like(streams.x));
  const size_t n = inputs.size();
  std::vector<int64_t> sources;
  const bool has_depth = ctx.depth != nullptr, keeps = has_depth && ctx.depth->is_source(l);
  if (has_depth) {
    sources = ctx.depth->sources(l);
    for (int64_t j : sources) {
      auto [k, vhat] = ctx.depth->recorded(j);
      inputs.push_back(k);
      inputs.push_back(vhat);
    }
  }
  // The block's weights are differentiated through its parameters, or through what a parameter source
  // gathers them from (the recomputation in backward asks the source for them again).
  ParameterSource* source = ctx.options.parameters;
  std::vector<at::Tensor> params;
  if (source) {
    params = source->block_leaves(l);
  } else {
    params = block_parameters(l);
  }
  // Everything by value: the function runs again in backward, after forward() has returned.
  ForwardOptions options;
  options.attention = ctx.options.attention;
  options.context_parallel = ctx.options.context_parallel;  // the recomputation exchanges keys and values again
  const int64_t window = ctx.window;
  const at::Tensor cos = ctx.cos, sin = ctx.sin;
  BlockFunction fn = [this, l, n, window, cos, sin, options, sources, has_depth, keeps, has_y, has_dual, documents,
                      source](const std::vector<at::Tensor>& in) {
    std::optional<DepthAttentionState> depth;
    if (has_depth) {
      depth.emplace(config_.num_hidden_layers, config_.depth_attention_stride, config_.depth_attention_recent_window);
      for (size_t s = 0; s < sources.size(); ++s) depth->record(sources[s], in[n + 2 * s], in[n + 2 * s + 1]);
    }
    const LayerContext block_ctx{l, window, cos, sin, options, depth ? &*depth : nullptr, documents.get()};
    Streams s;
    size_t i = 0;
    s.x = in[i++];
    if (has_y) s.y = in[i++];
    if (has_dual) s.dual = in[i++];
    if (source) {
      block(source->block(l), s, block_ctx);
    } else {
      block(layers_[l], s, block_ctx);
    }
    std::vector<at::Tensor> out = {s.x};
    if (has_y) out.push_back(s.y);
    if (has_dual) out.push_back(s.dual);
    if (keeps) {
      auto [k, vhat] = depth->recorded(l);
      out.push_back(k);
      out.push_back(vhat);
    }
    return out;
  };
  std::vector<at::Tensor> out = checkpointed(std::move(fn), inputs, params);
  if (keeps) ctx.depth->record(l, out[n], out[n + 1]);
  Streams result;
  size_t i = 0;
  result.x = out[i++];
  if (has_y) result.y = out[i++];
  if (has_dual) result.dual = out[i++];
  return result;
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, const ForwardOptions& options) const {
  if (input_ids.dim() != 2)
    throw Error("forward: input_ids must be [batch, time], got " + shape_string(input_ids.sizes().vec()));
  const int64_t T = input_ids.size(1);
  if (options.cache && (options.first_position != 0 || options.document_eos_id >= 0))
    throw Error("forward: first_position and document masking are for forwards without a KV cache");
  if (options.first_position < 0)
    throw Error("forward: first_position must be >= 0, got " + std::to_string(options.first_position));
  ContextParallel* cp = options.context_parallel;
  if (cp && options.cache)
    throw Error("forward: context parallelism is for training: it does not run with a KV cache (inference)");
  if (cp && (options.first_position != 0 || options.document_eos_id >= 0))
    throw Error("forward: context parallelism takes its positions from its slice and does not mask documents");
  // Positions past max_position_embeddings were never trained (and YaRN is defined up to it).
  const int64_t first = options.cache ? options.cache->length() : cp ? cp->slice_start() : options.first_position;
  const int64_t end = first + T;
  if (end > config_.max_position_embeddings) {
    throw Error("forward: " + std::to_string(end) + " positions, more than the model's max_position_embeddings " +
                std::to_string(config_.max_position_embeddings));
  }
  at::Tensor ids = input_ids.to(device(), at::kLong);
  // [T], or [B, T] for a left-padded batch (each row counts positions from its first real token).
  // A context-parallel slice: global positions, so RoPE (plain or YaRN) sees the whole sequence's.
  // Decoding an unpadded batch reads positions first .. end - 1 as rows of the kept tables (Rope::cached_rows).
  // A fixed-shape step (KVCache::fix_shapes) takes its positions from the cache's device slot instead.
  const bool fixed = options.cache && options.cache->fixed_shapes();
  const bool consecutive = options.cache && !options.cache->padded() && !fixed;
  at::Tensor positions = consecutive ? at::Tensor()
                         : options.cache
                             ? options.cache->positions(T, device())
                             : at::arange(first, end, at::TensorOptions().dtype(at::kLong).device(device()));
  // Documents found once per forward; a batch whose rows are each one document needs no masking.
  std::shared_ptr<const Documents> documents;
  if (options.document_eos_id >= 0) {
    auto found = std::make_shared<Documents>(find_documents(ids, options.document_eos_id));
    if (!found->whole_rows()) documents = std::move(found);
  }
  // With a cache (decoding, prefill into it) positions run late and repeat across calls: look the tables up.
  const int64_t max_pos = config_.max_position_embeddings;
  // Fixed shapes: the kept tables cover every slot the cache was fixed for from the first step on, so a replayed
  // step never looks up rows past them.
  const int64_t table_end = fixed ? std::max(end, options.cache->fixed_end()) : end;
  auto tables = [&](const Rope& rope) {
    if (consecutive) return rope.cached_rows(first, end, max_pos, device());
    return options.cache ? rope.cached_tables(positions, table_end, max_pos) : rope.tables(positions);
  };
  auto [sliding_cos, sliding_sin] = tables(sliding_rope_);
  auto [full_cos, full_sin] = tables(full_rope_);
  if (positions.defined() && positions.dim() == 2) {  // broadcast over heads: [B, 1, T, h]
    for (at::Tensor* table : {&sliding_cos, &sliding_sin, &full_cos, &full_sin}) *table = table->unsqueeze(1);
  }

  std::optional<DepthAttentionState> depth;
  if (uses_depth_attention()) {
    depth.emplace(config_.num_hidden_layers, config_.depth_attention_stride, config_.depth_attention_recent_window);
  }
  auto context = [&](int64_t l) {
    const bool sliding = config_.layer_types[l] == LayerType::kSliding;
    return LayerContext{l,
                        sliding ? config_.sliding_window : 0,
                        sliding ? sliding_cos : full_cos,
                        sliding ? sliding_sin : full_sin,
                        options,
                        depth ? &*depth : nullptr,
                        documents.get()};
  };

  if (options.skip_layer >= config_.num_hidden_layers || (options.skip_layer >= 0 && options.cache)) {
    throw Error("skip_layer " + std::to_string(options.skip_layer) + ": needs a layer below " +
                std::to_string(config_.num_hidden_layers) + " and no KV cache");
  }
  if (options.depth_weights) options.depth_weights->assign(config_.num_hidden_layers, at::Tensor());
  // Layer pruning: the dropped block leaves its stream(s) as they are and is no Depth-Attention source.
  auto skipped = [&](int64_t l) {
    if (l != options.skip_layer) return false;
    if (depth) depth->drop(l);
    return true;
  };
  ActivationRecorder* recorder = options.recorder;
  // Not with the analyses' options either (skip_layer, depth_weights): they run without grad anyway.
  const bool checkpoint = options.activation_checkpointing && c10::GradMode::is_enabled() && !options.cache &&
                          !recorder && options.skip_layer < 0 && !options.depth_weights;
  ParameterSource* source = options.parameters;
  at::Tensor x;
  if (source) {
    x = at::embedding(source->embedding(), ids, -1, false, options.sparse_embedding_gradient);
    source->embedding_done();
  } else {
    x = at::embedding(weights_.embed_tokens, ids, -1, false, options.sparse_embedding_gradient);
  }
  if (recorder) recorder->record("model.embeddings", x);
  Streams streams = initial_streams(x);
  // The source may free block l's weights and hand back streams whose backward brings them back.
  auto block_done = [&](int64_t l, bool recomputed) {
    std::vector<at::Tensor> outputs = {streams.x, streams.y, streams.dual};
    source->block_done(l, outputs, recomputed);
    streams = {outputs[0], outputs[1], outputs[2]};
  };
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (skipped(l)) continue;
    const LayerContext ctx = context(l);
    if (checkpoint) {
      streams = checkpointed_block(ctx, streams, documents);
    } else {
      block(source ? source->block(l) : layers_[l], streams, ctx);
    }
    if (source) block_done(l, checkpoint);
    record_streams(streams, ctx);
  }
  HeadWeights sourced;
  if (source) sourced = source->head();
  x = last_hidden(streams, source ? sourced.final_norms : final_norms_);
  if (options.cache) options.cache->advance(T);
  if (options.last_position_only) x = x.narrow(1, T - 1, 1);
  x = rms_norm(x, source ? sourced.norm : weights_.norm, config_.rms_norm_eps);
  if (recorder) recorder->record("model.final_hidden", x);
  if (options.final_hidden_only) return x;
  return source ? archspace::linear(x, sourced.lm_head) : head(x);
}

at::Tensor CausalLM::head(const at::Tensor& final_hidden) const {
  return archspace::linear(final_hidden, weights_.lm_head);
}

}  // namespace archspace
