"""archspace analyze against references computed here from transformers (base) and the archs/ remote code
(the variant): per-layer stream norms, the loss, the logit lens per stream, layer pruning, Depth-Attention
weights recomputed from the captured queries and keys (SPEC.md 3.2), fusion and input-intensity figures
recomputed from the weights.

Tolerances (fp32, CPU; tolerances.py): both sides run the same fp32 maths in other summation orders, so
stream norms within twice the forward's chain_gamma relative, losses within logprob_bound of the logits'
forward_bound, mixing weights within the scores' bound carried through softmax. Lens
agreements are fractions of positions whose top-1 token matches: they may differ by one position where two
logits are within float noise of each other, so the bound is one position (1 / positions)."""
import copy
import json

import numpy as np
import pytest
import torch

from conftest import run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from test_train import synthetic_tokens, write_shards
from tolerances import U, chain_gamma, forward_bound, forward_links, gamma, logprob_bound
from trace_reference import capture

N, T = 2, 24


def analyze(model_dir, tmp_path, *extra):
    shards = tmp_path / "shards"
    if not shards.exists():
        write_shards(shards, synthetic_tokens(2000))
    out = tmp_path / "analysis"
    result = run_cli("analyze", model_dir, "--data", shards, "--sequences", N, "--sequence-length", T, "--out", out,
                     *extra)
    ids = np.fromfile(shards / "part-00000.npy", dtype="<u4")[:N * T].astype(np.int64).reshape(N, T)
    return json.loads((out / "analysis.json").read_text()), torch.tensor(ids), result, out


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def next_token_loss(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)).item()


class Bounds:
    """The bounds of one model's checks: a stream's mean norm (its normwise relative error after the
    forward's chain, plus the norm's and the mean's sums), a mean next-token loss (each log-probability within
    logprob_bound; one NLL <= the sum of all, N T loss)."""

    def __init__(self, model):
        config = model.config
        self.relative = 2 * (chain_gamma(forward_links(config, T)) + gamma(config.hidden_size) + gamma(N * T))
        self.model = model

    def norm(self, value):
        return self.relative * abs(value)

    def loss(self, value):
        return logprob_bound(forward_bound(self.model, T), self.model.config.vocab_size, N * T * abs(value))


def assert_rel(a, b, bound, what=""):
    assert abs(a - b) <= bound, f"{what}: {a} vs {b} (bound {bound:.3g})"


def assert_lens(engine, reference, what):
    assert abs(engine - reference) <= 1.0 / (N * T) + 1e-12, f"{what}: lens agreement {engine} vs {reference}"


def test_base_model_against_transformers(tmp_path):
    model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "model")
    r, ids, result, out = analyze(tmp_path / "model", tmp_path)
    with torch.no_grad(), capture(model) as store:
        logits = model(ids).logits
    bounds = Bounds(model)
    loss = next_token_loss(logits, ids)
    assert_rel(r["loss"], loss, bounds.loss(loss), what="loss")
    top = logits.argmax(-1)
    s = r["streams"]["hidden"]
    assert list(r["streams"]) == ["hidden"] and len(s["norm"]) == 5
    want = store["model.embeddings"].norm(dim=-1).mean().item()
    assert_rel(s["norm"][0], want, bounds.norm(want), what="embedding norm")
    for l in range(4):
        h = store[f"model.layers.{l}.hidden"]
        want = h.norm(dim=-1).mean().item()
        assert_rel(s["norm"][l + 1], want, bounds.norm(want), what=f"layer {l} norm")
        lens = model.lm_head(model.model.norm(h))
        assert_lens(s["lens_agreement"][l], (lens.argmax(-1) == top).double().mean().item(), f"layer {l}")
        want = next_token_loss(lens, ids)
        assert_rel(s["lens_loss"][l], want, bounds.loss(want), what=f"layer {l} lens loss")
    assert abs(s["lens_agreement"][3] - 1.0) < 1e-12  # the last layer's lens is the model's own output
    # Layer pruning: transformers' model with that decoder layer deleted. Olmo3Model picks each layer's mask and
    # RoPE by its index in config.layer_types, so the deleted layer's entry goes too (every layer keeps its type).
    for l in range(4):
        pruned = copy.deepcopy(model)
        del pruned.model.layers[l]
        types = list(pruned.config.layer_types)
        pruned.config.layer_types = types[:l] + types[l + 1:]
        pruned.config.num_hidden_layers = 3
        with torch.no_grad():
            loss = next_token_loss(pruned(ids, use_cache=False).logits, ids)
        assert_rel(r["pruning"][l]["loss"], loss, bounds.loss(loss), what=f"pruned layer {l}")
        assert_rel(r["pruning"][l]["delta"], loss - r["loss"], 2 * bounds.loss(loss), what=f"pruned layer {l} delta")
    # Norm weights as they are in the file.
    w = model.model.layers[2].post_feedforward_layernorm.weight
    want = w.abs().mean().item()  # a mean of d values, in fp32 on both sides
    assert_rel(r["norm_weights_mean_abs"][2]["post_feedforward_layernorm.weight"], want, 2 * gamma(w.numel()) * want)
    assert "depth_attention" not in r and "fusion" not in r and "stream_disagreement" not in r
    assert "prune dloss" in result.stdout and (out / "analysis.png").stat().st_size > 10000


def test_variant_against_the_remote_code(tmp_path):
    model = save_random_variant(tmp_path / "model")  # 7 layers, Depth-Attention stride 2, GQA 4/2
    r, ids, _, out = analyze(tmp_path / "model", tmp_path)
    with torch.no_grad(), capture(model) as store:
        logits = model(ids).logits
    backbone = model.model
    bounds = Bounds(model)
    loss = next_token_loss(logits, ids)
    assert_rel(r["loss"], loss, bounds.loss(loss), what="loss")
    top = logits.argmax(-1)
    assert sorted(r["streams"]) == ["X", "Y"]
    final = {"X": backbone.siamese_post_final_layernorm.weight, "Y": backbone.siamese_pre_final_layernorm.weight}
    lens_top = {}
    for name in ("X", "Y"):
        s = r["streams"][name]
        for l in range(7):
            h = store[f"model.layers.{l}.{name}"]
            want = h.norm(dim=-1).mean().item()
            assert_rel(s["norm"][l + 1], want, bounds.norm(want), what=f"{name} layer {l} norm")
            lens = model.lm_head(rms_norm(rms_norm(h, final[name]), backbone.norm.weight))
            lens_top[name, l] = lens.argmax(-1)
            assert_lens(s["lens_agreement"][l], (lens_top[name, l] == top).double().mean().item(), f"{name} {l}")
    for row in r["stream_disagreement"]:
        differ = lens_top["X", row["layer"]] != lens_top["Y", row["layer"]]
        assert row["positions"] == int(differ.sum())
    # Depth-Attention weights from the captured post-RoPE queries and keys: qbar . k_j / sqrt(D), softmax.
    for row in r["depth_attention"]:
        l = row["layer"]
        sources = [j for j in range(l) if j % 2 == 0] + [l]
        q = store[f"model.layers.{l}.q"]  # [B, H, T, D]
        qbar = q.view(q.size(0), 2, 2, q.size(2), q.size(3)).mean(2)  # [B, G, T, D]
        keys = torch.stack([store[f"model.layers.{j}.k"] for j in sources], -2)  # [B, G, T, S+1, D]
        alpha = torch.softmax((qbar.unsqueeze(-2) * keys).sum(-1) / q.size(-1) ** 0.5, -1)
        # The engine's q and k are within bounds.relative of these, so each score within twice that of the
        # largest |qbar| . |k| / sqrt(D); a weight (<= 1) moves by twice a score's error plus softmax's
        # roundings, and the mean over positions adds its own.
        S = float(((qbar.abs().unsqueeze(-2) * keys.abs()).sum(-1) / q.size(-1) ** 0.5).max())
        bound = 2 * (2 * 2 * bounds.relative * S + gamma(len(sources) + 4)) + gamma(N * T)
        expected = alpha.reshape(-1, len(sources)).mean(0)
        assert [int(j) for j in row["weights"]] == sources
        got = torch.tensor([row["weights"][str(j)] for j in sources], dtype=torch.float64)
        assert (got - expected.double()).abs().max() <= bound, f"layer {l}"
    assert [row["layer"] for row in r["depth_attention"]] == list(range(7))
    # Removing the last block leaves X and Y of layer 5 to the final norms.
    X, Y = store["model.layers.5.X"], store["model.layers.5.Y"]
    h = rms_norm(rms_norm(X, final["X"]) + rms_norm(Y, final["Y"]), backbone.norm.weight)
    loss = next_token_loss(model.lm_head(h), ids)
    assert_rel(r["pruning"][6]["loss"], loss, bounds.loss(loss), what="pruned last layer")
    # Fusion and input intensity from the weights (and, for X into attention, the measured RMS of X).
    rms = lambda t: t.double().pow(2).mean().sqrt().item()  # noqa: E731
    # An RMS of a weight: the engine's fp32 mean of squares (gamma(n)) and square root; X's also carries
    # the stream's own error.
    weight = lambda t: (rms(t), (2 * gamma(t.numel()) + 2 * U) * rms(t))  # noqa: E731
    assert_rel(r["fusion"]["X"], *weight(final["X"]))
    assert_rel(r["fusion"]["Y"], *weight(final["Y"]))
    layer3 = backbone.layers[3]
    assert_rel(r["input_intensity"][3]["attn_Y"], *weight(layer3.siamese_attn_pre_norm.weight))
    X2 = store["model.layers.2.X"]
    want = rms(layer3.siamese_hybrid_attn_scale) * rms(X2)
    assert_rel(r["input_intensity"][3]["attn_X"], want,
               (weight(layer3.siamese_hybrid_attn_scale)[1] / rms(layer3.siamese_hybrid_attn_scale) + bounds.relative
                + 2 * gamma(X2.numel())) * want)
    assert_rel(r["input_intensity"][3]["mlp_Y"], *weight(layer3.siamese_mlp_pre_norm.weight))
    assert (out / "analysis.png").stat().st_size > 10000


def test_bad_input_names_it(tmp_path):
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "model")
    write_shards(tmp_path / "shards", synthetic_tokens(100))
    result = run_cli("analyze", tmp_path / "model", "--data", tmp_path / "shards", "--sequences", 8,
                     "--sequence-length", 64, check=False)
    assert result.returncode == 1 and "fewer than --sequences x --sequence-length = 512" in result.stderr
    result = run_cli("analyze", tmp_path / "nowhere", "--data", tmp_path / "shards", check=False)
    assert result.returncode == 1 and "nowhere" in result.stderr


def test_default_output_is_under_the_run_and_layer_ticks_are_integers(tmp_path):
    """Without --out: RUN/analysis/step-N for a run (not ./analysis in the directory the command runs in),
    MODEL_DIR/analysis for a plain model directory. Every layer axis of the plot has integer ticks only."""
    import importlib.util
    import subprocess

    from conftest import BINARY, REPO
    from test_train import base_sections, write_toml

    write_shards(tmp_path / "shards", synthetic_tokens(3000))
    save_random_variant(tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", train={"max_steps": 2})
    del s["debug"]
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", s))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    subprocess.run([str(a) for a in [BINARY, "analyze", tmp_path / "run", "--data", tmp_path / "shards", "--sequences", N,
                    "--sequence-length", T]], cwd=cwd, check=True, capture_output=True)
    final = (tmp_path / "run" / "checkpoints" / "final").read_text().strip()
    out = tmp_path / "run" / "analysis" / final
    assert (out / "analysis.json").exists() and (out / "analysis.png").exists()
    assert not (cwd / "analysis").exists()
    run_cli("analyze", tmp_path / "init", "--data", tmp_path / "shards", "--sequences", N, "--sequence-length", T,
            "--no-plot")
    assert (tmp_path / "init" / "analysis" / "analysis.json").exists()

    spec = importlib.util.spec_from_file_location("plot_analysis", REPO / "scripts" / "plot_analysis.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    # A 2-layer model too: matplotlib's own ticks on a -1..1 axis would be halves.
    save_random_olmo3(tiny_olmo3_config(num_hidden_layers=2), tmp_path / "two")
    run_cli("analyze", tmp_path / "two", "--data", tmp_path / "shards", "--sequences", N, "--sequence-length", T,
            "--no-plot")
    r = json.loads((out / "analysis.json").read_text())
    two = json.loads((tmp_path / "two" / "analysis" / "analysis.json").read_text())
    assert two["layers"] == 2
    for fig in (plot.single(r), plot.single(two), plot.compare([two, two], ["a", "b"])):
        fig.canvas.draw()
        checked = 0
        for ax in fig.axes:
            for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                if "layer" not in label:
                    continue
                lo, hi = sorted(axis.get_view_interval())
                ticks = [t for t in axis.get_ticklocs() if lo <= t <= hi]
                assert ticks and all(float(t).is_integer() for t in ticks), (label, ticks)
                checked += 1
        assert checked >= 3
