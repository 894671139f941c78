"""The same run in OLMo-core (docs/training.md, "The same run in OLMo-core"): a small OLMo 3 model trained from the
same weights on the same batches by OLMo-core itself (its TransformerTrainModule, SkipStepAdamW with OLMo 3's
no-decay override on the embeddings, CosWithWarmup, its cross-entropy with z-loss; fp32, one process:
tests/python/olmo_core_reference.py) and by the engine under optim.recipe = "olmo-core", 24 steps with a warm-up,
clipping active in some steps, z-loss on, and a spike batch that OLMo-core's rule skips (window 8, sigma 3).

Bounds (fp32 on both sides):
- lr: equal to 1e-12 relative (the same float64 formula; tests/python/test_recipes.py).
- skipped steps: the same steps.
- step 1's loss: both sides compute the same forward on the same weights, differing only in summation order:
  tolerances.logprob_bound of the forward's rounding (as test_train.py's step 1).
- later losses within 2e-5 absolute, gradient norms within 1e-4 relative, and per tensor the 99th percentile of the
  final weights' differences within 1e-4: after the first update the weights differ by rounding, and Adam's
  normalised update m / (sqrt(v) + eps) carries an ulp-sized gradient difference in a near-zero coordinate into a
  weight difference up to ~lr, in isolated coordinates; these are the bounds test_train.py and test_recipes.py hold
  the engine to against a plain PyTorch loop, and OLMo-core's own run is within 8.3e-7 of that loop
  (olmo_core_reference.py's self-check).
Mutating any one recipe setting (the schedule's convention, either decay group, step skipping, the whole recipe)
moves at least one of these far outside its bound: each is run and must fail.
"""
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import metrics, synthetic_tokens, write_shards, write_toml
from tolerances import forward_bound, logprob_bound

SEQ, MICRO, ACCUM, STEPS, WARMUP, SPIKE_STEP, CLIP = 16, 2, 2, 24, 4, 18, 4.0
SETTINGS = dict(lr=1e-2, warmup=WARMUP, max_steps=STEPS, final_lr_factor=0.1, weight_decay=0.1, clip=CLIP, z_loss=1e-4,
                rolling_interval_length=8, sigma_factor=3)


def corpus():
    """Learnable windows, and at step SPIKE_STEP (1-based) a batch of uniformly random ids: a loss spike."""
    batch = MICRO * ACCUM
    tokens = np.asarray(synthetic_tokens(STEPS * batch * SEQ), dtype=np.int64)
    start = (SPIKE_STEP - 1) * batch * SEQ
    tokens[start:start + batch * SEQ] = np.random.default_rng(7).integers(2, 96, batch * SEQ)
    return tokens


def engine_run(tmp_path, name, *sets, stop_after=None):
    sections = {
        "model": {"init_from": str(tmp_path / "init")},
        "data": {"train": str(tmp_path / "shards"), "shuffle": False},
        "train": {"run_dir": str(tmp_path / name), "sequence_length": SEQ, "micro_batch": MICRO, "grad_accum": ACCUM,
                  "max_steps": STEPS, "seed": 0, "threads": 2},
        "optim": {"recipe": "olmo-core", "lr": SETTINGS["lr"], "warmup_steps": WARMUP, "final_lr_factor": 0.1,
                  "weight_decay": 0.1, "clip_grad_norm": CLIP, "z_loss": 1e-4, "skip_step_window": 8,
                  "skip_step_sigma": 3},
        "checkpoint": {"interval": 8},
    }
    args = ["train", "--config", write_toml(tmp_path / f"{name}.toml", sections)]
    for s in sets:
        args += ["--set", s]
    if stop_after:  # interrupted there, then resumed from its checkpoint (the skipping window comes back with it)
        run_cli(*args, "--stop-after", str(stop_after))
        assert f"at step {stop_after}" in run_cli(*args, "--resume").stderr
    else:
        run_cli(*args)
    rows = {m["step"]: m for m in metrics(tmp_path / name)}
    lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    final = (tmp_path / name / "checkpoints" / "final").read_text().strip()
    steps = range(1, STEPS + 1)
    return {"ce_loss": [rows[s]["loss"] for s in steps], "grad_norm": [rows[s]["grad_norm"] for s in steps],
            "lr": [rows[s]["lr"] for s in steps],
            "skipped_steps": sorted(m["step"] for m in lines if m.get("skipped")),
            "weights": load_file(str(tmp_path / name / "checkpoints" / final / "model" / "model.safetensors"))}


def violations(engine, reference, step1_bound):
    """What falls outside the module docstring's bounds; empty when the runs agree."""
    out = []
    lr = np.array(engine["lr"]), np.array(reference["lr"])
    if np.abs(lr[0] - lr[1]).max() > 1e-12 * np.abs(lr[1]).max():
        out.append(f"lr: {lr[0]} vs {lr[1]}")
    ref_skipped = [s + 1 for s, x in enumerate(reference["skipped"]) if x]
    if engine["skipped_steps"] != ref_skipped:
        out.append(f"skipped steps {engine['skipped_steps']} vs OLMo-core's {ref_skipped}")
    loss = np.abs(np.array(engine["ce_loss"]) - np.array(reference["ce_loss"]))
    if loss[0] > step1_bound or loss.max() > 2e-5:
        out.append(f"losses differ by up to {loss.max():.3g} (step 1: {loss[0]:.3g}, bound {step1_bound:.3g})")
    ratio = np.abs(np.array(engine["grad_norm"]) / np.array(reference["grad_norm"]) - 1)
    if ratio.max() > 1e-4:
        out.append(f"gradient norms differ by up to {ratio.max():.3g} relative")
    worst = max(float(np.quantile(np.abs(engine["weights"][n] - p.numpy()), 0.99))
                for n, p in reference["weights"].items())
    if worst > 1e-4:
        out.append(f"final weights: a tensor's 99th percentile difference is {worst:.3g}")
    return out


def test_same_run_in_olmo_core(tmp_path):
    from olmo_core_reference import train_in_olmo_core

    tokens = corpus()
    write_shards(tmp_path / "shards", tokens)
    model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    batches = [torch.tensor(tokens[s * MICRO * ACCUM * SEQ:(s + 1) * MICRO * ACCUM * SEQ]).view(-1, SEQ)
               for s in range(STEPS)]
    reference = train_in_olmo_core(tmp_path / "init", batches, micro_batch_size=MICRO, **SETTINGS)
    # The run exercises what it claims to: a warm-up, clipping in some steps and not others, and a skipped spike.
    assert reference["lr"][0] < reference["lr"][WARMUP - 1]
    clipped = [g > CLIP for g in reference["grad_norm"]]
    assert any(clipped) and not all(clipped), reference["grad_norm"]
    assert reference["skipped"][SPIKE_STEP - 1] == 1.0, reference["skipped"]
    step1 = logprob_bound(forward_bound(model, SEQ), model.config.vocab_size,
                          MICRO * ACCUM * SEQ * reference["ce_loss"][0])

    engine = engine_run(tmp_path, "engine")
    assert not violations(engine, reference, step1), violations(engine, reference, step1)
    # Stopped after step 16 and resumed: the window of the last 8 steps comes back from the checkpoint, so steps 17
    # and 18 are skipped as in one run (a fresh window would judge nothing before its 4th value).
    resumed = engine_run(tmp_path, "resumed", stop_after=SPIKE_STEP - 2)
    assert not violations(resumed, reference, step1), violations(resumed, reference, step1)

    # Each recipe setting matters: changing any one of them breaks the agreement.
    for mutation in ["optim.schedule_convention=megatron", "optim.decay_embeddings=true", "optim.decay_norms=false",
                     "optim.skip_steps=false", "optim.recipe=archspace"]:
        name = "mutated-" + mutation.split(".")[1].replace("=", "-")
        assert violations(engine_run(tmp_path, name, mutation), reference, step1), f"{mutation} still agrees"


def test_olmo_core_reference_is_the_model(tmp_path):
    """The reference's model (OLMo-core's Transformer built from the HF directory through OLMo-core's own converter)
    computes transformers' logits on the same weights (every weight perturbed, norms included: within 2e-5, seen 0
    against SDPA), and its sliding-window layers matter at this length."""
    from olmo_core_reference import check_logits_against_transformers, random_hf_model

    random_hf_model(tmp_path)
    check_logits_against_transformers(tmp_path)
