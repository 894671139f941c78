#include "archspace/model/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "archspace/model/activation_checkpoint.h"
#include "archspace/model/linear.h"
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
  const bool siamese = c.variant == Variant::kSiameseDepth && c.use_siamese_norm;
  std::vector<ParamSpec> specs;
  auto add = [&](const auto& rows, const std::string& prefix) {
    for (const auto& row : rows) specs.push_back({prefix + row.name, row.shape.resolve(c), row.kind});
  };
  add(kEmbeddingRows, "");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    add(kAttentionMlpRows, layer_prefix(l));
    if (siamese) {
      add(kSiameseBlockRows, layer_prefix(l));
    } else {
      add(kBaseBlockRows, layer_prefix(l));
    }
  }
  if (siamese) add(kSiameseFinalRows, "");
  add(kHeadRows, "");
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
    if (t.scalar_type() != params_[0].second.scalar_type() || t.device() != params_[0].second.device()) {
      throw Error("CausalLM: parameter '" + name + "' differs in dtype or device from the others");
    }
    index_[name] = i;
  }
  using namespace param_tables;
  auto lookup = [this](const std::string& name) { return parameter(name); };
  bind_parameters(weights_, kEmbeddingRows, "", lookup);
  bind_parameters(weights_, kHeadRows, "", lookup);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (uses_siamese_norm()) {
      SiameseLayerWeights& layer = siamese_layers_.emplace_back();
      bind_parameters(layer, kAttentionMlpRows, layer_prefix(l), lookup);
      bind_parameters(layer, kSiameseBlockRows, layer_prefix(l), lookup);
    } else {
      BaseLayerWeights& layer = base_layers_.emplace_back();
      bind_parameters(layer, kAttentionMlpRows, layer_prefix(l), lookup);
      bind_parameters(layer, kBaseBlockRows, layer_prefix(l), lookup);
    }
  }
  if (uses_siamese_norm()) bind_parameters(siamese_final_.emplace(), kSiameseFinalRows, "", lookup);
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
    }
    params.emplace_back(spec.name, t.to(device, dtype));
  }
  return CausalLM(config, std::move(params));
}

void CausalLM::LayerContext::record(const char* name, const at::Tensor& t) const {
  if (options.recorder) options.recorder->record(layer_prefix(index) + name, t);
}

at::Tensor CausalLM::attention(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  ctx.record("attn_input", x);
  const int64_t B = x.size(0), T = x.size(1), h = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  // Q/K RMSNorm over the whole projection width, before splitting into heads.
  at::Tensor q = rms_norm(archspace::linear(x, layer.q_proj), layer.q_norm, eps);
  at::Tensor k = rms_norm(archspace::linear(x, layer.k_proj), layer.k_norm, eps);
  at::Tensor v = archspace::linear(x, layer.v_proj);
  at::Tensor q_BHTD = apply_rope(q.view({B, T, -1, h}).transpose(1, 2), ctx.cos, ctx.sin);
  at::Tensor k_BGTD = apply_rope(k.view({B, T, -1, h}).transpose(1, 2), ctx.cos, ctx.sin);
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
  if (ctx.options.cache) {
    KVCache::View view = ctx.options.cache->append(ctx.index, k_BGTD, v_BGTD);
    k_BGTD = view.k;
    v_BGTD = view.v;
    q_offset = view.q_offset;
    padding_mask = view.padding_mask;
  }
  at::Tensor o = causal_attention(q_BHTD, k_BGTD, v_BGTD, ctx.window, q_offset, ctx.options.attention, padding_mask);
  at::Tensor out = archspace::linear(o.transpose(1, 2).reshape({B, T, -1}), layer.o_proj);
  ctx.record("attn_output", out);
  return out;
}

at::Tensor CausalLM::mlp(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  at::Tensor out = swiglu_mlp(x, layer.gate_proj, layer.up_proj, layer.down_proj);
  ctx.record("mlp_output", out);
  return out;
}

at::Tensor CausalLM::base_block(const BaseLayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  // Reordered norms (OLMo 2/3): normalise each sublayer's output, not its input.
  const double eps = config_.rms_norm_eps;
  at::Tensor h = x + rms_norm(attention(layer, x, ctx), layer.post_attention_layernorm, eps);
  return h + rms_norm(mlp(layer, h, ctx), layer.post_feedforward_layernorm, eps);
}

void CausalLM::siamese_block(const SiameseLayerWeights& layer, at::Tensor& X, at::Tensor& Y,
                             const LayerContext& ctx) const {
  // SPEC.md section 3.1. X is the bounded (post-norm-like) stream, Y the identity (pre-norm-like) one;
  // both sublayers add c_l * O to X and O to Y, with c_l = 1/sqrt(2(l+1)).
  const double eps = config_.rms_norm_eps;
  const double c = 1.0 / std::sqrt(2.0 * static_cast<double>(ctx.index + 1));
  at::Tensor attn_in = rms_norm(Y, layer.siamese_attn_pre_norm, eps) + layer.siamese_hybrid_attn_scale * X;
  at::Tensor O = attention(layer, attn_in, ctx);
  X = X + c * O;
  Y = Y + O;
  X = rms_norm(X, layer.pre_mlp_layernorm, eps);
  at::Tensor mlp_in = rms_norm(X + rms_norm(Y, layer.siamese_mlp_pre_norm, eps), layer.siamese_mlp_input_norm, eps);
  O = mlp(layer, mlp_in, ctx);
  X = X + c * O;
  Y = Y + O;
}

std::vector<at::Tensor> CausalLM::checkpointed_block(const LayerContext& ctx,
                                                     const std::vector<at::Tensor>& streams) const {
  const int64_t l = ctx.index;
  const size_t n = streams.size();
  std::vector<at::Tensor> inputs(streams);
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
  std::vector<at::Tensor> params;
  const std::string prefix = layer_prefix(l);
  for (const auto& [name, p] : params_)
    if (name.rfind(prefix, 0) == 0) params.push_back(p);
  // Everything by value: the function runs again in backward, after forward() has returned.
  ForwardOptions options;
  options.attention = ctx.options.attention;
  const int64_t window = ctx.window;
  const at::Tensor cos = ctx.cos, sin = ctx.sin;
  BlockFunction fn = [this, l, n, window, cos, sin, options, sources, has_depth,
                      keeps](const std::vector<at::Tensor>& in) {
    std::optional<DepthAttentionState> depth;
    if (has_depth) {
      depth.emplace(config_.num_hidden_layers, config_.depth_attention_stride, config_.depth_attention_recent_window);
      for (size_t s = 0; s < sources.size(); ++s) depth->record(sources[s], in[n + 2 * s], in[n + 2 * s + 1]);
    }
    const LayerContext block_ctx{l, window, cos, sin, options, depth ? &*depth : nullptr};
    std::vector<at::Tensor> out;
    if (uses_siamese_norm()) {
      at::Tensor X = in[0], Y = in[1];
      siamese_block(siamese_layers_[l], X, Y, block_ctx);
      out = {X, Y};
    } else {
      out = {base_block(base_layers_[l], in[0], block_ctx)};
    }
    if (keeps) {
      auto [k, vhat] = depth->recorded(l);
      out.push_back(k);
      out.push_back(vhat);
    }
    return out;
  };
  std::vector<at::Tensor> out = checkpointed(std::move(fn), inputs, params);
  if (keeps) ctx.depth->record(l, out[n], out[n + 1]);
  out.resize(n);
  return out;
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, const ForwardOptions& options) const {
  if (input_ids.dim() != 2)
    throw Error("forward: input_ids must be [batch, time], got " + shape_string(input_ids.sizes().vec()));
  const int64_t T = input_ids.size(1);
  // Positions past max_position_embeddings were never trained (and YaRN is defined up to it).
  const int64_t end = (options.cache ? options.cache->length() : 0) + T;
  if (end > config_.max_position_embeddings) {
    throw Error("forward: " + std::to_string(end) + " positions, more than the model's max_position_embeddings " +
                std::to_string(config_.max_position_embeddings));
  }
  at::Tensor ids = input_ids.to(device(), at::kLong);
  // [T], or [B, T] for a left-padded batch (each row counts positions from its first real token).
  at::Tensor positions = options.cache ? options.cache->positions(T, device())
                                       : at::arange(T, at::TensorOptions().dtype(at::kLong).device(device()));
  auto [sliding_cos, sliding_sin] = sliding_rope_.tables(positions);
  auto [full_cos, full_sin] = full_rope_.tables(positions);
  if (positions.dim() == 2) {  // broadcast over heads: [B, 1, T, h]
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
                        depth ? &*depth : nullptr};
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
  at::Tensor x = at::embedding(weights_.embed_tokens, ids);
  if (recorder) recorder->record("model.embeddings", x);
  if (uses_siamese_norm()) {
    at::Tensor X = x, Y = x;
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      if (skipped(l)) continue;
      const LayerContext ctx = context(l);
      if (checkpoint) {
        const std::vector<at::Tensor> streams = checkpointed_block(ctx, {X, Y});
        X = streams[0];
        Y = streams[1];
      } else {
        siamese_block(siamese_layers_[l], X, Y, ctx);
      }
      ctx.record("X", X);
      ctx.record("Y", Y);
    }
    const double eps = config_.rms_norm_eps;
    x = rms_norm(X, siamese_final_->siamese_post_final_layernorm, eps) +
        rms_norm(Y, siamese_final_->siamese_pre_final_layernorm, eps);
  } else {
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      if (skipped(l)) continue;
      const LayerContext ctx = context(l);
      x = checkpoint ? checkpointed_block(ctx, {x})[0] : base_block(base_layers_[l], x, ctx);
      ctx.record("hidden", x);
    }
  }
  if (options.cache) options.cache->advance(T);
  if (options.last_position_only) x = x.narrow(1, T - 1, 1);
  x = rms_norm(x, weights_.norm, config_.rms_norm_eps);
  if (recorder) recorder->record("model.final_hidden", x);
  if (options.final_hidden_only) return x;
  return head(x);
}

at::Tensor CausalLM::head(const at::Tensor& final_hidden) const {
  return archspace::linear(final_hidden, weights_.lm_head);
}

}  // namespace archspace
