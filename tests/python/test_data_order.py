"""train.data_order = "olmo-core" against OLMo-core's own NumpyFSLDataset + NumpyFSLDataLoader (ai2-olmo-core 3.0):
the token ids of the first 50 global batches of a run equal the batches OLMo-core's loader gives for the same files,
seed, sequence length and global batch, over several epochs (each reshuffled with get_rng(seed + epoch) and cut to
whole global batches), across a resume and a change of world size. The engine's batches are seen through
metrics.jsonl's batch_hash (FNV-1a over the global batch's input ids in order, conftest.fnv1a_batch_hash).
"""
import json

import numpy as np
import pytest

from conftest import fnv1a_batch_hash, run_cli, save_random_olmo3, tiny_olmo3_config
from test_distributed import torchrun
from test_train import write_toml

VOCAB, SEQ, GLOBAL_BATCH, STEPS = 96, 16, 4, 50
# Five files of uneven lengths (remainders dropped per file, as NumpyFSLDataset does): 87 instances, so an epoch is
# 21 global batches (84 instances) and 50 steps read three epochs.
FILE_TOKENS = [300, 17 * SEQ + 5, 401, 15 * SEQ, 12 * SEQ + 15]


def write_corpus(directory, seed=0):
    """OLMo-core token files: raw little-endian arrays named .npy, uint8 for a 96-id vocabulary (the smallest dtype
    that holds it, as both OLMo-core's configs and the engine pick it)."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i, n in enumerate(FILE_TOKENS):
        path = directory / f"part-{i:02d}.npy"
        rng.integers(2, VOCAB, n).astype(np.uint8).tofile(path)
        paths.append(path)
    assert sum(n // SEQ for n in FILE_TOKENS) == 87
    return paths


def olmo_core_batches(paths, seed, work_dir, count=STEPS):
    """OLMo-core's loader, as its Trainer drives it: reshuffle(epoch) before each epoch, iterate, reset()."""
    from olmo_core.data import DataCollator, NumpyFSLDataLoader, NumpyFSLDataset

    dataset = NumpyFSLDataset(*paths, sequence_length=SEQ, pad_token_id=1, eos_token_id=0, vocab_size=VOCAB,
                              dtype=np.uint8)
    dataset.prepare()
    loader = NumpyFSLDataLoader(dataset, collator=DataCollator(pad_token_id=1), global_batch_size=GLOBAL_BATCH * SEQ,
                                work_dir=work_dir, seed=seed, shuffle=True, dp_world_size=1, dp_rank=0,
                                fs_local_rank=0)
    batches, epoch = [], 1
    while len(batches) < count:
        loader.reshuffle(epoch=epoch, in_memory=True)
        for batch in loader:
            batches.append(batch["input_ids"].numpy())
            if len(batches) == count:
                break
        loader.reset()
        epoch += 1
    return batches


def sections(tmp_path, run, seed, **train):
    return {
        "model": {"init_from": str(tmp_path / "init")},
        "data": {"train": str(tmp_path / "corpus")},
        "train": {"run_dir": str(tmp_path / run), "sequence_length": SEQ, "micro_batch": 2, "grad_accum": 2,
                  "max_steps": STEPS, "seed": seed, "threads": 1, "data_order": "olmo-core", **train},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "checkpoint": {"interval": 10, "keep_last": 2},
    }


def batch_hashes(run_dir):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["batch_hash"] for m in rows if "batch_hash" in m}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("order")
    paths = write_corpus(tmp / "corpus")
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp / "init")
    return tmp, paths


@pytest.mark.parametrize("seed", [0, 12345])
def test_first_50_batches_are_olmo_core_loaders(corpus, seed):
    tmp, paths = corpus
    expected = [fnv1a_batch_hash(b.tolist()) for b in olmo_core_batches(paths, seed, tmp / f"work{seed}")]
    run_cli("train", "--config", write_toml(tmp / f"straight{seed}.toml", sections(tmp, f"straight{seed}", seed)))
    got = batch_hashes(tmp / f"straight{seed}")
    mismatched = [s for s in range(1, STEPS + 1) if got[s] != expected[s - 1]]
    assert not mismatched, f"steps whose batch is not OLMo-core's: {mismatched}"


def test_order_holds_across_a_resume_on_another_world_size(corpus):
    """20 steps on two data-parallel ranks (micro-batch 2 each), then resumed alone (micro-batch 2 x accumulation 2):
    the same global batches as OLMo-core's loader throughout."""
    tmp, paths = corpus
    expected = [fnv1a_batch_hash(b.tolist()) for b in olmo_core_batches(paths, 3, tmp / "work3")]
    config = write_toml(tmp / "resumed.toml", sections(tmp, "resumed", 3))
    torchrun("train", "--config", config, "--set", "train.grad_accum=1", "--stop-after", "20")
    assert "at step 20" in run_cli("train", "--config", config, "--resume").stderr
    got = batch_hashes(tmp / "resumed")
    assert [got[s] for s in range(1, STEPS + 1)] == expected


def test_the_engine_order_differs_and_mixtures_are_refused(corpus, tmp_path):
    """The default order (train.data_order = "archspace") is the engine's own permutation, not OLMo-core's: the key is
    what makes the two agree. A mixture has no OLMo-core loader order: refused, naming the key."""
    tmp, paths = corpus
    expected = [fnv1a_batch_hash(b.tolist()) for b in olmo_core_batches(paths, 0, tmp / "work-default", count=5)]
    s = sections(tmp, "engine-order", 0, max_steps=5)
    del s["train"]["data_order"]
    run_cli("train", "--config", write_toml(tmp / "engine-order.toml", s))
    got = batch_hashes(tmp / "engine-order")
    assert [got[i] for i in range(1, 6)] != expected
    s = sections(tmp, "mixture", 0)
    del s["data"]
    config = write_toml(tmp_path / "mixture.toml", s)
    config.write_text(config.read_text() + f'[[data.sources]]\nname = "a"\npath = "{tmp / "corpus"}"\nratio = 1.0\n')
    result = run_cli("train", "--config", config, check=False)
    assert result.returncode != 0 and "train.data_order' = \"olmo-core\" applies to token data from data.train" in \
        result.stderr, result.stderr
