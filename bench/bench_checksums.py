"""What verifying a checkpoint costs before its model is used (docs/faults.md, "Checksums on every load"): the same
command (`archspace logits` on a micro model) on a checkpoint whose files total --gib GiB, with and without
--skip-checksums, interleaved; the median difference is the verification's time, and the rate it gives is scaled to
the fp32 checkpoints of the 1B and 7B presets (model weights 4 bytes a parameter, AdamW's two moments 8 more). The
files were just written, so they are read from the page cache: a checkpoint read from disk is bounded by the disk
as well. Prints the CPU flags and load.

    .venv/bin/python bench/bench_checksums.py [--gib 4] [--repeat 5]
"""
import argparse
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

from bench_threads import cpu_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
BINARY = REPO / "build" / "archspace"


def sha_ni():
    """Whether the CPU has the SHA extensions OpenSSL's SHA-256 uses."""
    return any(line.startswith("flags") and "sha_ni" in line.split()
               for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines())


def parameters(preset):
    out = subprocess.run([str(BINARY), "info", "--preset", preset], capture_output=True, text=True, check=True).stdout
    return int(next(line for line in out.splitlines() if line.startswith("parameters:")).split()[1])


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    print(f"CPU flags: {' '.join(cpu_flags() + (['sha_ni'] if sha_ni() else []))}; load before: {pathlib.Path('/proc/loadavg').read_text().strip()}")
    with tempfile.TemporaryDirectory(dir=REPO / "build") as tmp:
        ckpt = pathlib.Path(tmp) / "checkpoints" / "step-00000001"
        subprocess.run([str(BINARY), "init", "--preset", "micro", "--out", str(ckpt / "model")], check=True,
                       capture_output=True)
        # The bulk of a real checkpoint is its optimizer state: random bytes of that size stand in for it.
        filler = ckpt / "optimizer.safetensors"
        with open(filler, "wb") as f:
            for _ in range(int(a.gib * 1024)):
                f.write(os.urandom(1 << 20))
        sums = {str(q.relative_to(ckpt)): sha256(q) for q in sorted(ckpt.rglob("*")) if q.is_file()}
        (ckpt / "checksums.json").write_text(json.dumps(sums, indent=2) + "\n")
        total = sum(q.stat().st_size for q in ckpt.rglob("*") if q.is_file())
        start = time.perf_counter()
        sha256(filler)
        python_rate = filler.stat().st_size / (time.perf_counter() - start)

        def timed(*extra):
            start = time.perf_counter()
            subprocess.run([str(BINARY), "logits", "--model", str(ckpt), "--tokens", "1 2 3", "--out",
                            str(pathlib.Path(tmp) / "logits.safetensors"), *extra], check=True, capture_output=True)
            return time.perf_counter() - start

        verified, skipped = [], []
        for _ in range(a.repeat):
            verified.append(timed())
            skipped.append(timed("--skip-checksums"))
    cost = statistics.median(verified) - statistics.median(skipped)
    rate = total / cost
    print(f"checkpoint files: {total / 2**30:.2f} GiB; logits with verification {statistics.median(verified):.2f} s, "
          f"--skip-checksums {statistics.median(skipped):.2f} s (medians of {a.repeat})")
    print(f"verification: {cost:.2f} s = {rate / 1e9:.2f} GB/s (Python's hashlib on the same file: "
          f"{python_rate / 1e9:.2f} GB/s)")
    for preset in ("1B", "7B"):
        n = parameters(preset)
        size = 12 * n
        print(f"{preset}: {n / 1e9:.2f}B parameters, fp32 checkpoint ~{size / 1e9:.1f} GB "
              f"(model {4 * n / 1e9:.1f} GB): verification ~{size / rate:.0f} s at this rate")
    print(f"load after: {pathlib.Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
