"""A training step against the roofline (issue 25 items 2 and 4): `archspace train` against the same step in PyTorch
eager (transformers' Olmo3ForCausalLM, torch.optim.AdamW(fused=True), the z-loss and clipping the engine applies),
fp32 and bf16 autocast, on one preset at one sequence length and micro-batch 1, with the same threads; and the limits
measured in the same run: the fp32 and bf16 GEMM peaks (torch.mm of 4096 x 4096, median of several) and the memory read
bandwidth. Each side's step is also shown as achieved FLOP/s (6 x parameters in matmuls x tokens plus the attention
scores, forward and backward) and as a percentage of its dtype's GEMM peak.

Memory: `archspace train` keeps freed memory for reuse (util/malloc_policy.h: glibc's M_MMAP_MAX = 0), where PyTorch
runs with glibc's defaults, under which every large tensor of a step is a fresh mmap faulted in page by page. That
alone made the engine's 190M bf16 step 1.46x faster. So PyTorch's step is timed twice a round: as it runs by default,
and under the engine's policy (GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647, the
same settings; jemalloc or tcmalloc do the like), and each ratio is reported against both.

The sides run in alternating rounds (engine fp32, PyTorch fp32 both ways, engine bf16, PyTorch bf16 both ways, then
again), so a busy neighbour slows both sides of a ratio alike; each ratio is reported as the median over rounds with
its range, and each round's limits are printed with its times. The share of the GEMM peak is given twice: the sides'
median step against the median peak, and per round (each round's step against the peak read in that round, median
and range), the spread a goal's margin is judged against. Every run of either side is a fresh process: PyTorch's
steps once ran in this process, and its heap and caches carried over from round to round (on a 16-core AMX Xeon its
bf16 step read 1.59 s in the first round and 2.23 s in the next two), where every engine run starts clean.

    .venv/bin/python bench/bench_train_step.py [--preset 190M] [--seq 512] [--steps 10] [--rounds 3] [--threads N]
                                               [--dtypes fp32,bf16]

Goal (issue 25): bf16 >= 1.5x PyTorch eager with fused AdamW and >= 40% of the bf16 GEMM peak on CPUs with
AVX512-BF16 or AMX; fp32 >= 1.1x. Results: bench/results/train-step-<time>.json and a table on stdout.

The engine's bf16 step against its fp32 step is also reported on each of `--kernel-paths` (scripts/kernel_paths.sh;
default native and avx2): under avx2 LibTorch has no native bf16 GEMM, and the engine widens its bf16 matmuls to fp32
(kernels/bf16_matmuls.h), so bf16 should run at >= 0.8x fp32's speed there (issue 52; it ran at 1/50 without).
"""
import argparse
import json
import os
import pathlib
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "bench"))
from bench_decode_dtype import read_bandwidth  # noqa: E402
from bench_threads import cpu_flags  # noqa: E402
from test_train import metrics, write_shards, write_toml  # noqa: E402

BINARY = REPO / "build" / "archspace"
# PyTorch's two memory set-ups: glibc's defaults, and the engine's policy (util/malloc_policy.h) as glibc tunables.
TORCH_MALLOC = {"torch": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647", "torch_default_malloc": None}
# Steps not counted on either side: kernel caches, and the engine's heap, which grows over the first steps
# (AdamW's moments appear at step 1, then the allocator's free lists settle) until no step faults in a new
# page (perf stat -e page-faults: none from step ~5 of the 190M preset). Steady state is what a run of
# thousands of steps sees.
WARMUP = 4


def gemm_peak(dtype, threads, n=4096, repeat=5):
    """GFLOP/s of torch.mm on n x n operands in `dtype` (median of `repeat` after one warm-up)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def step_flops(config, seq):
    """Model FLOPs of one training step of one sequence: 6 x (the matmul parameters: every linear layer and the
    head, not the embedding, which is gathered) per token, plus the attention scores and weighted sums (QK^T and
    PV: 2 x 2 x T^2/2 x width per layer forward, causal, counted for full attention as is usual), times 3 for
    forward + backward."""
    D, I, L, V = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    h = config.get("head_dim") or D // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * h, config["num_key_value_heads"] * h
    matmul_params = L * (D * q + 2 * D * kv + q * D + 3 * D * I) + V * D
    attention = L * 2 * 2 * (seq * seq / 2) * q
    return 6 * matmul_params * seq + 3 * attention


def engine_step_seconds(tmp, model_dir, seq, steps, threads, dtype, tag, kernel_path="native", binary=BINARY,
                        train_extra=None):
    run = tmp / f"run-{dtype}-{tag}"
    toml = write_toml(tmp / f"{dtype}-{tag}.toml", {
        "model": {"init_from": str(model_dir)},
        "data": {"train": str(tmp / "shards"), "shuffle": False},
        "train": {"run_dir": str(run), "sequence_length": seq, "micro_batch": 1, "grad_accum": 1, "max_steps": steps,
                  "threads": threads, "dtype": dtype, **(train_extra or {})},
        "optim": {"lr": 1e-4, "warmup_steps": 0, "weight_decay": 0.1, "clip_grad_norm": 1.0, "z_loss": 1e-4,
                  "fused": True},
    })
    done = subprocess.run(["bash", str(REPO / "scripts" / "kernel_paths.sh"), kernel_path, str(binary), "train",
                           "--config", str(toml)], capture_output=True, text=True)
    if done.returncode != 0:  # say why: a bench that stops without the engine's message cannot be acted on
        raise RuntimeError(f"{binary} train --config {toml} exited {done.returncode}:\n{done.stderr[-2000:]}")
    seconds = [seq / m["tokens_per_s"] for m in metrics(run)[WARMUP:]]
    # Each run leaves a final checkpoint (2.3 GB at 190M with AdamW's moments): compare_builds' 20 runs filled a 53 GB
    # disk before this removal.
    shutil.rmtree(run)
    return seconds


def torch_step_seconds(model_dir, tokens_file, seq, steps, threads, dtype, glibc_tunables):
    """The PyTorch step's seconds, timed in a fresh process (see the module's docstring) with `glibc_tunables`
    (None: glibc's defaults)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    if glibc_tunables:
        env["GLIBC_TUNABLES"] = glibc_tunables
    out = subprocess.run([sys.executable, __file__, "--torch-side", str(model_dir), str(tokens_file), "--seq", str(seq),
                          "--steps", str(steps), "--threads", str(threads), "--dtypes", dtype],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def torch_side(model_dir, tokens, seq, steps, threads, dtype):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    windows = torch.tensor(np.asarray(tokens[: (len(tokens) // seq) * seq], dtype=np.int64)).view(-1, seq)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        ids = windows[step:step + 1]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(ids).logits[:, :-1].float()
        lse = torch.logsumexp(logits, -1)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                               reduction="sum")
        ((ce + 1e-4 * (lse**2).sum()) / (seq - 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[WARMUP:]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10, help=f"steps per run (the first {WARMUP} are not counted)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--dtypes", default="fp32,bf16", help="which steps to time, comma-separated")
    parser.add_argument("--kernel-paths", default="native,avx2",
                        help="kernel paths (scripts/kernel_paths.sh) on which the engine's bf16 step is timed against "
                             "its fp32 step, comma-separated")
    parser.add_argument("--torch-side", nargs=2, metavar=("MODEL_DIR", "TOKENS_NPY"),
                        help="internal: time PyTorch's step in this process and print the seconds as JSON")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= {"fp32", "bf16"}:
        parser.error(f"--dtypes {args.dtypes!r}: expected fp32, bf16 or both, comma-separated")
    paths = args.kernel_paths.split(",") if args.kernel_paths else []
    known = subprocess.run(["bash", str(REPO / "scripts" / "kernel_paths.sh"), "list"], check=True, capture_output=True,
                           text=True).stdout.split()
    if not set(paths) <= set(known):
        parser.error(f"--kernel-paths {args.kernel_paths!r}: expected some of {', '.join(known)}, comma-separated")
    if args.torch_side:
        tokens = np.load(args.torch_side[1])
        print(json.dumps(torch_side(args.torch_side[0], tokens, args.seq, args.steps, args.threads, dtypes[0])))
        return
    load_before = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {load_before}")
    result = {"benchmark": "train_step_roofline", "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
              "torch_glibc_tunables": TORCH_MALLOC,
              "preset": args.preset, "sequence_length": args.seq, "micro_batch": 1,
              "threads": args.threads, "cpu_flags": cpu_flags(), "loadavg_before": load_before}
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        model_dir = tmp / "model"
        subprocess.run([str(BINARY), "init", "--preset", args.preset, "--out", str(model_dir)], check=True,
                       capture_output=True)
        config = json.loads((model_dir / "config.json").read_text())
        tokens = np.random.default_rng(0).integers(2, config["vocab_size"], args.seq * (args.steps + 1))
        write_shards(tmp / "shards", tokens, vocab=config["vocab_size"])
        np.save(tmp / "tokens.npy", tokens)
        flops = step_flops(config, args.seq)
        rounds = {f"{side}_{dtype}": [] for dtype in dtypes for side in ("engine", *TORCH_MALLOC)}
        limits = {"gemm_fp32_gflops": [], "gemm_bf16_gflops": [], "read_gb_s": []}
        for r in range(args.rounds):
            limits["gemm_fp32_gflops"].append(gemm_peak(torch.float32, args.threads))
            limits["gemm_bf16_gflops"].append(gemm_peak(torch.bfloat16, args.threads))
            limits["read_gb_s"].append(read_bandwidth(args.threads))
            for dtype in dtypes:
                rounds[f"engine_{dtype}"].append(
                    statistics.median(engine_step_seconds(tmp, model_dir, args.seq, args.steps, args.threads, dtype, r)))
                for side, tunables in TORCH_MALLOC.items():
                    rounds[f"{side}_{dtype}"].append(statistics.median(torch_step_seconds(
                        model_dir, tmp / "tokens.npy", args.seq, args.steps, args.threads, dtype, tunables)))
            # The engine's fp32 and bf16 steps on the other kernel paths (native's are the ones above).
            for path in paths:
                if path == "native" or set(dtypes) != {"fp32", "bf16"}:
                    continue
                for dtype in dtypes:
                    rounds.setdefault(f"engine_{dtype}_{path}", []).append(statistics.median(
                        engine_step_seconds(tmp, model_dir, args.seq, args.steps, args.threads, dtype, f"{path}-{r}",
                                            path)))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in rounds.items()) + "; limits: "
                  + ", ".join(f"{k} {v[-1]:.1f}" for k, v in limits.items()), flush=True)
    result["step_seconds"] = {k: spread(v) for k, v in rounds.items()}
    result["limits"] = {k: spread(v) for k, v in limits.items()}
    result["model_flops_per_step"] = flops
    for dtype in dtypes:
        peak = statistics.median(limits[f"gemm_{dtype}_gflops"])
        for side in TORCH_MALLOC:
            ratios = [t / e for t, e in zip(rounds[f"{side}_{dtype}"], rounds[f"engine_{dtype}"])]
            result[f"engine_vs_{side}_{dtype}"] = spread(ratios)
        for side in ("engine", *TORCH_MALLOC):
            gflops = flops / statistics.median(rounds[f"{side}_{dtype}"]) / 1e9
            result[f"{side}_{dtype}_gflops"] = gflops
            result[f"{side}_{dtype}_percent_of_gemm_peak"] = 100 * gflops / peak
            # Each round's step against the peak read in that round: the spread a goal's margin is judged against.
            per_round = zip(rounds[f"{side}_{dtype}"], limits[f"gemm_{dtype}_gflops"])
            result[f"{side}_{dtype}_percent_of_gemm_peak_by_round"] = spread(
                [100 * flops / seconds / 1e9 / peak_read for seconds, peak_read in per_round])
    # bf16's speed against fp32's (fp32 seconds / bf16 seconds, per round) on each kernel path.
    if set(dtypes) == {"fp32", "bf16"}:
        for path in paths:
            suffix = "" if path == "native" else f"_{path}"
            result[f"engine_bf16_vs_fp32_{path}"] = spread(
                [f / b for f, b in zip(rounds[f"engine_fp32{suffix}"], rounds[f"engine_bf16{suffix}"])])
    result["loadavg_after"] = pathlib.Path("/proc/loadavg").read_text().strip()
    out = REPO / "bench" / "results" / f"train-step-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    lim = result["limits"]
    print(f"\n{args.preset}, sequence {args.seq}, micro-batch 1, {args.threads} threads, {args.rounds} rounds; "
          f"GEMM peak fp32 {lim['gemm_fp32_gflops']['median']:.0f}, bf16 {lim['gemm_bf16_gflops']['median']:.0f} "
          f"GFLOP/s; read {lim['read_gb_s']['median']:.1f} GB/s; {flops / 1e9:.0f} GFLOP a step")
    print(f"  {'':34}{'engine s':>9}{'PyTorch s':>10}{'ratio (range)':>22}{'engine % peak':>15}"
          f"{'PyTorch % peak':>16}")
    for dtype in dtypes:
        for side, label in (("torch_default_malloc", "PyTorch with glibc's defaults"),
                            ("torch", "both with the engine's malloc")):
            s, ratio = result["step_seconds"], result[f"engine_vs_{side}_{dtype}"]
            print(f"  {dtype + ', ' + label:34}{s[f'engine_{dtype}']['median']:9.3f}{s[f'{side}_{dtype}']['median']:10.3f}"
                  f"{ratio['median']:9.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"
                  f"{result[f'engine_{dtype}_percent_of_gemm_peak']:14.1f}%{result[f'{side}_{dtype}_percent_of_gemm_peak']:15.1f}%")
    for dtype in dtypes:
        by_round = result[f"engine_{dtype}_percent_of_gemm_peak_by_round"]
        print(f"  engine {dtype}, each round against its own peak reading: {by_round['median']:.1f}% "
              f"({by_round['min']:.1f}-{by_round['max']:.1f}%)")
    for path in paths:
        if f"engine_bf16_vs_fp32_{path}" in result:
            ratio, suffix = result[f"engine_bf16_vs_fp32_{path}"], "" if path == "native" else f"_{path}"
            s = result["step_seconds"]
            print(f"  engine bf16 against fp32 on the {path} kernel path: {ratio['median']:.2f}x the speed "
                  f"({ratio['min']:.2f}-{ratio['max']:.2f}; fp32 {s[f'engine_fp32{suffix}']['median']:.3f} s, "
                  f"bf16 {s[f'engine_bf16{suffix}']['median']:.3f} s)")
    print(f"  load after: {result['loadavg_after']}; wrote {out}")


if __name__ == "__main__":
    main()
