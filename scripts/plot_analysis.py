"""Plots of `archspace analyze` (used by it): one figure with the analyses of analysis.json.

    plot_analysis.py ANALYSIS.json [ANALYSIS.json ...] --out FILE.png [--labels A,B,...]

Panels: hidden-state norm per layer of each stream (log scale), layer-pruning loss increase per layer,
logit-lens agreement with the output per layer of each stream, and, for one model, each stream's input
intensity per sublayer and Depth-Attention's mean mixing weight per (layer, source layer). Several files
compare models on the first three panels (the paper's Figure 2 layout): one colour per model, one line style per
stream, grouped bars for pruning.
"""
import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

STREAM_STYLES = ["o-", "s--", "^:"]


def integer_ticks(axis):
    """Layers are whole numbers: no 0.5 ticks on a few-layer axis."""
    axis.set_major_locator(MaxNLocator(integer=True))


def compare(analyses, labels):
    """The norm, pruning and lens panels of several models side by side."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(analyses)
    for m, (r, label) in enumerate(zip(analyses, labels)):
        colour = colours[m % len(colours)]
        layers = list(range(r["layers"]))
        for k, (name, s) in enumerate(r["streams"].items()):
            style = STREAM_STYLES[k % len(STREAM_STYLES)]
            axes[0].plot(range(-1, r["layers"]), s["norm"], style, color=colour, label=f"{label} {name}",
                         markersize=3)
            axes[2].plot(layers, s["lens_agreement"], style, color=colour, label=f"{label} {name}", markersize=3)
        axes[1].bar([l + (m - (len(analyses) - 1) / 2) * width for l in layers], [p["delta"] for p in r["pruning"]],
                    width, color=colour, label=f"{label} (loss {r['loss']:.3f})")
    axes[0].set_yscale("log")
    axes[0].set_title("hidden-state norm (mean L2 per token)")
    axes[0].set_xlabel("layer (-1: embeddings)")
    axes[1].axhline(0, color="black", linewidth=0.5)
    axes[1].set_yscale("symlog", linthresh=1e-3)  # the first layer's increase dwarfs the others
    axes[1].set_title("loss increase when the layer is removed (symlog)")
    axes[1].set_xlabel("layer removed")
    axes[2].set_ylim(0, 1.02)
    axes[2].set_title("logit lens: top-1 agreement with the output")
    axes[2].set_xlabel("layer")
    for ax in axes:
        ax.legend(fontsize=8)
        integer_ticks(ax.xaxis)
    r = analyses[0]
    fig.suptitle(f"{r['sequences']} x {r['sequence_length']} tokens of {r.get('data', '')}")
    fig.tight_layout()
    return fig


def single(r):
    """Every panel of one model's analysis."""
    panels = ["norms", "pruning", "lens"] + (["intensity"] if "input_intensity" in r else []) + \
             (["depth"] if "depth_attention" in r else [])
    cols = 3 if len(panels) > 4 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    axes = axes.ravel()
    layers = list(range(r["layers"]))
    for ax, panel in zip(axes, panels):
        if panel == "norms":
            for name, s in r["streams"].items():
                ax.plot(range(-1, r["layers"]), s["norm"], "o-", label=name, markersize=3)
            ax.set_yscale("log")
            ax.set_title("hidden-state norm (mean L2 per token)")
            ax.set_xlabel("layer (-1: embeddings)")
            ax.legend()
        elif panel == "pruning":
            ax.bar(layers, [p["delta"] for p in r["pruning"]])
            ax.set_title(f"loss increase when the layer is removed (loss {r['loss']:.3f})")
            ax.set_xlabel("layer removed")
        elif panel == "lens":
            for name, s in r["streams"].items():
                ax.plot(layers, s["lens_agreement"], "o-", label=name, markersize=3)
            ax.set_ylim(0, 1.02)
            ax.set_title("logit lens: top-1 agreement with the output")
            ax.set_xlabel("layer")
            ax.legend()
        elif panel == "intensity":
            for key in ("attn_X", "attn_Y", "mlp_X", "mlp_Y"):
                xs = [row["layer"] for row in r["input_intensity"] if key in row]
                if xs:
                    ax.plot(xs, [row[key] for row in r["input_intensity"] if key in row], "o-", label=key, markersize=3)
            ax.set_title("stream input intensity (RMS of each summand)")
            ax.set_xlabel("layer")
            ax.legend()
        elif panel == "depth":
            n = r["layers"]
            grid = [[float("nan")] * n for _ in range(n)]
            for row in r["depth_attention"]:
                for source, w in row["weights"].items():
                    grid[row["layer"]][int(source)] = w
            im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=0, vmax=1)
            fig.colorbar(im, ax=ax)
            ax.set_title("Depth-Attention mean weight (diagonal: own value)")
            ax.set_xlabel("source layer")
            ax.set_ylabel("layer")
    for ax in axes[len(panels):]:
        ax.axis("off")
    for ax in axes[:len(panels)]:
        integer_ticks(ax.xaxis)
    if "depth" in panels:
        integer_ticks(axes[panels.index("depth")].yaxis)
    fig.suptitle(f"{r.get('model', '')}: {r['sequences']} x {r['sequence_length']} tokens")
    fig.tight_layout()
    return fig


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("analysis", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--labels", help="comma-separated, one per file (default: each file's model)")
    args = parser.parse_args()
    analyses = [json.load(open(path)) for path in args.analysis]
    labels = args.labels.split(",") if args.labels else [r.get("model", path) for r, path in zip(analyses, args.analysis)]
    if len(labels) != len(analyses):
        parser.error(f"--labels names {len(labels)} models for {len(analyses)} files")
    fig = compare(analyses, labels) if len(analyses) > 1 else single(analyses[0])
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
