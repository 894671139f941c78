"""Forward time of siamese_depth against base in the engine, same preset, same tokens, CPU fp32.

Times `archspace logits --repeat` on randomly initialised models (same seed) of: base, siamese_depth
(both switches on), and the two single-switch ablations, and reports each as a ratio to base
(> 1: slower than base). Results: bench/results/variant-<time>.json and a table on stdout.

    .venv/bin/python bench/bench_variant.py [--preset 190M] [--tokens 512] [--threads N] [--repeat 2] [--rounds 2]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import time

import numpy as np

from bench_logits import BINARY, REPO, engine_forward_seconds
from bench_threads import cpu_flags  # noqa: E402

MODELS = {
    "base": ["--variant", "base"],
    "siamese_depth": ["--variant", "siamese_depth"],
    "siamese_only": ["--variant", "siamese_depth", "--no-depth-attention"],
    "depth_only": ["--variant", "siamese_depth", "--no-siamese-norm"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=2, help="timed forwards per process (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the models")
    parser.add_argument("--model-cache", default=str(REPO / "bench" / "results" / "models"))
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {pathlib.Path('/proc/loadavg').read_text().strip()}")

    rng = np.random.default_rng(0)
    result = {"benchmark": "variant_forward", "preset": args.preset, "tokens": args.tokens,
              "threads": args.threads, "dtype": "fp32", "device": "cpu", "median_s": {}, "ratio_to_base": {}}
    tokens = None
    dirs = {}
    for name, flags in MODELS.items():
        dirs[name] = model_dir = pathlib.Path(args.model_cache) / f"{args.preset}-{name}-seed0"
        if not (model_dir / "config.json").exists():
            subprocess.run([str(BINARY), "init", "--preset", args.preset, "--out", str(model_dir), "--seed", "0", *flags],
                           check=True)
        if tokens is None:
            vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
            tokens = rng.integers(0, vocab, args.tokens).tolist()
    # Interleave the models round by round so that drift in machine load hits all of them alike.
    seconds = {name: [] for name in MODELS}
    scratch = pathlib.Path(args.model_cache) / "variant-logits.safetensors"
    for _ in range(args.rounds):
        for name in MODELS:
            s, _ = engine_forward_seconds(dirs[name], tokens, args.threads, args.repeat, scratch)
            seconds[name] += s
    result["seconds"] = seconds
    for name, s in seconds.items():
        result["median_s"][name] = statistics.median(s)
    base = result["median_s"]["base"]
    for name, s in result["median_s"].items():
        result["ratio_to_base"][name] = s / base

    out = REPO / "bench" / "results" / f"variant-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nengine forward, {args.preset}, {args.tokens} tokens, fp32 CPU, {args.threads} threads (median of {args.repeat * args.rounds}, interleaved)")
    for name, s in result["median_s"].items():
        print(f"  {name:<15}{s * 1000:9.1f} ms   {result['ratio_to_base'][name]:.3f}x base")
    print(f"  wrote {out}")


if __name__ == "__main__":
    main()
