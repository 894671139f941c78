"""Configuration of OLMo 3 + SiameseNorm + Depth-Attention (archspace SPEC.md sections 3.3 and 7).

Olmo3Config plus the variant's switches; every Olmo3Config field keeps its meaning. Written for
transformers 5 (configs are dataclasses there: fields are declared, not passed through __init__).
`norm_topology` picks the block's normalization topology (SPEC.md section 7); without it,
`use_siamese_norm` picks siamese_hybrid_pre (or, with siamese_norm_variant "post_pre", siamese_post_pre)
or reordered, as in configs written before the field existed.
"""
from transformers.models.olmo3.configuration_olmo3 import Olmo3Config

NORM_TOPOLOGIES = ("reordered", "pre", "peri", "post", "deepnorm", "hybrid", "residual",
                   "siamese_hybrid_pre", "siamese_post_pre")


class Olmo3SiameseDepthConfig(Olmo3Config):
    model_type = "olmo3_siamese_depth"

    use_siamese_norm: bool | None = None  # two residual streams; off: the Olmo3 block. None: follows norm_topology (else on)
    use_depth_attention: bool = True  # cross-layer value mixing inside attention; off: plain values
    siamese_norm_variant: str = "hybrid_pre"  # or "post_pre"
    norm_topology: str | None = None  # one of NORM_TOPOLOGIES; None: from use_siamese_norm and siamese_norm_variant
    siamese_depth_scaling: bool = True  # SiameseNorm ablation: False sets c_l = 1
    siamese_normalized_input: bool = True  # SiameseNorm ablation: False drops the fused-input norms
    depth_attention_stride: int = 8  # layers 0, stride, 2*stride, ... are sources for later layers
    depth_attention_recent_window: int = 0  # plus the last `recent_window` layers below
    qk_norm: bool = True
    qk_norm_mode: str = "full_projection"
    padded_vocab_size: int | None = None  # training-side vocabulary padding; checkpoints hold vocab_size rows
    true_vocab_size: int | None = None
    vocab_z_loss_coeff: float = 1e-5
    truncated_normal_factor: float = 3.0

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.siamese_norm_variant not in ("hybrid_pre", "post_pre"):
            raise ValueError(f"siamese_norm_variant={self.siamese_norm_variant!r}: 'hybrid_pre' or 'post_pre'")
        topology = self.resolved_norm_topology()
        if topology not in NORM_TOPOLOGIES:
            raise ValueError(f"norm_topology={topology!r}: valid are {', '.join(NORM_TOPOLOGIES)}")
        siamese = topology.startswith("siamese_")
        if self.use_siamese_norm is None:
            self.use_siamese_norm = siamese
        if self.use_siamese_norm != siamese:
            raise ValueError(f"use_siamese_norm={self.use_siamese_norm} contradicts norm_topology={topology!r}")
        if siamese and self.siamese_norm_variant != topology[len("siamese_"):]:
            if self.siamese_norm_variant != "hybrid_pre":  # the default: follow the topology
                raise ValueError(f"siamese_norm_variant={self.siamese_norm_variant!r} contradicts "
                                 f"norm_topology={topology!r}")
            self.siamese_norm_variant = topology[len("siamese_"):]
        if not siamese and not (self.siamese_depth_scaling and self.siamese_normalized_input):
            raise ValueError("siamese_depth_scaling / siamese_normalized_input apply to the siamese_* topologies only")
        if self.depth_attention_stride < 1 or self.depth_attention_recent_window < 0:
            raise ValueError("depth_attention_stride must be >= 1 and depth_attention_recent_window >= 0")
        if not self.qk_norm or self.qk_norm_mode != "full_projection":
            raise ValueError("OLMo 3 normalises q and k over the full projection width")

    def resolved_norm_topology(self):
        """norm_topology, or for configs without it (left unset, so they save as they were): reordered when
        use_siamese_norm is false, else the siamese topology siamese_norm_variant names."""
        if self.norm_topology is not None:
            return self.norm_topology
        if self.use_siamese_norm is False:
            return "reordered"
        return "siamese_" + self.siamese_norm_variant


__all__ = ["Olmo3SiameseDepthConfig"]
