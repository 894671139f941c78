"""Normalization topologies (SPEC.md section 7): the engine and the archs/ remote code, each against the
independent reference of topology_reference.py (written from the papers' equations, cited there), with
and without Depth-Attention, plus the SiameseNorm ablations; first-step training gradients of the engine
against the reference's autograd; strict keyspaces; the CLI and TOML switches and their errors.

Tolerances (fp32, CPU): logits within tolerances.forward_bound; gradients within tolerances.gradient_bound
of the largest gradient entry: the reference computes the same maths in another operation order (einsum
attention, its own RMSNorm and RoPE), so the two differ by fp32 rounding along the forward's and the
backward's chains.
"""
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import engine_logits, hf_logits, run_cli, save_random_variant
from test_train import synthetic_tokens, write_shards, write_toml
from tolerances import activation_bound, forward_bound, gradient_bound
from topology_reference import Reference, reference_loss

SEQ = 20  # > sliding_window (6)

TOPOLOGIES = ["reordered", "pre", "peri", "post", "deepnorm", "hybrid", "residual", "siamese_hybrid_pre",
              "siamese_post_pre"]
# (topology, extra config fields): every topology, and the SiameseNorm ablations of the paper's Table 3.
CASES = [(t, {}) for t in TOPOLOGIES] + [
    (t, {ablation: False})
    for t in ("siamese_hybrid_pre", "siamese_post_pre")
    for ablation in ("siamese_depth_scaling", "siamese_normalized_input")
]


def case_id(case):
    topology, extra = case
    return topology + "".join(f"-no_{k[len('siamese_'):]}" for k in extra)


def topology_fields(topology, **extra):
    """config.json fields of a tiny variant with this topology: 4 layers, stride 2 (layers 2 and 3 mix
    values with layers 0 and 2), GQA 4/2, window 6, plain RoPE (the reference has no YaRN)."""
    siamese = topology.startswith("siamese_")
    return dict(norm_topology=topology, use_siamese_norm=siamese, num_hidden_layers=4, rope_scaling=None,
                siamese_norm_variant=topology[len("siamese_"):] if siamese else "hybrid_pre", **extra)


def reference_for(model):
    config = model.config.to_dict()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Reference(weights, config)


@pytest.mark.parametrize("depth", [True, False], ids=["depth", "nodepth"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_engine_and_remote_code_equal_the_reference(case, depth, tmp_path, rng):
    topology, extra = case
    model = save_random_variant(tmp_path / "m", use_depth_attention=depth, **topology_fields(topology, **extra))
    assert model.config.resolved_norm_topology() == topology
    tokens = rng.integers(0, 96, SEQ).tolist()
    with torch.no_grad():
        expected = reference_for(model).logits(torch.tensor([tokens]))[0].numpy()
    remote = hf_logits(model, tokens)
    engine = engine_logits(tmp_path / "m", tokens, tmp_path)
    bound = forward_bound(model, SEQ)
    assert np.abs(remote - expected).max() <= bound, f"remote code vs reference: {np.abs(remote - expected).max():.3g}"
    assert np.abs(engine - expected).max() <= bound, f"engine vs reference: {np.abs(engine - expected).max():.3g}"


def test_topologies_differ(tmp_path, rng):
    """The parity above would pass trivially if the switch did nothing: same weights where the names
    agree, different topologies, different logits."""
    tokens = torch.tensor([rng.integers(0, 96, SEQ).tolist()])
    outputs = {}
    for topology in ("reordered", "post", "deepnorm", "residual"):  # the same parameter names, other maths
        model = save_random_variant(tmp_path / topology, seed=3, **topology_fields(topology))
        outputs[topology] = hf_logits(model, tokens[0].tolist())
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert np.abs(outputs[a] - outputs[b]).max() > 1e-2, (a, b)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_first_step_gradients_equal_the_reference(case, tmp_path):
    """One training step of the engine (debug.dump_gradients_steps) against autograd through the reference,
    on the same batch: the loss is next-token cross-entropy plus z-loss, averaged over the labels."""
    topology, extra = case
    model = save_random_variant(tmp_path / "init", **topology_fields(topology, **extra))
    tokens = synthetic_tokens(200)
    write_shards(tmp_path / "shards", tokens)
    z = 1e-4
    write_toml(tmp_path / "run.toml", {
        "model": {"init_from": str(tmp_path / "init")},
        "data": {"train": str(tmp_path / "shards"), "shuffle": False},
        "train": {"run_dir": str(tmp_path / "run"), "sequence_length": 16, "micro_batch": 2, "max_steps": 1,
                  "threads": 2},
        "optim": {"z_loss": z},
        "debug": {"dump_gradients_steps": 1},
    })
    run_cli("train", "--config", tmp_path / "run.toml")
    engine = load_file(str(tmp_path / "run" / "debug" / "grads-step-000001.safetensors"))

    reference = reference_for(model)
    for w in reference.w.values():
        w.requires_grad_(True)
    ids = torch.tensor(np.asarray(tokens[:32], dtype=np.int64)).view(2, 16)
    reference_loss(reference.logits(ids), ids, z).backward()
    assert set(engine) == set(reference.w)
    worst = {n: float(np.abs(engine[n] - reference.w[n].grad.numpy()).max()) for n in engine}
    name = max(worst, key=worst.get)
    scale = max(float(w.grad.abs().max()) for w in reference.w.values())
    bound = gradient_bound(model.config, 16, 2 * 16, scale)
    assert worst[name] <= bound, f"{name}: max gradient difference {worst[name]:.3g} > {bound:.3g}"
    # The gradients are not all zero (a topology whose norms cut the graph would compare equal trivially).
    assert all(np.abs(engine[n]).max() > 0 for n in engine if "norm" in n or "scale" in n), \
        [n for n in engine if np.abs(engine[n]).max() == 0]


# ---- keyspaces, configs and switches --------------------------------------------------------------

LAYER_NORMS = {  # SPEC.md section 7, "norms per layer", as the spec lists them
    "reordered": ["post_attention_layernorm", "post_feedforward_layernorm"],
    "pre": ["input_layernorm", "pre_feedforward_layernorm"],
    "peri": ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"],
    "post": ["post_attention_layernorm", "post_feedforward_layernorm"],
    "deepnorm": ["post_attention_layernorm", "post_feedforward_layernorm"],
    "hybrid": ["self_attn.v_norm", "pre_feedforward_layernorm"],
    "residual": ["post_attention_layernorm", "post_feedforward_layernorm"],
    "siamese_hybrid_pre": ["pre_mlp_layernorm", "siamese_attn_pre_norm", "siamese_mlp_pre_norm", "siamese_mlp_input_norm"],
    "siamese_post_pre": ["siamese_attn_pre_norm", "siamese_attn_input_norm", "post_attention_layernorm",
                         "siamese_mlp_pre_norm", "siamese_mlp_input_norm", "post_feedforward_layernorm"],
}


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_topology_has_exactly_its_norms(topology, tmp_path):
    run_cli("init", "--preset", "tiny", "--variant", "siamese_depth", "--norm-topology", topology,
            "--out", tmp_path / "m")
    names = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    layer0 = {n[len("model.layers.0."):] for n in names if n.startswith("model.layers.0.")}
    norms = {n.removesuffix(".weight") for n in layer0 if "norm" in n or "scale" in n} - {"self_attn.q_norm", "self_attn.k_norm"}
    expected = set(LAYER_NORMS[topology]) | ({"siamese_hybrid_attn_scale"} if topology == "siamese_hybrid_pre" else set())
    assert norms == expected
    model_level = {n for n in names if not n.startswith("model.layers.")}
    extra = {"siamese_hybrid_pre": {"model.siamese_post_final_layernorm.weight", "model.siamese_pre_final_layernorm.weight"},
             "siamese_post_pre": {"model.siamese_post_final_layernorm.weight", "model.siamese_pre_final_layernorm.weight"},
             "residual": {"model.residual_dual_norm.weight"}}.get(topology, set())
    assert model_level == {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | extra
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["norm_topology"] == topology
    info = run_cli("info", tmp_path / "m").stdout
    assert f"norm topology:      {topology}" in info


def test_normalized_input_ablation_drops_the_fused_input_norms(tmp_path):
    run_cli("init", "--preset", "tiny", "--variant", "siamese_depth", "--norm-topology", "siamese_post_pre",
            "--no-siamese-normalized-input", "--out", tmp_path / "m")
    names = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    assert not any("siamese_attn_input_norm" in n or "siamese_mlp_input_norm" in n for n in names)
    assert "model.layers.0.siamese_attn_pre_norm.weight" in names
    assert json.loads((tmp_path / "m" / "config.json").read_text())["siamese_normalized_input"] is False


def test_deepnorm_init_scales_v_o_and_mlp_by_beta(tmp_path):
    """DeepNet's init (SPEC.md section 7): v_proj, o_proj and the MLP weights drawn with std 0.02 * beta,
    beta = (8L)^(-1/4) = 0.42 for the tiny preset's 4 layers; q_proj and k_proj keep 0.02. Each estimate
    pools >= 8192 draws (relative standard error <= 0.8%), so 5% tells 0.42 from 1 with a wide margin."""
    run_cli("init", "--preset", "tiny", "--variant", "siamese_depth", "--norm-topology", "deepnorm",
            "--out", tmp_path / "m")
    w = load_file(str(tmp_path / "m" / "model.safetensors"))
    beta = (8 * 4) ** -0.25
    # std of a normal truncated at +-3 std is 0.9866 of the untruncated one
    for name, factor in (("self_attn.q_proj", 1.0), ("self_attn.k_proj", 1.0), ("self_attn.v_proj", beta),
                         ("self_attn.o_proj", beta), ("mlp.gate_proj", beta), ("mlp.up_proj", beta),
                         ("mlp.down_proj", beta)):
        std = np.std(np.concatenate([w[f"model.layers.{l}.{name}.weight"].ravel() for l in range(4)]))
        assert abs(std / (0.02 * 0.9866 * factor) - 1) < 0.05, (name, std)
    assert "alpha 1.68179" in run_cli("info", tmp_path / "m").stdout  # (2 * 4)^(1/4)


def test_unknown_topology_lists_the_valid_ones(tmp_path):
    result = run_cli("init", "--preset", "tiny", "--variant", "siamese_depth", "--norm-topology", "sandwich",
                     "--out", tmp_path / "m", check=False)
    assert result.returncode == 1
    assert "--norm-topology" in result.stderr and "'sandwich'" in result.stderr
    for name in TOPOLOGIES:
        assert name in result.stderr


def test_topology_on_base_is_refused(tmp_path):
    result = run_cli("init", "--preset", "tiny", "--norm-topology", "pre", "--out", tmp_path / "m", check=False)
    assert result.returncode == 1 and "siamese_depth" in result.stderr and "reordered" in result.stderr
    run_cli("init", "--preset", "tiny", "--norm-topology", "reordered", "--out", tmp_path / "ok")  # base's own
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    cfg["norm_topology"] = "peri"
    (tmp_path / "ok" / "config.json").write_text(json.dumps(cfg))
    result = run_cli("info", tmp_path / "ok", check=False)
    assert result.returncode == 1 and "config.json" in result.stderr and "'norm_topology'" in result.stderr


def test_contradicting_config_fields_are_refused(tmp_path):
    save_random_variant(tmp_path / "m", **topology_fields("pre"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    for bad, fragment in ((dict(use_siamese_norm=True), "use_siamese_norm"),
                          (dict(norm_topology="prenorm"), "valid: reordered, pre, peri"),
                          (dict(siamese_depth_scaling=False), "siamese_depth_scaling"),
                          (dict(norm_topology="siamese_post_pre", use_siamese_norm=True,
                                siamese_norm_variant="hybrid_pre"), "siamese_norm_variant")):
        (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, **bad}))
        result = run_cli("info", tmp_path / "m", check=False)
        assert result.returncode == 1 and fragment in result.stderr, (bad, result.stderr)


def test_checkpoint_of_another_topology_is_refused(tmp_path):
    """Strict keyspaces: weights of one topology under a config naming another list what differs."""
    save_random_variant(tmp_path / "m", **topology_fields("pre"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "norm_topology": "peri"}))
    result = run_cli("logits", "--model", tmp_path / "m", "--tokens", "1 2", "--out", tmp_path / "x", check=False)
    assert result.returncode == 1
    assert "missing" in result.stderr and "model.layers.0.post_attention_layernorm.weight" in result.stderr


def test_toml_key_trains_the_topology(tmp_path):
    """model.norm_topology in a run's TOML (and through --set): the checkpoint has that topology."""
    write_shards(tmp_path / "shards", synthetic_tokens(400))
    write_toml(tmp_path / "run.toml", {
        "model": {"preset": "tiny", "variant": "siamese_depth", "norm_topology": "residual", "use_depth_attention": False},
        "data": {"train": str(tmp_path / "shards")},
        "train": {"run_dir": str(tmp_path / "run"), "sequence_length": 16, "micro_batch": 2, "max_steps": 2},
    })
    run_cli("train", "--config", tmp_path / "run.toml")
    final = (tmp_path / "run" / "checkpoints" / "final").read_text().strip()
    cfg = json.loads((tmp_path / "run" / "checkpoints" / final / "model" / "config.json").read_text())
    assert cfg["norm_topology"] == "residual" and cfg["use_depth_attention"] is False
    result = run_cli("train", "--config", tmp_path / "run.toml", "--set", "model.norm_topology=sandwich",
                     "--set", f"train.run_dir={tmp_path / 'run2'}", check=False)
    assert result.returncode == 1 and "model.norm_topology" in result.stderr and "siamese_post_pre" in result.stderr


@pytest.mark.parametrize("topology", ["pre", "hybrid", "residual", "siamese_post_pre"])
def test_traces_agree_tensor_by_tensor(topology, tmp_path, rng):
    """Named activations (model/trace.h) of the engine and the remote code: the same names (hidden, and
    dual for ResiDual; X and Y for SiameseNorm) and values, so a topology's failing parity names its layer."""
    from trace_reference import engine_trace, first_difference, reference_trace

    model = save_random_variant(tmp_path / "m", **topology_fields(topology))
    tokens = rng.integers(0, 96, SEQ).tolist()
    reference = reference_trace(model, tokens)
    engine = engine_trace(tmp_path / "m", tokens, tmp_path, "--attention", "reference")
    assert sorted(engine) == sorted(reference)
    stream = {"residual": "dual", "siamese_post_pre": "Y"}.get(topology, "hidden")
    assert f"model.layers.3.{stream}" in engine
    assert first_difference(engine, reference, activation_bound(model, SEQ)) is None
