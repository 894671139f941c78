"""archspace generate: greedy decoding with the KV cache gives the tokens of a plain greedy loop over full
forwards in transformers (both variants, past the sliding window, YaRN on full layers), and bad input."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from conftest import BINARY, run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from test_tokenizer import DOLMA2

PROMPT = "The quick brown fox jumps over the lazy dog near the river bank"


def greedy_reference(model, ids, n):
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_greedy_generation_equals_full_forward_loop(variant, tmp_path):
    from tokenizers import Tokenizer

    vocab = 100278
    if variant == "base":
        model = save_random_olmo3(tiny_olmo3_config(vocab_size=vocab, num_key_value_heads=2,
                                                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                                                     "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                                                                        "original_max_position_embeddings": 16}}),
                                  tmp_path / "m")
    else:
        model = save_random_variant(tmp_path / "m", vocab_size=vocab, depth_attention_recent_window=1)
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    tok = Tokenizer.from_file(str(DOLMA2))
    prompt_ids = tok.encode(PROMPT).ids
    expected = greedy_reference(model, prompt_ids, 16)[len(prompt_ids):]  # 13 + 16 tokens: past the window of 6
    out = subprocess.run([str(BINARY), "generate", "--model", str(tmp_path / "m"), "--prompt", PROMPT, "--max-new-tokens", "16"],
                         capture_output=True, check=True).stdout
    eos = [i for i, t in enumerate(expected) if t == 100257]
    expected = expected[: eos[0]] if eos else expected
    assert len(expected) >= 8  # enough decoded tokens for the comparison to mean something
    assert out.decode("utf-8").rstrip("\n") == tok.decode(expected)


def test_sampling_is_seeded(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    args = ["generate", "--model", tmp_path / "m", "--prompt", "Hello", "--temperature", "1.0", "--top-k", "50",
            "--top-p", "0.9", "--max-new-tokens", "12"]
    a = run_cli(*args, "--seed", "1").stdout
    assert a == run_cli(*args, "--seed", "1").stdout
    assert a != run_cli(*args, "--seed", "2").stdout


def expect_error(args, *fragments):
    result = subprocess.run([str(BINARY), *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    for f in fragments:
        assert str(f) in result.stderr, f"'{f}' not in:\n{result.stderr}"


def test_bad_input(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, max_position_embeddings=16), tmp_path / "m")
    expect_error(["generate", "--model", tmp_path / "m", "--prompt", "hi"], "no tokenizer.json")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    expect_error(["generate", "--model", tmp_path / "m", "--prompt", ""], "empty prompt")
    expect_error(["generate", "--model", tmp_path / "m", "--prompt", "word " * 40], "the model's maximum is 16 positions")
    expect_error(["generate", "--model", tmp_path / "m", "--prompt-tokens", "5 100278"], "token id 100278 is out of range")


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_batch_of_different_lengths_equals_each_prompt_alone(variant, tmp_path):
    """Four prompts of 3 to 19 tokens (window 6) decode as one left-padded batch; each row's greedy tokens
    equal transformers' greedy loop over that prompt alone, and the engine run with that prompt alone."""
    vocab = 100278
    if variant == "base":
        model = save_random_olmo3(tiny_olmo3_config(vocab_size=vocab, num_key_value_heads=2), tmp_path / "m")
    else:
        model = save_random_variant(tmp_path / "m", vocab_size=vocab, depth_attention_recent_window=1)
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 100000, n).tolist() for n in (7, 3, 19, 11)]
    lines = [json.dumps({"tokens": p}) for p in prompts]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    new = 12
    out = subprocess.run([str(BINARY), "generate", "--model", str(tmp_path / "m"), "--prompts-file", str(tmp_path / "prompts.jsonl"),
                          "--max-new-tokens", str(new)], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert "batch 4" in out.stderr
    for prompt, row in zip(prompts, rows):
        expected = greedy_reference(model, prompt, new)[len(prompt):]
        eos = [i for i, t in enumerate(expected) if t == 100257]
        expected = expected[: eos[0]] if eos else expected
        assert row["prompt_tokens"] == len(prompt)
        assert row["tokens"] == expected
        alone = subprocess.run([str(BINARY), "generate", "--model", str(tmp_path / "m"), "--prompt-tokens", " ".join(map(str, prompt)),
                                "--max-new-tokens", str(new)], capture_output=True, check=True).stdout
        assert alone.decode("utf-8").rstrip("\n") == row["text"]


def test_prompts_file_bad_input(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    f = tmp_path / "p.jsonl"
    f.write_text('"fine"\n{"prompt": "also fine"\n')
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", f], f"{f}:2", "malformed JSON")
    f.write_text('"fine"\n{"tokens": [1, 100278]}\n')
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", f], f"{f}:2", "token id 100278 is out of range")
    f.write_text('{"prompt": ""}\n')
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", f], f"{f}:1", "empty prompt")
    f.write_text('[1, 2]\n')
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", f], f"{f}:1", "expected a string or an object")
    f.write_text("\n\n")
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", f], "no prompts")
    expect_error(["generate", "--model", tmp_path / "m", "--prompts-file", tmp_path / "missing.jsonl"], "missing.jsonl: cannot open")
