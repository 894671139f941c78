"""bf16 against fp32 for the commands that compute with bf16 weights (issue 52 item 1): `eval ppl`, `eval downstream`
(multiple-choice scoring), `analyze` and batched decoding (`generate` with 8 prompts: the engine `serve` runs), each
with `--dtype bf16` and `--dtype fp32` on the same model and data, under each of `--kernel-paths`
(scripts/kernel_paths.sh; default avx2, where LibTorch has no native bf16 GEMM and the engine widens its bf16
matmuls to fp32, kernels/bf16_matmuls.h, and native for comparison). Training's step is bench_train_step.py's.

A figure is the whole command's wall time (loading the model included: it is what a user waits for), and bf16's
speed against fp32's is fp32 seconds / bf16 seconds. The two dtypes run back to back within a round and rounds
repeat, so a busy neighbour falls on both sides of a round's ratio; the median and range over rounds are reported.
Goal (issue 52): >= 0.8x on the avx2 path. Prints the CPU flags and /proc/loadavg before and after. Results:
bench/results/bf16-commands-<time>.json.

    .venv/bin/python bench/bench_bf16_commands.py [--preset 190M] [--rounds 3] [--threads N]
                                                  [--kernel-paths avx2,native] [--only ppl,score,analyze,decode]
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
from bench_downstream import loadavg  # noqa: E402
from bench_train_step import spread  # noqa: E402
from test_train import write_shards  # noqa: E402

BINARY = REPO / "build" / "archspace"


def commands(tmp, model, threads):
    """Each command's arguments after `archspace --threads N`, without --dtype."""
    common = ["--threads", str(threads)]
    prompts = tmp / "prompts.jsonl"
    rng = np.random.default_rng(1)
    prompts.write_text("".join(json.dumps({"tokens": rng.integers(2, 50000, 32 + 8 * k).tolist()}) + "\n"
                               for k in range(8)))
    return {
        # 4 windows of 512 tokens: the forward of scoring without the task files.
        "ppl": [*common, "eval", "ppl", "--model", str(model), "--data", str(tmp / "shards"), "--context", "512",
                "--max-tokens", "2048"],
        # 20 ARC-Easy documents, rc, 0 shots: batched log-likelihoods of short continuations.
        "score": [*common, "eval", "downstream", "--model", str(model), "--tokenizer", "dolma2", "--tasks", "arc_easy",
                  "--shots", "0",
                  "--limit", "20", "--out", str(tmp / "score.json")],
        "analyze": [*common, "analyze", "--model", str(model), "--data", str(tmp / "shards"), "--sequences", "4",
                    "--sequence-length", "256", "--out", str(tmp / "analysis"), "--no-plot"],
        # 8 prompts of 32-88 tokens, 16 new tokens each: prefill and batched decode steps.
        "decode": [*common, "generate", "--model", str(model), "--tokenizer", "dolma2", "--prompts-file", str(prompts),
                   "--max-new-tokens", "16"],
    }


def timed(kernel_path, args):
    start = time.perf_counter()
    subprocess.run(["bash", str(REPO / "scripts" / "kernel_paths.sh"), kernel_path, str(BINARY), *args], check=True,
                   capture_output=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--kernel-paths", default="avx2,native")
    parser.add_argument("--only", default="ppl,score,analyze,decode")
    args = parser.parse_args()
    paths, only = args.kernel_paths.split(","), args.only.split(",")
    known = subprocess.run(["bash", str(REPO / "scripts" / "kernel_paths.sh"), "list"], check=True, capture_output=True,
                           text=True).stdout.split()
    if not set(paths) <= set(known):
        parser.error(f"--kernel-paths {args.kernel_paths!r}: expected some of {', '.join(known)}, comma-separated")
    load_before = loadavg()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load_before}", flush=True)
    seconds = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        model = tmp / "model"
        subprocess.run([str(BINARY), "init", "--preset", args.preset, "--out", str(model)], check=True,
                       capture_output=True)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        write_shards(tmp / "shards", np.random.default_rng(0).integers(2, vocab, 4096), vocab=vocab)
        table = commands(tmp, model, args.threads)
        unknown = set(only) - set(table)
        if unknown:
            parser.error(f"--only {args.only!r}: expected some of {', '.join(table)}")
        for r in range(args.rounds):
            for path in paths:
                for name in only:
                    dtypes = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
                    for dtype in dtypes:
                        seconds.setdefault((path, name, dtype), []).append(
                            timed(path, [*table[name], "--dtype", dtype]))
            print(f"round {r + 1} (load {loadavg()}): " + ", ".join(
                f"{p}/{n}/{d} {v[-1]:.2f} s" for (p, n, d), v in seconds.items()), flush=True)
    result = {"benchmark": "bf16_commands", "preset": args.preset, "threads": args.threads, "rounds": args.rounds,
              "cpu_flags": cpu_flags(), "loadavg_before": load_before, "figures": {}}
    print(f"\n{args.preset}, {args.threads} threads, {args.rounds} rounds: bf16's speed against fp32's "
          "(fp32 s / bf16 s, whole command)")
    for path in paths:
        for name in only:
            fp32, bf16 = seconds[(path, name, "fp32")], seconds[(path, name, "bf16")]
            ratio = spread([f / b for f, b in zip(fp32, bf16)])
            result["figures"][f"{path}/{name}"] = {"fp32_seconds": spread(fp32), "bf16_seconds": spread(bf16),
                                                   "bf16_speed_vs_fp32": ratio}
            print(f"  {path:9}{name:9} fp32 {statistics.median(fp32):7.2f} s  bf16 {statistics.median(bf16):7.2f} s  "
                  f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")
    result["loadavg_after"] = loadavg()
    out = REPO / "bench" / "results" / f"bf16-commands-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"  load after: {result['loadavg_after']}; wrote {out}")


if __name__ == "__main__":
    main()
