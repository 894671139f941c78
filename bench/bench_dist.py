"""Data-parallel training throughput on the CPU: one process (grad_accum 2, 2 threads) against two Gloo
ranks under torchrun (grad_accum 1, 1 thread each) at the same global batch, the same cores and the same
instances. On a 2-core machine this is a correctness setting, not a speed-up: both sides use the same two
cores, and the ranks add an all-reduce of every gradient per step. The figure says what data
parallelism costs here; on GPUs (one rank per device) it is the scaling that matters, and
`bench/bench_dist.py --ranks N` should be run there when a GPU machine is lent.

Config: the tiny preset with a 4096-token vocabulary, sequence 256, micro-batch 4, 14 steps (the first 4
are warm-up). Tokens/s from rank 0's metrics.jsonl (global tokens per step / step time). Results:
bench/results/dist-<time>.json and a table.

    .venv/bin/python bench/bench_dist.py [--steps 14] [--ranks 2]
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

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "bench"))
from bench_train import VOCAB, SEQ, MICRO, init_model  # noqa: E402
from bench_threads import cpu_flags  # noqa: E402
from test_train import metrics, write_shards, write_toml  # noqa: E402

BINARY = REPO / "build" / "archspace"
TORCHRUN = pathlib.Path(sys.executable).with_name("torchrun")


def run(tmp, model_dir, name, ranks, accum, threads, steps):
    toml = write_toml(tmp / f"{name}.toml", {
        "model": {"init_from": str(model_dir)},
        "data": {"train": str(tmp / "shards"), "shuffle": False},
        "train": {"run_dir": str(tmp / name), "sequence_length": SEQ, "micro_batch": MICRO, "grad_accum": accum,
                  "max_steps": steps, "threads": threads},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
    })
    command = [str(BINARY), "train", "--config", str(toml)]
    if ranks > 1:
        command = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), "--no-python"] + command
    subprocess.run(command, check=True, capture_output=True)
    lines = metrics(tmp / name)
    return statistics.median(m["tokens_per_s"] for m in lines[4:]), [m["loss"] for m in lines]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--ranks", type=int, default=2)
    a = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        rng = np.random.default_rng(0)
        write_shards(tmp / "shards", rng.integers(2, VOCAB, 400_000), vocab=VOCAB)
        model = init_model(tmp, "base")
        load = pathlib.Path("/proc/loadavg").read_text().split()[0]
        one, one_losses = run(tmp, model, "one", 1, a.ranks, cores, a.steps)
        many, many_losses = run(tmp, model, "ranks", a.ranks, 1, max(1, cores // a.ranks), a.steps)
    worst = max(abs(x - y) / abs(x) for x, y in zip(one_losses, many_losses))
    print(f"CPU flags: {' '.join(cpu_flags())}; cores: {cores}; load before: {load}")
    print(f"global batch {MICRO * a.ranks} x {SEQ} tokens, tiny preset (vocab {VOCAB}), fp32, {a.steps} steps")
    print(f"  1 process  (grad_accum {a.ranks}, {cores} threads):      {one:9.0f} tok/s")
    print(f"  {a.ranks} ranks    (grad_accum 1, {max(1, cores // a.ranks)} thread(s) each): {many:9.0f} tok/s   ratio {many / one:.2f}x")
    print(f"  losses: max relative difference {worst:.2e} (the same instances; fp32 sum order)")
    out = REPO / "bench" / "results" / f"dist-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_flags": cpu_flags(), "cores": cores, "one_process_tok_s": one, "ranks": a.ranks,
                               "ranks_tok_s": many, "ratio": many / one, "max_rel_loss_diff": worst}, indent=2))


if __name__ == "__main__":
    main()
