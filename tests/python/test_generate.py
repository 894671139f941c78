"""archspace generate: greedy decoding with the KV cache gives the tokens of a plain greedy loop over full
forwards in transformers (both variants, past the sliding window, YaRN on full layers); sampling keeps to
the set of transformers' temperature/top-k/top-p warpers, --top-k 1 is greedy, and one step's draws follow
the warpers' distribution (chi-square); and bad input."""
import json
import pathlib
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


@pytest.mark.parametrize("decode_steps", ["eager", "fixed-shapes"])
@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_greedy_generation_equals_full_forward_loop(variant, decode_steps, tmp_path):
    """Also with --decode-steps fixed-shapes: the KV cache reserved once and each step reading its slot from a
    tensor (what a CUDA graph replays), run eagerly here."""
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
    out = subprocess.run([str(BINARY), "generate", "--model", str(tmp_path / "m"), "--prompt", PROMPT, "--max-new-tokens", "16",
                          "--decode-steps", decode_steps], capture_output=True, check=True).stdout
    eos = [i for i, t in enumerate(expected) if t == 100257]
    expected = expected[: eos[0]] if eos else expected
    assert len(expected) >= 8  # enough decoded tokens for the comparison to mean something
    assert out.decode("utf-8").rstrip("\n") == tok.decode(expected)


def test_sampling_is_seeded(sampler, tmp_path):
    """The same seed gives the same sampled tokens; another seed other ones (a flat-enough distribution: 3
    rows x 12 tokens at temperature 1.5 with top-k 50, top-p 0.95)."""
    _, model_dir = sampler
    prompts = [[72, 105], [87, 104, 97, 116], [84]]
    args = ["--max-new-tokens", 12, "--temperature", 1.5, "--top-k", 50, "--top-p", 0.95]
    a = [r["tokens"] for r in generate_batch(model_dir, prompts, tmp_path, *args, "--seed", 1)]
    assert sum(map(len, a)) >= 24
    assert a == [r["tokens"] for r in generate_batch(model_dir, prompts, tmp_path, *args, "--seed", 1)]
    assert a != [r["tokens"] for r in generate_batch(model_dir, prompts, tmp_path, *args, "--seed", 2)]


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


@pytest.mark.parametrize("flags,fragment", [
    (["--max-new-tokens", "-1"], "--max-new-tokens must be at least 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "nan"], "--top-p must be in (0, 1]"),
    (["--top-k", "-5"], "--top-k must be >= 0"),
    (["--stop", ""], "--stop: an empty string"),
    (["--prompt-tokens", "5 6"], "--prompt-tokens: give the prompt as ids only"),
    (["--decode-steps", "graph"], "--decode-steps: \"graph\" is not one of eager, fixed-shapes, cuda-graph"),
    (["--decode-steps", "cuda-graph"], "--decode-steps cuda-graph: CUDA graphs need --device cuda"),
])
def test_bad_sampling_flags_are_refused(flags, fragment, tmp_path):
    """Each out-of-range flag is an error naming it and its range (they used to act as 'off' or as greedy,
    or end in a LibTorch error)."""
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    expect_error(["generate", "--model", tmp_path / "m", "--prompt", "hi", *flags], fragment)


@pytest.mark.parametrize("decode_steps", ["eager", "fixed-shapes"])
@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_batch_of_different_lengths_equals_each_prompt_alone(variant, decode_steps, tmp_path):
    """Four prompts of 3 to 19 tokens (window 6) decode as one left-padded batch; each row's greedy tokens
    equal transformers' greedy loop over that prompt alone, and the engine run with that prompt alone (eagerly).
    With fixed shapes the batch's steps read the padding from the cache's device mask."""
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
                          "--max-new-tokens", str(new), "--decode-steps", decode_steps], capture_output=True, text=True, check=True)
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


# ---- sampling: top-k / top-p against transformers' logits warpers ----------------------------------
#
# These use a small byte-level tokenizer (the dolma2 pre-tokenizer and decoder, the 256 byte tokens and four
# special tokens, no merges) so that the model's vocabulary is 260 and one sampling step costs little: the
# distribution test draws thousands of samples. The engine's rows of a batch share one random stream (one
# generator, rows drawn in turn: src/infer/generator.cpp), so N copies of one prompt decoded for one step are
# N independent draws from the filtered distribution of that prompt.

SMALL_VOCAB = 260  # = the tokenizer's size
SMALL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]  # ids 256..259


def write_small_tokenizer(path):
    from tokenizers import pre_tokenizers

    spec = json.loads(DOLMA2.read_text())
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    assert len(alphabet) == 256
    spec["model"]["vocab"] = {ch: i for i, ch in enumerate(alphabet)}
    spec["model"]["merges"] = []
    template = next(t for t in spec["added_tokens"] if t["content"] == "<|endoftext|>")
    spec["added_tokens"] = [dict(template, id=256 + i, content=s) for i, s in enumerate(SMALL_SPECIALS)]
    pathlib.Path(path).write_text(json.dumps(spec))


def sampling_model(directory, seed=0, sharpen=3.0):
    """A random base model of vocabulary 260 whose lm_head is scaled by `sharpen`, so that a few tokens hold
    most of the mass (top-k and top-p then cut inside the mass, not in a flat tail). EOS = <|endoftext|>."""
    model = save_random_olmo3(tiny_olmo3_config(vocab_size=SMALL_VOCAB, num_key_value_heads=2, pad_token_id=259,
                                                eos_token_id=256), directory, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(directory, safe_serialization=True)
    write_small_tokenizer(pathlib.Path(directory) / "tokenizer.json")
    return model


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sampling") / "m"
    return sampling_model(directory), directory


def reference_filtered_probs(logits, temperature, top_k, top_p):
    """transformers' sampling distribution: its temperature, top-k and top-p warpers in generate()'s order."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    scores = logits.double().unsqueeze(0)
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, -1)[0]


def set_is_ambiguous(logits, temperature, top_k, top_p, tol=1e-4):
    """Whether moving any logit by `tol` (the engine/transformers fp32 logit tolerance) could change the kept
    set: then a membership check at that step would test rounding, not the filter."""
    scaled = logits.double() / temperature
    values, _ = scaled.sort(descending=True)
    if 0 < top_k < len(values) and values[top_k - 1] - values[top_k] <= 2 * tol / temperature:
        return True
    if top_p < 1.0:
        kept = values[:top_k] if top_k > 0 else values
        probs = torch.softmax(kept, -1)
        before = probs.cumsum(-1) - probs
        # when every logit moves by at most tol, each probability moves by a factor within exp(+-2 tol / T), so
        # a mass `before` (<= 1) moves by at most about 2 tol / T
        if ((before - top_p).abs() <= 2 * tol / temperature).any():
            return True
    return False


def generate_batch(model_dir, prompts, tmp_path, *args):
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"tokens": p}) + "\n" for p in prompts))
    out = run_cli("generate", "--model", model_dir, "--prompts-file", f, *args).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in rows] == list(range(len(prompts)))
    return rows


SAMPLING_SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 5, 1.0),    # top-k only
    (0.7, 0, 0.8),    # top-p only, temperature below 1
    (1.4, 12, 0.75),  # both: top-p cuts inside the top-k set (renormalised after top-k), temperature above 1
]


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING_SETTINGS)
def test_sampled_tokens_lie_in_the_reference_top_k_top_p_set(temperature, top_k, top_p, sampler, tmp_path):
    """Every token sampled (five prompts of different lengths, left-padded, 14 steps, two seeds) lies in the set
    that transformers' warpers keep for the logits of that row's prefix (a full forward in transformers), and
    a row that stopped early stopped on a token of that set (<|endoftext|>). Steps where a 1e-4 logit change
    (the engine/transformers logit tolerance; in practice they differ by ~1e-6) could change the set are left
    out, and counted: at most 10% of the steps (about 3% expected for the top-p settings)."""
    model, model_dir = sampler
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, n).tolist() for n in (4, 9, 2, 13, 7)]
    new = 14
    checked, skipped, filtered_out = 0, 0, 0
    for seed in (1, 2):
        rows = generate_batch(model_dir, prompts, tmp_path, "--max-new-tokens", new, "--temperature", temperature,
                              "--top-k", top_k, "--top-p", top_p, "--seed", seed)
        for prompt, row in zip(prompts, rows):
            sampled = row["tokens"] + ([256] if len(row["tokens"]) < new else [])  # a stop: <|endoftext|> was drawn
            with torch.no_grad():
                logits = model(torch.tensor([prompt + sampled])).logits[0]
            for step, token in enumerate(sampled):
                at = logits[len(prompt) - 1 + step]
                if set_is_ambiguous(at, temperature, top_k, top_p):
                    skipped += 1
                    continue
                probs = reference_filtered_probs(at, temperature, top_k, top_p)
                kept = int((probs > 0).sum())
                assert probs[token] > 0, (seed, prompt, step, token, kept)
                checked += 1
                filtered_out += SMALL_VOCAB - kept
    assert skipped <= 0.1 * (checked + skipped) and checked >= 100
    assert filtered_out > 0.9 * checked * SMALL_VOCAB  # the filter removed most of the vocabulary at each step


def test_top_k_1_is_greedy(sampler, tmp_path):
    """--top-k 1 at any temperature (0.5, 1, 3: at 3 the distribution is nearly flat, so sampling would show)
    gives transformers' greedy tokens (a full-forward greedy loop), as does --temperature 0, for a batch of
    prompts of different lengths."""
    model, model_dir = sampler
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 256, n).tolist() for n in (5, 11, 3)]
    new = 10
    expected = []
    for prompt in prompts:
        e = greedy_reference(model, prompt, new)[len(prompt):]
        expected.append(e[: e.index(256)] if 256 in e else e)
    assert all(len(e) >= 5 for e in expected)
    greedy = generate_batch(model_dir, prompts, tmp_path, "--max-new-tokens", new, "--temperature", 0)
    assert [r["tokens"] for r in greedy] == expected
    for temperature in (0.5, 1.0, 3.0):
        rows = generate_batch(model_dir, prompts, tmp_path, "--max-new-tokens", new, "--temperature", temperature,
                              "--top-k", 1, "--seed", 7)
        assert [r["tokens"] for r in rows] == expected, temperature


def chi_square_p_value(counts, expected):
    """Pearson's chi-square test of counts against expected counts: the bins with expected >= 5, the rest pooled
    into one bin; returns (statistic, degrees of freedom, p-value from the chi-square survival function)."""
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # a pooled bin too small for the approximation: fold it into the smallest big bin
        i = int(np.argmin(exp[:-1]))
        obs[i] += obs[-1]
        exp[i] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING_SETTINGS)
def test_one_step_distribution_equals_the_reference(temperature, top_k, top_p, sampler, tmp_path):
    """N = 6000 draws of the first token (6000 copies of one prompt in one batch, one random stream) follow
    transformers' filtered softmax of that prompt: no draw outside the kept set, and Pearson's chi-square test
    over the kept tokens has p-value > 1e-6 (bins with expected count >= 5, the rest pooled). If the engine
    sampled exactly the reference distribution, this fails with probability 1e-6 per setting (3e-6 for the
    three); a filter or temperature applied wrongly moves probability by several percent of a bin, which at
    N = 6000 gives p-values far below 1e-6 (checked by the test itself: the unfiltered softmax is rejected)."""
    model, model_dir = sampler
    prompt = [72, 101, 108, 108, 111, 44, 32]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    assert not set_is_ambiguous(logits, temperature, top_k, top_p)
    probs = reference_filtered_probs(logits, temperature, top_k, top_p).numpy()
    kept = probs > 0
    assert 3 <= kept.sum() <= 12 and probs.max() < 0.8  # a real choice among several tokens
    n = 6000
    rows = generate_batch(model_dir, [prompt] * n, tmp_path, "--max-new-tokens", 1, "--temperature", temperature,
                          "--top-k", top_k, "--top-p", top_p, "--seed", 11)
    drawn = np.array([r["tokens"][0] if r["tokens"] else 256 for r in rows])  # no token: <|endoftext|> (a stop) drawn
    counts = np.bincount(drawn, minlength=SMALL_VOCAB).astype(np.float64)
    assert counts[~kept].sum() == 0, np.nonzero(counts * ~kept)
    stat, df, p = chi_square_p_value(counts[kept], n * probs[kept])
    assert p > 1e-6, (stat, df, p)
    # The test has power: the same counts against the distribution without the filters are rejected.
    unfiltered = torch.softmax(logits.double() / temperature, -1).numpy()
    assert chi_square_p_value(counts, n * unfiltered)[2] < 1e-6


def test_a_vocabulary_padded_beyond_the_tokenizer_never_samples_padding(tmp_path):
    """A model whose vocabulary is larger than its tokenizer (trained vocabularies are padded, 100278 ->
    100352) samples only ids the tokenizer has: padded rows are made the most likely here, and greedy and
    sampled completions must still be tokenizer ids (and greedy = transformers' argmax over those ids)."""
    padded = SMALL_VOCAB + 40
    model = save_random_olmo3(tiny_olmo3_config(vocab_size=padded, num_key_value_heads=2, pad_token_id=259, eos_token_id=256),
                              tmp_path / "m")
    with torch.no_grad():
        model.lm_head.weight[SMALL_VOCAB:] = 10.0 * model.lm_head.weight[:40]  # padding rows dominate (10x the best of 40 rows)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    write_small_tokenizer(tmp_path / "m" / "tokenizer.json")
    prompt = [10, 20, 30, 40]
    rows = generate_batch(tmp_path / "m", [prompt] * 8, tmp_path, "--temperature", "1.0", "--seed", "3", "--max-new-tokens", "6")
    assert all(0 <= t < SMALL_VOCAB for r in rows for t in r["tokens"])
    greedy = generate_batch(tmp_path / "m", [prompt, prompt], tmp_path, "--max-new-tokens", "4")[0]["tokens"]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(4):
            logits = model(torch.tensor([ids])).logits[0, -1, :SMALL_VOCAB]
            assert model(torch.tensor([ids])).logits[0, -1].argmax() >= SMALL_VOCAB  # padding really would win
            ids.append(int(logits.argmax()))
    expected = ids[len(prompt):]
    assert greedy == expected[:len(greedy)] and (len(greedy) == 4 or expected[len(greedy)] == 256)  # 256: EOS


def test_bf16_greedy_tokens_are_fp32_best_within_bf16_error(tmp_path):
    """--dtype bf16 decodes with the cache in bf16. Each greedy token it picks must be, by transformers'
    fp32 logits of the same sequence, within twice the bf16 logit error of the best token: transformers' own
    error on that sequence (the model cast to bf16, max over positions and vocabulary) bounds how far bf16
    rounding moves any logit, so a token further behind could only come from a wrong cache or position.
    (Exact equality with fp32 greedy is not a fair demand: near-ties flip under any rounding.)"""
    vocab = 100278
    model = save_random_olmo3(tiny_olmo3_config(vocab_size=vocab, num_key_value_heads=2), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    prompts = [list(range(300, 311)), list(range(500, 513))]
    rows = generate_batch(tmp_path / "m", prompts, tmp_path, "--max-new-tokens", 12, "--dtype", "bf16")
    import copy

    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    for prompt, row in zip(prompts, rows):
        seq = prompt + row["tokens"]
        assert len(row["tokens"]) >= 8
        with torch.no_grad():
            fp32 = model(torch.tensor([seq])).logits[0, len(prompt) - 1:-1].float()
            err = (model_bf16(torch.tensor([seq])).logits[0, len(prompt) - 1:-1].float() - fp32).abs().max()
        chosen = fp32.gather(1, torch.tensor(row["tokens"]).unsqueeze(1)).squeeze(1)
        behind = (fp32.max(1).values - chosen).max()
        print(f"bf16 logit error {float(err):.3g}; chosen tokens at most {float(behind):.3g} behind the fp32 best")
        assert 0 < err and behind <= 2 * err, (float(behind), float(err))
