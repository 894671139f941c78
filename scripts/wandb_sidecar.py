"""The W&B tracker of `archspace train` ([log] wandb = {...}; docs/training.md, "Tracking").

The engine starts this script with the python that has wandb and writes JSON lines to its stdin:

    {"init": {"project", "name", "mode", "run_dir", "start_step", "config", "run"}}   first
    {"record": {"step": N, ...}}   each metrics.jsonl line, flattened ("downstream/arc_easy/value")
    {"finish": true}   the run ended normally: the loss plot is logged and the W&B run closed

End of input without "finish" (the trainer failed or was killed) closes the W&B run as failed. stdout and stderr
go to RUN_DIR/wandb/archspace-sidecar.log; when this script cannot go on, its last line says why (the engine's
warning quotes it). RUN_DIR/wandb/archspace-run.json keeps the W&B run id and how far it was logged, so that a
resumed training run continues the same W&B run and logs each step once.
"""
import json
import os
import pathlib
import secrets
import signal
import string
import subprocess
import sys


def fail(message, status=3):
    print(f"error: {message}", flush=True)
    sys.exit(status)


def load_state(path, start_step):
    """The W&B run this training run logged to: kept when the run resumes, forgotten when it starts over."""
    if start_step <= 0 or not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
        return state if isinstance(state.get("id"), str) else {}
    except (OSError, ValueError):
        return {}


def save_state(path, state):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)  # whole or not at all: a kill between the two leaves the previous state


def draw_plot(run_dir):
    """The run's loss curves as `archspace plot` draws them, or None (no matplotlib: a line in the log)."""
    out = run_dir / "wandb" / "archspace-loss.png"
    script = pathlib.Path(__file__).with_name("plot_runs.py")
    try:
        subprocess.run([sys.executable, str(script), str(run_dir), "--out", str(out)], check=True, timeout=300,
                       stdout=subprocess.DEVNULL)
        return out
    except (OSError, subprocess.SubprocessError) as e:
        print(f"the loss plot was not drawn ({e}); the charts of the logged metrics are unaffected", flush=True)
        return None


def main():
    # The trainer answers Ctrl-C and SIGTERM by saving a checkpoint; this process ends when its input does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lines = iter(sys.stdin.buffer)
    try:
        init = json.loads(next(lines))["init"]
    except (StopIteration, ValueError, KeyError, TypeError) as e:
        fail(f"the first line on stdin must be {{\"init\": ...}} ({e!r})")
    try:
        import wandb
    except ImportError as e:
        fail(f"cannot import wandb ({e}); scripts/setup.sh installs it into the .venv (requirements-tracking.txt), "
             "or ARCHSPACE_PYTHON names a python that has it")

    run_dir = pathlib.Path(init["run_dir"])
    state_path = run_dir / "wandb" / "archspace-run.json"
    start_step = int(init.get("start_step", 0))
    state = load_state(state_path, start_step)
    state.setdefault("id", "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8)))
    logged_step, logged_at = int(state.get("logged_step", 0)), int(state.get("logged_at_step", 0))
    if logged_step > start_step:
        print(f"steps {start_step + 1}..{logged_step} were logged to W&B run {state['id']} before the run resumed "
              f"from step {start_step}; they are not logged again", flush=True)
    config = dict(init.get("config") or {})
    config["archspace"] = init.get("run") or {}
    try:
        run = wandb.init(project=init["project"], name=init["name"], mode=init["mode"], dir=str(run_dir),
                         id=state["id"], resume="allow" if start_step > 0 else None, config=config,
                         settings=wandb.Settings(console="off", save_code=False))
    except Exception as e:  # noqa: BLE001 - whatever wandb raises, the engine's warning should say it
        fail(f"wandb.init failed: {type(e).__name__}: {e}")
    save_state(state_path, state)

    finished, last_step, seen_at_logged = False, logged_step, 0
    for raw in lines:
        message = json.loads(raw)
        if "finish" in message:
            finished = True
            break
        record = message["record"]
        step = int(record.pop("step"))
        # A resumed run repeats the steps after its checkpoint; W&B has those already (the resume is bit-exact),
        # the records of the last logged step as far as they got.
        if step < logged_step:
            continue
        if step == logged_step:
            seen_at_logged += 1
            if seen_at_logged <= logged_at:
                continue
        run.log(record, step=step)
        if step == state.get("logged_step"):
            state["logged_at_step"] += 1
        else:
            state.update(logged_step=step, logged_at_step=1)
        save_state(state_path, state)
        last_step = step
    if finished:
        plot = draw_plot(run_dir)
        if plot is not None:
            run.log({"plots/loss": wandb.Image(str(plot))}, step=last_step)
    run.finish(exit_code=0 if finished else 1)


if __name__ == "__main__":
    main()
