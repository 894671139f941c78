"""model.init / `archspace init --init` against the field trainers' own initialisations, per tensor family:

- olmo-core: OLMo-core 3.0's Transformer (TransformerConfig.olmo3_30M, InitMethod.normal as its OLMo 3 configs use)
  built and initialised by its own init_weights, beside `archspace init --init olmo-core` of the same shape;
- megatron: Megatron-Core's own init functions (megatron/core/utils.py init_method_normal(0.02) and
  scaled_init_method_normal(0.02, layers), as its TransformerConfig applies them) on tensors of the engine's shapes.

Each family (embedding, q/k/v, attention output, gate/up, down, LM head) is a two-sample Kolmogorov-Smirnov test of
100,000 values drawn from each side at level 1e-4: with 6 families against each of the two references the chance
that a correct init fails is at most 12 x 1e-4 = 1.2e-3 (Bonferroni). The norms are exactly 1 on both sides. The
tests can fail: Megatron's scaled output projections (std 0.02 / sqrt(8)) against OLMo-core's are rejected, and the
truncation (|w| <= 3 std exactly, from the arithmetic) is checked where KS at this size cannot see 0.27% of mass.
"""
import json
import math

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import run_cli, tiny_olmo3_config

LAYERS, D, HEADS, FFN, VOCAB = 4, 256, 8, 768, 4096
ALPHA = 1e-4
SAMPLE = 100_000

# engine name suffix -> OLMo-core name suffix, per family
FAMILIES = {
    "embedding": (["model.embed_tokens.weight"], ["embeddings.weight"]),
    "qkv": ([".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight"],
            [".attention.w_q.weight", ".attention.w_k.weight", ".attention.w_v.weight"]),
    "attention_output": ([".self_attn.o_proj.weight"], [".attention.w_out.weight"]),
    "gate_up": ([".mlp.gate_proj.weight", ".mlp.up_proj.weight"], [".feed_forward.w1.weight", ".feed_forward.w3.weight"]),
    "down": ([".mlp.down_proj.weight"], [".feed_forward.w2.weight"]),
    "head": (["lm_head.weight"], ["lm_head.w_out.weight"]),
}


def family_values(named, suffixes, seed):
    values = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for n, v in named.items()
                             if any(n.endswith(s) for s in suffixes)])
    return np.random.default_rng(seed).choice(values, size=min(SAMPLE, values.size), replace=False)


def engine_init(tmp_path, scheme, seed=1):
    config = tiny_olmo3_config(vocab_size=VOCAB, hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, num_key_value_heads=HEADS)
    (tmp_path / "cfg").mkdir(exist_ok=True)
    config.to_json_file(str(tmp_path / "cfg" / "config.json"))
    out = tmp_path / f"init-{scheme}"
    run_cli("init", "--config", tmp_path / "cfg" / "config.json", "--out", out, "--init", scheme, "--seed", str(seed))
    return load_file(str(out / "model.safetensors"))


def olmo_core_init():
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    config = TransformerConfig.olmo3_30M(vocab_size=VOCAB, attn_backend=AttentionBackendName.torch)
    assert (config.d_model, config.n_layers) == (D, LAYERS)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    named = {n: p.detach().numpy() for n, p in model.named_parameters()}
    assert named["blocks.0.feed_forward.w1.weight"].shape == (FFN, D)  # the same shapes as the engine's
    return named


def megatron_init(engine):
    """Megatron's own init functions on tensors of the engine's shapes: output projections scaled, the rest 0.02."""
    from megatron.core.utils import init_method_normal, scaled_init_method_normal

    torch.manual_seed(0)
    plain, scaled = init_method_normal(0.02), scaled_init_method_normal(0.02, LAYERS)
    out = {}
    for name, value in engine.items():
        t = torch.empty(value.shape)
        if value.ndim == 1:
            t.fill_(1.0)
        else:
            (scaled if name.endswith((".o_proj.weight", ".down_proj.weight")) else plain)(t)
        out[name] = t.numpy()
    return out


def ks_pvalue(a, b):
    from scipy.stats import ks_2samp

    return ks_2samp(a, b).pvalue


def test_olmo_core_init_is_olmo_cores(tmp_path):
    engine, reference = engine_init(tmp_path, "olmo-core"), olmo_core_init()
    for family, (ours, theirs) in FAMILIES.items():
        a, b = family_values(engine, ours, 0), family_values(reference, theirs, 1)
        assert ks_pvalue(a, b) > ALPHA, family
        assert np.abs(a).max() <= 3 * 0.02 * (1 + 1e-6), family  # truncated at 3 std (rounding of the clamp)
    norms = [v for n, v in engine.items() if v.ndim == 1]
    assert norms and all((v == 1).all() for v in norms)
    # The test can tell inits apart: Megatron's scaled output projection is not OLMo-core's.
    megatron = engine_init(tmp_path, "megatron")
    ours, theirs = FAMILIES["attention_output"]
    assert ks_pvalue(family_values(megatron, ours, 0), family_values(reference, theirs, 1)) < ALPHA


def test_megatron_init_is_megatrons(tmp_path):
    engine = engine_init(tmp_path, "megatron", seed=2)
    reference = megatron_init(engine)
    for family, (ours, _) in FAMILIES.items():
        assert ks_pvalue(family_values(engine, ours, 0), family_values(reference, ours, 1)) > ALPHA, family
    # Not truncated: about 0.27% of a normal lies beyond 3 std (binomial std ~16 of 100,000; 6 std of slack).
    a = family_values(engine, FAMILIES["qkv"][0], 3)
    beyond = int((np.abs(a) > 3 * 0.02).sum())
    expected = SAMPLE * math.erfc(3 / math.sqrt(2))
    assert abs(beyond - expected) <= 6 * math.sqrt(expected), (beyond, expected)
    # Output projections at 0.02 / sqrt(2 x layers): their sample std within 1% (std of a std estimate ~0.2%).
    down = family_values(engine, FAMILIES["down"][0], 4)
    assert abs(down.std() / (0.02 / math.sqrt(2 * LAYERS)) - 1) < 0.01


def test_train_init_key(tmp_path):
    """model.init reaches training from scratch; with model.init_from it is refused (the weights come from there)."""
    from test_recipes import schedule_toml

    config = schedule_toml(tmp_path)
    got = run_cli("schedule", "--config", config, "--set", "model.init=megatron", "--json", check=False)
    assert got.returncode == 0, got.stderr
    text = config.read_text().replace('preset = "micro"', f'init_from = "{tmp_path}"\ninit = "megatron"')
    config.write_text(text)
    bad = run_cli("schedule", "--config", config, "--json", check=False)
    assert bad.returncode != 0 and "model.init' applies to a model trained from scratch" in bad.stderr, bad.stderr
