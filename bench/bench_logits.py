"""Forward-pass speed: `archspace logits` against transformers' Olmo3ForCausalLM.

Same random model (the 190M preset, written once by `archspace init`), same 512 tokens, CPU, fp32, the
same thread count on both sides. Reports the median of several forwards after a warm-up, as a ratio
(transformers time / engine time: > 1 means the engine is faster), and checks that both computed the
same logits. Results go to bench/results/logits-<time>.json and a table on stdout.

    .venv/bin/python bench/bench_logits.py [--preset 190M] [--tokens 512] [--threads N] [--repeat 5]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch
from safetensors.numpy import load_file
from bench_threads import cpu_flags  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"


def engine_forward_seconds(model_dir, tokens, threads, repeat, out):
    cmd = [str(BINARY), "--threads", str(threads), "logits", "--model", str(model_dir),
           "--tokens", " ".join(map(str, tokens)), "--out", str(out), "--repeat", str(repeat + 1)]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    line = next(l for l in result.stderr.splitlines() if l.startswith("forward_seconds:"))
    seconds = [float(x) for x in line.split(":")[1].split()]
    return seconds[1:], wall  # the first run is the warm-up


def hf_forward_seconds(model_dir, tokens, threads, repeat):
    from transformers import Olmo3ForCausalLM

    torch.set_num_threads(threads)
    start = time.perf_counter()
    model = Olmo3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([tokens])
    seconds = []
    with torch.inference_mode():
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            logits = model(ids).logits
            seconds.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    return seconds[1:], wall, logits[0].float().numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--model-cache", default=str(REPO / "bench" / "results" / "models"))
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {pathlib.Path('/proc/loadavg').read_text().strip()}")

    model_dir = pathlib.Path(args.model_cache) / f"{args.preset}-base-seed0"
    if not (model_dir / "config.json").exists():
        print(f"writing a random {args.preset} model to {model_dir} ...", flush=True)
        subprocess.run([str(BINARY), "init", "--preset", args.preset, "--out", str(model_dir), "--seed", "0"], check=True)
    rng = np.random.default_rng(0)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    tokens = rng.integers(0, vocab, args.tokens).tolist()

    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "logits.safetensors"
        engine_s, engine_wall = engine_forward_seconds(model_dir, tokens, args.threads, args.repeat, out)
        engine_logits = load_file(str(out))["logits"]
    hf_s, hf_wall, hf_logits = hf_forward_seconds(model_dir, tokens, args.threads, args.repeat)

    engine_med, hf_med = statistics.median(engine_s), statistics.median(hf_s)
    result = {
        "benchmark": "forward_logits",
        "preset": args.preset,
        "tokens": args.tokens,
        "threads": args.threads,
        "dtype": "fp32",
        "device": "cpu",
        "torch": torch.__version__,
        "engine_forward_s": engine_s,
        "transformers_forward_s": hf_s,
        "engine_median_s": engine_med,
        "transformers_median_s": hf_med,
        "speedup_vs_transformers": hf_med / engine_med,
        "engine_process_wall_s": engine_wall,
        "transformers_load_and_run_wall_s": hf_wall,
        "max_abs_logit_diff": float(np.abs(engine_logits - hf_logits).max()),
        "engine_tokens_per_s": args.tokens / engine_med,
    }
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"logits-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")

    print(f"\nforward, {args.preset}, {args.tokens} tokens, fp32 CPU, {args.threads} threads (median of {args.repeat})")
    print(f"  {'engine':<14}{engine_med * 1000:9.1f} ms   {args.tokens / engine_med:8.0f} tok/s")
    print(f"  {'transformers':<14}{hf_med * 1000:9.1f} ms   {args.tokens / hf_med:8.0f} tok/s")
    print(f"  speedup (transformers / engine): {result['speedup_vs_transformers']:.2f}x")
    print(f"  max |logit diff|: {result['max_abs_logit_diff']:.2e}")
    print(f"  wrote {path}")


if __name__ == "__main__":
    main()
