"""The tables of `make study` (scripts/study.sh) in Markdown, computed from its outputs:

    study_table.py STUDY_DIR

STUDY_DIR/topologies/sweep.json (topology x learning rate), STUDY_DIR/variants/sweep.json (base against
siamese_depth), STUDY_DIR/analysis-*/analysis.json (layer pruning) and STUDY_DIR/corpus/vocab.json (the unigram
loss, the plateau of a model that learns no context).
"""
import json
import os
import sys


def fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}f}"


def sweep_rows(summary, unigram, key):
    yield f"| {key} | lr | final train loss | validation loss | below unigram | spikes (steps) | diverged |"
    yield "|---|---|---|---|---|---|---|"
    for run in summary["runs"]:
        s = run["settings"]
        valid = run["final_valid_loss"]
        spikes = f"{run['spikes']}" + (f" ({', '.join(map(str, run['spike_steps']))})" if run["spike_steps"] else "")
        yield (f"| {s.get('model.norm_topology', s.get('model.variant', '-'))} | {s.get('optim.lr', '-')} | "
               f"{fmt(run['final_loss'])} | {fmt(valid)} | {fmt(None if valid is None else unigram - valid)} | "
               f"{spikes} | {'yes at step ' + str(run['steps']) if run['diverged'] else 'no'} |")


def main():
    study = sys.argv[1]
    vocab = json.load(open(os.path.join(study, "corpus", "vocab.json")))
    unigram = vocab["unigram_valid_loss"]
    print(f"Unigram validation loss (no context): {unigram:.3f}; vocabulary {vocab['vocab_size']} ids, "
          f"{100 * vocab['other_share']['valid']:.1f}% of validation tokens are the other id.\n")
    print("Topology x learning rate (final train loss: mean of the last 10 steps):\n")
    for line in sweep_rows(json.load(open(os.path.join(study, "topologies", "sweep.json"))), unigram, "topology"):
        print(line)
    print("\nBase against siamese_depth at matched tokens:\n")
    for line in sweep_rows(json.load(open(os.path.join(study, "variants", "sweep.json"))), unigram, "variant"):
        print(line)
    analyses = {v: json.load(open(os.path.join(study, f"analysis-{v}", "analysis.json")))
                for v in ("base", "siamese_depth")}
    layers = analyses["base"]["layers"]
    print("\nLayer pruning (held-out loss increase when one block is removed):\n")
    print("| layer | " + " | ".join(analyses) + " |")
    print("|---|" + "---|" * len(analyses))
    for l in range(layers):
        print(f"| {l} | " + " | ".join(f"{a['pruning'][l]['delta']:+.4f}" for a in analyses.values()) + " |")
    print("| loss | " + " | ".join(f"{a['loss']:.4f}" for a in analyses.values()) + " |")


if __name__ == "__main__":
    main()
