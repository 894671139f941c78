"""Plots of `archspace analyze` (used by it): one figure with the analyses of analysis.json.

    plot_analysis.py ANALYSIS.json --out FILE.png

Panels: hidden-state norm per layer of each stream (log scale), layer-pruning loss increase per layer,
logit-lens agreement with the output per layer of each stream, and, when present, each stream's input
intensity per sublayer and Depth-Attention's mean mixing weight per (layer, source layer).
"""
import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("analysis")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    r = json.load(open(args.analysis))
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
    fig.suptitle(f"{r.get('model', '')}: {r['sequences']} x {r['sequence_length']} tokens")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
