"""`archspace logits` equals transformers' Olmo3ForCausalLM on random tiny fp32 models.

Tolerance: tolerances.forward_bound, the fp32 rounding two computations of the same forward in different
summation orders can differ by (matmul and softmax kernels, blocking). On failure the message names the
first named activation (model/trace.h) where the engine and transformers part.
"""
import numpy as np
import pytest

from conftest import engine_logits, hf_logits, save_random_olmo3, tiny_olmo3_config
from tolerances import activation_bound, forward_bound
from trace_reference import explain_logit_difference

SEQ = 20  # longer than the sliding window (6) so sliding and full layers differ


CASES = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "gqa_4_to_1": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64),
    "head_dim_unequal": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24),
    "yarn_full_layers": dict(
        num_key_value_heads=2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 8192,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        },
    ),
    "yarn_head_dim_32_theta_10000": dict(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path, rng):
    config = tiny_olmo3_config(**CASES[case])
    model = save_random_olmo3(config, tmp_path / "model")
    tokens = rng.integers(0, config.vocab_size, SEQ).tolist()
    expected = hf_logits(model, tokens)
    bound = forward_bound(model, SEQ)
    for attention in ("sdpa", "reference"):
        got = engine_logits(tmp_path / "model", tokens, tmp_path, "--attention", attention)
        assert got.shape == expected.shape
        diff = np.abs(got - expected).max()
        assert diff <= bound, (f"{case}/{attention}: max abs diff {diff:.3g} > {bound:.3g}; " + explain_logit_difference(
            tmp_path / "model", model, tokens, tmp_path, activation_bound(model, SEQ), "--attention", attention))


def test_window_matters(tmp_path, rng):
    """The cases above only mean something if sliding and full layers really differ at this length."""
    config = tiny_olmo3_config(num_key_value_heads=2)
    model = save_random_olmo3(config, tmp_path / "a")
    wide = tiny_olmo3_config(num_key_value_heads=2, sliding_window=SEQ + 1)
    from transformers import Olmo3ForCausalLM
    import torch

    other = Olmo3ForCausalLM(wide).eval()
    other.load_state_dict(model.state_dict())
    tokens = rng.integers(0, config.vocab_size, SEQ).tolist()
    narrow_logits, wide_logits = hf_logits(model, tokens), hf_logits(other, tokens)
    # Positions inside the window agree (the same maths, other masks and kernels); later ones differ.
    assert np.abs(narrow_logits[:6] - wide_logits[:6]).max() <= forward_bound(model, 6)
    assert np.abs(narrow_logits[6:] - wide_logits[6:]).max() > 1e-3


def test_reference_keeps_sliding_layers_plain():
    """SPEC.md section 1: YaRN never applies to sliding layers. The pinned transformers must agree before
    it can serve as the reference for the YaRN cases above."""
    import torch
    from transformers import Olmo3ForCausalLM

    config = tiny_olmo3_config(**CASES["yarn_full_layers"])
    rotary = Olmo3ForCausalLM(config).model.rotary_emb
    dim = config.hidden_size // config.num_attention_heads
    plain = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    assert torch.equal(rotary.sliding_attention_inv_freq, plain)
    assert rotary.sliding_attention_attention_scaling == 1.0
    assert not torch.equal(rotary.full_attention_inv_freq, plain)
    assert rotary.full_attention_attention_scaling > 1.0


def test_legacy_rope_scaling_config(tmp_path, rng):
    """ArchSpace checkpoints carry the transformers 4.x form (rope_theta + rope_scaling, no head_dim);
    the engine reads it as the same model as the 5.x rope_parameters form."""
    import json

    case = CASES["yarn_full_layers"]
    config = tiny_olmo3_config(**case)
    model = save_random_olmo3(config, tmp_path / "model")
    cfg_path = tmp_path / "model" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    full = case["rope_parameters"]["full_attention"]
    cfg.pop("rope_parameters")
    cfg["rope_theta"] = full["rope_theta"]
    cfg["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
    cfg_path.write_text(json.dumps(cfg))
    tokens = rng.integers(0, config.vocab_size, SEQ).tolist()
    got = engine_logits(tmp_path / "model", tokens, tmp_path)
    assert np.abs(got - hf_logits(model, tokens)).max() <= forward_bound(model, len(tokens)), \
        explain_logit_difference(tmp_path / "model", model, tokens, tmp_path, activation_bound(model, len(tokens)))
