"""bf16 and int8 weights against fp32 for decoding (issue 25 items 1 and 4): batch-1 decode tokens/s of `archspace
generate --dtype fp32`, `--dtype bf16` and `--quantization int8` on the same model and prompt, run in rotating
rounds (so all see the same machine), the ratio to fp32 per round with its median and range; then the same decode
with the three variants in one process, their steps interleaved (build/bench_decode_steps: a shared host's memory
bandwidth moves by tens of percent between one process and the next, which the per-round ratios of separate
processes carry and the interleaved steps cancel), again on the AVX2 kernels where the CPU has AVX512-BF16 (the
dispatch's two vector paths, ARCHSPACE_MAX_CPU_ISA=avx2), and at --batch rows (batched decoding: generation tasks,
`serve`; compute-bound rather than memory-bound); and the roofline measured in the same run:
memory read bandwidth (a torch.sum over a 1 GiB fp32 tensor with the same threads, larger than any cache), so
each decode rate is also shown as a percentage of what reading its weights at that bandwidth would allow
(the weights a token reads: every linear layer and the head, not the embedding table, which is gathered).

    .venv/bin/python bench/bench_decode_dtype.py [--preset 190M] [--prompt 128] [--new 32] [--pairs 5] [--batch 8]

Goals (issue 25): bf16 decode >= 1.8x fp32, int8 >= 3x, on the 190M preset at batch 1. Results: bench/results/decode-dtype-<time>.json.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import time

import numpy as np
import torch
from bench_generate import model_dir
from bench_threads import cpu_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"
STEPS_BINARY = REPO / "build" / "bench_decode_steps"


# variant -> (generate's flags, bytes a weight): int8 keeps fp32 activations with int8 matmul weights.
VARIANTS = {"fp32": (["--dtype", "fp32"], 4), "bf16": (["--dtype", "bf16"], 2), "int8": (["--quantization", "int8"], 1)}


def decode_rate(d, prompt, new, threads, variant):
    r = subprocess.run([str(BINARY), "--threads", str(threads), "generate", "--model", str(d), "--tokenizer", "dolma2",
                        "--prompt-tokens", " ".join(map(str, prompt)), "--max-new-tokens", str(new),
                        *VARIANTS[variant][0]], capture_output=True, text=True, check=True)
    m = re.search(r"decode (\d+) tokens in ([0-9.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2))


def interleaved(d, prompt, new, threads, rounds, batch=1, isa=None):
    """bench_decode_steps' figures: per-round tokens/s of each variant and ratios to fp32, steps interleaved;
    `isa` caps the engine's kernels (ARCHSPACE_MAX_CPU_ISA)."""
    out = REPO / "bench" / "results" / f".decode-steps-{os.getpid()}.json"
    env = dict(os.environ, **({"ARCHSPACE_MAX_CPU_ISA": isa} if isa else {}))
    try:
        subprocess.run([str(STEPS_BINARY), "--model", str(d), "--prompt-tokens", " ".join(map(str, prompt)),
                        "--new", str(new), "--rounds", str(rounds), "--threads", str(threads), "--batch", str(batch),
                        "--out", str(out)], check=True, capture_output=True, text=True, env=env)
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def read_bandwidth(threads, repeat=7):
    """GB/s of torch.sum over 1 GiB of fp32 (median of `repeat`)."""
    torch.set_num_threads(threads)
    x = torch.ones(256 * 1024 * 1024)
    x.sum()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times) / 1e9


def model_sizes(d):
    """A model directory's shapes: layers, hidden size, query and KV features, vocabulary, and the parameters of
    the layers' matmul weights and of the head."""
    c = json.loads((d / "config.json").read_text())
    D, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    h = c.get("head_dim") or D // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * h, c["num_key_value_heads"] * h
    return {"layers": L, "hidden": D, "q": q, "kv": kv, "vocab": V,
            "layer_matmul_params": L * (D * q + 2 * D * kv + q * D + 3 * D * I), "head_params": V * D}


def weights_read_per_token(d):
    """Parameters every decode step reads: the linear layers and the head (not the embedding rows it gathers,
    nor the norms, which are small)."""
    sizes = model_sizes(d)
    return sizes["layer_matmul_params"] + sizes["head_params"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--pairs", type=int, default=5, help="rounds, each running every variant once")
    parser.add_argument("--batch", type=int, default=8, help="rows of the batched interleaved run (0: none)")
    parser.add_argument("--model-cache", default=str(REPO / "bench" / "results" / "models"))
    args = parser.parse_args()
    load_before = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load_before}")
    prompt = np.random.default_rng(0).integers(0, 100000, args.prompt).tolist()
    d = model_dir(args.preset, "base", args.model_cache)
    bandwidth = [read_bandwidth(args.threads)]
    variants = list(VARIANTS)
    rates = {v: [] for v in variants}
    for i in range(args.pairs):  # rotate which goes first, so a drift in the machine falls on all
        for v in variants[i % len(variants):] + variants[:i % len(variants)]:
            rates[v].append(decode_rate(d, prompt, args.new, args.threads, v))
    steps = interleaved(d, prompt, args.new, args.threads, args.pairs)
    more = {}  # the other kernel path and the batched decode, each steps interleaved
    if "avx512_bf16" in cpu_flags():
        more["avx2 kernels, batch 1"] = ("interleaved_steps_avx2", interleaved(d, prompt, args.new, args.threads,
                                                                               args.pairs, isa="avx2"))
    if args.batch > 1:
        more[f"batch {args.batch}"] = ("interleaved_steps_batch", interleaved(d, prompt, args.new, args.threads,
                                                                              args.pairs, batch=args.batch))
    bandwidth.append(read_bandwidth(args.threads))
    ratios = {v: [r / f for f, r in zip(rates["fp32"], rates[v])] for v in variants if v != "fp32"}
    params = weights_read_per_token(d)
    gbs = statistics.median(bandwidth)
    limit = {v: gbs * 1e9 / (VARIANTS[v][1] * params) for v in variants}  # tokens/s at the roofline
    med = {v: statistics.median(rates[v]) for v in variants}
    result = {"benchmark": "decode-dtype", "preset": args.preset, "prompt_tokens": args.prompt, "new_tokens": args.new,
              "threads": args.threads, "cpu_flags": cpu_flags(), "load_before": load_before,
              "load_after": pathlib.Path("/proc/loadavg").read_text().strip(),
              "read_bandwidth_gb_s": bandwidth, "weights_read_per_token": params,
              **{f"{v}_decode_tok_s": rates[v] for v in variants},
              **{f"{v}_over_fp32": ratios[v] for v in ratios},
              **{f"{v}_over_fp32_median": statistics.median(ratios[v]) for v in ratios},
              "roofline_tok_s": limit, "percent_of_roofline": {k: 100 * med[k] / limit[k] for k in med},
              "interleaved_steps": steps, **{key: r for key, r in more.values()}}
    out = REPO / "bench" / "results" / f"decode-dtype-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nbatch-1 decode, {args.preset}, prompt {args.prompt}, {args.new} new tokens, {args.threads} threads, "
          f"{args.pairs} rotating rounds")
    print(f"  read bandwidth {gbs:.1f} GB/s (before/after: {bandwidth[0]:.1f}/{bandwidth[1]:.1f}); "
          f"{params / 1e6:.0f}M weights read per token")
    for k in variants:
        runs = rates[k]
        print(f"  {k}: median {med[k]:.1f} tok/s (range {min(runs):.1f}-{max(runs):.1f}); roofline "
              f"{limit[k]:.1f} tok/s: {100 * med[k] / limit[k]:.0f}% of it")
    for k, goal in (("bf16", 1.8), ("int8", 3.0)):
        r = ratios[k]
        print(f"  {k} / fp32: median {statistics.median(r):.2f}x (range {min(r):.2f}-{max(r):.2f}; goal {goal}x)")
    for title, run in [(steps["kernel_path"] + " kernels, batch 1", steps)] + [(t, r) for t, (_, r) in more.items()]:
        print(f"  in one process, steps interleaved ({args.pairs} rounds), {title}:")
        for k in variants:
            runs = run[f"{k}_decode_tok_s"]
            line = f"    {k}: median {statistics.median(runs):.1f} tok/s (range {min(runs):.1f}-{max(runs):.1f})"
            if k != "fp32":
                r = run[f"{k}_over_fp32"]
                line += f"; / fp32: median {statistics.median(r):.2f}x (range {min(r):.2f}-{max(r):.2f})"
            print(line)
    print(f"  load after: {result['load_after']}; wrote {out}")


if __name__ == "__main__":
    main()
