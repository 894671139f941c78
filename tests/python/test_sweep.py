"""archspace sweep: a grid of overrides over one run config. Each point trains exactly as `archspace train`
with the same overrides (bit-equal losses), all points see the same batches, an interrupted sweep resumes
bit-exactly, a diverging point is recorded and does not stop the others, and bad grids fail before training."""
import json
import os
import signal
import subprocess

from conftest import BINARY, run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import base_sections, metrics, synthetic_tokens, write_shards, write_toml


def sweep_setup(tmp_path, max_steps=6):
    write_shards(tmp_path / "shards", synthetic_tokens(4000))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", run="sweep", train={"max_steps": max_steps},
                      data={"shuffle": True}, checkpoint={"interval": 2, "keep_last": 2})
    del s["debug"]
    return write_toml(tmp_path / "run.toml", s)


def summary(out):
    return {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}


def test_points_train_as_train_would_on_matched_batches(tmp_path):
    config = sweep_setup(tmp_path)
    result = run_cli("sweep", "--config", config, "--grid", "optim.lr=1e-3,1e-2", "--grid", "optim.warmup_steps=0,3",
                     "--set", "optim.clip_grad_norm=1.0")
    out = tmp_path / "sweep"
    names = ["lr=1e-3,warmup_steps=0", "lr=1e-3,warmup_steps=3", "lr=1e-2,warmup_steps=0", "lr=1e-2,warmup_steps=3"]
    runs = summary(out)
    assert sorted(runs) == sorted(names)
    for name in names:
        assert runs[name]["status"] == "finished" and runs[name]["steps"] == 6 and name in result.stdout
    # Matched: every point reads the same batches in the same order.
    hashes = {name: [m["batch_hash"] for m in metrics(out / name)] for name in names}
    assert len({tuple(h) for h in hashes.values()}) == 1
    # A point is exactly the run `archspace train` makes with the same overrides.
    run_cli("train", "--config", config, "--set", "optim.clip_grad_norm=1.0", "--set", "optim.lr=1e-2",
            "--set", "optim.warmup_steps=3", "--set", f"train.run_dir={tmp_path / 'alone'}")
    assert [m["loss"] for m in metrics(tmp_path / "alone")] == [m["loss"] for m in metrics(out / names[3])]
    # The summary's numbers are the metrics' numbers.
    losses = [m["loss"] for m in metrics(out / names[3])]
    assert runs[names[3]]["first_loss"] == losses[0] and runs[names[3]]["min_loss"] == min(losses)
    assert abs(runs[names[3]]["final_loss"] - sum(losses) / len(losses)) < 1e-12  # 6 steps: the mean of all
    assert runs[names[3]]["final_loss"] != runs[names[0]]["final_loss"]
    assert (out / "sweep.png").stat().st_size > 10000
    # A second sweep finds every point finished and trains nothing.
    again = run_cli("sweep", "--config", config, "--grid", "optim.lr=1e-3,1e-2", "--grid", "optim.warmup_steps=0,3",
                    "--set", "optim.clip_grad_norm=1.0")
    assert "step" not in again.stderr.replace("steps", "")
    assert summary(out) == runs


def test_a_killed_sweep_resumes_exactly(tmp_path):
    """kill -9 during point 1's step-6 checkpoint (the trainer's test hook): the rerun resumes that point from its
    step-4 checkpoint, then runs point 2; point 1's losses equal an uninterrupted run's bit for bit."""
    config = sweep_setup(tmp_path, max_steps=8)
    grid = ["--grid", "optim.lr=1e-3,2e-3"]
    out = tmp_path / "sweep"
    env = dict(os.environ, ARCHSPACE_TEST_KILL_DURING_CHECKPOINT="6")
    killed = subprocess.run([str(BINARY), "sweep", "--config", str(config), *grid, "--no-plot"], env=env,
                            capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "lr=1e-3" / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    assert not (out / "lr=2e-3").exists() and not (out / "sweep.json").exists()
    result = run_cli("sweep", "--config", config, *grid, "--no-plot")
    runs = summary(out)
    assert runs["lr=1e-3"]["status"] == runs["lr=2e-3"]["status"] == "finished", result.stderr
    run_cli("train", "--config", config, "--set", "optim.lr=1e-3", "--set", f"train.run_dir={tmp_path / 'alone'}")
    assert [m["loss"] for m in metrics(tmp_path / "alone")] == [m["loss"] for m in metrics(out / "lr=1e-3")]
    assert len(metrics(out / "lr=1e-3")) == 8


def test_a_diverging_point_is_recorded_and_the_others_run(tmp_path):
    config = sweep_setup(tmp_path)
    # Without clipping, lr 3 trains to the end with its loss far above where it began; lr 1e-3 learns. A z-loss
    # coefficient of 1e38 makes the first step's loss infinite on any CPU (the fp32 z-loss sum is lse^2 >= 1 per
    # token times 1e38: above fp32's largest 3.4e38 for 4 tokens already), so those points stop as diverged.
    # (lr 10 used to be the diverging point: whether its gradient norm of ~1e19 overflows depends on the kernels.)
    grid = ["--grid", "optim.lr=3,1e-3", "--grid", "optim.z_loss=1e-4,1e38", "--set", "optim.clip_grad_norm=0",
            "--set", "optim.warmup_steps=0", "--no-plot"]
    run_cli("sweep", "--config", config, *grid)
    runs = summary(tmp_path / "sweep")
    for lr in ("3", "1e-3"):
        point = runs[f"lr={lr},z_loss=1e38"]
        assert point["status"] == "diverged" and point["diverged"] and point["steps"] == 0, point
        assert "training diverged" in point["message"]
    assert runs["lr=3,z_loss=1e-4"]["status"] == "finished" and runs["lr=3,z_loss=1e-4"]["diverged"]
    assert runs["lr=3,z_loss=1e-4"]["final_loss"] > runs["lr=3,z_loss=1e-4"]["first_loss"]
    assert runs["lr=1e-3,z_loss=1e-4"]["status"] == "finished" and not runs["lr=1e-3,z_loss=1e-4"]["diverged"]
    assert runs["lr=1e-3,z_loss=1e-4"]["final_loss"] < runs["lr=1e-3,z_loss=1e-4"]["first_loss"]
    # A rerun keeps the diverged points as they are unless asked to retry them.
    again = run_cli("sweep", "--config", config, *grid)
    assert "lr=3,z_loss=1e38: diverged" in again.stderr and "[train]" not in again.stderr
    retried = run_cli("sweep", "--config", config, *grid, "--retry-diverged")
    assert "[train]" in retried.stderr and summary(tmp_path / "sweep")["lr=3,z_loss=1e38"]["status"] == "diverged"


def test_bad_grids_fail_before_any_training(tmp_path):
    config = sweep_setup(tmp_path)
    for args, fragment in [(["--grid", "optim.lr=1e-3,fast"], "sweep point 'lr=fast'"),
                           (["--grid", "optim.learning_rate=1"], "unknown key 'optim.learning_rate'"),
                           (["--grid", "lr=1,2"], "section.key"),
                           (["--grid", "optim.lr=1", "--grid", "optim.lr=2"], "given twice")]:
        result = run_cli("sweep", "--config", config, *args, check=False)
        assert result.returncode == 1 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "sweep").exists()
    dry = run_cli("sweep", "--config", config, "--grid", "optim.lr=1e-3,1e-2", "--dry-run")
    assert "lr=1e-2" in dry.stdout and "pending" in dry.stdout and not (tmp_path / "sweep").exists()
