"""Load test of `archspace serve` on 127.0.0.1: N concurrent clients x M completion requests each against a
tiny random model (dolma2 vocabulary), then the same N x M requests one at a time. Reports errors (must
be 0), p50/p99 request latency, generated tokens/s and requests/s of both, the ratio (what continuous
batching buys), and the server's RSS before and after the load (growth would be a leak). Prints CPU
flags and /proc/loadavg: other work on the machine changes the numbers.

Requests: greedy, a prompt from a fixed list, max_tokens 32 (a few end earlier at a stop token), so rows
join and leave the running batch at different steps. Results: bench/results/serve-<time>.json.

    .venv/bin/python bench/bench_serve.py [--clients 8] [--requests 8] [--max-tokens 32] [--binary B]
                                          [--before B0 [--rounds 3]]
With --before, the binary B0 (an older build) and B run the same load in alternating rounds, and each figure is
reported as the median and range of the rounds' ratios (B / B0, as speed: above 1 is faster), as
bench/compare_builds.py does for the other benches: a busy neighbour falls on both sides of a round alike.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import requests

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "bench"))
from bench_threads import cpu_flags  # noqa: E402
from conftest import save_random_olmo3, tiny_olmo3_config  # noqa: E402
from test_tokenizer import DOLMA2  # noqa: E402

BINARY = REPO / "build" / "archspace"
PROMPTS = ["The quick brown fox", "Once upon a time, in a village by the sea,", "def main():", "Question: 2 + 2 =",
           "In the beginning", "The results of the experiment show that", "Dear reader,", "1, 1, 2, 3, 5, 8,"]


def rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(url, clients, per_client, max_tokens):
    """clients threads, each sending per_client requests in turn; returns latencies, errors, tokens, seconds."""
    def client(c):
        session = requests.Session()
        lat, errors, tokens = [], 0, 0
        for i in range(per_client):
            body = {"prompt": PROMPTS[(c + i) % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0}
            t0 = time.perf_counter()
            try:
                r = session.post(url + "/v1/completions", json=body, timeout=300)
                if r.status_code != 200:
                    errors += 1
                else:
                    tokens += r.json()["usage"]["completion_tokens"]
            except requests.RequestException:
                errors += 1
            lat.append(time.perf_counter() - t0)
        return lat, errors, tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        parts = list(pool.map(client, range(clients)))
    seconds = time.perf_counter() - t0
    lat = sorted(x for p in parts for x in p[0])
    return lat, sum(p[1] for p in parts), sum(p[2] for p in parts), seconds


def summary(name, lat, errors, tokens, seconds):
    p50, p99 = statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"  {name:<22} {len(lat):4d} requests  errors {errors}  p50 {p50 * 1e3:7.1f} ms  p99 {p99 * 1e3:7.1f} ms  "
          f"{tokens / seconds:8.1f} tok/s  {len(lat) / seconds:6.2f} req/s")
    return {"requests": len(lat), "errors": errors, "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3,
            "tokens_per_s": tokens / seconds, "requests_per_s": len(lat) / seconds}


def run_load(binary, model, a):
    """One server from `binary` on `model`: the concurrent load, then the same requests one at a time."""
    server = subprocess.Popen([str(binary), "serve", "--model", str(model), "--port", "0", "--max-batch",
                               str(a.clients)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = "http://127.0.0.1:" + re.search(r":(\d+) ", server.stdout.readline()).group(1)
        load(url, 2, 2, a.max_tokens)  # warm-up
        rss_before = rss_mb(server.pid)
        print(f"{binary}:")
        together = summary(f"{a.clients} clients x {a.requests}", *load(url, a.clients, a.requests, a.max_tokens))
        alone = summary("one at a time", *load(url, 1, a.clients * a.requests, a.max_tokens))
        rss_after = rss_mb(server.pid)
        ratio = together["tokens_per_s"] / alone["tokens_per_s"]
        print(f"  throughput concurrent / one at a time: {ratio:.2f}x")
        print(f"  server RSS: {rss_before:.1f} MB before the load, {rss_after:.1f} MB after")
    finally:
        server.terminate()
        server.wait(60)
    return {"concurrent": together, "one_at_a_time": alone, "throughput_ratio": ratio, "rss_mb_before": rss_before,
            "rss_mb_after": rss_after}


def side_by_side(rounds):
    """Per figure, each side's values over the rounds and the median and range of the rounds' after / before."""
    out = {}
    figures = {"concurrent_tokens_per_s": ("concurrent", "tokens_per_s", 1),
               "one_at_a_time_tokens_per_s": ("one_at_a_time", "tokens_per_s", 1),
               "concurrent_p50_ms": ("concurrent", "p50_ms", -1),
               "one_at_a_time_p50_ms": ("one_at_a_time", "p50_ms", -1)}
    for name, (part, key, sign) in figures.items():
        before = [r["before"][part][key] for r in rounds]
        after = [r["after"][part][key] for r in rounds]
        ratios = [(x / y) ** sign for x, y in zip(after, before)]  # above 1: the after build is faster
        out[name] = {"before": before, "after": after, "ratio_median": statistics.median(ratios),
                     "ratio_range": [min(ratios), max(ratios)]}
        print(f"  {name:<28} after/before {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=8, help="per client")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--binary", default=str(BINARY))
    p.add_argument("--before", help="an older build's archspace, run in alternating rounds beside --binary")
    p.add_argument("--rounds", type=int, default=3, help="with --before")
    a = p.parse_args()
    loadavg = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"CPU flags: {' '.join(cpu_flags())}; cores: {len(os.sched_getaffinity(0))}; loadavg before: {loadavg}")
    print(f"tiny model (d=64, 4 layers, vocab 100278), greedy, max_tokens {a.max_tokens}, --max-batch {a.clients}")
    result = {"cpu_flags": cpu_flags(), "loadavg_before": loadavg, "clients": a.clients,
              "requests_per_client": a.requests, "max_tokens": a.max_tokens}
    with tempfile.TemporaryDirectory() as d:
        model = pathlib.Path(d) / "tiny"
        save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2, eos_token_id=100257,
                                            pad_token_id=100277), model)
        shutil.copy(DOLMA2, model / "tokenizer.json")
        if a.before:
            binaries, rounds = {"before": a.before, "after": a.binary}, []
            for r in range(a.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                rounds.append({side: run_load(binaries[side], model, a) for side in order})
            result.update({"before_binary": a.before, "after_binary": a.binary, "rounds": rounds,
                           "side_by_side": side_by_side(rounds)})
            parts = [r[side][part] for r in rounds for side in r for part in ("concurrent", "one_at_a_time")]
        else:
            result.update(run_load(a.binary, model, a))
            parts = [result["concurrent"], result["one_at_a_time"]]
    result["loadavg_after"] = pathlib.Path("/proc/loadavg").read_text().strip()
    print(f"  loadavg after: {result['loadavg_after']}")
    out = REPO / "bench" / "results" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    if any(part["errors"] for part in parts):
        sys.exit("errors under load")


if __name__ == "__main__":
    main()
