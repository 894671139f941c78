"""Downstream-evaluation speed: `archspace eval downstream` against lm-evaluation-harness's HFLM (transformers)
on the same requests and model (CPU, fp32, the same threads): requests per second for the scoring alone.

The engine's figure is requests / the JSON's scoring_seconds (tokenizing and the batched forwards; reading
the task files and loading the model come before); lm-eval's is requests / the time of HFLM.loglikelihood (its
tokenization and scoring) at --hf-batch sequences per batch. Each side: the best of
--repeat runs (the machine is shared and noisy). Prints the CPU flags and /proc/loadavg before and after.

Shared prefixes: each round also runs the engine with --no-prefix-sharing (every request scored whole) right after
its default run (each document's context run once, infer/prefix_groups.h), so the speed-up of sharing is a
per-round ratio of two runs side by side, reported as the median over rounds with its range.
Results: bench/results/downstream-<time>.json and a line per side.

    .venv/bin/python bench/bench_downstream.py [--preset micro] [--task arc_easy] [--format rc] [--limit 40]
                                               [--repeat 2] [--no-lm-eval]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"


def cpu_flags():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return []


def loadavg():
    return pathlib.Path("/proc/loadavg").read_text().strip()


def exported_random_model(preset, prefix):
    """A temporary directory with a randomly initialised `preset` model, `m`, and its Hugging Face export, `hf`."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.run([str(BINARY), "init", "--preset", preset, "--out", str(tmp / "m")], check=True, capture_output=True)
    subprocess.run([str(BINARY), "export-hf", str(tmp / "m"), str(tmp / "hf")], check=True, capture_output=True)
    return tmp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="micro")
    parser.add_argument("--task", default="arc_easy")
    parser.add_argument("--format", default="rc")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hf-batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-lm-eval", action="store_true", help="time the engine only (shared against whole)")
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags())}; load before: {loadavg()}")
    tmp = exported_random_model(args.preset, "bench_downstream_")

    def engine_run(*extra):
        subprocess.run([str(BINARY), "--threads", str(args.threads), "eval", "downstream", "--model", str(tmp / "hf"),
                        "--tasks", args.task, "--format", args.format, "--limit", str(args.limit),
                        "--out", str(tmp / "out.json"), "--requests-out", str(tmp / "req.jsonl"), *extra],
                       check=True, capture_output=True)
        rows = [json.loads(line) for line in (tmp / "req.jsonl").read_text().splitlines()]
        return rows, len(rows) / json.loads((tmp / "out.json").read_text())["scoring_seconds"]

    engine_rate, whole_rates, sharing = 0.0, [], []
    for r in range(args.repeat):
        rows, shared_rate = engine_run()
        _, whole_rate = engine_run("--no-prefix-sharing")
        engine_rate = max(engine_rate, shared_rate)
        whole_rates.append(whole_rate)
        sharing.append(shared_rate / whole_rate)
        print(f"round {r + 1}: engine {shared_rate:.2f} requests/s shared, {whole_rate:.2f} whole "
              f"({sharing[-1]:.2f}x); load {loadavg()}", flush=True)
    result = {"preset": args.preset, "task": args.task, "format": args.format, "limit": args.limit,
              "requests": len(rows), "threads": args.threads, "engine_requests_per_s": engine_rate,
              "engine_whole_requests_per_s": max(whole_rates),
              "prefix_sharing_speedup": {"median": statistics.median(sharing), "min": min(sharing),
                                         "max": max(sharing), "values": sharing},
              "cpu_flags": cpu_flags()}
    print(f"{args.task} {args.format} ({len(rows)} requests, {args.preset}, {args.threads} threads): shared "
          f"prefixes {statistics.median(sharing):.2f}x every request whole (median of {args.repeat} rounds, "
          f"{min(sharing):.2f}-{max(sharing):.2f})")
    if args.no_lm_eval:
        finish(result)
        return

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32).eval()
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(tmp / "hf"), batch_size=args.hf_batch,
              device="cpu", max_length=model.config.max_position_embeddings)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(r["context"], r["continuation"]), idx=i)
                for i, r in enumerate(rows)]
    hf_rate = 0.0
    for _ in range(args.repeat):
        start = time.perf_counter()
        lm.loglikelihood(requests, disable_tqdm=True)
        hf_rate = max(hf_rate, len(requests) / (time.perf_counter() - start))

    result.update({"lm_eval_hf_requests_per_s": hf_rate, "hf_batch": args.hf_batch, "ratio": engine_rate / hf_rate})
    print(f"{args.task} {args.format} ({len(rows)} requests, {args.preset}, {args.threads} threads): engine "
          f"{engine_rate:.1f} requests/s, lm-eval HFLM {hf_rate:.1f} requests/s (batch {args.hf_batch}): "
          f"{engine_rate / hf_rate:.2f}x")
    finish(result)


def finish(result):
    result["loadavg_after"] = loadavg()
    print(f"load after: {result['loadavg_after']}")
    out = REPO / "bench" / "results" / f"downstream-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
