"""bench/bench_decode_steps.cpp times the decode step `archspace generate` takes, for fp32, bf16 and int8 weights
in one process: its greedy tokens must be generate's for each variant (so it times the same computation), and its
ratios must be the per-round tokens/s it reports divided by fp32's."""
import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import BINARY, save_random_olmo3, tiny_olmo3_config
from test_tokenizer import DOLMA2

STEPS = BINARY.parent / "bench_decode_steps"
FLAGS = {"fp32": ["--dtype", "fp32"], "bf16": ["--dtype", "bf16"], "int8": ["--quantization", "int8"]}


def test_steps_are_generate_steps_and_ratios_are_its_rates(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    prompt = np.random.default_rng(5).integers(0, 100000, 9).tolist()
    new, rounds = 7, 3
    out = tmp_path / "steps.json"
    subprocess.run([str(STEPS), "--model", str(tmp_path / "m"), "--prompt-tokens", " ".join(map(str, prompt)),
                    "--new", str(new), "--rounds", str(rounds), "--threads", "1", "--out", str(out)],
                   check=True, capture_output=True)
    r = json.loads(out.read_text())
    assert r["new_tokens"] == new and r["rounds"] == rounds and r["prompt_tokens"] == len(prompt)
    # Twice: a batch prints each row's ids (one prompt prints text); rows are batch invariant (test_generate).
    (tmp_path / "p.jsonl").write_text(2 * (json.dumps({"tokens": prompt}) + "\n"))
    for variant, flags in FLAGS.items():
        # new decode steps pick new + 1 tokens (the first from the prefill's logits).
        tokens = r[f"{variant}_tokens"]
        assert len(tokens) == new + 1
        g = subprocess.run([str(BINARY), "--threads", "1", "generate", "--model", str(tmp_path / "m"),
                            "--prompts-file", str(tmp_path / "p.jsonl"), "--max-new-tokens", str(new + 1), *flags],
                           capture_output=True, text=True, check=True)
        rows = [json.loads(line)["tokens"] for line in g.stdout.splitlines()]
        assert len(rows) == 2 and rows[0] == rows[1] and rows[0], variant
        expected = rows[0]
        assert tokens[: len(expected)] == expected, variant  # generate stops at EOS; the bench does not
        rates = r[f"{variant}_decode_tok_s"]
        assert len(rates) == rounds and all(x > 0 for x in rates)
        if variant != "fp32":
            ratios = [x / f for x, f in zip(rates, r["fp32_decode_tok_s"])]
            assert r[f"{variant}_over_fp32"] == pytest.approx(ratios, rel=1e-12)
            assert r[f"{variant}_over_fp32_median"] == pytest.approx(float(np.median(ratios)), rel=1e-12)


def test_bad_arguments_are_refused(tmp_path):
    for args in ([], ["--model", str(tmp_path)], ["--model", str(tmp_path), "--prompt-tokens", "1", "--new", "0"],
                 ["--bogus", "1"], ["--model", str(tmp_path), "--prompt-tokens", "1", "--variants", "fp16"]):
        p = subprocess.run([str(STEPS), *args], capture_output=True, text=True)
        assert p.returncode == 2, args
        assert "usage" in p.stderr or "unknown option" in p.stderr or "--variants" in p.stderr, (args, p.stderr)
