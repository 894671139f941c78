"""Training throughput: `archspace train` against the equivalent PyTorch loop on transformers, and
siamese_depth against base, at the same small config, batch and thread count (CPU, fp32), and the
engine's bf16 autocast against its fp32 (faster only on CPUs with AVX512-BF16 or AMX: the CPU flags are
printed and recorded).

Config: the `tiny` preset shapes with a 4096-token vocabulary, sequence 256, micro-batch 4, 12 steps
(the first 2 are warm-up and not counted), AdamW + clipping + z-loss on both sides. Engine tokens/s
come from its metrics.jsonl; the PyTorch loop is timed per step around the same work. Results:
bench/results/train-<time>.json and a table on stdout.

    .venv/bin/python bench/bench_train.py [--steps 12] [--threads N]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from test_train import metrics, reference_training, write_shards, write_toml  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from bench_threads import cpu_flags  # noqa: E402

BINARY = REPO / "build" / "archspace"
VOCAB, SEQ, MICRO = 4096, 256, 4


def init_model(tmp, variant):
    out = tmp / f"init-{variant}"
    subprocess.run([str(BINARY), "init", "--preset", "tiny", "--variant", variant, "--out", str(out)], check=True, capture_output=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(vocab_size=VOCAB, padded_vocab_size=VOCAB)
    (out / "config.json").write_text(json.dumps(cfg))
    subprocess.run([str(BINARY), "init", "--config", str(out / "config.json"), "--out", str(tmp / f"model-{variant}")],
                   check=True, capture_output=True)
    return tmp / f"model-{variant}"


def engine_tokens_per_s(tmp, model_dir, steps, threads, dtype="fp32"):
    run = tmp / f"run-{model_dir.name}-{dtype}"
    toml = write_toml(tmp / f"{model_dir.name}-{dtype}.toml", {
        "model": {"init_from": str(model_dir)},
        "data": {"train": str(tmp / "shards"), "shuffle": False},
        "train": {"run_dir": str(run), "sequence_length": SEQ, "micro_batch": MICRO, "grad_accum": 1, "max_steps": steps,
                  "threads": threads, "dtype": dtype},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
    })
    subprocess.run([str(BINARY), "train", "--config", str(toml)], check=True, capture_output=True)
    return statistics.median(m["tokens_per_s"] for m in metrics(run)[2:])


def torch_tokens_per_s(model_dir, tokens, steps, threads, remote=False):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    if remote:
        from conftest import install_remote_code
        install_remote_code(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=remote).train()
    times = []
    start = time.perf_counter()

    orig_step = torch.optim.AdamW.step

    def timed_step(self, *a, **k):
        nonlocal start
        r = orig_step(self, *a, **k)
        now = time.perf_counter()
        times.append(now - start)
        start = now
        return r

    torch.optim.AdamW.step = timed_step
    try:
        reference_training(model, tokens, steps=steps, seq=SEQ, global_batch=MICRO, micro=MICRO, lr=1e-3, warmup=1)
    finally:
        torch.optim.AdamW.step = orig_step
    return SEQ * MICRO / statistics.median(times[2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    load = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load}")
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        rng = np.random.default_rng(0)
        tokens = rng.integers(2, VOCAB, SEQ * MICRO * (args.steps + 1))
        write_shards(tmp / "shards", tokens, vocab=VOCAB)
        base, variant = init_model(tmp, "base"), init_model(tmp, "siamese_depth")
        result = {
            "benchmark": "train_throughput", "preset": "tiny (vocab 4096)", "sequence_length": SEQ, "micro_batch": MICRO,
            "threads": args.threads, "dtype": "fp32", "device": "cpu", "cpu_flags": cpu_flags(), "loadavg_before": load,
            "engine_base_tok_s": engine_tokens_per_s(tmp, base, args.steps, args.threads),
            "engine_siamese_depth_tok_s": engine_tokens_per_s(tmp, variant, args.steps, args.threads),
            "engine_base_bf16_tok_s": engine_tokens_per_s(tmp, base, args.steps, args.threads, "bf16"),
            "torch_base_tok_s": torch_tokens_per_s(base, tokens, args.steps, args.threads),
            "torch_siamese_depth_tok_s": torch_tokens_per_s(variant, tokens, args.steps, args.threads, remote=True),
        }
    result["engine_vs_torch_base"] = result["engine_base_tok_s"] / result["torch_base_tok_s"]
    result["engine_vs_torch_siamese_depth"] = result["engine_siamese_depth_tok_s"] / result["torch_siamese_depth_tok_s"]
    result["engine_siamese_depth_vs_base"] = result["engine_siamese_depth_tok_s"] / result["engine_base_tok_s"]
    result["engine_bf16_vs_fp32_base"] = result["engine_base_bf16_tok_s"] / result["engine_base_tok_s"]
    out = REPO / "bench" / "results" / f"train-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntraining tokens/s, tiny shapes, vocab {VOCAB}, seq {SEQ} x batch {MICRO}, fp32 CPU, {args.threads} threads")
    print(f"  {'':<16}{'engine':>10}{'PyTorch':>10}{'ratio':>8}")
    for v in ("base", "siamese_depth"):
        print(f"  {v:<16}{result[f'engine_{v}_tok_s']:10.0f}{result[f'torch_{v}_tok_s']:10.0f}{result[f'engine_vs_torch_{v}']:7.2f}x")
    print(f"  engine siamese_depth / base: {result['engine_siamese_depth_vs_base']:.3f}x tokens/s")
    print(f"  engine base bf16 autocast / fp32: {result['engine_bf16_vs_fp32_base']:.3f}x tokens/s "
          f"(CPU flags: {' '.join(result['cpu_flags'])})")
    print(f"  wrote {out}")


if __name__ == "__main__":
    main()
