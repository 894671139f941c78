"""The training step with train.fused_kernels on and off, side by side on the CPU (kernels/fused_training.h): the
same model, data and steps as bench_train_step's engine side (190M, sequence 512, micro-batch 1, fp32 and bf16
autocast), the two settings in alternating order each round so that a busy neighbour falls on both alike; the
ratio off / on per round (above 1: the fused kernels are faster), median and range. Also each kernel's own time
beside the composite's from build/check_kernels --device cpu (tiny shapes: dispatch-bound, an upper bound on what
fusing saves per call).

On the CPU the step is its matmuls; the elementwise work the kernels fuse is a few percent of it, so this measures
that the kernels cost nothing here. The figure they are for is the GPU's (scripts/device_check.py:
training_1b_fused and the fused_kernels check's timing).

    .venv/bin/python bench/bench_fused_kernels.py [--preset 190M] [--seq 512] [--steps 8] [--rounds 3] [--threads N]

Results: bench/results/fused-kernels-<time>.json and a line per figure on stdout.
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
from bench_threads import cpu_flags  # noqa: E402
from bench_train_step import BINARY, engine_step_seconds, spread  # noqa: E402
from test_train import write_shards  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first 4 are not counted)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    load_before = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load_before}")
    result = {"benchmark": "fused_kernels", "preset": args.preset, "sequence_length": args.seq, "micro_batch": 1,
              "threads": args.threads, "cpu_flags": cpu_flags(), "loadavg_before": load_before}
    kernels = subprocess.run([str(BINARY.parent / "check_kernels"), "--device", "cpu"], capture_output=True,
                             text=True, check=True)
    result["kernels_cpu_tiny_shapes"] = json.loads(kernels.stdout.strip().splitlines()[-1])["timing_ms"]
    rounds = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        model_dir = tmp / "model"
        subprocess.run([str(BINARY), "init", "--preset", args.preset, "--out", str(model_dir)], check=True,
                       capture_output=True)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        tokens = np.random.default_rng(0).integers(2, vocab, args.seq * (args.steps + 1))
        write_shards(tmp / "shards", tokens, vocab=vocab)
        for r in range(args.rounds):
            for dtype in ("fp32", "bf16"):
                order = (False, True) if r % 2 == 0 else (True, False)
                for fused in order:
                    name = f"{dtype}_{'fused' if fused else 'composite'}"
                    seconds = engine_step_seconds(tmp, model_dir, args.seq, args.steps, args.threads, dtype,
                                                  f"{name}-{r}", train_extra={"fused_kernels": fused})
                    rounds.setdefault(name, []).append(statistics.median(seconds))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in rounds.items()), flush=True)
    result["step_seconds"] = {k: spread(v) for k, v in rounds.items()}
    for dtype in ("fp32", "bf16"):
        ratios = [c / f for c, f in zip(rounds[f"{dtype}_composite"], rounds[f"{dtype}_fused"])]
        result[f"composite_over_fused_{dtype}"] = spread(ratios)
        print(f"{dtype}: composite / fused step time {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}; above 1: fused faster)")
    result["loadavg_after"] = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"load after: {result['loadavg_after']}")
    out = REPO / "bench" / "results" / f"fused-kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
