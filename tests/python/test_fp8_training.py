"""train.fp8 = true on the CPU: the block's linear layers through at::_scaled_mm with e4m3 operands and tensorwise
dynamic scaling (kernels/fp8_linear.h), the rest as train.dtype = "bf16". Compared with the bf16 run from the same
weights and data: step 1's loss within a bound derived from e4m3's precision, step 1's gradients within a
norm-wise bound, and the loss curve of 5 steps (it learns; the last loss within 1% of bf16's, the issue's figure
for the GPU). The kernel's own forward and gradients are checked elementwise against fp64 in
tests/unit/test_fp8_linear.cpp; here the question is whether the whole step stays where e4m3's rounding puts it.

The loss bound. The fp8 run takes the bf16 run's operands of each block linear (x and W) and rounds them once more,
to e4m3: each entry moves by at most u |v| + eta (u = 2^-4, e4m3's unit roundoff; eta = 2^-10 amax / 448, half the
subnormal spacing at the tensor's scale). To first order the loss moves by sum_e (dL/dv_e) dv_e over those
entries (x once per micro-batch and per distinct input tensor, q/k/v and gate/up sharing theirs; W once per step,
its gradient summed over the micro-batches), and both runs round each linear's output (and the head's logits) to
bf16 independently, |dv| <= 2^-8 |v| each. The rounding errors are of either sign and independent across entries,
so by Hoeffding's inequality the sum exceeds LAMBDA sqrt(sum_e c_e^2), c_e = |dL/dv_e| max|dv_e|, with probability
below 2 exp(-LAMBDA^2 / 2) (4e-22 at LAMBDA = 10, the lambda of tests/python/tolerances.py). The derivatives come
from an fp32 reference forward and backward of the same step in transformers (their own difference from the bf16
run's is second order). Not in the bound: the bf16 roundings inside attention and the norms, which both runs also
make independently, 16 times finer than e4m3's per entry.

The gradient bound: a parameter's gradient passes through the e4m3 casts of the block linears it depends on, each
an independent relative error of RMS u / sqrt(3) (3.6%), about 21 casts a block (x and W of 7 linears in the
forward, with q/k/v's and gate/up's shared x counted per use, and 7 gradient casts); over the tiny model's 4 blocks
that is sqrt(84) x 3.6% = 33% at most relative (norm-wise), with full correlation of every cast with the
gradient. Asserted: at most 50%, which a wrong or missing gradient path (off by 100% or more) does not meet.
"""
import math

import numpy as np
import torch
from safetensors.numpy import load_file

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import base_sections, metrics, synthetic_tokens, write_shards, write_toml

E4M3_UNIT = 2.0 ** -4
E4M3_SUBNORMAL_HALF = 2.0 ** -10
BF16_UNIT = 2.0 ** -8
LAMBDA = 10.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def eta(t):
    return E4M3_SUBNORMAL_HALF * float(t.detach().abs().max()) / 448.0


def first_order_loss_sigma(model, tokens, seq=16, global_batch=4, micro=2):
    """sqrt(sum_e c_e^2) of the module docstring for step 1 (its loss: the CE mean over the step's labelled
    tokens), from an fp32 forward and backward of transformers' model."""
    windows = torch.tensor(np.asarray(tokens[: (len(tokens) // seq) * seq], dtype=np.int64)).view(-1, seq)
    batch = windows[:global_batch]
    labelled = global_batch * (seq - 1)
    linears = {f"{i}.{n}": getattr(layer.self_attn if n in LINEARS[:4] else layer.mlp, n)
               for i, layer in enumerate(model.model.layers) for n in LINEARS}
    squares = 0.0
    model.zero_grad(set_to_none=True)
    for m in range(0, global_batch, micro):
        seen = []  # (module, input, output) of this micro-batch's block linears, and the head's logits

        def keep(module, inputs, output):
            output.retain_grad()
            seen.append((module, inputs[0], output))

        hooks = [mod.register_forward_hook(keep) for mod in [*linears.values(), model.lm_head]]
        ids = batch[m:m + micro]
        logits = model(ids).logits[:, :-1]
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                               reduction="sum") / labelled
        ce.backward()
        for h in hooks:
            h.remove()
        inputs = {}  # one e4m3 cast per distinct input tensor: dL/dx summed over the linears that read it
        for module, x, y in seen:
            g = y.grad.detach()
            squares += float(((2 * BF16_UNIT * y.detach().abs() * g.abs()) ** 2).sum())  # both runs' bf16 rounding
            if module is model.lm_head:
                continue
            dx = g @ module.weight.detach()
            if id(x) in inputs:
                inputs[id(x)][1].add_(dx)
            else:
                inputs[id(x)] = (x.detach(), dx)
        for x, dx in inputs.values():
            squares += float((((E4M3_UNIT * x.abs() + eta(x)) * dx.abs()) ** 2).sum())
    for module in linears.values():  # the weights: one cast a step, their gradient over both micro-batches
        w = module.weight.detach()
        squares += float((((E4M3_UNIT * w.abs() + eta(w)) * module.weight.grad.abs()) ** 2).sum())
    model.zero_grad(set_to_none=True)
    return math.sqrt(squares)


def test_fp8_step_against_the_bf16_step_and_its_loss_curve(tmp_path):
    tokens = synthetic_tokens(2000)
    write_shards(tmp_path / "shards", tokens)
    model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    # The engine's schedule and decay groups before recipes, which the loss-curve bound below was calibrated under
    # (under the olmo-core recipe the two 5-step curves end 1.7% apart on an AVX2-only CPU): this test is about FP8
    # against bf16, not about the recipe.
    sections = base_sections(tmp_path, tmp_path / "init", train={"dtype": "bf16"}, debug={"dump_gradients_steps": 1},
                             optim={"recipe": "archspace"})
    config = write_toml(tmp_path / "run.toml", sections)
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'bf16'}")
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'fp8'}", "--set", "train.fp8=true")
    bf16 = np.array([m["loss"] for m in metrics(tmp_path / "bf16")])
    fp8 = np.array([m["loss"] for m in metrics(tmp_path / "fp8")])
    print("losses bf16", bf16, "fp8", fp8)

    sigma = first_order_loss_sigma(model.float().train(), tokens)
    step1 = abs(fp8[0] - bf16[0])
    print(f"step 1: |fp8 - bf16| {step1:.3g}, bound LAMBDA sigma {LAMBDA * sigma:.3g} (sigma {sigma:.3g})")
    assert step1 > 0  # FP8 really ran
    assert step1 <= LAMBDA * sigma

    g8 = load_file(str(tmp_path / "fp8" / "debug" / "grads-step-000001.safetensors"))
    g16 = load_file(str(tmp_path / "bf16" / "debug" / "grads-step-000001.safetensors"))
    assert set(g8) == set(g16)
    relative = {n: float(np.linalg.norm(g8[n] - g16[n]) / max(np.linalg.norm(g16[n]), 1e-30)) for n in g16}
    worst = max(relative, key=relative.get)
    print(f"step 1 gradients: largest relative difference {relative[worst]:.3g} ({worst}), "
          f"median {float(np.median(list(relative.values()))):.3g}")
    assert relative[worst] <= 0.5, relative

    assert fp8[-1] < fp8[0]  # it learns
    assert abs(fp8[-1] - bf16[-1]) <= 0.01 * bf16[-1], (fp8, bf16)


def test_fp8_needs_bf16(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    s = base_sections(tmp_path, tmp_path / "init", train={"fp8": True})
    result = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s), check=False)
    assert result.returncode != 0
    assert "'train.fp8'" in result.stderr and 'train.dtype = "bf16"' in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
    s = base_sections(tmp_path, tmp_path / "init", train={"fp8": "yes", "dtype": "bf16"})
    result = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s), check=False)
    assert result.returncode != 0
    assert "train.fp8" in result.stderr and "true or false" in result.stderr, result.stderr
