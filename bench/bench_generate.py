"""Generation speed: `archspace generate` against transformers' generate() on the same model and prompt
(CPU, fp32, greedy, the same threads): prefill tokens/s and batch-1 decode tokens/s, and siamese_depth
against base in the engine. Target: decode >= 2x transformers on the 190M preset. Also the engine's
decode throughput for a batch of 4 prompts of different lengths (one left-padded batch).

Decode tokens/s for transformers: (N - 1) new tokens over the time of generate(N) minus generate(1)
(which is the prefill plus the first token). Each side: the best of --repeat runs (this machine is shared
and noisy). Results: bench/results/generate-<time>.json and a table.

    .venv/bin/python bench/bench_generate.py [--preset 190M] [--prompt 128] [--new 32]
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
from bench_threads import cpu_flags  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"


def model_dir(preset, variant, cache):
    d = pathlib.Path(cache) / f"{preset}-{variant}-seed0"
    if not (d / "config.json").exists():
        subprocess.run([str(BINARY), "init", "--preset", preset, "--variant", variant, "--out", str(d)], check=True)
    return d


def engine(d, prompts, new, threads, repeat, tmp, binary=BINARY):
    """Best prefill and decode tokens/s over `repeat` runs (decode: all rows' tokens per second)."""
    if len(prompts) == 1:
        source = ["--prompt-tokens", " ".join(map(str, prompts[0]))]
    else:
        tmp.write_text("".join(json.dumps({"tokens": p}) + "\n" for p in prompts))
        source = ["--prompts-file", str(tmp)]
    best = (0.0, 0.0, 0)
    for _ in range(repeat):
        r = subprocess.run([str(binary), "--threads", str(threads), "generate", "--model", str(d), "--tokenizer", "dolma2",
                            *source, "--max-new-tokens", str(new)], capture_output=True, text=True, check=True)
        m = re.search(r"prefill (\d+) tokens in ([0-9.]+) s .*decode (\d+) tokens in ([0-9.]+) s", r.stderr)
        run = (int(m.group(1)) / float(m.group(2)), int(m.group(3)) / float(m.group(4)), int(m.group(3)))
        best = (max(best[0], run[0]), max(best[1], run[1]), run[2])
    return best


def hf(d, prompt, new, threads, repeat):
    from transformers import Olmo3ForCausalLM

    torch.set_num_threads(threads)
    model = Olmo3ForCausalLM.from_pretrained(d).eval()
    ids = torch.tensor([prompt])

    def timed(n):
        best = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            best.append(time.perf_counter() - t0)
        return min(best)

    t1, tn = timed(1), timed(new)
    return len(prompt) / t1, (new - 1) / (tn - t1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="190M")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model-cache", default=str(REPO / "bench" / "results" / "models"))
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {pathlib.Path('/proc/loadavg').read_text().strip()}")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 100000, args.prompt).tolist()
    batch = [rng.integers(0, 100000, max(1, args.prompt * k // 4)).tolist() for k in (4, 1, 3, 2)]
    base = model_dir(args.preset, "base", args.model_cache)
    variant = model_dir(args.preset, "siamese_depth", args.model_cache)
    tmp = pathlib.Path(args.model_cache) / "bench-prompts.jsonl"
    e_pre, e_dec, n = engine(base, [prompt], args.new, args.threads, args.repeat, tmp)
    v_pre, v_dec, _ = engine(variant, [prompt], args.new, args.threads, args.repeat, tmp)
    b_pre, b_dec, _ = engine(base, batch, args.new, args.threads, args.repeat, tmp)
    h_pre, h_dec = hf(base, prompt, args.new, args.threads, args.repeat)
    result = {"benchmark": "generate", "preset": args.preset, "prompt_tokens": args.prompt, "new_tokens": args.new,
              "engine_decoded": n, "threads": args.threads, "dtype": "fp32", "device": "cpu",
              "engine_prefill_tok_s": e_pre, "engine_decode_tok_s": e_dec,
              "transformers_prefill_tok_s": h_pre, "transformers_decode_tok_s": h_dec,
              "engine_siamese_depth_prefill_tok_s": v_pre, "engine_siamese_depth_decode_tok_s": v_dec,
              "engine_batch4_prompt_tokens": [len(p) for p in batch], "engine_batch4_prefill_tok_s": b_pre,
              "engine_batch4_decode_tok_s": b_dec,
              "decode_speedup_vs_transformers": e_dec / h_dec, "prefill_speedup_vs_transformers": e_pre / h_pre,
              "siamese_depth_vs_base_decode": v_dec / e_dec}
    out = REPO / "bench" / "results" / f"generate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ngeneration, {args.preset}, prompt {args.prompt}, {args.new} new tokens, fp32 CPU, {args.threads} threads, batch 1")
    print(f"  {'':<26}{'prefill tok/s':>14}{'decode tok/s':>14}")
    print(f"  {'engine base':<26}{e_pre:14.1f}{e_dec:14.2f}")
    print(f"  {'engine siamese_depth':<26}{v_pre:14.1f}{v_dec:14.2f}")
    print(f"  {'transformers base':<26}{h_pre:14.1f}{h_dec:14.2f}")
    print(f"  {'engine base, batch of 4':<26}{b_pre:14.1f}{b_dec:14.2f}   (prompts of {[len(p) for p in batch]} tokens; all rows)")
    print(f"  decode speedup vs transformers: {result['decode_speedup_vs_transformers']:.2f}x "
          f"(prefill {result['prefill_speedup_vs_transformers']:.2f}x); siamese_depth/base decode {result['siamese_depth_vs_base_decode']:.3f}")
    print(f"  wrote {out}")


if __name__ == "__main__":
    main()
