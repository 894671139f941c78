"""The CPU kernel paths of scripts/kernel_paths.sh (docs/reference.md): each setting really
changes which kernels run (the bits of LibTorch's fp32 GEMM, softmax and attention, oneDNN's bf16 GEMM,
differ from the native ones), and on every path the engine's logits stay within tolerances.forward_bound of
transformers' native ones. `make test` also reruns the unit tests and the parity tests under each setting
(Makefile, kernel-paths); this file shows that doing so is not a no-op."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import BINARY, REPO, hf_logits, save_random_olmo3, tiny_olmo3_config
from tolerances import forward_bound

SCRIPT = REPO / "scripts" / "kernel_paths.sh"
PATHS = subprocess.run(["bash", str(SCRIPT), "list"], capture_output=True, text=True, check=True).stdout.split()

# Fingerprints of LibTorch kernels: a digest of each output's bits, computed in a fresh process.
PROBE = r"""
import hashlib, json, torch
torch.manual_seed(0)
def digest(t):
    return hashlib.sha1(t.float().contiguous().numpy().tobytes()).hexdigest()[:12]
a, b = torch.randn(37, 301), torch.randn(301, 53)
x = torch.randn(4, 64, 333)
q, k, v = (torch.randn(1, 4, 21, 16) for _ in range(3))
p, r = torch.randn(64, 4096).bfloat16(), torch.randn(4096, 64).bfloat16()
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "gemm_fp32": digest(a @ b),
    "softmax": digest(torch.softmax(x, -1)),
    "sdpa": digest(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "gemm_bf16": digest(p @ r),
}))
"""


def under(path, *command, env=None):
    return subprocess.run(["bash", str(SCRIPT), path, *map(str, command)], capture_output=True, text=True,
                          env=env, timeout=300)


def fingerprints(path):
    result = under(path, sys.executable, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_settings_are_the_documented_ones():
    assert PATHS == ["native", "avx2", "baseline"]
    bad = under("avx9", "true")
    assert bad.returncode == 2 and "kernel path 'avx9' is not one of: native avx2 baseline" in bad.stderr


def test_each_setting_changes_which_kernels_run():
    prints = {path: fingerprints(path) for path in PATHS}
    for path, f in prints.items():
        print(path, f)
    native, avx2, baseline = prints["native"], prints["avx2"], prints["baseline"]
    assert baseline["capability"] == "DEFAULT" and avx2["capability"] == "AVX2"
    # The baseline path runs other fp32 GEMM, softmax and attention kernels than this CPU's own.
    for op in ("gemm_fp32", "softmax", "sdpa"):
        assert baseline[op] != native[op], f"{op}: the baseline setting ran the native kernel"
    if native["capability"] == "AVX512":
        # ATen's AVX2 kernels sum in 8-wide vectors instead of 16-wide ones.
        assert avx2["softmax"] != native["softmax"], "the avx2 setting ran the AVX512 softmax"
    else:
        print(f"this CPU's own capability is {native['capability']}: native and avx2 may run the same kernels")


@pytest.mark.parametrize("length", [4, 40])  # 4: the engine's streaming GEMV (<= 32 rows); 40: GEMMs
def test_engine_logits_on_every_path_stay_within_the_bound(length, tmp_path, rng):
    config = tiny_olmo3_config(num_key_value_heads=2)
    model = save_random_olmo3(config, tmp_path / "m")
    tokens = rng.integers(0, config.vocab_size, length).tolist()
    expected = hf_logits(model, tokens)  # transformers on this process's native kernels
    bound = forward_bound(model, length)
    seen = {}
    for path in PATHS:
        out = tmp_path / f"{path}.safetensors"
        result = under(path, BINARY, "logits", "--model", tmp_path / "m", "--tokens", " ".join(map(str, tokens)),
                       "--out", out)
        assert result.returncode == 0, result.stderr
        got = load_file(str(out))["logits"]
        seen[path] = got
        diff = float(np.abs(got - expected).max())
        print(f"{path}: max |engine - transformers| {diff:.3g} (bound {bound:.3g})")
        assert diff <= bound, path
    assert not np.array_equal(seen["native"], seen["baseline"]), "the engine ran the same kernels on both paths"


def cpu_has(flag):
    return any(line.startswith("flags") and flag in line.split() for line in open("/proc/cpuinfo"))


@pytest.mark.skipif(not cpu_has("avx512f"), reason="MKL has no path above AVX2 to leave on this CPU")
def test_mkl_picks_its_path_by_the_cpu_features_whatever_the_vendor(tmp_path, rng):
    """kernels/cpu_isa.cpp answers MKL's vendor check, so MKL chooses its GEMM path from the CPU's features on AMD
    CPUs as on Intel ones, and MKL_ENABLE_INSTRUCTIONS=AVX2 (part of the avx2 setting) moves the engine's fp32
    GEMMs from MKL's AVX512 kernels to its AVX2 ones: other bits. Without that answer, MKL on an AMD CPU takes one
    generic path and ignores the variable (checked here on a Zen 4 EPYC: the same bits with and without it)."""
    config = tiny_olmo3_config(hidden_size=256, intermediate_size=512)
    save_random_olmo3(config, tmp_path / "m")
    tokens = " ".join(map(str, rng.integers(0, config.vocab_size, 200).tolist()))  # 200 rows: MKL's GEMM
    seen = {}
    for cap in ("AVX512", "AVX2"):
        out = tmp_path / f"{cap}.safetensors"
        env = dict(os.environ, MKL_ENABLE_INSTRUCTIONS=cap)
        result = subprocess.run([str(BINARY), "logits", "--model", str(tmp_path / "m"), "--tokens", tokens, "--out",
                                 str(out)], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        seen[cap] = load_file(str(out))["logits"]
    assert not np.array_equal(seen["AVX512"], seen["AVX2"]), "MKL ran the same GEMM kernels under both caps"


def test_a_bad_isa_cap_names_the_variable(tmp_path):
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "m")
    env = dict(os.environ, ARCHSPACE_MAX_CPU_ISA="avx9")
    result = subprocess.run([str(BINARY), "logits", "--model", str(tmp_path / "m"), "--tokens", "1 2",
                             "--out", str(tmp_path / "x.safetensors")], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert "ARCHSPACE_MAX_CPU_ISA='avx9' is not one of: scalar, avx2, avx512_bf16" in result.stderr, result.stderr


def cpu_has_native_bf16():
    """kernels/cpu_isa's avx512_bf16 rule, read from /proc/cpuinfo: AVX2, AVX512F, AVX512BW and AVX512-BF16."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"avx2", "avx512f", "avx512bw", "avx512_bf16"} <= flags


WIDENED_LINE = "bf16 matmuls: widened to fp32 on this CPU (no AVX512-BF16/AMX)"


def test_widened_bf16_matmuls_are_said_once_at_start_up(tmp_path):
    # Issue 52: where the engine widens its bf16 matmuls (no AVX512-BF16, or the avx2 and baseline paths, which cap
    # it), a command that computes says so once, on stderr, before its work; where they are native, nothing.
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "m")
    for path in PATHS:
        result = under(path, BINARY, "logits", "--model", tmp_path / "m", "--tokens", "1 2 3",
                       "--out", tmp_path / f"{path}.safetensors")
        assert result.returncode == 0, result.stderr
        widened = path != "native" or not cpu_has_native_bf16()
        lines = [line for line in result.stderr.splitlines() if not line.startswith("[kernel path")]
        assert lines.count(WIDENED_LINE) == (1 if widened else 0), (path, result.stderr)
        if widened:
            assert lines[0] == WIDENED_LINE, (path, result.stderr)
