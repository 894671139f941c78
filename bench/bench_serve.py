"""Load test of `archspace serve` on 127.0.0.1: N concurrent clients x M completion requests each against a
tiny random model (dolma2 vocabulary), then the same N x M requests one at a time. Reports errors (must
be 0), p50/p99 request latency, generated tokens/s and requests/s of both, the ratio (what continuous
batching buys), and the server's RSS before and after the load (growth would be a leak). Prints CPU
flags and /proc/loadavg: other work on the machine changes the numbers.

Requests: greedy, a prompt from a fixed list, max_tokens 32 (a few end earlier at a stop token), so rows
join and leave the running batch at different steps. Results: bench/results/serve-<time>.json.

    .venv/bin/python bench/bench_serve.py [--clients 8] [--requests 8] [--max-tokens 32]
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=8, help="per client")
    p.add_argument("--max-tokens", type=int, default=32)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = pathlib.Path(d) / "tiny"
        save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2, eos_token_id=100257,
                                            pad_token_id=100277), model)
        shutil.copy(DOLMA2, model / "tokenizer.json")
        server = subprocess.Popen([str(BINARY), "serve", "--model", str(model), "--port", "0", "--max-batch",
                                   str(a.clients)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url = "http://127.0.0.1:" + re.search(r":(\d+) ", server.stdout.readline()).group(1)
            loadavg = pathlib.Path("/proc/loadavg").read_text().strip()
            load(url, 2, 2, a.max_tokens)  # warm-up
            rss_before = rss_mb(server.pid)
            print(f"CPU flags: {' '.join(cpu_flags())}; cores: {len(os.sched_getaffinity(0))}; loadavg before: {loadavg}")
            print(f"tiny model (d=64, 4 layers, vocab 100278), greedy, max_tokens {a.max_tokens}, "
                  f"--max-batch {a.clients}")
            together = summary(f"{a.clients} clients x {a.requests}", *load(url, a.clients, a.requests, a.max_tokens))
            alone = summary("one at a time", *load(url, 1, a.clients * a.requests, a.max_tokens))
            rss_after = rss_mb(server.pid)
            ratio = together["tokens_per_s"] / alone["tokens_per_s"]
            print(f"  throughput concurrent / one at a time: {ratio:.2f}x")
            print(f"  server RSS: {rss_before:.1f} MB before the load, {rss_after:.1f} MB after")
            print(f"  loadavg after: {pathlib.Path('/proc/loadavg').read_text().strip()}")
        finally:
            server.terminate()
            server.wait(60)
    out = REPO / "bench" / "results" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_flags": cpu_flags(), "loadavg_before": loadavg, "clients": a.clients,
                               "requests_per_client": a.requests, "max_tokens": a.max_tokens, "concurrent": together,
                               "one_at_a_time": alone, "throughput_ratio": ratio, "rss_mb_before": rss_before,
                               "rss_mb_after": rss_after}, indent=2))
    if together["errors"] or alone["errors"]:
        sys.exit("errors under load")


if __name__ == "__main__":
    main()
