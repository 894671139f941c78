"""Loss curves of several runs on one chart (used by `archspace plot`).

    plot_runs.py --out FILE.png [--x step|tokens] RUN_DIR...

Each run's metrics.jsonl gives a training-loss line (solid) and, where present, validation loss
(dashed markers), labelled by the run directory's name.
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
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for run in args.runs:
        path = pathlib.Path(run) / "metrics.jsonl"
        if not path.exists():
            sys.exit(f"error: {path}: no metrics (is {run} a run directory?)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        train = [r for r in rows if "loss" in r]
        valid = [r for r in rows if "valid_loss" in r]
        label = pathlib.Path(run).resolve().name if len({pathlib.Path(r).name for r in args.runs}) == len(args.runs) else run
        line, = ax.plot([r[args.x] for r in train], [r["loss"] for r in train], label=f"{label} train", linewidth=1.2)
        if valid:
            ax.plot([r[args.x] for r in valid], [r["valid_loss"] for r in valid], "o--", color=line.get_color(),
                    label=f"{label} valid", markersize=4)
    ax.set_xlabel("step" if args.x == "step" else "tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
