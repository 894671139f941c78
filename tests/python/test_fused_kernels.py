"""train.fused_kernels = true through the CLI on the CPU: the block's RMSNorms, Q/K norm + RoPE, residual adds and
SwiGLU through the fused training kernels (kernels/fused_training.h) instead of ATen's composite ops, from the same
weights and data as the run without them.

The kernels' own forward and backward are held elementwise to the composite and fp64 in
tests/unit/test_fused_training.cpp (and the tiny model's gradients to an fp64 run: as accurate as the composite).
Here the question is whether a training run through the CLI takes them and stays where the composite's run is.

Bounds. In fp32 the two runs differ only in the order of each norm row's sums (D = 64 terms here): each norm's
output moves by at most about (D + 8) u = 72 x 2^-24 = 4.3e-6 relative, and a loss that averages many such values
moves far less; step 1's loss (the initial weights) is asserted within 1e-5 relative and step 1's gradients within
1e-4 relative norm-wise (the backward's sums, the same order of terms, through 4 blocks), the later steps' losses
within 1e-4 (AdamW's early steps move each weight by about lr whatever the gradient's size, so a gradient entry
near zero may change sign between the runs; measured here: 2e-7 at most, 5e-8 at step 1). In bf16 autocast both runs round the same
values; a rounding that flips moves a value by a bf16 unit (2^-8), so the loss curves are compared at 1% (the
figure the device check uses for FP8's curve, a far coarser change), and each run must learn.
"""
import numpy as np
from safetensors.numpy import load_file

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import base_sections, metrics, synthetic_tokens, write_shards, write_toml


def _runs(tmp_path, dtype):
    write_shards(tmp_path / "shards", synthetic_tokens(2000))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    sections = base_sections(tmp_path, tmp_path / "init", train={"dtype": dtype}, debug={"dump_gradients_steps": 1})
    config = write_toml(tmp_path / "run.toml", sections)
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'composite'}")
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'fused'}",
            "--set", "train.fused_kernels=true")
    return tuple(np.array([m["loss"] for m in metrics(tmp_path / name)]) for name in ("composite", "fused"))


def _step1_gradients(tmp_path):
    fused = load_file(str(tmp_path / "fused" / "debug" / "grads-step-000001.safetensors"))
    composite = load_file(str(tmp_path / "composite" / "debug" / "grads-step-000001.safetensors"))
    assert set(fused) == set(composite)
    return {n: float(np.linalg.norm(fused[n] - composite[n]) / max(np.linalg.norm(composite[n]), 1e-30))
            for n in composite}


def test_fp32_run_with_the_fused_kernels_follows_the_composite(tmp_path):
    composite, fused = _runs(tmp_path, "fp32")
    print("losses composite", composite, "fused", fused)
    relative = np.abs(fused - composite) / np.abs(composite)
    assert relative[0] <= 1e-5, relative
    assert relative.max() <= 1e-4, relative
    gradients = _step1_gradients(tmp_path)
    worst = max(gradients, key=gradients.get)
    print(f"step 1 gradients: largest relative difference {gradients[worst]:.3g} ({worst})")
    assert gradients[worst] <= 1e-4, gradients
    # The kernels really ran: the order of the norms' sums differs somewhere.
    assert any(v > 0 for v in gradients.values())


def test_bf16_run_with_the_fused_kernels_follows_the_composite(tmp_path):
    composite, fused = _runs(tmp_path, "bf16")
    print("losses composite", composite, "fused", fused)
    assert fused[-1] < fused[0] and composite[-1] < composite[0]  # both learn
    assert np.all(np.abs(fused - composite) <= 0.01 * np.abs(composite)), (fused, composite)


def test_a_malformed_value_names_the_key(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    s = base_sections(tmp_path, tmp_path / "init", train={"fused_kernels": "yes"})
    result = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s), check=False)
    assert result.returncode != 0
    assert "train.fused_kernels" in result.stderr and "true or false" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
