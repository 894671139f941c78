"""Loss curves of several runs on one chart (used by `archspace plot`).

    plot_runs.py --out FILE.png [--x step|tokens] RUN_DIR...

Each run's metrics.jsonl gives a training-loss line (solid) and, where present, validation loss
(dashed markers), labelled by the run directory's name. Runs with in-loop downstream evaluation
([eval] downstream: lines with "downstream") get a second panel: each task's primary metric per run.
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--x", choices=["step", "tokens"], default="step")
    args = parser.parse_args()
    runs = []
    for run in args.runs:
        path = pathlib.Path(run) / "metrics.jsonl"
        if not path.exists():
            sys.exit(f"error: {path}: no metrics (is {run} a run directory?)")
        runs.append((run, [json.loads(line) for line in path.read_text().splitlines() if line.strip()]))
    downstream = any("downstream" in r for _, rows in runs for r in rows)
    fig, axes = plt.subplots(1, 2 if downstream else 1, figsize=(15 if downstream else 9, 5.5), squeeze=False)
    ax = axes[0][0]
    for run, rows in runs:
        train = [r for r in rows if "loss" in r]
        valid = [r for r in rows if "valid_loss" in r]
        label = pathlib.Path(run).resolve().name if len({pathlib.Path(r).name for r in args.runs}) == len(args.runs) else run
        line, = ax.plot([r[args.x] for r in train], [r["loss"] for r in train], label=f"{label} train", linewidth=1.2)
        if valid:
            ax.plot([r[args.x] for r in valid], [r["valid_loss"] for r in valid], "o--", color=line.get_color(),
                    label=f"{label} valid", markersize=4)
        if downstream:
            draw_downstream(axes[0][1], rows, label, args.x)
    ax.set_xlabel("step" if args.x == "step" else "tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    if downstream:
        axes[0][1].set_xlabel("step" if args.x == "step" else "tokens")
        axes[0][1].set_ylabel("primary metric (accuracy)")
        axes[0][1].set_title("downstream tasks")
        axes[0][1].grid(alpha=0.3)
        axes[0][1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def draw_downstream(ax, rows, label, x):
    """One line per task: its primary metric at each in-loop evaluation."""
    evals = [r for r in rows if "downstream" in r]
    for task in sorted({t for r in evals for t in r["downstream"]}):
        points = [(r[x], r["downstream"][task]["value"]) for r in evals if task in r["downstream"]]
        metric = next(r["downstream"][task]["metric"] for r in evals if task in r["downstream"])
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", markersize=4,
                label=f"{label} {task} ({metric})")


if __name__ == "__main__":
    main()
