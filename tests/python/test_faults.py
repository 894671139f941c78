"""Training under faults and bad runs: one process per run directory (an OS lock), SIGTERM/SIGINT save the
step in progress and a resume continues bit-exactly, a non-finite loss stops (or skips, by policy) without
saving NaN weights, damaged shards are refused, and a sequence longer than the model's positions."""
import json
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from conftest import BINARY, run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import assert_same_run, base_sections, expect_error, metrics, synthetic_tokens, write_shards, write_toml


@pytest.fixture
def run_config(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(6000), per_shard=3000)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")

    def config(run, train=None, **overrides):
        s = base_sections(tmp_path, tmp_path / "init", run=run, train={"max_steps": 400, **(train or {})},
                          data={"shuffle": True}, **overrides)
        del s["debug"]
        return write_toml(tmp_path / f"{run}.toml", s)
    return config


def start(config, *extra):
    return subprocess.Popen([str(BINARY), "train", "--config", str(config), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_steps(run_dir, n, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    raise AssertionError(f"{run_dir}: fewer than {n} steps after {timeout} s")


def test_one_training_process_per_run_directory(tmp_path, run_config):
    first = start(run_config("run"))
    try:
        wait_for_steps(tmp_path / "run", 1, first)
        expect_error(["train", "--config", run_config("run"), "--resume"], "run", f"another process (pid {first.pid})")
    finally:
        first.kill()  # kill -9: the OS releases the lock with the process
        first.wait()
    short = run_config("run", train={"max_steps": 3})
    result = subprocess.run([str(BINARY), "train", "--config", short, "--resume"], capture_output=True, text=True)
    assert "another process" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_the_step_and_resume_is_exact(tmp_path, run_config, sig):
    straight = subprocess.run([str(BINARY), "train", "--config", run_config("straight", train={"max_steps": 40})],
                              capture_output=True, text=True)
    assert straight.returncode == 0, straight.stderr
    proc = start(run_config("stopped", train={"max_steps": 40}))
    wait_for_steps(tmp_path / "stopped", 3, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    stopped_at = len(metrics(tmp_path / "stopped"))
    assert 3 <= stopped_at < 40, err
    assert f"stopped by {sig.name} after step {stopped_at}" in err
    assert (tmp_path / "stopped" / "checkpoints" / "latest").read_text().strip() == f"step-{stopped_at:08d}"
    run_cli("train", "--config", run_config("stopped", train={"max_steps": 40}), "--resume")
    assert_same_run(tmp_path / "straight", tmp_path / "stopped")


def test_a_second_signal_exits_at_once(tmp_path, run_config):
    proc = start(run_config("run"))
    wait_for_steps(tmp_path / "run", 2, proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM)


def diverging_model(tmp_path):
    """A model whose logits overflow to infinity: every loss is NaN."""
    d = tmp_path / "init"
    weights = load_file(str(d / "model.safetensors"))
    weights["lm_head.weight"] = (weights["lm_head.weight"] * 1e37).astype(np.float32)
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_a_nonfinite_loss_stops_without_saving(tmp_path, run_config):
    diverging_model(tmp_path)
    expect_error(["train", "--config", run_config("run", train={"max_steps": 4})], "step 1: the loss is", "gradient norm",
                 "training diverged", "train.nonfinite")
    assert not (tmp_path / "run" / "checkpoints" / "final").exists()


def test_nonfinite_steps_can_be_skipped(tmp_path, run_config):
    diverging_model(tmp_path)
    toml = run_config("run", train={"max_steps": 3, "nonfinite": "skip"})
    result = subprocess.run([str(BINARY), "train", "--config", toml], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if l.get("skipped")] == [1, 2, 3]
    final = (tmp_path / "run" / "checkpoints" / "final").read_text().strip()
    saved = load_file(str(tmp_path / "run" / "checkpoints" / final / "model" / "model.safetensors"))
    start_weights = load_file(str(tmp_path / "init" / "model.safetensors"))
    assert all(np.array_equal(saved[n], start_weights[n]) for n in saved)  # no update from skipped steps
    expect_error(["train", "--config", run_config("bad", train={"nonfinite": "ignore"})], "train.nonfinite", "valid: stop, skip")


def test_damaged_shards_are_refused(tmp_path, run_config):
    shard = sorted((tmp_path / "shards").glob("*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[40] ^= 0x01  # same size, other token
    shard.write_bytes(bytes(data))
    expect_error(["train", "--config", run_config("run", train={"max_steps": 2})], shard.name, "does not match manifest.json")


def test_sequence_longer_than_the_model_is_refused(tmp_path, run_config):
    expect_error(["train", "--config", run_config("run", train={"sequence_length": 70000, "max_steps": 2})],
                 "'train.sequence_length' is 70000", "max_position_embeddings 65536")


def test_resume_after_the_model_section_changed_is_refused(tmp_path, run_config):
    """Editing [model] between a run and its resume used to end in LibTorch's raw shape error."""
    run_cli("train", "--config", run_config("run", train={"max_steps": 4}, checkpoint={"interval": 2}), "--stop-after", "2")
    edited = run_config("run", train={"max_steps": 4}, checkpoint={"interval": 2},
                        model={"init_from": "", "preset": "tiny"})
    expect_error(["train", "--config", edited, "--resume"], "cannot resume", "its model is not this config's",
                 "[model] section changed")
