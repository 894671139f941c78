"""Experiment tracking ([log] tensorboard / wandb; docs/training.md, "Tracking"): what the engine wrote is read
back with the packages' own readers (TensorBoard's EventAccumulator; W&B's transaction-log reader `wandb leet
inspect`, which reads the offline .wandb files `wandb sync` uploads) and compared with metrics.jsonl, the record;
a resumed run logs each step once; a tracker that fails warns once and training goes on.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINARY, REPO, save_random_olmo3, tiny_olmo3_config
from test_train import base_sections, synthetic_tokens, write_shards

PYTHON = pathlib.Path(sys.executable)
WANDB = PYTHON.parent / "wandb"


def write_config(tmp_path, run, log=None, **sections):
    s = base_sections(tmp_path, tmp_path / "init", run=run, train={"max_steps": 8, "grad_norm_interval": 3},
                      checkpoint={"interval": 2, "keep_last": 2}, data={"valid": str(tmp_path / "shards")},
                      eval={"interval": 3, "batches": 1}, **sections)
    del s["debug"]
    lines = []
    for name, values in s.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}" for k, v in values.items()]
    lines += ["[log]", *(log or [])]
    path = tmp_path / f"{run}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def train(config, *args, env=None):
    result = subprocess.run([str(BINARY), "train", "--config", str(config), *args], capture_output=True, text=True,
                            env=dict(os.environ, **(env or {})), timeout=600)
    assert result.returncode == 0, result.stderr
    return result


def flatten(record, prefix=""):
    """The tracker keys of a metrics line (nested keys joined by "/", the step left out, nulls left out)."""
    out = {}
    for k, v in record.items():
        key = f"{prefix}/{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        elif isinstance(v, list):
            out.update(flatten({str(i): x for i, x in enumerate(v)}, key))
        elif v is not None and key != "step":
            out[key] = v
    return out


def per_step(run_dir):
    """metrics.jsonl merged per step: {step: {key: value}}."""
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(flatten(record))
    return steps


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """8 steps with both trackers, stopped after step 5 (checkpoint at 4) and resumed: step 5 is trained twice."""
    tmp_path = tmp_path_factory.mktemp("tracking")
    write_shards(tmp_path / "shards", synthetic_tokens(4000), per_shard=1500)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    log = [f'tensorboard = "{tmp_path / "tb"}"', 'wandb = { project = "tracking-test", name = "resumed" }']
    config = write_config(tmp_path, "run", log)
    first = train(config, "--stop-after", "5")
    second = train(config, "--resume")
    return tmp_path, first.stderr + second.stderr


def test_tensorboard_event_files_read_back_by_tensorboard(resumed_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp_path, _ = resumed_run
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2  # one file per process
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    want = {}  # tag -> {step: value}: every number of metrics.jsonl
    for step, values in per_step(tmp_path / "run").items():
        for k, v in values.items():
            if isinstance(v, (int, float)):
                want.setdefault(k, {})[step] = float(v)
    assert {"loss", "lr", "grad_norm", "valid_loss", "tokens"} <= set(want)
    assert any(t.startswith("grad_norms/") for t in want)
    assert sorted(acc.Tags()["scalars"]) == sorted(want)
    for tag, by_step in want.items():
        events = acc.Scalars(tag)
        # Each step once: the resumed file's SessionLog START dropped the first process's step 5.
        assert [e.step for e in events] == sorted(by_step), tag
        np.testing.assert_array_equal([e.value for e in events], np.float32([by_step[s] for s in sorted(by_step)]))
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 9))


def inspect(wandb_file):
    out = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(wandb_file)], capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_wandb_offline_run_has_every_record_the_config_and_the_plot(resumed_run):
    tmp_path, _ = resumed_run
    run_dir = tmp_path / "run"
    fragments = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(fragments) == 2  # the first process and the resumed one, which `wandb sync` uploads in order
    state = json.loads((run_dir / "wandb" / "archspace-run.json").read_text())
    history, runs = {}, []
    for fragment in fragments:
        for record in inspect(next(fragment.glob("*.wandb"))):
            if record["type"] == "run":
                runs.append(record["run"])
            elif record["type"] == "history":
                step = int(record["history"]["step"]["num"])
                assert step not in history, f"step {step} logged twice"
                history[step] = {k: v for k, v in record["history"]["item"].items() if not k.startswith("_")}
    # One W&B run, continued: the id kept in the run directory.
    assert [r["run_id"] for r in runs] == [state["id"]] * 2
    assert runs[1].get("resume") is True
    assert {r["project"] for r in runs} == {"tracking-test"} and {r["display_name"] for r in runs} == {"resumed"}
    # The configuration: the TOML file's tables, and what the engine derived.
    config = runs[0]["config"]["update"]
    assert config["train"]["max_steps"] == 8 and config["eval"]["interval"] == 3
    assert config["archspace"]["world_size"] == 1 and config["archspace"]["tokens_per_step"] == 4 * 16
    # Every record, per step, with its values.
    # (each process logs the plot as it finishes: the first at its last step, 5, the resumed one at 8)
    plots = {step: {k: row.pop(k) for k in list(row) if k.startswith("plots/")} for step, row in history.items()}
    plot = plots[8]
    want = per_step(run_dir)
    assert sorted(history) == sorted(want) == list(range(1, 9))
    for step in want:
        assert sorted(history[step]) == sorted(want[step]), step
        for key, value in want[step].items():  # numbers to 1e-12 (W&B keeps doubles); text (the batch hash) exactly
            if key in ("elapsed_s", "tokens_per_s") and step == 5:
                continue  # wall-clock timings of step 5, which the first process logged and the resumed one retrained
            if isinstance(value, str):
                assert history[step][key] == value, (step, key)
            else:
                assert history[step][key] == pytest.approx(value, rel=1e-12), (step, key)
    # The plot: the run's loss curves as `archspace plot` draws them, an image file of the last fragment.
    assert plot["plots/loss._type"] == "image-file"
    image = fragments[-1] / "files" / plot["plots/loss.path"]
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def small_run(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(4000), per_shard=1500)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    return tmp_path


def assert_trained_with_one_warning(result, run_dir, *fragments):
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    for f in fragments:
        assert f in warnings[0], warnings[0]
    assert "metrics.jsonl stays the record" in warnings[0]
    assert sorted(per_step(run_dir)) == list(range(1, 9))  # training went on, and metrics.jsonl has every step


# A sidecar that exits at once is noticed either while the tracker starts (its first message finds the socket
# closed: "tracking is off") or at a later record ("tracking stopped"), whichever comes first on this machine;
# either way one warning names the cause and training goes on.
def test_a_python_that_exits_at_once_is_one_warning(small_run):
    config = write_config(small_run, "run", ['wandb = { project = "p" }'])
    result = train(config, env={"ARCHSPACE_PYTHON": shutil.which("false")})
    assert_trained_with_one_warning(result, small_run / "run", "W&B tracking ", "exited with status 1")


def test_a_python_without_wandb_is_one_warning_naming_it(small_run):
    bare = shutil.which("python3", path="/usr/bin")
    if not bare or subprocess.run([bare, "-c", "import wandb"], capture_output=True).returncode == 0:
        pytest.skip("no python without wandb on this machine")
    config = write_config(small_run, "run", ['wandb = { project = "p" }'])
    result = train(config, env={"ARCHSPACE_PYTHON": bare})
    assert_trained_with_one_warning(result, small_run / "run", "W&B tracking ", "cannot import wandb")


def test_a_sidecar_that_dies_mid_run_is_one_warning(small_run):
    dying = small_run / "dying.py"
    dying.write_text("import sys\nfor i, line in enumerate(sys.stdin):\n    if i == 3:\n"
                     "        print('error: gone after three records'); sys.exit(5)\n")
    config = write_config(small_run, "run", ['wandb = { project = "p" }'])
    result = train(config, env={"ARCHSPACE_WANDB_SIDECAR": str(dying)})
    assert_trained_with_one_warning(result, small_run / "run", "W&B tracking stopped", "exited with status 5",
                                    "gone after three records")


def test_a_tensorboard_dir_that_is_a_file_is_one_warning(small_run):
    (small_run / "tb").write_text("not a directory")
    config = write_config(small_run, "run", [f'tensorboard = "{small_run / "tb"}"'])
    result = train(config)
    assert_trained_with_one_warning(result, small_run / "run", "TensorBoard tracking is off", str(small_run / "tb"))


def test_mode_disabled_starts_no_sidecar(small_run):
    config = write_config(small_run, "run", ['wandb = { project = "p", mode = "disabled" }'])
    result = train(config, env={"ARCHSPACE_PYTHON": shutil.which("false")})
    assert "warning" not in result.stderr and not (small_run / "run" / "wandb").exists()


@pytest.mark.parametrize("log, message", [
    (['wandb = { project = "p", entity = "me" }'], "unknown key 'log.wandb.entity' (known: mode, name, project)"),
    (['wandb = { project = 3 }'], "key 'log.wandb.project' must be a string"),
    (['wandb = { mode = "dryrun" }'], "key 'log.wandb.mode' must be \"offline\", \"online\" or \"disabled\""),
    (['wandb = "offline"'], "key 'log.wandb' must be a table"),
    (['tensorboard = true'], "key 'log.tensorboard' must be a string"),
    (['tensorbord = "tb"'], "unknown key 'log.tensorbord' (known: tensorboard, wandb)"),
])
def test_log_config_errors_name_the_field(small_run, log, message):
    config = write_config(small_run, "run", log)
    result = subprocess.run([str(BINARY), "train", "--config", str(config)], capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert str(config) in result.stderr


def test_set_log_tensorboard_and_not_the_wandb_table(small_run):
    config = write_config(small_run, "run")
    result = subprocess.run([str(BINARY), "train", "--config", str(config), "--set", "log.wandb=x"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "key 'log.wandb' is a table; set it in the TOML file" in result.stderr
    train(config, "--set", f"log.tensorboard={small_run / 'tb'}")
    assert len(list((small_run / "tb").glob("events.out.tfevents.*"))) == 1
