"""Loss curves of several runs on one chart (used by `archspace plot`).

    plot_runs.py --out FILE.png [--x step|tokens] RUN_DIR...

Each run's metrics.jsonl gives a training-loss line (solid) and, where present, validation loss
(dashed markers), labelled by the run directory's name; loss spikes (train.spike_factor) are marked
with an x. Runs that traced per-layer gradient norms (train.grad_norm_interval) get a second panel:
one line per layer (colour from the first layer to the last), embedding and head dotted, log scale.
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
    runs = {}
    for run in args.runs:
        path = pathlib.Path(run) / "metrics.jsonl"
        if not path.exists():
            sys.exit(f"error: {path}: no metrics (is {run} a run directory?)")
        runs[run] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    traced = {run: [r for r in rows if "grad_norms" in r] for run, rows in runs.items()}
    traced = {run: rows for run, rows in traced.items() if rows}
    if traced:
        fig, (ax, gax) = plt.subplots(2, 1, figsize=(9, 9), sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(9, 5.5))
    x_of = {}  # step -> tokens of each run, for the gradient panel's x axis
    for run, rows in runs.items():
        train = [r for r in rows if "loss" in r]
        valid = [r for r in rows if "valid_loss" in r]
        spikes = [r for r in rows if r.get("spike")]
        x_of[run] = {r["step"]: r[args.x] for r in train}
        label = pathlib.Path(run).resolve().name if len({pathlib.Path(r).name for r in args.runs}) == len(args.runs) else run
        line, = ax.plot([r[args.x] for r in train], [r["loss"] for r in train], label=f"{label} train", linewidth=1.2)
        if valid:
            ax.plot([r[args.x] for r in valid], [r["valid_loss"] for r in valid], "o--", color=line.get_color(),
                    label=f"{label} valid", markersize=4)
        if spikes:
            steps = {r["step"]: r for r in train}
            ax.plot([steps[r["step"]][args.x] if r["step"] in steps else r["step"] for r in spikes],
                    [r["spike_loss"] for r in spikes], "x", color=line.get_color(), markersize=9,
                    label=f"{label} spikes ({len(spikes)})")
    for i, (run, rows) in enumerate(traced.items()):
        style = ["-", "--", ":", "-."][i % 4]
        xs = [x_of[run].get(r["step"], r["step"]) for r in rows]
        layers = len(rows[0]["grad_norms"]["layers"])
        cmap = plt.get_cmap("viridis")
        for l in range(layers):
            gax.plot(xs, [r["grad_norms"]["layers"][l] for r in rows], style, color=cmap(l / max(layers - 1, 1)),
                     label=f"{pathlib.Path(run).name} layer {l}" if l in (0, layers - 1) else None, linewidth=1)
        for part, colour in (("embed", "tab:red"), ("head", "tab:gray")):
            gax.plot(xs, [r["grad_norms"][part] for r in rows], style, color=colour, alpha=0.6,
                     label=f"{pathlib.Path(run).name} {part}", linewidth=1)
    if traced:
        gax.set_yscale("log")
        gax.set_ylabel("gradient norm (before clipping)")
        gax.set_xlabel("step" if args.x == "step" else "tokens")
        gax.grid(alpha=0.3)
        gax.legend(fontsize=7)
    ax.set_xlabel("step" if args.x == "step" else "tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
