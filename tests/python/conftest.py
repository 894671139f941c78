"""Shared helpers for the Python-side tests: the engine binary and tiny random transformers models."""
import os
import pathlib
import signal
import subprocess

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("ARCHSPACE_BIN", REPO / "build" / "archspace"))


# Each test's wall-clock bound. The slowest test took 56 s on two idle cores (2026-12-03); a test still running
# after this is stuck, and fails by name (with whatever it started killed) instead of holding CI until its limit.
TEST_TIMEOUT_S = int(os.environ.get("ARCHSPACE_TEST_TIMEOUT_S", "600"))


class TestTimedOut(Exception):
    pass


def _descendants(pid):
    """The processes below `pid` (from /proc): a timed-out test's engines, torchrun agents and their ranks."""
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces or parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
        except (ValueError, OSError, IndexError):
            continue
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.fixture(autouse=True)
def bounded_test_time(request):
    """SIGALRM after TEST_TIMEOUT_S: the test fails with TestTimedOut, and every process it left is killed."""
    if TEST_TIMEOUT_S <= 0:
        yield
        return

    def expired(signum, frame):
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        raise TestTimedOut(f"{request.node.nodeid} still ran after {TEST_TIMEOUT_S} s (ARCHSPACE_TEST_TIMEOUT_S); "
                           "its processes were killed")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# No engine command of the suite takes a minute on two idle cores; a run that goes on for 300 s is stuck (or
# training toward a max_steps it was never meant to reach) and fails by name instead of holding CI until its limit.
RUN_CLI_TIMEOUT_S = 300


# What a command that computes says first on stderr where bf16 matmuls are widened (a CPU without AVX512-BF16/AMX, or
# a capped kernel path: docs/reference.md), before any error or work.
WIDENED_BF16_LINE = "bf16 matmuls: widened to fp32 on this CPU (no AVX512-BF16/AMX)"


def without_startup_note(stderr):
    """stderr without the widened-bf16 start-up line, so that "the error is the first thing said" reads the same on
    every CPU."""
    return stderr[len(WIDENED_BF16_LINE) + 1:] if stderr.startswith(WIDENED_BF16_LINE + "\n") else stderr


def run_cli(*args, check=True, timeout=RUN_CLI_TIMEOUT_S):
    """Runs build/archspace with the given arguments; returns the CompletedProcess."""
    try:
        result = subprocess.run([str(BINARY), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "")[-2000:]
        raise AssertionError(f"archspace {' '.join(map(str, args))} still ran after {timeout} s (killed):\n{tail}")
    if check and result.returncode != 0:
        raise AssertionError(f"archspace {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr}")
    return result


def engine_logits(model_dir, tokens, tmp_path, *extra):
    out = tmp_path / "logits.safetensors"
    run_cli("logits", "--model", model_dir, "--tokens", " ".join(map(str, tokens)), "--out", out, *extra)
    return load_file(str(out))["logits"]


def tiny_olmo3_config(**overrides):
    """A small Olmo3Config in the new (transformers 5) form; overrides replace fields."""
    from transformers import Olmo3Config

    fields = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=65536,
        rms_norm_eps=1e-6,
        sliding_window=6,
        pad_token_id=1,
        eos_token_id=0,
        bos_token_id=None,
    )
    fields.update(overrides)
    return Olmo3Config(**fields)


def save_random_olmo3(config, directory, seed=0):
    """Builds a random Olmo3ForCausalLM (norm weights randomised too, so a wrong norm shows) and saves it."""
    from transformers import Olmo3ForCausalLM

    torch.manual_seed(seed)
    model = Olmo3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


ARCHS = REPO / "archs" / "olmo3-siamese-depth-attn"
REMOTE_FILES = ("configuration_olmo3_siamese_depth.py", "modeling_olmo3_siamese_depth.py")
AUTO_MAP = {
    "AutoConfig": "configuration_olmo3_siamese_depth.Olmo3SiameseDepthConfig",
    "AutoModel": "modeling_olmo3_siamese_depth.Olmo3SiameseDepthModel",
    "AutoModelForCausalLM": "modeling_olmo3_siamese_depth.Olmo3SiameseDepthForCausalLM",
}


def install_remote_code(directory):
    import shutil

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in REMOTE_FILES:
        shutil.copy(ARCHS / name, directory / name)


def variant_config_dict(**overrides):
    """config.json contents of a tiny siamese_depth model: 7 layers, stride 2, window 6, YaRN on full layers."""
    fields = dict(
        model_type="olmo3_siamese_depth",
        architectures=["Olmo3SiameseDepthForCausalLM"],
        auto_map=AUTO_MAP,
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
        rms_norm_eps=1e-6,
        sliding_window=6,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                      "beta_fast": 32.0, "beta_slow": 1.0},
        pad_token_id=1,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
        use_siamese_norm=True,
        use_depth_attention=True,
        siamese_norm_variant="hybrid_pre",
        depth_attention_stride=2,
        depth_attention_recent_window=0,
        qk_norm=True,
        qk_norm_mode="full_projection",
    )
    fields.update(overrides)
    return fields


def randomize_(model, seed=0):
    """Random weights with non-trivial norms and SiameseNorm scales, so that a wrong norm shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("siamese_hybrid_attn_scale"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def save_random_variant(directory, seed=0, **overrides):
    """Writes a random siamese_depth model directory through the archs/ remote code; returns the model."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    directory = pathlib.Path(directory)
    install_remote_code(directory)
    (directory / "config.json").write_text(json.dumps(variant_config_dict(**overrides)))
    config = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True).to(torch.float32).eval()
    randomize_(model, seed)
    model.save_pretrained(directory)
    install_remote_code(directory)
    return model


# ---- training batches seen from outside: metrics.jsonl's batch_hash --------------------------------


def fnv1a_batch_hash(rows):
    """The `batch_hash` of metrics.jsonl for a batch whose input ids are `rows` (lists of equal length, in
    batch order, micro-batches one after another): FNV-1a 64 over the ids as 64-bit integers."""
    h = 1469598103934665603
    for row in rows:
        for t in row:
            h = ((h ^ int(t)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
