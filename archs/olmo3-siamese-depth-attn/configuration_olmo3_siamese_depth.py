"""Configuration of OLMo 3 + SiameseNorm + Depth-Attention (archspace SPEC.md section 3.3).

Olmo3Config plus the variant's switches; every Olmo3Config field keeps its meaning. Written for
transformers 5 (configs are dataclasses there: fields are declared, not passed through __init__).
"""
from transformers.models.olmo3.configuration_olmo3 import Olmo3Config


class Olmo3SiameseDepthConfig(Olmo3Config):
    model_type = "olmo3_siamese_depth"

    use_siamese_norm: bool = True  # two residual streams ("hybrid_pre"); off: the Olmo3 block
    use_depth_attention: bool = True  # cross-layer value mixing inside attention; off: plain values
    siamese_norm_variant: str = "hybrid_pre"
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
        if self.siamese_norm_variant != "hybrid_pre":
            raise ValueError(f"siamese_norm_variant={self.siamese_norm_variant!r}: only 'hybrid_pre' is defined")
        if self.depth_attention_stride < 1 or self.depth_attention_recent_window < 0:
            raise ValueError("depth_attention_stride must be >= 1 and depth_attention_recent_window >= 0")
        if not self.qk_norm or self.qk_norm_mode != "full_projection":
            raise ValueError("OLMo 3 normalises q and k over the full projection width")


__all__ = ["Olmo3SiameseDepthConfig"]
