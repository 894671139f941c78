"""bench/bench_decode_steps.cpp times the decode step `archspace generate` takes, for fp32, bf16 and int8 weights
in one process, at batch 1 or a batch of rotated prompts: its greedy tokens must be generate's for each variant and
row (so it times the same computation), and its ratios must be the per-round tokens/s it reports divided by
fp32's."""
import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import BINARY, save_random_olmo3, tiny_olmo3_config
from test_tokenizer import DOLMA2

STEPS = BINARY.parent / "bench_decode_steps"
FLAGS = {"fp32": ["--dtype", "fp32"], "bf16": ["--dtype", "bf16"], "int8": ["--quantization", "int8"]}


@pytest.mark.parametrize("batch", [1, 3])
def test_steps_are_generate_steps_and_ratios_are_its_rates(tmp_path, batch):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    prompt = np.random.default_rng(5).integers(0, 100000, 9).tolist()
    new, rounds = 7, 3
    out = tmp_path / "steps.json"
    subprocess.run([str(STEPS), "--model", str(tmp_path / "m"), "--prompt-tokens", " ".join(map(str, prompt)),
                    "--new", str(new), "--rounds", str(rounds), "--threads", "1", "--batch", str(batch),
                    "--out", str(out)],
                   check=True, capture_output=True)
    r = json.loads(out.read_text())
    assert r["new_tokens"] == new and r["rounds"] == rounds and r["prompt_tokens"] == len(prompt)
    assert r["batch"] == batch
    # The bench's row b is the prompt rotated left by b. At least two rows: a batch prints each row's ids (one
    # prompt prints text); rows are batch invariant (test_generate), so row 0 alone is checked at batch 1 too.
    rows_in = [prompt[b:] + prompt[:b] for b in range(max(batch, 2))]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"tokens": p}) + "\n" for p in rows_in))
    for variant, flags in FLAGS.items():
        # new decode steps pick new + 1 tokens (the first from the prefill's logits).
        by_row = r[f"{variant}_tokens_by_row"]
        assert len(by_row) == batch and r[f"{variant}_tokens"] == by_row[0]
        g = subprocess.run([str(BINARY), "--threads", "1", "generate", "--model", str(tmp_path / "m"),
                            "--prompts-file", str(tmp_path / "p.jsonl"), "--max-new-tokens", str(new + 1), *flags],
                           capture_output=True, text=True, check=True)
        rows = [json.loads(line)["tokens"] for line in g.stdout.splitlines()]
        assert len(rows) == len(rows_in), variant
        for b, tokens in enumerate(by_row):
            assert len(tokens) == new + 1
            assert rows[b] and tokens[: len(rows[b])] == rows[b], (variant, b)  # generate stops at EOS, the bench not
        rates = r[f"{variant}_decode_tok_s"]
        assert len(rates) == rounds and all(x > 0 for x in rates)
        if variant != "fp32":
            ratios = [x / f for x, f in zip(rates, r["fp32_decode_tok_s"])]
            assert r[f"{variant}_over_fp32"] == pytest.approx(ratios, rel=1e-12)
            assert r[f"{variant}_over_fp32_median"] == pytest.approx(float(np.median(ratios)), rel=1e-12)


def test_bad_arguments_are_refused(tmp_path):
    for args in ([], ["--model", str(tmp_path)], ["--model", str(tmp_path), "--prompt-tokens", "1", "--new", "0"],
                 ["--bogus", "1"], ["--model", str(tmp_path), "--prompt-tokens", "1", "--variants", "fp16"],
                 ["--model", str(tmp_path), "--prompt-tokens", "1", "--batch", "0"]):
        p = subprocess.run([str(STEPS), *args], capture_output=True, text=True)
        assert p.returncode == 2, args
        assert "usage" in p.stderr or "unknown option" in p.stderr or "--variants" in p.stderr, (args, p.stderr)
