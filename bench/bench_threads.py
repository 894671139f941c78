"""CPU threads policy (docs/commands.md, "CPU threads"): batch-1 decode tokens/s of the demo-sized model (micro
preset, siamese_depth) with --threads 1, --threads <all cores> and the default policy, on an idle machine
and with other processes keeping K cores busy (K = 1 .. cores-1, a spinning `python -c 'while 1: pass'`
each). The default should follow the best fixed choice in every row. Prints the CPU flags and load.

    .venv/bin/python bench/bench_threads.py [--new 64] [--repeat 3]
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"


def cpu_flags():
    flags = set()
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]


def decode_rate(model, threads, new, repeat):
    best = 0.0
    for _ in range(repeat):
        args = [str(BINARY)] + (["--threads", str(threads)] if threads else []) + [
            "generate", "--model", str(model), "--tokenizer", "dolma2", "--prompt-tokens", " ".join(str(i) for i in range(100, 132)),
            "--max-new-tokens", str(new)]
        err = subprocess.run(args, capture_output=True, text=True, check=True).stderr
        m = re.search(r"decode (\d+) tokens in ([\d.]+) s", err)
        best = max(best, int(m.group(1)) / float(m.group(2)))
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cache", default=str(REPO / "bench" / "results" / "models"))
    a = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    model = pathlib.Path(a.cache) / "micro-siamese_depth-seed0"
    if not (model / "config.json").exists():
        subprocess.run([str(BINARY), "init", "--preset", "micro", "--variant", "siamese_depth", "--out", str(model)], check=True)
    print(f"CPU flags: {' '.join(cpu_flags())}; cores: {cores}; load before: {pathlib.Path('/proc/loadavg').read_text().strip()}")
    rows = []
    for busy in range(cores):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            time.sleep(1.0)
            row = {"busy_cores": busy}
            for label, threads in (("1 thread", 1), (f"{cores} threads", cores), ("default", 0)):
                row[label] = decode_rate(model, threads, a.new, a.repeat)
            rows.append(row)
        finally:
            for s in spinners:
                s.kill()
    labels = [k for k in rows[0] if k != "busy_cores"]
    print(f"decode tok/s (best of {a.repeat}, {a.new} new tokens, micro siamese_depth, fp32)")
    print(f"  {'busy cores':<12}" + "".join(f"{l:>14}" for l in labels))
    for r in rows:
        print(f"  {r['busy_cores']:<12}" + "".join(f"{r[l]:>14.1f}" for l in labels))
    out = REPO / "bench" / "results" / f"threads-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_flags": cpu_flags(), "cores": cores, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
