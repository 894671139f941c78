// Which norms each normalization topology has (SPEC.md section 7), as parameter rows: what the checkpoint of a
// topology holds. The block each topology runs is in block.cpp.
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

}  // namespace archspace
