"""Stability traces in metrics.jsonl (issue 15 item 3): per-layer gradient norms every N steps (checked
against the gradients the same run dumps), loss spikes against the recent losses with their policy
(record, skip, stop), a resume that flags the same steps, the plot's gradient panel, and bad keys."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import VOCAB, write_shards, write_toml

SEQ, BATCH = 16, 4  # tokens per instance; instances per step (micro_batch 2 x grad_accum 2)


def sections(tmp_path, run, **train):
    return {
        "model": {"init_from": str(tmp_path / "init")},
        "data": {"train": str(tmp_path / "shards"), "shuffle": False},
        "train": {"run_dir": str(tmp_path / run), "sequence_length": SEQ, "micro_batch": 2, "grad_accum": 2,
                  "max_steps": 14, "seed": 0, "threads": 2, **train},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "clip_grad_norm": 1.0},
    }


def lines(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def shifted_data(tmp_path):
    """A repeating pattern for 10 steps (the loss falls as it is learnt), then uniformly random ids: the loss
    jumps at step 11, a spike by construction."""
    rng = np.random.default_rng(0)
    learnt = np.tile(np.arange(2, 34), 20)[: 10 * BATCH * SEQ]
    noise = rng.integers(2, VOCAB, 10 * BATCH * SEQ)
    write_shards(tmp_path / "shards", np.concatenate([learnt, noise]))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    return tmp_path


def test_layer_gradient_norms_equal_the_dumped_gradients(shifted_data, tmp_path):
    s = sections(tmp_path, "run", max_steps=4, grad_norm_interval=2)
    s["debug"] = {"dump_gradients_steps": 4}
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", s))
    traced = [l for l in lines(tmp_path / "run") if "grad_norms" in l]
    assert [l["step"] for l in traced] == [2, 4]
    for line in traced:
        grads = load_file(str(tmp_path / "run" / "debug" / f"grads-step-{line['step']:06d}.safetensors"))
        sq = lambda names: float(np.sqrt(sum(np.sum(grads[n].astype(np.float64) ** 2) for n in names)))
        want_layers = [sq([n for n in grads if n.startswith(f"model.layers.{l}.")]) for l in range(4)]
        got = line["grad_norms"]
        assert len(got["layers"]) == 4
        # Both sides sum the same float32 values in float64: only summation order differs.
        assert np.allclose(got["layers"], want_layers, rtol=1e-9, atol=0)
        assert np.isclose(got["embed"], sq(["model.embed_tokens.weight"]), rtol=1e-9, atol=0)
        assert np.isclose(got["head"], sq(["model.norm.weight", "lm_head.weight"]), rtol=1e-9, atol=0)
        assert min(got["layers"]) > 0
    # The plot gets a second panel (per-layer gradient norms): a taller image than the loss chart alone.
    run_cli("plot", tmp_path / "run", "--out", tmp_path / "traced.png")
    s2 = sections(tmp_path, "plain", max_steps=2)
    run_cli("train", "--config", write_toml(tmp_path / "plain.toml", s2))
    run_cli("plot", tmp_path / "plain", "--out", tmp_path / "plain.png")
    height = lambda p: struct.unpack(">I", p.read_bytes()[20:24])[0]  # PNG IHDR
    assert height(tmp_path / "traced.png") > 1.5 * height(tmp_path / "plain.png")


def spike_steps(run_dir):
    return [l["step"] for l in lines(run_dir) if l.get("spike")]


def test_a_loss_spike_is_recorded(shifted_data, tmp_path):
    run_cli("train", "--config", write_toml(tmp_path / "run.toml",
                                            sections(tmp_path, "run", spike_factor=1.3, spike_window=3)))
    rows = lines(tmp_path / "run")
    losses = {l["step"]: l["loss"] for l in rows if "loss" in l}
    spikes = [l for l in rows if l.get("spike")]
    assert spikes and spikes[0]["step"] == 11, [(l["step"], l["spike_loss"]) for l in spikes]
    first = spikes[0]
    assert first["spike_loss"] == losses[11]
    assert first["spike_baseline"] == np.median([losses[8], losses[9], losses[10]])
    assert first["spike_loss"] > 1.3 * first["spike_baseline"]
    # No step before the shift was one: each loss is within 1.3 x the median of the three before it.
    assert all(losses[s] <= 1.3 * np.median([losses[s - 3], losses[s - 2], losses[s - 1]]) for s in range(4, 11))
    # The sweep summary's rule (train/sweep.cpp loss_spikes), recomputed here from the step losses, flags the
    # same steps: a window of the last 3 losses, spikes included.
    steps = sorted(losses)
    posthoc = [steps[i] for i in range(3, len(steps))
               if losses[steps[i]] > 1.3 * np.median([losses[steps[j]] for j in range(i - 3, i)])]
    assert [l["step"] for l in spikes] == posthoc
    assert not any(l.get("skipped") for l in rows)  # "record" (the default) updates as usual


def test_spikes_can_be_skipped(shifted_data, tmp_path):
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", sections(
        tmp_path, "run", spike_factor=1.3, spike_window=3, spike="skip", max_steps=12)))
    rows = lines(tmp_path / "run")
    spikes = spike_steps(tmp_path / "run")
    assert spikes and spikes[0] == 11
    assert [l["step"] for l in rows if l.get("skipped")] == spikes


def test_a_spike_can_stop_the_run(shifted_data, tmp_path):
    result = run_cli("train", "--config", write_toml(tmp_path / "run.toml", sections(
        tmp_path, "run", spike_factor=1.3, spike_window=3, spike="stop")), check=False)
    assert result.returncode == 1
    assert "step 11: loss spike" in result.stderr and 'train.spike = "stop"' in result.stderr
    assert spike_steps(tmp_path / "run") == [11]
    assert not (tmp_path / "run" / "checkpoints" / "final").exists()


def test_resume_flags_the_same_spikes(shifted_data, tmp_path):
    """The window of recent losses travels in the checkpoint: resuming just before the shift flags the
    same steps as the uninterrupted run."""
    straight = sections(tmp_path, "straight", spike_factor=1.3, spike_window=3)
    run_cli("train", "--config", write_toml(tmp_path / "straight.toml", straight))
    resumed = write_toml(tmp_path / "resumed.toml", sections(tmp_path, "resumed", spike_factor=1.3, spike_window=3))
    run_cli("train", "--config", resumed, "--stop-after", "10")
    run_cli("train", "--config", resumed, "--resume")
    assert spike_steps(tmp_path / "resumed") == spike_steps(tmp_path / "straight") != []


@pytest.mark.parametrize("key,value,fragment", [
    ("spike", "ignore", "valid: record, skip, stop"),
    ("spike_factor", 0.5, "must be 0 (off) or a finite number > 1"),
    ("spike_window", 0, "must be >= 1"),
    ("grad_norm_interval", -1, "must be >= 0"),
])
def test_bad_stability_keys_are_refused(shifted_data, tmp_path, key, value, fragment):
    result = run_cli("train", "--config", write_toml(tmp_path / "bad.toml", sections(tmp_path, "bad", **{key: value})),
                     check=False)
    assert result.returncode == 1 and f"train.{key}" in result.stderr and fragment in result.stderr, result.stderr


def test_divergence_is_recorded_before_the_run_stops(shifted_data, tmp_path):
    """A non-finite loss under train.nonfinite = "stop" leaves a 'diverged' line naming the step."""
    from safetensors.numpy import save_file

    weights = load_file(str(tmp_path / "init" / "model.safetensors"))
    weights["lm_head.weight"] = (weights["lm_head.weight"] * 1e37).astype(np.float32)  # logits overflow
    save_file(weights, str(tmp_path / "init" / "model.safetensors"), metadata={"format": "pt"})
    result = run_cli("train", "--config", write_toml(tmp_path / "run.toml", sections(tmp_path, "run")), check=False)
    assert result.returncode == 1 and "training diverged" in result.stderr
    assert [l for l in lines(tmp_path / "run") if l.get("diverged")] == [{"step": 1, "diverged": True}]
