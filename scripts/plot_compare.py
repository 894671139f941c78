"""The charts of `archspace compare` from its compare.json.

    plot_compare.py COMPARE_JSON --out DIR

DIR/convergence.png: the training loss of both sides against tokens (smoothed as the report states, the raw
curves faint behind), validation loss as markers, and below it the difference B - A of the smoothed training
loss (and of the validation loss) at the tokens both logged. DIR/forest.png (when the report has an evaluation):
each task's paired difference B - A in points with its 95% interval, the macro difference last; tasks
significant after Holm's correction filled.
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def difference(xa, ya, xb, yb):
    """B - A at the x values both sides have."""
    at_a = dict(zip(xa, ya))
    xs = [x for x in xb if x in at_a]
    return xs, [y - at_a[x] for x, y in zip(xb, yb) if x in at_a]


def convergence(report, out):
    c = report["convergence"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    for side, colour in (("a", "tab:blue"), ("b", "tab:orange")):
        runs = report[side]
        s, name = c[side], runs[0] if len(runs) == 1 else f"{len(runs)} runs ({pathlib.Path(runs[0]).name}, ...)"
        top.plot(s["tokens"], s["loss"], color=colour, alpha=0.25, linewidth=1)
        top.plot(s["tokens"], s["smoothed"], color=colour, label=f"{side.upper()}: {name} (train)")
        if s["valid_tokens"]:
            top.plot(s["valid_tokens"], s["valid_loss"], "o--", color=colour, label=f"{side.upper()} validation")
    seeds = report.get("seeds") or {}
    for side, colour in (("a", "tab:blue"), ("b", "tab:orange")):
        band = seeds.get(f"band_{side}")
        if band:  # several runs: the mean smoothed curve's t band over the seeds
            top.fill_between(seeds["tokens"], band["low"], band["high"], color=colour, alpha=0.2, linewidth=0,
                             label=f"{side.upper()}: 95% t band over {seeds[f'runs_{side}']} seeds")
    for level in c["levels"]:
        top.axhline(level["loss"], color="grey", linewidth=0.5, linestyle=":")
    top.set_ylabel("loss")
    top.legend(fontsize=8)
    top.set_title(f"convergence (training loss smoothed, weight {c['smooth']})")
    xs, d = difference(c["a"]["tokens"], c["a"]["smoothed"], c["b"]["tokens"], c["b"]["smoothed"])
    bottom.plot(xs, d, color="black", label="train (smoothed)")
    for row in seeds.get("loss_at_tokens", []):  # the seed-resampled 95% intervals of the difference
        boot = row["bootstrap"]
        if boot["low"] is not None:
            err = [[row["diff"] - boot["low"]], [boot["high"] - row["diff"]]]
            bottom.errorbar([row["tokens"]], [row["diff"]], yerr=err, fmt="s", color="black", markersize=3, capsize=3)
    vx, vd = difference(c["a"]["valid_tokens"], c["a"]["valid_loss"], c["b"]["valid_tokens"], c["b"]["valid_loss"])
    if vx:
        bottom.plot(vx, vd, "o--", color="grey", label="validation")
    bottom.axhline(0, color="grey", linewidth=0.8)
    bottom.set_ylabel("B - A")
    bottom.set_xlabel("tokens")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=110)
    plt.close(fig)


def forest(report, out):
    e = report["evaluation"]
    rows = e["tasks"] + [dict(e["macro"], task="macro", significant=False)]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for i, r in enumerate(reversed(rows)):
        d, lo, hi = (100 * r[k] for k in ("diff", "low", "high"))
        ax.plot([lo, hi], [i, i], color="black")
        ax.plot([d], [i], "D" if r["task"] == "macro" else "o", color="black",
                markerfacecolor="black" if r.get("significant") else "white")
    ax.set_yticks(range(len(rows)), [r["task"] for r in reversed(rows)])
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("B - A (points), 95% paired-bootstrap interval; filled: significant after Holm")
    fig.tight_layout()
    fig.savefig(out / "forest.png", dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("report")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        report = json.loads(pathlib.Path(args.report).read_text())
    except (OSError, ValueError) as e:
        print(f"error: {args.report}: {e}", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out)
    convergence(report, out)
    if "evaluation" in report:
        forest(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
