// The block of each normalization topology (SPEC.md section 7) and which norms each has. Equations are
// cited per topology; the independent reference in tests/python/topology_reference.py is written from the
// same papers, not from this file.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "archspace/model/causal_lm.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

using N = BlockNorms;
using Member = at::Tensor N::*;

// The block norms of each topology, in checkpoint order (SPEC.md section 7, "norms per layer").
std::vector<Member> topology_norms(NormTopology t) {
  switch (t) {
    case NormTopology::kReordered:
    case NormTopology::kPost:
    case NormTopology::kDeepNorm:
    case NormTopology::kResidual:
      return {&N::post_attention_layernorm, &N::post_feedforward_layernorm};
    case NormTopology::kPre:
      return {&N::input_layernorm, &N::pre_feedforward_layernorm};
    case NormTopology::kPeri:
      return {&N::input_layernorm, &N::post_attention_layernorm, &N::pre_feedforward_layernorm,
              &N::post_feedforward_layernorm};
    case NormTopology::kHybrid:
      return {&N::v_norm, &N::pre_feedforward_layernorm};
    case NormTopology::kSiameseHybridPre:  // the order of the published checkpoints
      return {&N::pre_mlp_layernorm, &N::siamese_attn_pre_norm, &N::siamese_mlp_pre_norm, &N::siamese_mlp_input_norm,
              &N::siamese_hybrid_attn_scale};
    case NormTopology::kSiamesePostPre:
      return {&N::siamese_attn_pre_norm, &N::siamese_attn_input_norm, &N::post_attention_layernorm,
              &N::siamese_mlp_pre_norm,  &N::siamese_mlp_input_norm,  &N::post_feedforward_layernorm};
  }
  throw Error("unknown norm topology");
}

const ParamRow<BlockNorms>* row_of(Member member) {
  for (const auto& row : param_tables::kBlockNormRows) {
    if (row.member == member) return &row;
  }
  throw Error("no parameter row for a block norm");
}

}  // namespace

std::vector<const ParamRow<BlockNorms>*> block_norm_rows(const ModelConfig& c) {
  std::vector<const ParamRow<BlockNorms>*> rows;
  for (Member m : topology_norms(c.topology())) {
    // The normalized-input ablation: the sublayer reads the fused sum directly, so its norm does not exist.
    if (!c.siamese_normalized_input && (m == &N::siamese_attn_input_norm || m == &N::siamese_mlp_input_norm)) continue;
    rows.push_back(row_of(m));
  }
  return rows;
}

std::vector<const ParamRow<FinalNorms>*> final_norm_rows(const ModelConfig& c) {
  const auto& rows = param_tables::kFinalNormRows;
  const NormTopology t = c.topology();
  if (is_siamese(t)) return {&rows[0], &rows[1]};
  if (t == NormTopology::kResidual) return {&rows[2]};
  return {};
}

CausalLM::Streams CausalLM::initial_streams(const at::Tensor& embeddings) const {
  Streams s;
  s.x = embeddings;
  if (is_siamese(config_.topology())) s.y = embeddings;  // X_0 = Y_0 = embedding
  return s;
}

void CausalLM::block(const BlockWeights& layer, Streams& s, const LayerContext& ctx) const {
  const double eps = config_.rms_norm_eps;
  auto norm = [eps](const at::Tensor& x, const at::Tensor& w) { return rms_norm(x, w, eps); };
  // r + norm(x, w) (one pass in inference on the CPU)
  auto add_norm = [eps](const at::Tensor& r, const at::Tensor& x, const at::Tensor& w) {
    return add_rms_norm(r, x, w, eps);
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

at::Tensor CausalLM::last_hidden(const Streams& s, const FinalNorms& final_norms) const {
  const double eps = config_.rms_norm_eps;
  if (s.y.defined()) {
    return rms_norm(s.x, final_norms.siamese_post_final_layernorm, eps) +
           rms_norm(s.y, final_norms.siamese_pre_final_layernorm, eps);
  }
  if (config_.topology() == NormTopology::kResidual) {
    // With no layers the dual stream is still 0.
    if (!s.dual.defined()) return s.x + rms_norm(at::zeros_like(s.x), final_norms.residual_dual_norm, eps);
    return s.x + rms_norm(s.dual, final_norms.residual_dual_norm, eps);
  }
  return s.x;
}

double CausalLM::siamese_scale(int64_t layer) const {
  return config_.siamese_depth_scaling ? 1.0 / std::sqrt(2.0 * static_cast<double>(layer + 1)) : 1.0;
}

}  // namespace archspace
