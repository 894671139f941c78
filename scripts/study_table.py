"""The tables of `make study` (scripts/study.sh) in Markdown, computed from its outputs:

    study_table.py STUDY_DIR

STUDY_DIR/topologies/sweep.json (topology x learning rate), STUDY_DIR/variants/sweep.json (base against
siamese_depth, five seeds each), STUDY_DIR/seeds/compare.json (`archspace compare` of those seeds: the verdict with
its intervals), STUDY_DIR/analysis-*/analysis.json (layer pruning) and STUDY_DIR/corpus/vocab.json (the unigram
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
        name = s.get("model.norm_topology", s.get("model.variant", "-"))
        if "train.seed" in s:
            name += f" (seed {s['train.seed']})"
        yield (f"| {name} | {s.get('optim.lr', '-')} | "
               f"{fmt(run['final_loss'])} | {fmt(valid)} | {fmt(None if valid is None else unigram - valid)} | "
               f"{spikes} | {'yes at step ' + str(run['steps']) if run['diverged'] else 'no'} |")


def interval(row, digits=4):
    b, t = row["bootstrap"], row["t"]
    seeds = "-" if b["low"] is None else f"[{b['low']:+.{digits}f}, {b['high']:+.{digits}f}]"
    student = "-" if t is None else f"[{t['low']:+.{digits}f}, {t['high']:+.{digits}f}], p {t['p']:.3g}"
    return f"{row['diff']:+.{digits}f} | {seeds} | {student}"


def verdict(report):
    """Does siamese_depth converge faster here, and by how much, with what interval? From compare's seeds section
    (B = siamese_depth, A = base; pairs of one seed)."""
    s = report["seeds"]
    yield (f"\nDoes siamese_depth converge faster here? {s['runs_a']} seeds of base (A) against {s['runs_b']} of "
           f"siamese_depth (B), {'paired by seed' if s['paired'] else 'unpaired'}; intervals: 95% over "
           f"{s['resamples']} seed resamples, and Student's t ({'paired' if s['paired'] else 'Welch'}):\n")
    yield "| B - A | tokens | difference | 95% seed resamples | 95% t, p | seeds per arm for 0.01 nats |"
    yield "|---|---|---|---|---|---|"
    rows = [(f"smoothed training loss", f"{r['tokens']:.0f}", r) for r in s["loss_at_tokens"]]
    if s["final_valid"] is not None:
        rows.append(("final validation loss", "end", s["final_valid"]))
    for what, tokens, r in rows:
        needed = next(n["seeds_per_arm"] for n in r["seeds_needed"] if n["delta"] == 0.01)
        yield f"| {what} | {tokens} | {interval(r)} | {needed} |"
    yield "\n| loss level | tokens B/A | 95% seed resamples | resamples reaching it |"
    yield "|---|---|---|---|"
    for r in s["tokens_to_reach"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        span = "-" if r["low"] is None else f"[{r['low']:.3f}, {r['high']:.3f}]"
        yield f"| {r['loss']:.3f} | {ratio} | {span} | {r['defined']} of {s['resamples']} |"
    if report["differences"]:
        yield "\nNot matched: " + "; ".join(report["differences"])


def main():
    study = sys.argv[1]
    vocab = json.load(open(os.path.join(study, "corpus", "vocab.json")))
    unigram = vocab["unigram_valid_loss"]
    print(f"Unigram validation loss (no context): {unigram:.3f}; vocabulary {vocab['vocab_size']} ids, "
          f"{100 * vocab['other_share']['valid']:.1f}% of validation tokens are the other id.\n")
    print("Topology x learning rate (final train loss: mean of the last 10 steps):\n")
    for line in sweep_rows(json.load(open(os.path.join(study, "topologies", "sweep.json"))), unigram, "topology"):
        print(line)
    print("\nBase against siamese_depth at matched tokens, each seed:\n")
    for line in sweep_rows(json.load(open(os.path.join(study, "variants", "sweep.json"))), unigram, "variant"):
        print(line)
    seeds = os.path.join(study, "seeds", "compare.json")
    report = json.load(open(seeds)) if os.path.exists(seeds) else {}
    if "seeds" in report:
        for line in verdict(report):
            print(line)
    else:
        print(f"\n(no seeded comparison: {seeds} is missing or compares one run per side)")
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
