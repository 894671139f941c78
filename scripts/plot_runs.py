"""Loss curves of several runs on one chart (used by `archspace plot`).

    plot_runs.py --out FILE.png [--x step|tokens] [--smooth W] RUN_DIR...

Each run's metrics.jsonl gives a training-loss line (solid) and, where present, validation loss
(dashed markers), labelled by the run directory's name; loss spikes (train.spike_factor) are marked
with an x. Runs that traced per-layer gradient norms (train.grad_norm_interval) get a panel below: one line
per layer (colour from the first layer to the last), embedding and head dotted, log scale. Runs with in-loop
downstream evaluation ([eval] downstream: lines with "downstream") get a panel beside: each task's primary
metric per run.

--smooth W (0 <= W < 1) smooths the training loss as TensorBoard's slider does: an exponential moving average
with weight W on the past, debiased at the start (s_t = sum_i W^i x_(t-i) / sum_i W^i over the points so far,
the first point unchanged); the raw curve stays behind it, faint. Validation points are never smoothed.
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def ema(values, weight):
    """TensorBoard's smoothing: a debiased exponential moving average with `weight` on the past."""
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = weight * last + (1 - weight) * v
        norm = weight * norm + (1 - weight)  # 1 - weight^t: the debiasing that keeps the first point as it is
        out.append(last / norm)
    return out


def smoothing_weight(text):
    w = float(text)
    if not 0 <= w < 1:
        raise argparse.ArgumentTypeError(f"--smooth must be in [0, 1) (TensorBoard's weight), not {text}")
    return w


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--x", choices=["step", "tokens"], default="step")
    parser.add_argument("--smooth", type=smoothing_weight, default=0.0)
    args = parser.parse_args()
    if args.smooth > 0:
        print(f"smoothing: training loss as an exponential moving average, weight {args.smooth:g} "
              "(TensorBoard's, debiased); raw curve faint behind it")
    runs = {}
    for run in args.runs:
        path = pathlib.Path(run) / "metrics.jsonl"
        if not path.exists():
            sys.exit(f"error: {path}: no metrics (is {run} a run directory?)")
        runs[run] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    traced = {run: [r for r in rows if "grad_norms" in r] for run, rows in runs.items()}
    traced = {run: rows for run, rows in traced.items() if rows}
    downstream = any("downstream" in r for rows in runs.values() for r in rows)
    nrows, ncols = (2 if traced else 1), (2 if downstream else 1)
    fig, axes = plt.subplots(nrows, ncols, figsize=(9 + 6 * (ncols - 1), 5.5 + 3.5 * (nrows - 1)), squeeze=False)
    ax = axes[0][0]
    gax = axes[1][0] if traced else None
    if traced and downstream:
        axes[1][1].axis("off")
    x_of = {}  # step -> tokens of each run, for the gradient panel's x axis
    for run, rows in runs.items():
        train = [r for r in rows if "loss" in r]
        valid = [r for r in rows if "valid_loss" in r]
        spikes = [r for r in rows if r.get("spike")]
        x_of[run] = {r["step"]: r[args.x] for r in train}
        label = pathlib.Path(run).resolve().name if len({pathlib.Path(r).name for r in args.runs}) == len(args.runs) else run
        xs, losses = [r[args.x] for r in train], [r["loss"] for r in train]
        if args.smooth > 0:
            line, = ax.plot(xs, ema(losses, args.smooth), label=f"{label} train (EMA {args.smooth:g})", linewidth=1.2)
            ax.plot(xs, losses, color=line.get_color(), alpha=0.25, linewidth=0.8)
        else:
            line, = ax.plot(xs, losses, label=f"{label} train", linewidth=1.2)
        if valid:
            ax.plot([r[args.x] for r in valid], [r["valid_loss"] for r in valid], "o--", color=line.get_color(),
                    label=f"{label} valid", markersize=4)
        if spikes:
            steps = {r["step"]: r for r in train}
            ax.plot([steps[r["step"]][args.x] if r["step"] in steps else r["step"] for r in spikes],
                    [r["spike_loss"] for r in spikes], "x", color=line.get_color(), markersize=9,
                    label=f"{label} spikes ({len(spikes)})")
        if downstream:
            draw_downstream(axes[0][1], rows, label, args.x)
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
