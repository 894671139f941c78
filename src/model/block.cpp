// One decoder block: its attention and MLP sublayers, the residual wiring of each normalization topology
// (SPEC.md section 7), and the block under activation checkpointing. Equations are cited per topology; the
// independent reference in tests/python/topology_reference.py is written from the same papers, not from this file.
#include <cmath>

#include "archspace/kernels/linear.h"
#include "archspace/model/activation_checkpoint.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/mlp.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/trace.h"
#include "archspace/util/error.h"

namespace archspace {

void CausalLM::LayerContext::record(const char* name, const at::Tensor& t) const {
  if (ActivationRecorder* recorder = mode.recorder()) recorder->record(layer_prefix(index) + name, t);
}

at::Tensor CausalLM::attention(const BlockWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  ctx.record("attn_input", x);
  const int64_t B = x.size(0), T = x.size(1), h = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  // Q/K RMSNorm over the whole projection width, before splitting into heads.
  const KernelChoices kernels = ctx.mode.kernels();  // training's FP8 matmuls and fused kernels (kernels/dispatch.h)
  std::vector<at::Tensor> qkv = linear_many(x, {layer.q_proj, layer.k_proj, layer.v_proj}, kernels);
  at::Tensor q_BHTD = rms_norm_rope(qkv[0], layer.q_norm, eps, ctx.cos, ctx.sin, h, kernels);
  at::Tensor k_BGTD = rms_norm_rope(qkv[1], layer.k_norm, eps, ctx.cos, ctx.sin, h, kernels);
  at::Tensor v = std::move(qkv[2]);
  if (layer.v_norm.defined()) v = rms_norm(v, layer.v_norm, eps, kernels);  // HybridNorm's QKV norm
  at::Tensor v_BGTD = v.view({B, T, -1, h}).transpose(1, 2);
  ctx.record("q", q_BHTD);
  ctx.record("k", k_BGTD);
  ctx.record("v", v_BGTD);
  // Depth-Attention replaces the values with their cross-layer mix; token attention reads the mix.
  if (ctx.depth) {
    const AnalysisOptions* analysis = ctx.mode.analysis();
    at::Tensor* weights = analysis && analysis->depth_weights ? &(*analysis->depth_weights)[ctx.index] : nullptr;
    v_BGTD = ctx.depth->mix(ctx.index, q_BHTD, k_BGTD, v_BGTD, weights);
    ctx.record("v_mixed", v_BGTD);
  }
  int64_t q_offset = 0;
  at::Tensor padding_mask;
  if (ContextParallel* cp = ctx.mode.context_parallel()) {  // the earlier slices' keys and values in the window
    ContextParallel::Keys keys = cp->attention_keys(k_BGTD, v_BGTD, ctx.window);
    k_BGTD = keys.k;
    v_BGTD = keys.v;
    q_offset = keys.q_offset;
  }
  if (KVCache* cache = ctx.mode.cache()) {
    KVCache::View view = cache->append(ctx.index, k_BGTD, v_BGTD);
    k_BGTD = view.k;
    v_BGTD = view.v;
    q_offset = view.q_offset;
    padding_mask = view.padding_mask;
  }
  at::Tensor o =
      causal_attention(q_BHTD, k_BGTD, v_BGTD, ctx.window, q_offset, ctx.mode.attention(), padding_mask, ctx.documents);
  const at::Tensor heads = o.transpose(1, 2).reshape({B, T, -1});
  at::Tensor out = archspace::linear(heads, layer.o_proj, kernels);
  ctx.record("attn_output", out);
  return out;
}

at::Tensor CausalLM::mlp(const LayerWeights& layer, const at::Tensor& x, const LayerContext& ctx) const {
  at::Tensor out = swiglu_mlp(x, layer.gate_proj, layer.up_proj, layer.down_proj, ctx.mode.kernels());
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
  ParameterSource* source = ctx.mode.parameters();
  std::vector<at::Tensor> params;
  if (source) {
    params = source->block_leaves(l);
  } else {
    params = block_parameters(l);
  }
  // Everything by value: the function runs again in backward, after forward() has returned.
  SequenceOptions recomputation;
  recomputation.attention = ctx.mode.attention();
  recomputation.context_parallel = ctx.mode.context_parallel();  // the recomputation exchanges keys and values again
  recomputation.fp8 = ctx.mode.fp8();                            // and casts to e4m3 as the forward did
  recomputation.fused_kernels = ctx.mode.kernels().fused;        // and runs the kernels it ran
  const ForwardMode mode = recomputation;
  const int64_t window = ctx.window;
  const at::Tensor cos = ctx.cos, sin = ctx.sin;
  BlockFunction fn = [this, l, n, window, cos, sin, mode, sources, has_depth, keeps, has_y, has_dual, documents,
                      source](const std::vector<at::Tensor>& in) {
    std::optional<DepthAttentionState> depth;
    if (has_depth) {
      depth.emplace(config_.num_hidden_layers, config_.depth_attention_stride, config_.depth_attention_recent_window);
      for (size_t s = 0; s < sources.size(); ++s) depth->record(sources[s], in[n + 2 * s], in[n + 2 * s + 1]);
    }
    const LayerContext block_ctx{l, window, cos, sin, mode, depth ? &*depth : nullptr, documents.get()};
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

CausalLM::Streams CausalLM::initial_streams(const at::Tensor& embeddings) const {
  Streams s;
  s.x = embeddings;
  if (is_siamese(config_.topology())) s.y = embeddings;  // X_0 = Y_0 = embedding
  return s;
}

void CausalLM::block(const BlockWeights& layer, Streams& s, const LayerContext& ctx) const {
  const double eps = config_.rms_norm_eps;
  const KernelChoices kernels = ctx.mode.kernels();
  auto norm = [eps, kernels](const at::Tensor& x, const at::Tensor& w) { return rms_norm(x, w, eps, kernels); };
  // r + norm(x, w) (one pass in inference on the CPU)
  auto add_norm = [eps, kernels](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
    return add_rms_norm(r, x, w, eps, kernels);
  };
  at::Tensor& x = s.x;
  switch (config_.topology()) {
    case NormTopology::kReordered: {
      // OLMo 2 (arXiv 2501.00656, "reordered norm"; SPEC.md section 2): h = x + Norm(Attn(x)); out = h + Norm(MLP(h)).
      at::Tensor h = add_norm(x, attention(layer, x, ctx), layer.post_attention_layernorm);
      x = add_norm(h, mlp(layer, h, ctx), layer.post_feedforward_layernorm);
      return;
    }
    case NormTopology::kPre:
      // Pre-LN (Xiong et al. 2020, arXiv 2002.04745, Table 1 right): x = x + F(Norm(x)).
      x = x + attention(layer, norm(x, layer.input_layernorm), ctx);
      x = x + mlp(layer, norm(x, layer.pre_feedforward_layernorm), ctx);
      return;
    case NormTopology::kPeri:
      // Peri-LN (Kim et al. 2025, arXiv 2502.02732, its definition of Peri-LN): x = x + Norm_out(F(Norm_in(x))).
      x = add_norm(x, attention(layer, norm(x, layer.input_layernorm), ctx), layer.post_attention_layernorm);
      x = add_norm(x, mlp(layer, norm(x, layer.pre_feedforward_layernorm), ctx), layer.post_feedforward_layernorm);
      return;
    case NormTopology::kPost:
      // Post-LN (Vaswani et al. 2017; Xiong et al. 2020, Table 1 left): x = Norm(x + F(x)).
      x = norm(x + attention(layer, x, ctx), layer.post_attention_layernorm);
      x = norm(x + mlp(layer, x, ctx), layer.post_feedforward_layernorm);
      return;
    case NormTopology::kDeepNorm: {
      // DeepNet (Wang et al. 2022, arXiv 2203.00555, DeepNorm and its Figure 2 constants): x = LN(alpha x + G(x)),
      // decoder-only alpha = (2N)^(1/4) with N = layers (beta is an init scale: random_init).
      const double alpha = config_.deepnorm_alpha();
      x = norm(x * alpha + attention(layer, x, ctx), layer.post_attention_layernorm);
      x = norm(x * alpha + mlp(layer, x, ctx), layer.post_feedforward_layernorm);
      return;
    }
    case NormTopology::kHybrid: {
      // HybridNorm (Zhuo et al. 2025, arXiv 2503.04598, its definition of HybridNorm): QKV-norm attention (v_norm in
      // attention()), y = x + Attn(x); then Post-Norm around the MLP: h = Norm(y), out = h + MLP(h).
      at::Tensor h = norm(x + attention(layer, x, ctx), layer.pre_feedforward_layernorm);
      x = h + mlp(layer, h, ctx);
      return;
    }
    case NormTopology::kResidual: {
      // ResiDual (Xie et al. 2023, arXiv 2304.14802, its PPLN equations): per sublayer o = F(x_a); x_a = LN(x_a + o);
      // x_d = x_d + o (x_d starts at 0). The end fuses x_a + LN(x_d) (last_hidden).
      at::Tensor o = attention(layer, x, ctx);
      s.dual = s.dual.defined() ? s.dual + o : o;
      x = norm(x + o, layer.post_attention_layernorm);
      o = mlp(layer, x, ctx);
      s.dual = s.dual + o;
      x = norm(x + o, layer.post_feedforward_layernorm);
      return;
    }
    case NormTopology::kSiameseHybridPre: {
      // SPEC.md section 3.1 (SiameseNorm, arXiv 2602.08064, the "hybrid_pre" block of its official code). X is
      // the bounded (post-norm-like) stream, Y the identity (pre-norm-like) one; both sublayers add c_l * O to X
      // and O to Y, with c_l = 1/sqrt(2(l+1)) (1 without depth-wise scaling).
      at::Tensor& X = s.x;
      at::Tensor& Y = s.y;
      const double c = siamese_scale(ctx.index);
      at::Tensor attn_in = norm(Y, layer.siamese_attn_pre_norm) + layer.siamese_hybrid_attn_scale * X;
      at::Tensor O = attention(layer, attn_in, ctx);
      X = X + c * O;
      Y = Y + O;
      X = norm(X, layer.pre_mlp_layernorm);
      at::Tensor fused = add_norm(X, Y, layer.siamese_mlp_pre_norm);
      O = mlp(layer, config_.siamese_normalized_input ? norm(fused, layer.siamese_mlp_input_norm) : fused, ctx);
      X = X + c * O;
      Y = Y + O;
      return;
    }
    case NormTopology::kSiamesePostPre: {
      // SPEC.md section 7 (SiameseNorm, arXiv 2602.08064: a Post-Norm stream X and a Pre-Norm stream Y
      // share each sublayer; its input fuses X with the normalised Y).
      at::Tensor& X = s.x;
      at::Tensor& Y = s.y;
      const double c = siamese_scale(ctx.index);
      at::Tensor fused = add_norm(X, Y, layer.siamese_attn_pre_norm);
      at::Tensor O =
          attention(layer, config_.siamese_normalized_input ? norm(fused, layer.siamese_attn_input_norm) : fused, ctx);
      X = norm(X + c * O, layer.post_attention_layernorm);
      Y = Y + O;
      fused = add_norm(X, Y, layer.siamese_mlp_pre_norm);
      O = mlp(layer, config_.siamese_normalized_input ? norm(fused, layer.siamese_mlp_input_norm) : fused, ctx);
      X = norm(X + c * O, layer.post_feedforward_layernorm);
      Y = Y + O;
      return;
    }
  }
  throw Error("unknown norm topology");
}

void CausalLM::record_streams(const Streams& s, const LayerContext& ctx) const {
  if (s.y.defined()) {
    ctx.record("X", s.x);
    ctx.record("Y", s.y);
    return;
  }
  ctx.record("hidden", s.x);
  if (s.dual.defined()) ctx.record("dual", s.dual);
}

at::Tensor CausalLM::last_hidden(const Streams& s, const FinalNorms& final_norms, KernelChoices kernels) const {
  const double eps = config_.rms_norm_eps;
  if (s.y.defined()) {
    return rms_norm(s.x, final_norms.siamese_post_final_layernorm, eps, kernels) +
           rms_norm(s.y, final_norms.siamese_pre_final_layernorm, eps, kernels);
  }
  if (config_.topology() == NormTopology::kResidual) {
    // With no layers the dual stream is still 0.
    if (!s.dual.defined()) return s.x + rms_norm(at::zeros_like(s.x), final_norms.residual_dual_norm, eps, kernels);
    return s.x + rms_norm(s.dual, final_norms.residual_dual_norm, eps, kernels);
  }
  return s.x;
}

double CausalLM::siamese_scale(int64_t layer) const {
  return config_.siamese_depth_scaling ? 1.0 / std::sqrt(2.0 * static_cast<double>(layer + 1)) : 1.0;
}

}  // namespace archspace
