"""train.data_order = "megatron" against Megatron-Core's own GPTDataset (megatron-core 0.16.1, as installed): for
datasets written by Megatron's own IndexedDatasetBuilder, the engine's document, sample and shuffle indices
(build/megatron_samples_dump, src/data/megatron_samples.cpp) equal the ones GPTDataset builds, over sequence lengths,
sample counts and seeds that take one epoch, several, and a separate final epoch; and a run reads, step after step and
across a resume on another number of ranks, the first 50 global batches Megatron's samples make (input ids through
metrics.jsonl's batch_hash), with Megatron's labels (the sample's extra token: the first step's loss equals
transformers' on GPTDataset's tokens and labels)."""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

from conftest import REPO, fnv1a_batch_hash, run_cli, save_random_olmo3, tiny_olmo3_config
from test_distributed import torchrun
from test_train import write_toml

DUMP = pathlib.Path(os.environ.get("ARCHSPACE_MEGATRON_SAMPLES_DUMP", REPO / "build" / "megatron_samples_dump"))
VOCAB, EOS = 96, 0


def write_megatron_dataset(prefix, lengths, seed=0):
    """Documents of these lengths (random ids, each ending with EOS as preprocess_data.py --append-eod writes them),
    by Megatron's own builder."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for n in lengths:
        ids = rng.integers(2, VOCAB, int(n))
        ids[-1] = EOS
        builder.add_document(torch.from_numpy(ids.astype(np.int64)), [int(n)])
    builder.finalize(f"{prefix}.idx")
    return prefix


class Tokenizer:
    """What GPTDatasetConfig reads of a tokenizer."""
    eod, pad, vocab_size = EOS, 1, VOCAB
    unique_identifiers = {"class": "Tokenizer"}


def gpt_dataset(prefix, sequence_length, num_samples, seed):
    """GPTDataset over the whole dataset as the training split (--split 100,0,0), built in memory."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    config = GPTDatasetConfig(random_seed=seed, sequence_length=sequence_length, blend=([str(prefix)], None),
                              split="100,0,0", tokenizer=Tokenizer(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    indexed = IndexedDataset(str(prefix))
    return GPTDataset(indexed, str(prefix), np.arange(len(indexed.sequence_lengths), dtype=np.int32), num_samples,
                      Split.train, config)


def engine_indices(requests):
    """The dump tool's answer to each (sequence_length, num_samples, seed, lengths)."""
    assert DUMP.exists(), f"{DUMP} is missing: build the megatron_samples_dump target"
    lines = [" ".join(map(str, [s, n, seed, *lengths])) for s, n, seed, lengths in requests]
    out = subprocess.run([str(DUMP)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.split("\n")
    answers = []
    for i in range(len(requests)):
        head, docs, samples, shuffle = rows[4 * i:4 * i + 4]
        parse = lambda text: np.array(text.split(), dtype=np.int64)  # noqa: E731
        epochs, separate = map(int, head.split())
        answers.append((epochs, bool(separate), parse(docs), parse(samples).reshape(-1, 2), parse(shuffle)))
    return answers


# (name, lengths, sequence length, samples): documents shorter and longer than a sample, one document, length-1
# documents; one epoch, many, and a last epoch that is separate (a few samples of it) or not (most of it).
def cases():
    rng = np.random.default_rng(1)
    mixed = rng.integers(1, 60, 40)
    long = rng.integers(50, 400, 12)
    return [
        ("mixed-one-epoch", mixed, 16, 20),
        ("mixed-separate-final", mixed, 16, int(mixed.sum()) // 16 + 3),
        ("mixed-whole-final", mixed, 16, 2 * (int(mixed.sum()) - 1) // 16),
        ("mixed-many-epochs", mixed, 7, 2000),
        ("long-documents", long, 64, 150),
        ("one-document", np.array([301]), 16, 90),
        ("length-one-documents", np.array([1] * 50 + [17, 3, 1]), 2, 400),
        ("short-sequence", mixed, 2, 500),
    ]


@pytest.mark.parametrize("seed", [0, 1234, 2**32 - 1])
def test_indices_equal_gpt_datasets(tmp_path, seed):
    requests, datasets, names = [], [], []
    for name, lengths, sequence_length, samples in cases():
        prefix = write_megatron_dataset(tmp_path / name, lengths)
        datasets.append(gpt_dataset(prefix, sequence_length, samples, seed))
        requests.append((sequence_length, samples, seed, [int(n) for n in lengths]))
        names.append(name)
    separate_seen = set()
    for name, ds, (epochs, separate, docs, samples, shuffle) in zip(names, datasets, engine_indices(requests)):
        assert np.array_equal(docs, ds.document_index), f"{name}: document index"
        assert np.array_equal(samples, ds.sample_index), f"{name}: sample index"
        assert np.array_equal(shuffle, ds.shuffle_index), f"{name}: shuffle index"
        assert len(ds) == len(shuffle), name
        separate_seen.add((epochs > 1, separate))
    # The cases reach every branch: one epoch, several with a separate final epoch, several without.
    assert separate_seen == {(False, False), (True, True), (True, False)}, separate_seen


SEQ, GLOBAL_BATCH, STEPS = 16, 4, 50


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megatron-order")
    lengths = np.random.default_rng(2).integers(3, 90, 25)  # ~1,160 tokens: 50 steps of 4 x 16 (+1) read three epochs
    write_megatron_dataset(tmp / "data", lengths)
    model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp / "init")

    def sections(run, seed, **train):
        return {
            "model": {"init_from": str(tmp / "init")},
            "data": {"train": str(tmp / "data")},
            "train": {"run_dir": str(tmp / run), "sequence_length": SEQ, "micro_batch": 2, "grad_accum": 2,
                      "max_steps": STEPS, "seed": seed, "threads": 1, "data_order": "megatron", **train},
            "optim": {"lr": 1e-3, "warmup_steps": 2, "z_loss": 0.0},
            "checkpoint": {"interval": 10, "keep_last": 2},
        }
    return tmp, model, sections


def metrics_rows(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def megatron_batches(tmp, seed):
    ds = gpt_dataset(tmp / "data", SEQ, STEPS * GLOBAL_BATCH, seed)
    return ds, [[ds[step * GLOBAL_BATCH + i] for i in range(GLOBAL_BATCH)] for step in range(STEPS)]


@pytest.mark.parametrize("seed", [0, 77])
def test_a_run_reads_gpt_datasets_batches_with_its_labels(megatron_run, seed):
    tmp, model, sections = megatron_run
    run_cli("train", "--config", write_toml(tmp / f"run{seed}.toml", sections(f"run{seed}", seed)))
    rows = metrics_rows(tmp / f"run{seed}")
    got = {m["step"]: m["batch_hash"] for m in rows if "batch_hash" in m}
    _, batches = megatron_batches(tmp, seed)
    expected = [fnv1a_batch_hash([s["tokens"].tolist() for s in batch]) for batch in batches]
    mismatched = [s for s in range(1, STEPS + 1) if got[s] != expected[s - 1]]
    assert not mismatched, f"steps whose batch is not GPTDataset's: {mismatched}"
    # Every position is trained with Megatron's label (the extra token included): the first step's loss, before any
    # update, is transformers' mean cross-entropy over GPTDataset's tokens and labels (fp32 sums of 64 terms: 1e-5).
    first = batches[0]
    with torch.no_grad():
        logits = model(torch.stack([s["tokens"] for s in first])).logits.float()
        labels = torch.stack([s["labels"] for s in first])
        reference = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).item()
    loss = next(m["loss"] for m in rows if m.get("step") == 1 and "loss" in m)
    assert abs(loss - reference) <= 1e-5 * abs(reference), (loss, reference)


def test_the_order_holds_across_a_resume_on_another_world_size(megatron_run):
    """20 steps on two data-parallel ranks (micro-batch 2 each), resumed alone (2 x accumulation 2): GPTDataset's
    global batches throughout (Megatron's sampler splits a global batch over ranks otherwise, the batch is the same)."""
    tmp, _, sections = megatron_run
    config = write_toml(tmp / "resumed.toml", sections("resumed", 5))
    torchrun("train", "--config", config, "--set", "train.grad_accum=1", "--stop-after", "20")
    assert "at step 20" in run_cli("train", "--config", config, "--resume").stderr
    got = {m["step"]: m["batch_hash"] for m in metrics_rows(tmp / "resumed") if "batch_hash" in m}
    _, batches = megatron_batches(tmp, 5)
    assert [got[s] for s in range(1, STEPS + 1)] == [
        fnv1a_batch_hash([s["tokens"].tolist() for s in batch]) for batch in batches]


def test_other_formats_and_unshuffled_data_are_refused(megatron_run, tmp_path):
    tmp, _, sections = megatron_run
    from test_train import synthetic_tokens, write_shards
    write_shards(tmp_path / "shards", synthetic_tokens(2000))
    s = sections("shards", 0)
    s["data"]["train"] = str(tmp_path / "shards")
    r = run_cli("train", "--config", write_toml(tmp_path / "shards.toml", s), check=False)
    assert r.returncode == 1 and "reads a Megatron indexed dataset" in r.stderr and "shards format" in r.stderr, \
        r.stderr
    s = sections("unshuffled", 0)
    s["data"]["shuffle"] = False
    r = run_cli("train", "--config", write_toml(tmp_path / "unshuffled.toml", s), check=False)
    assert r.returncode == 1 and "data.shuffle" in r.stderr and "always shuffles" in r.stderr, r.stderr
