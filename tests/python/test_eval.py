"""archspace eval ppl: the perplexity of an exported model equals transformers' on the same tokens and
the same strided windows (fp32 log-softmax on both sides, the same windows, summation orders differing
inside the kernels: each token's NLL within tolerances.logprob_bound, so the perplexity within its exp), and
bad input."""
import json
import math
import shutil

import numpy as np
import pytest
import torch

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_tokenizer import DOLMA2
from tolerances import forward_bound, logprob_bound

TEXT = ("Perplexity measures how well a probability model predicts a sample. " * 3 +
        "Numbers 12345 and symbols {x: [1, 2]} and naïve café text. ") * 6


def reference_ppl(model, ids, context, stride):
    """(perplexity, scored tokens, the relative bound on another fp32 computation of that perplexity)."""
    nll, count, prev_end, largest = 0.0, 0, 0, 0.0
    with torch.no_grad():
        for begin in range(0, len(ids), stride):
            end = min(begin + context, len(ids))
            window = torch.tensor([ids[begin:end]])
            new = end - prev_end
            logp = torch.log_softmax(model(window).logits[0].float(), -1)
            first = max(1, window.shape[1] - new)
            for t in range(first, window.shape[1]):
                nll -= logp[t - 1, window[0, t]].item()
                largest = max(largest, -logp[t - 1, window[0, t]].item())
                count += 1
            prev_end = end
            if end == len(ids):
                break
    # Each NLL term within logprob_bound, so their mean too, and exp(mean) within expm1 of that, relative.
    bound = math.expm1(logprob_bound(forward_bound(model, context), model.config.vocab_size, largest))
    return math.exp(nll / count), count, bound


@pytest.mark.parametrize("context,stride", [(32, 32), (32, 8), (64, 20)])
def test_perplexity_equals_transformers(context, stride, tmp_path):
    from tokenizers import Tokenizer
    from transformers import Olmo3ForCausalLM

    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), tmp_path / "m")
    run_cli("export-hf", tmp_path / "m", tmp_path / "hf")
    (tmp_path / "text.txt").write_text(TEXT)
    out = json.loads(run_cli("eval", "ppl", "--model", tmp_path / "hf", "--data", tmp_path / "text.txt",
                             "--context", context, "--stride", stride, "--out", tmp_path / "ppl.json").stdout)
    assert json.loads((tmp_path / "ppl.json").read_text())["perplexity"] == out["perplexity"]
    ids = Tokenizer.from_file(str(DOLMA2)).encode(TEXT).ids
    model = Olmo3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    expected, count, bound = reference_ppl(model, ids, context, stride)
    assert out["scored_tokens"] == count
    # Overlapping windows score every token but the first; disjoint ones lose each window's first token.
    assert count == (len(ids) - 1 if stride < context else len(ids) - out["windows"])
    assert abs(out["perplexity"] - expected) / expected <= bound, (out["perplexity"], expected, bound)


def test_perplexity_on_shards(tmp_path):
    """On token shards (the text's ids followed by <|endoftext|>), with the default window (stride = context)
    and with --max-tokens and a stride, the perplexity equals the reference over the same ids (the same
    bound as above)."""
    from tokenizers import Tokenizer

    model = save_random_olmo3(tiny_olmo3_config(vocab_size=100278), tmp_path / "m")
    (tmp_path / "a.txt").write_text(TEXT)
    run_cli("tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "shards", tmp_path / "a.txt")
    ids = Tokenizer.from_file(str(DOLMA2)).encode(TEXT).ids + [100257]
    for extra, n, stride in (([], len(ids), 64), (["--max-tokens", 150, "--stride", 24], 150, 24)):
        out = json.loads(run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "shards", "--context", 64, *extra).stdout)
        assert out["tokenizer"] == "allenai/dolma2"
        expected, count, bound = reference_ppl(model, ids[:n], 64, stride)
        assert out["scored_tokens"] == count
        assert abs(out["perplexity"] - expected) / expected <= bound, (extra, out["perplexity"], expected)


def test_bad_input(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, max_position_embeddings=64), tmp_path / "m")
    (tmp_path / "a.txt").write_text(TEXT)
    r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", check=False)
    assert r.returncode == 1 and "no tokenizer.json" in r.stderr
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", "--context", 128, check=False)
    assert r.returncode == 1 and "exceeds the model's max_position_embeddings 64" in r.stderr
    r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "nope.txt", check=False)
    assert r.returncode == 1 and "nope.txt" in r.stderr
    for context in (1, -3):
        r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", "--context", context, check=False)
        assert r.returncode == 1 and "--context must be at least 2" in r.stderr, r.stderr
    r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", "--out", tmp_path / "no" / "x.json", check=False)
    assert r.returncode == 1 and "--out" in r.stderr and "not a writable directory" in r.stderr, r.stderr


def test_a_failed_evaluation_keeps_an_earlier_result(tmp_path):
    """--out is replaced only by a complete result: a run that fails leaves the previous file as it was."""
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, max_position_embeddings=64), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    (tmp_path / "a.txt").write_text(TEXT)
    run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", "--context", 32, "--out", tmp_path / "r.json")
    before = (tmp_path / "r.json").read_text()
    assert json.loads(before)["context"] == 32
    r = run_cli("eval", "ppl", "--model", tmp_path / "m", "--data", tmp_path / "a.txt", "--context", 128,
                "--out", tmp_path / "r.json", check=False)
    assert r.returncode == 1 and (tmp_path / "r.json").read_text() == before
    assert not (tmp_path / "r.json.tmp").exists()


def test_context_defaults_to_the_training_length_and_is_printed(tmp_path):
    """A run trained at sequence length 16 on a model with 65536 positions: eval ppl on the run (positionally) uses
    16-token windows, says so on stderr and in the JSON, and equals --context 16; a plain model directory (no
    training record) keeps min(max_position_embeddings, 4096). The JSON on stdout ends with a newline."""
    from test_train import base_sections, synthetic_tokens, write_shards, write_toml

    write_shards(tmp_path / "shards", synthetic_tokens(3000))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", train={"max_steps": 2})
    del s["debug"]
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", s))
    args = ["--data", tmp_path / "shards", "--max-tokens", 400]
    r = run_cli("eval", "ppl", tmp_path / "run", *args)
    assert r.stdout.endswith("}\n"), repr(r.stdout[-5:])
    out = json.loads(r.stdout)
    assert out["context"] == 16 and "training length" in out["context_from"], out
    assert "eval ppl: context 16 tokens, from the training length" in r.stderr, r.stderr
    explicit = json.loads(run_cli("eval", "ppl", "--model", tmp_path / "run", *args, "--context", 16).stdout)
    assert explicit["perplexity"] == out["perplexity"] and explicit["context_from"] == "--context"
    plain = json.loads(run_cli("eval", "ppl", tmp_path / "init", *args).stdout)
    assert plain["context"] == 4096 and "no training length recorded" in plain["context_from"]
