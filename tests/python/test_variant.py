"""The siamese_depth variant: the engine against the archs/ remote code, the switches, generate() with
cache, and strict keyspaces.

Tolerance: tolerances.forward_bound in fp32 on the CPU (as for the base model: two computations of the same
forward differ by the summation order of their kernels). On failure the message names the first named
activation (model/trace.h) where the engine and the remote code part.
"""
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import (engine_logits, hf_logits, run_cli, save_random_olmo3, save_random_variant,
                      tiny_olmo3_config, variant_config_dict)
from tolerances import activation_bound, forward_bound
from trace_reference import explain_logit_difference

SEQ = 20  # > sliding_window (6)

SWITCHES = [(True, True), (True, False), (False, True), (False, False)]
HEADS = {"mha": dict(num_attention_heads=4, num_key_value_heads=4), "gqa": dict(num_attention_heads=4, num_key_value_heads=2)}


@pytest.mark.parametrize("siamese,depth", SWITCHES)
@pytest.mark.parametrize("heads", sorted(HEADS))
def test_engine_equals_remote_code(siamese, depth, heads, tmp_path, rng):
    model = save_random_variant(tmp_path / "m", use_siamese_norm=siamese, use_depth_attention=depth, **HEADS[heads])
    tokens = rng.integers(0, 96, SEQ).tolist()
    expected = hf_logits(model, tokens)
    for attention in ("sdpa", "reference"):
        got = engine_logits(tmp_path / "m", tokens, tmp_path, "--attention", attention)
        diff = np.abs(got - expected).max()
        assert diff <= forward_bound(model, SEQ), (
            f"siamese={siamese} depth={depth} {heads} {attention}: {diff:.3g}; " + explain_logit_difference(
                tmp_path / "m", model, tokens, tmp_path, activation_bound(model, SEQ), "--attention", attention))


@pytest.mark.parametrize("overrides", [
    dict(depth_attention_stride=3, depth_attention_recent_window=1),  # sources {0, 3, ...} plus the layer below
    dict(depth_attention_stride=8, num_hidden_layers=12),  # the published stride: layers 9..11 read 0 and 8
    dict(head_dim=24, num_attention_heads=8, num_key_value_heads=2),  # GQA 4:1, head_dim != d/H
])
def test_engine_equals_remote_code_more_shapes(overrides, tmp_path, rng):
    model = save_random_variant(tmp_path / "m", **overrides)
    tokens = rng.integers(0, 96, SEQ).tolist()
    assert np.abs(engine_logits(tmp_path / "m", tokens, tmp_path) - hf_logits(model, tokens)).max() <= forward_bound(model, SEQ), \
        explain_logit_difference(tmp_path / "m", model, tokens, tmp_path, activation_bound(model, SEQ))


def test_depth_attention_changes_the_output(tmp_path, rng):
    """The cases above would pass trivially if mixing did nothing: the switch must matter."""
    tokens = rng.integers(0, 96, SEQ).tolist()
    on = save_random_variant(tmp_path / "on", use_depth_attention=True)
    off = save_random_variant(tmp_path / "off", use_depth_attention=False)
    assert np.abs(hf_logits(on, tokens) - hf_logits(off, tokens)).max() > 1e-2


def test_both_switches_off_equals_olmo3(tmp_path, rng):
    """SPEC.md: with both switches off the variant equals base bit for bit on the same weights."""
    from transformers import Olmo3ForCausalLM

    variant = save_random_variant(tmp_path / "v", use_siamese_norm=False, use_depth_attention=False)
    cfg = variant_config_dict(use_siamese_norm=False, use_depth_attention=False)
    base_cfg = tiny_olmo3_config(
        num_hidden_layers=cfg["num_hidden_layers"], num_key_value_heads=cfg["num_key_value_heads"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "full_attention": {"rope_theta": 500000.0, **cfg["rope_scaling"]}})
    base = Olmo3ForCausalLM(base_cfg).eval()
    base.load_state_dict(variant.state_dict(), strict=True)
    base.save_pretrained(tmp_path / "b")
    tokens = rng.integers(0, 96, SEQ).tolist()
    assert np.array_equal(hf_logits(variant, tokens), hf_logits(base, tokens))
    assert np.array_equal(engine_logits(tmp_path / "v", tokens, tmp_path), engine_logits(tmp_path / "b", tokens, tmp_path))
    assert np.abs(engine_logits(tmp_path / "v", tokens, tmp_path) - hf_logits(base, tokens)).max() <= forward_bound(base, SEQ)


@pytest.mark.parametrize("siamese,depth", [(True, True), (False, True)])
def test_generate_with_cache_equals_full_forward(siamese, depth, tmp_path):
    """The KV cache holds mixed values: cached greedy decoding equals re-running the whole sequence."""
    model = save_random_variant(tmp_path / "m", use_siamese_norm=siamese, use_depth_attention=depth)
    prompt = torch.tensor([[5, 17, 33, 2, 64, 9, 41, 12, 70, 3]])
    step_lengths = []  # prove that decoding really runs one new token at a time against the cache
    hook = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: step_lengths.append((kwargs.get("input_ids", args[0] if args else None)).shape[1]),
        with_kwargs=True)
    out = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=1, eos_token_id=None)
    hook.remove()
    assert step_lengths[0] == 10 and set(step_lengths[1:]) == {1}, step_lengths
    sequence = out.sequences[0].tolist()
    assert len(sequence) == 20  # prompt + 10: well past the window of 6
    with torch.no_grad():
        for step, logits in enumerate(out.logits):
            prefix = torch.tensor([sequence[: prompt.shape[1] + step]])
            full = model(prefix, use_cache=False).logits[0, -1]
            # cached decoding and the full forward: the same maths in other orders, at this prefix's length
            assert torch.abs(full - logits[0]).max().item() <= forward_bound(model, prefix.shape[1]), f"step {step}"
            assert int(full.argmax()) == sequence[prompt.shape[1] + step]


def test_remote_code_loads_through_auto_classes(tmp_path, rng):
    from transformers import AutoModel, AutoModelForCausalLM

    model = save_random_variant(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True).eval()
    tokens = rng.integers(0, 96, SEQ).tolist()
    assert np.array_equal(hf_logits(loaded, tokens), hf_logits(model, tokens))
    backbone = AutoModel.from_pretrained(tmp_path / "m", trust_remote_code=True)
    assert type(backbone).__name__ == "Olmo3SiameseDepthModel"


def test_engine_info_on_variant(tmp_path):
    save_random_variant(tmp_path / "m", depth_attention_recent_window=1)
    out = run_cli("info", tmp_path / "m").stdout
    assert "siamese_depth" in out
    assert "on (hybrid_pre)" in out and "stride 2, recent window 1" in out


# ---- strict keyspaces -----------------------------------------------------------------------------


def test_base_checkpoint_as_variant_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    save_random_olmo3(tiny_olmo3_config(num_hidden_layers=7, num_key_value_heads=2), tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps(variant_config_dict()))
    result = run_cli("logits", "--model", tmp_path / "m", "--tokens", "1 2", "--out", tmp_path / "x", check=False)
    assert result.returncode == 1
    for fragment in ("siamese_depth", "missing", "model.layers.0.siamese_hybrid_attn_scale",
                     "model.siamese_pre_final_layernorm.weight", "unexpected", "model.layers.6.post_attention_layernorm.weight"):
        assert fragment in result.stderr, result.stderr
    shutil.copy(tmp_path / "m" / "config.json", tmp_path / "config.json")
    from conftest import install_remote_code

    install_remote_code(tmp_path / "m")
    with pytest.raises(ValueError) as err:
        AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True)
    assert "missing" in str(err.value) and "model.layers.0.siamese_hybrid_attn_scale" in str(err.value)
    assert "model.layers.0.post_attention_layernorm.weight" in str(err.value)


def test_variant_checkpoint_as_base_is_refused(tmp_path):
    save_random_variant(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["model_type"] = "olmo3"
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    result = run_cli("logits", "--model", tmp_path / "m", "--tokens", "1 2", "--out", tmp_path / "x", check=False)
    assert result.returncode == 1
    for fragment in ("base (olmo3)", "missing", "model.layers.0.post_feedforward_layernorm.weight",
                     "unexpected", "model.layers.3.siamese_mlp_input_norm.weight", "model.siamese_post_final_layernorm.weight"):
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("stage", ["stage2", "stage4"])
def test_published_config_layout_loads(stage, tmp_path, rng):
    """A directory carrying a published ArchSpace config.json (every field kept, only the sizes shrunk)
    plus matching weights loads in the engine and in the remote code, and both agree."""
    from conftest import REPO, install_remote_code
    from transformers import AutoModelForCausalLM

    cfg = json.loads((REPO / "tests" / "data" / f"archspace-1b-siamese-depth-{stage}.config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
               vocab_size=128, padded_vocab_size=128, true_vocab_size=128, pad_token_id=1, eos_token_id=0,
               sliding_window=6)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    run_cli("init", "--config", tmp_path / "config.json", "--out", tmp_path / "m", "--seed", "1")
    install_remote_code(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True).eval()
    assert model.config.depth_attention_stride == 8 and len(model.model.layers) == 16
    tokens = rng.integers(0, 128, SEQ).tolist()
    assert np.abs(engine_logits(tmp_path / "m", tokens, tmp_path) - hf_logits(model, tokens)).max() <= forward_bound(model, SEQ), \
        explain_logit_difference(tmp_path / "m", model, tokens, tmp_path, activation_bound(model, SEQ))
