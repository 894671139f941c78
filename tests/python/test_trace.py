"""Named activations: the engine's trace (`archspace trace`) equals transformers' (base, through hooks) and
the remote code's (variant, capture_activations) tensor by tensor, and a planted difference is reported
at the tensor where it enters.

Tolerance: tolerances.activation_bound per tensor in fp32: both sides run the same fp32 operations in
other summation orders, so each tensor is within twice gamma(the forward's chain of roundings) of its own
largest magnitude, and the logits within forward_bound.
"""
import numpy as np
import pytest
import torch

from conftest import (engine_logits, hf_logits, save_random_olmo3, save_random_variant, tiny_olmo3_config,
                      variant_config_dict)
from tolerances import activation_bound, forward_bound
from trace_reference import activation_names, engine_trace, explain_logit_difference, first_difference, reference_trace

SEQ = 20  # > sliding_window (6): sliding and full layers differ
BASE_CASES = {
    "gqa": dict(num_key_value_heads=2),
    "yarn_head_dim_24": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                           "original_max_position_embeddings": 8192}}),
}


@pytest.mark.parametrize("case", sorted(BASE_CASES))
def test_base_traces_agree_tensor_by_tensor(case, tmp_path, rng):
    config = tiny_olmo3_config(**BASE_CASES[case])
    model = save_random_olmo3(config, tmp_path / "m")
    tokens = rng.integers(0, config.vocab_size, SEQ).tolist()
    reference = reference_trace(model, tokens)
    assert list(reference) == activation_names(config.num_hidden_layers) + ["logits"]  # forward order
    for attention in ("sdpa", "reference"):
        engine = engine_trace(tmp_path / "m", tokens, tmp_path, "--attention", attention)
        assert sorted(engine) == sorted(reference)
        assert first_difference(engine, reference, activation_bound(model, SEQ)) is None, attention


@pytest.mark.parametrize("siamese,depth", [(True, True), (True, False), (False, True), (False, False)])
def test_variant_traces_agree_tensor_by_tensor(siamese, depth, tmp_path, rng):
    model = save_random_variant(tmp_path / "m", use_siamese_norm=siamese, use_depth_attention=depth)
    tokens = rng.integers(0, 96, SEQ).tolist()
    reference = reference_trace(model, tokens)
    assert list(reference) == activation_names(model.config.num_hidden_layers, siamese, depth) + ["logits"]
    engine = engine_trace(tmp_path / "m", tokens, tmp_path, "--attention", "reference")
    assert first_difference(engine, reference, activation_bound(model, SEQ)) is None
    # The documented layouts: q [B, H, T, D], k and v [B, G, T, D] (4 query heads, 2 kv heads, D 16).
    assert engine["model.layers.3.q"].shape == (1, 4, SEQ, 16)
    assert engine["model.layers.3.k"].shape == engine["model.layers.3.v"].shape == (1, 2, SEQ, 16)


def test_hooks_on_olmo3_equal_the_remote_codes_own_recording(tmp_path, rng):
    """The hook-based helper for transformers' Olmo3 (q, k recomputed with RoPE) against the variant with
    both switches off, which records in its own code and is Olmo3 exactly: the same tensors, bit for bit."""
    from transformers import Olmo3ForCausalLM

    variant = save_random_variant(tmp_path / "v", use_siamese_norm=False, use_depth_attention=False)
    cfg = variant.config
    base = Olmo3ForCausalLM(tiny_olmo3_config(
        num_hidden_layers=cfg.num_hidden_layers, num_key_value_heads=cfg.num_key_value_heads,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "full_attention": {"rope_theta": 500000.0, **variant_config_dict()["rope_scaling"]}})).eval()
    base.load_state_dict(variant.state_dict(), strict=True)
    tokens = rng.integers(0, 96, SEQ).tolist()
    hooked, recorded = reference_trace(base, tokens), reference_trace(variant, tokens)
    assert list(hooked) == list(recorded)
    for name in recorded:
        assert np.array_equal(hooked[name], recorded[name]), name


def test_capturing_leaves_the_remote_code_output_unchanged(tmp_path, rng):
    model = save_random_variant(tmp_path / "m")
    tokens = rng.integers(0, 96, SEQ).tolist()
    assert np.array_equal(reference_trace(model, tokens)["logits"][0], hf_logits(model, tokens))


@pytest.mark.parametrize("kind", ["base", "variant"])
def test_a_planted_difference_is_named_where_it_enters(kind, tmp_path, rng):
    """Scale one norm weight of layer 1 on the transformers side only (the engine reads the saved
    weights): the logits then differ, and the report must name the first tensor that norm feeds."""
    if kind == "base":
        model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "m")
        norm, expected = model.model.layers[1].self_attn.k_norm, "model.layers.1.k"
    else:
        model = save_random_variant(tmp_path / "m")
        norm, expected = model.model.layers[1].siamese_mlp_input_norm, "model.layers.1.mlp_output"
    tokens = rng.integers(0, 96, SEQ).tolist()
    with torch.no_grad():
        norm.weight.mul_(1.5)
    assert np.abs(engine_logits(tmp_path / "m", tokens, tmp_path) - hf_logits(model, tokens)).max() > forward_bound(model, SEQ)
    message = explain_logit_difference(tmp_path / "m", model, tokens, tmp_path, activation_bound(model, SEQ))
    assert message.startswith(f"first difference: {expected} (max abs diff "), message


def test_first_difference_reports_missing_and_misshaped_tensors():
    a = {"x": np.zeros((1, 2)), "y": np.zeros((1, 3))}
    assert first_difference(a, dict(a), 1e-4) is None
    assert first_difference({"x": a["x"]}, a, 1e-4) == "first difference: y (missing from the engine's trace)"
    assert first_difference({**a, "z": a["x"]}, a, 1e-4) == "first difference: z (missing from the reference trace)"
    assert first_difference({**a, "x": np.zeros((2, 1))}, a, 1e-4).startswith("first difference: x (shape")
    assert first_difference({**a, "x": np.full((1, 2), np.nan)}, a, 1e-4).startswith("first difference: x (max abs diff nan")
