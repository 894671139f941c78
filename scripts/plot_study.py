"""The figures of `make study` (scripts/study.sh), from its runs' metrics.jsonl:

    plot_study.py STUDY_DIR

STUDY_DIR/topologies.png: one column per learning rate; top, each topology's training loss (a 10-step moving
mean) and validation points against the unigram loss (the plateau of a model that learns no context); bottom,
the gradient norm reaching the embeddings (log scale), where a vanishing gradient shows (the paper's section 5.1).
STUDY_DIR/variants.png: base against siamese_depth at matched tokens, every seed.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(run_dir):
    steps, losses, valid, grads = [], [], [], []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        m = json.loads(line)
        if "loss" in m:
            steps.append(m["step"])
            losses.append(m["loss"])
        if "valid_loss" in m:
            valid.append((m["step"], m["valid_loss"]))
        if "grad_norms" in m:
            grads.append((m["step"], m["grad_norms"]["embed"]))
    return steps, losses, valid, grads


def moving_mean(values, n=10):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def loss_panel(ax, run_dir, label, colour):
    steps, losses, valid, _ = read_run(run_dir)
    ax.plot(steps, moving_mean(losses), color=colour, label=label, linewidth=1.2)
    if valid:
        ax.plot(*zip(*valid), "o", color=colour, markersize=4)


def main():
    study = sys.argv[1]
    unigram = json.load(open(os.path.join(study, "corpus", "vocab.json")))["unigram_valid_loss"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    runs = json.load(open(os.path.join(study, "topologies", "sweep.json")))["runs"]
    lr = {r["name"]: r["settings"].get("optim.lr", "-") for r in runs}
    topology = {r["name"]: r["settings"].get("model.norm_topology", r["name"]) for r in runs}
    lrs, topologies = list(dict.fromkeys(lr.values())), list(dict.fromkeys(topology.values()))
    fig, axes = plt.subplots(2, len(lrs), figsize=(5.2 * len(lrs), 7.5), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for r in runs:
        column = lrs.index(lr[r["name"]])
        colour = colours[topologies.index(topology[r["name"]]) % len(colours)]
        loss_panel(axes[0][column], r["run_dir"], topology[r["name"]], colour)
        _, _, _, grads = read_run(r["run_dir"])
        if grads:
            axes[1][column].semilogy(*zip(*grads), "o-", color=colour, markersize=2.5, linewidth=1)
    for column, rate in enumerate(lrs):
        top, bottom = axes[0][column], axes[1][column]
        top.axhline(unigram, color="black", linestyle=":", linewidth=1, label=f"unigram ({unigram:.2f})")
        top.set_title(f"lr {rate}")
        top.set_ylim(unigram - 2.2, unigram + 2.4)
        bottom.set_xlabel("step")
    axes[0][0].set_ylabel("loss (train: 10-step mean; dots: validation)")
    axes[1][0].set_ylabel("gradient norm at the embeddings")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(study, "topologies.png")
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")

    runs = json.load(open(os.path.join(study, "variants", "sweep.json")))["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    variants = sorted({r["settings"].get("model.variant", r["name"]) for r in runs})
    for r in runs:  # one colour per variant, its seeds' curves alike (the legend names each variant once)
        variant = r["settings"].get("model.variant", r["name"])
        seed = r["settings"].get("train.seed", "0")
        loss_panel(ax, r["run_dir"], variant if seed == "0" else None, colours[variants.index(variant) % len(colours)])
    ax.axhline(unigram, color="black", linestyle=":", linewidth=1, label=f"unigram ({unigram:.2f})")
    ax.set_ylim(unigram - 2.8, unigram + 2.4)
    ax.set_xlabel("step (1,024 tokens each)")
    ax.set_ylabel("loss (train: 10-step mean; dots: validation)")
    ax.set_title(f"base against siamese_depth at matched tokens, {len(runs) // len(variants)} seeds each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(study, "variants.png")
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
