"""The parts of `make study` the CI can afford (the study itself takes about 24 minutes: docs/analysis.md "A small study"):
scripts/study_vocab.py's vocabulary cut against a count made here, the engine training and analysing on the
shards it writes, and the tables and figures (study_table.py, plot_study.py, plot_analysis.py's comparison) drawn
from real outputs."""
import json
import math
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np

from conftest import run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from test_train import base_sections, synthetic_tokens, write_shards, write_toml

SCRIPTS = __import__("pathlib").Path(__file__).resolve().parents[2] / "scripts"
K = 16


def run_script(name, *args):
    result = subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def cut_corpus(tmp_path):
    train, valid = synthetic_tokens(3000, seed=0), synthetic_tokens(1000, seed=1)
    train[::500] = 0  # a few EOS (id 0): rarer than the K - 1 kept ids, so only the EOS rule keeps it
    write_shards(tmp_path / "train", train)
    write_shards(tmp_path / "valid", valid)
    out = run_script("study_vocab.py", tmp_path / "train", tmp_path / "valid", tmp_path / "corpus", "--vocab", K)
    return train, valid, tmp_path / "corpus", out


def test_the_vocabulary_cut_keeps_the_most_frequent_ids_and_eos(tmp_path):
    train, valid, corpus, out = cut_corpus(tmp_path)
    counts = Counter(train.tolist())
    ranked = sorted(counts, key=lambda i: (-counts[i], i))
    kept = ranked[:K - 2] + [0] if 0 not in ranked[:K - 1] else ranked[:K - 1]
    assert 0 not in ranked[:K - 1]  # the test exercises the EOS rule
    mapping = {t: r for r, t in enumerate(kept)}
    for split, tokens in (("train", train), ("valid", valid)):
        got = np.fromfile(corpus / split / "part-00000.npy", dtype="<u4")
        assert got.tolist() == [mapping.get(t, K - 1) for t in tokens.tolist()]
        manifest = json.loads((corpus / split / "manifest.json").read_text())
        assert manifest["tokenizer"]["vocab_size"] == K and manifest["tokenizer"]["eos_token_id"] == mapping[0]
    vocab = json.loads((corpus / "vocab.json").read_text())
    assert vocab["dolma2_ids"] == kept and vocab["other_id"] == K - 1
    assert vocab["other_share"]["valid"] == sum(t not in mapping for t in valid.tolist()) / len(valid)
    mapped_train = Counter(mapping.get(t, K - 1) for t in train.tolist())
    unigram = -np.mean([math.log((mapped_train[mapping.get(t, K - 1)] + 1) / (len(train) + K)) for t in valid.tolist()])
    assert abs(vocab["unigram_valid_loss"] - unigram) <= 1e-9
    assert f"unigram validation loss {unigram:.4f}" in out


def test_the_engine_trains_and_analyses_the_cut_corpus_and_the_tables_come_from_the_outputs(tmp_path):
    _, _, corpus, _ = cut_corpus(tmp_path)
    study = tmp_path / "study"
    study.mkdir()
    shutil.copytree(corpus, study / "corpus")
    # A sweep on the cut shards (the engine checks every shard's SHA-256 in the manifest the script wrote).
    save_random_olmo3(tiny_olmo3_config(vocab_size=K, num_key_value_heads=2), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", run="study/topologies", train={"max_steps": 4},
                      data={"train": str(corpus / "train"), "valid": str(corpus / "valid")}, eval={"interval": 4})
    del s["debug"]
    config = write_toml(tmp_path / "run.toml", s)
    run_cli("sweep", "--config", config, "--grid", "optim.lr=1e-3,1e-2", "--set", "train.grad_norm_interval=2",
            "--no-plot")
    shutil.copytree(study / "topologies", study / "variants")
    # Analyses of two models on the cut validation shards.
    save_random_variant(tmp_path / "variant", vocab_size=K)
    for name, model in (("base", study / "topologies" / "lr=1e-2"), ("siamese_depth", tmp_path / "variant")):
        run_cli("analyze", model, "--data", corpus / "valid", "--sequences", 2, "--sequence-length", 16, "--out",
                study / f"analysis-{name}", "--no-plot")
    run_script("plot_analysis.py", study / "analysis-base" / "analysis.json",
               study / "analysis-siamese_depth" / "analysis.json", "--labels", "base,siamese_depth",
               "--out", study / "analysis.png")
    # The seeded comparison study.sh runs (here the sweep's two runs on each side, paired by their seed).
    runs = [study / "variants" / name for name in ("lr=1e-3", "lr=1e-2")]
    run_cli("compare", "--a", *runs, "--b", *runs, "--resamples", 200, "--out", study / "seeds", "--no-plot")
    run_script("plot_study.py", study)
    for figure in ("analysis.png", "topologies.png", "variants.png"):
        assert (study / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = run_script("study_table.py", study)
    vocab = json.loads((study / "corpus" / "vocab.json").read_text())
    for run in json.loads((study / "topologies" / "sweep.json").read_text())["runs"]:
        row = (f"| - | {run['settings']['optim.lr']} | {run['final_loss']:.3f} | {run['final_valid_loss']:.3f} | "
               f"{vocab['unigram_valid_loss'] - run['final_valid_loss']:.3f} |")
        assert row in table
    seeds = json.loads((study / "seeds" / "compare.json").read_text())["seeds"]
    assert seeds["paired"] and "Does siamese_depth converge faster here? 2 seeds of base (A)" in table
    last = seeds["loss_at_tokens"][-1]
    assert f"| smoothed training loss | {last['tokens']:.0f} | {last['diff']:+.4f} |" in table
    base = json.loads((study / "analysis-base" / "analysis.json").read_text())
    variant = json.loads((study / "analysis-siamese_depth" / "analysis.json").read_text())
    for layer in range(base["layers"]):
        assert (f"| {layer} | {base['pruning'][layer]['delta']:+.4f} | {variant['pruning'][layer]['delta']:+.4f} |"
                in table)
