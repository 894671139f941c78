#!/usr/bin/env python3
"""Training tokens/s of transformers' Olmo3ForCausalLM as a user gets it fastest without the engine (issue 49's
baseline; scripts/device_check.py runs it in a process of its own, so that its deadline can stop it and the
GPU memory it holds is given back before the next figure). Prints one JSON line.

The model is built from a model directory's config.json (random weights: the figure is speed), with fp32
parameters under torch.autocast bf16, torch.compile(model) (inductor) and torch.optim.AdamW(fused=True), as
transformers' Trainer does by default (adamw_torch_fused, max_grad_norm 1.0; fused AdamW runs on the CPU too
since torch 2.4), with the engine's optimizer settings (weight decay 0.1, clipping at 1.0). The loss is
transformers' own (labels = input ids, shifted inside). Each step's tokens/s is micro_batch x sequence_length
over its wall time (the device synchronized at both ends); the first steps include the compile.
"""
import argparse
import json
import time

import numpy as np


def synchronize(device):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train(config_dir, device, sequence_length, micro_batch, steps, seed=0):
    import torch
    from transformers import Olmo3Config, Olmo3ForCausalLM

    torch.manual_seed(seed)
    config = Olmo3Config.from_pretrained(config_dir)
    with torch.device(device):  # initialized where it trains: a 1B on the CPU first would take longer than its steps
        model = Olmo3ForCausalLM(config).to(torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    compiled = torch.compile(model)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed)
    seconds, losses = [], []
    for _ in range(steps):
        ids = torch.tensor(rng.integers(2, 1000, (micro_batch, sequence_length)), device=device)
        synchronize(device)
        start = time.time()
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        seconds.append(time.time() - start)
        losses.append(float(loss.detach()))
    tokens = micro_batch * sequence_length
    return {"step_seconds": seconds, "tokens_per_s": [tokens / max(t, 1e-9) for t in seconds], "losses": losses,
            "parameters": sum(p.numel() for p in model.parameters()),
            "peak_memory_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if device_type == "cuda" else None,
            "attention": model.config._attn_implementation, "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model directory (its config.json is read)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sequence-length", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    a = p.parse_args()
    print(json.dumps(train(a.model, a.device, a.sequence_length, a.micro_batch, a.steps)))


if __name__ == "__main__":
    main()
