"""Two builds of the engine side by side: the training step, `generate` and generation-based evaluation timed with
a `--before` binary and an `--after` binary in alternating rounds, so that a change meant to leave speed alone
(a restructuring, a new module) can be shown to, and a busy neighbour falls on both sides of a round alike.

Each round times, with each binary (the order alternates between rounds):
  - the training step (bench_train_step's engine side: 190M, sequence 512, micro-batch 1, fp32 and bf16; the
    median step after its warm-up steps),
  - `generate` (bench_generate's engine side: 190M, a 128-token prompt, 32 new tokens, greedy; batch 1 and the
    left-padded batch of 4; decode tokens/s),
  - `eval downstream --tasks gsm8k` (bench_generation_eval's engine side: micro preset, 8 requests, batch 8;
    requests per second of generation).
Reported per figure: each side's median and range over rounds, and the median and range of the rounds' ratios
(after / before, as speed: above 1 is faster). Prints the CPU flags and /proc/loadavg before and after.
Results: bench/results/compare-builds-<time>.json.

    git worktree add /tmp/before <commit> && cmake -S /tmp/before -B /tmp/before/build ... && cmake --build ...
    .venv/bin/python bench/compare_builds.py --before /tmp/before/build/archspace [--after build/archspace]
                                             [--rounds 3] [--threads N] [--only train,generate,eval]
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
import bench_generate  # noqa: E402
import bench_train_step  # noqa: E402
from bench_downstream import exported_random_model, loadavg  # noqa: E402
from bench_generation_eval import request_lines  # noqa: E402
from bench_threads import cpu_flags  # noqa: E402
from bench_train_step import spread  # noqa: E402
from test_train import write_shards  # noqa: E402


class TrainStep:
    """Steps per second of `train` (the engine side of bench_train_step), one figure per dtype."""

    def __init__(self, tmp, binary, threads, preset="190M", seq=512, steps=10):
        self.tmp, self.threads, self.seq, self.steps = tmp, threads, seq, steps
        self.model = tmp / "train-model"
        subprocess.run([str(binary), "init", "--preset", preset, "--out", str(self.model)], check=True,
                       capture_output=True)
        vocab = json.loads((self.model / "config.json").read_text())["vocab_size"]
        write_shards(tmp / "shards", np.random.default_rng(0).integers(2, vocab, seq * (steps + 1)), vocab=vocab)

    def measure(self, binary, tag):
        out = {}
        for dtype in ("fp32", "bf16"):
            seconds = bench_train_step.engine_step_seconds(self.tmp, self.model, self.seq, self.steps, self.threads,
                                                            dtype, tag, binary=binary)
            out[f"train_step_{dtype}_steps_per_s"] = 1 / statistics.median(seconds)
        return out


class Generate:
    """Decode tokens/s of `generate` (the engine side of bench_generate), batch 1 and the batch of 4."""

    def __init__(self, tmp, binary, threads, preset="190M", prompt=128, new=32):
        self.tmp, self.threads, self.new = tmp, threads, new
        self.model = bench_generate.model_dir(preset, "base", str(REPO / "bench" / "results" / "models"))
        rng = np.random.default_rng(0)
        self.prompt = rng.integers(0, 100000, prompt).tolist()
        self.batch = [rng.integers(0, 100000, max(1, prompt * k // 4)).tolist() for k in (4, 1, 3, 2)]

    def measure(self, binary, tag):
        prompts = self.tmp / "prompts.jsonl"
        _, one, _ = bench_generate.engine(self.model, [self.prompt], self.new, self.threads, 1, prompts, binary)
        _, four, _ = bench_generate.engine(self.model, self.batch, self.new, self.threads, 1, prompts, binary)
        return {"generate_batch1_decode_tok_s": one, "generate_batch4_decode_tok_s": four}


class GenerationEval:
    """Requests/s of `eval downstream --tasks gsm8k` (the engine side of bench_generation_eval)."""

    def __init__(self, tmp, binary, threads, preset="micro", task="gsm8k", limit=8, batch=8):
        self.threads, self.task, self.limit, self.batch = threads, task, limit, batch
        self.dir = exported_random_model(preset, "compare_builds_")
        request_lines(task, limit)  # fails early if the installed task data is missing

    def measure(self, binary, tag):
        out, req = self.dir / f"out-{tag}.json", self.dir / f"req-{tag}.jsonl"
        subprocess.run([str(binary), "--threads", str(self.threads), "eval", "downstream", "--model",
                        str(self.dir / "hf"), "--tasks", self.task, "--limit", str(self.limit), "--batch-size",
                        str(self.batch), "--out", str(out), "--requests-out", str(req)], check=True,
                       capture_output=True)
        rows = len(req.read_text().splitlines())
        return {"generation_eval_requests_per_s": rows / json.loads(out.read_text())["generation_seconds"]}


BENCHES = {"train": TrainStep, "generate": Generate, "eval": GenerationEval}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the binary of the build before the change")
    parser.add_argument("--after", default=str(REPO / "build" / "archspace"), help="the binary after it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--only", default=",".join(BENCHES), help="which benches, comma-separated")
    args = parser.parse_args()
    chosen = args.only.split(",")
    if not set(chosen) <= set(BENCHES):
        parser.error(f"--only {args.only!r}: expected some of {', '.join(BENCHES)}, comma-separated")
    binaries = {"before": pathlib.Path(args.before).resolve(), "after": pathlib.Path(args.after).resolve()}
    for side, path in binaries.items():
        if not os.access(path, os.X_OK):
            parser.error(f"--{side} {path}: not an executable")
    load_before = loadavg()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load_before}", flush=True)
    figures = {side: {} for side in binaries}
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        benches = [BENCHES[name](tmp, binaries["after"], args.threads) for name in chosen]
        for r in range(args.rounds):
            order = list(binaries) if r % 2 == 0 else list(reversed(binaries))
            for side in order:
                for bench in benches:
                    for name, value in bench.measure(binaries[side], f"{side}-{r}").items():
                        figures[side].setdefault(name, []).append(value)
            print(f"round {r + 1} (load {loadavg()}): " + "; ".join(
                f"{name} {figures['before'][name][-1]:.3f} -> {figures['after'][name][-1]:.3f}"
                for name in figures["after"]), flush=True)
    result = {"benchmark": "compare_builds", "binaries": {k: str(v) for k, v in binaries.items()},
              "threads": args.threads, "rounds": args.rounds, "cpu_flags": cpu_flags(), "loadavg_before": load_before,
              "figures": {}}
    print(f"\n{'':34}{'before':>10}{'after':>10}{'after/before per round':>30}")
    for name in figures["after"]:
        ratios = [a / b for a, b in zip(figures["after"][name], figures["before"][name])]
        result["figures"][name] = {"before": spread(figures["before"][name]), "after": spread(figures["after"][name]),
                                   "after_over_before": spread(ratios)}
        print(f"  {name:32}{statistics.median(figures['before'][name]):10.3f}"
              f"{statistics.median(figures['after'][name]):10.3f}"
              f"{statistics.median(ratios):17.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")
    result["loadavg_after"] = loadavg()
    out = REPO / "bench" / "results" / f"compare-builds-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"  load after: {result['loadavg_after']}; wrote {out}")


if __name__ == "__main__":
    main()
