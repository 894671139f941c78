"""archspace's copies of numpy's generators (src/data/numpy_random.cpp) against numpy itself, draw for draw:
default_rng(seed) (SeedSequence, PCG64, Generator.shuffle/permutation: OLMo-core's instance order) and the legacy
RandomState(seed) (MT19937, RandomState.shuffle/permutation: Megatron-Core's). The C++ side is
build/numpy_random_dump (tests/tools/numpy_random_dump.cpp), or the binary ARCHSPACE_NUMPY_RANDOM_DUMP names."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import REPO

DUMP = pathlib.Path(os.environ.get("ARCHSPACE_NUMPY_RANDOM_DUMP", REPO / "build" / "numpy_random_dump"))

SEEDS = list(range(41)) + [2**31 - 1, 2**32 - 1]
# SeedSequence takes any integer >= 0: one above 2**32 makes two entropy words, 2**64 - 1 the largest we pass.
GENERATOR_SEEDS = SEEDS + [2**32, 12345678901, 2**63 + 5, 2**64 - 1]
SIZES = [0, 1, 2, 3, 7, 100, 1000, 65537, 300000]


def dump(requests):
    """One run of the dump tool over `requests` (lines); its answers as uint64 arrays, in order."""
    assert DUMP.exists(), f"{DUMP} is missing: build the numpy_random_dump target (or set ARCHSPACE_NUMPY_RANDOM_DUMP)"
    result = subprocess.run([str(DUMP)], input="\n".join(requests) + "\n", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == len(requests), (len(lines), len(requests))
    # fromstring's text mode parses the full uint64 range; an empty line is an empty answer.
    return [np.fromstring(line, dtype=np.uint64, sep=" ") if line else np.zeros(0, np.uint64) for line in lines]


def assert_same(ours, numpy_values, what):
    numpy_values = np.asarray(numpy_values).astype(np.uint64)
    assert ours.shape == numpy_values.shape, f"{what}: {ours.shape} values, numpy {numpy_values.shape}"
    if not np.array_equal(ours, numpy_values):
        k = int(np.flatnonzero(ours != numpy_values)[0])
        raise AssertionError(f"{what}: first difference at {k}: {ours[k]} here, numpy {numpy_values[k]}")


@pytest.mark.parametrize("n", SIZES)
def test_generator_permutation(n):
    ours = dump([f"generator {seed} {n}" for seed in GENERATOR_SEEDS])
    for seed, got in zip(GENERATOR_SEEDS, ours):
        assert_same(got, np.random.default_rng(seed).permutation(n), f"default_rng({seed}).permutation({n})")
        # OLMo-core shuffles a uint32 index array in place: the same swaps (numpy moves raw items, any width).
        indices = np.arange(n, dtype=np.uint32)
        np.random.default_rng(seed).shuffle(indices)
        assert_same(got, indices, f"default_rng({seed}).shuffle(arange({n}, uint32))")


@pytest.mark.parametrize("n", SIZES)
def test_randomstate_permutation(n):
    ours = dump([f"randomstate {seed} {n}" for seed in SEEDS])
    for seed, got in zip(SEEDS, ours):
        assert_same(got, np.random.RandomState(seed).permutation(n), f"RandomState({seed}).permutation({n})")
        indices = np.arange(n, dtype=np.int32)  # Megatron-Core's document index dtype
        np.random.RandomState(seed).shuffle(indices)
        assert_same(got, indices, f"RandomState({seed}).shuffle(arange({n}, int32))")


def test_raw_draws():
    ours = dump([f"draws {seed} 1000" for seed in GENERATOR_SEEDS] +
                [f"draws32 {seed} 1001" for seed in GENERATOR_SEEDS])
    for seed, got in zip(GENERATOR_SEEDS, ours[:len(GENERATOR_SEEDS)]):
        assert_same(got, np.random.default_rng(seed).bit_generator.random_raw(1000), f"default_rng({seed}) raw")
    for seed, got in zip(GENERATOR_SEEDS, ours[len(GENERATOR_SEEDS):]):
        # integers over the whole uint32 range returns next_uint32 as it is: low half of a draw, then the high.
        expected = np.random.default_rng(seed).integers(0, 2**32, size=1001, dtype=np.uint32)
        assert_same(got, expected, f"default_rng({seed}) next_uint32")


# Bounds on both sides of the 32-bit switch, where random_interval goes from 32-bit to 64-bit draws.
INTERVAL_MAXES = [1, 2, 5, 1000, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**33 + 7, 3 * 2**61, 2**63, 2**64 - 1]


def test_random_interval():
    # random_interval itself is not exposed to Python; the legacy randint draws with the same masked rejection
    # (and 32-bit draws up to the same bound), so a RandomState over either bit generator shows it.
    seeds = [0, 1, 7, 2**32 - 1]
    ours = dump([f"interval {seed} {m} 500" for seed in seeds for m in INTERVAL_MAXES] +
                [f"rsinterval {seed} {m} 500" for seed in seeds for m in INTERVAL_MAXES])
    half = len(seeds) * len(INTERVAL_MAXES)
    cases = [(seed, m) for seed in seeds for m in INTERVAL_MAXES]
    for (seed, m), got in zip(cases, ours[:half]):
        legacy = np.random.RandomState(np.random.PCG64(seed))
        assert_same(got, legacy.randint(0, m + 1, size=500, dtype=np.uint64), f"PCG64({seed}) interval {m}")
    for (seed, m), got in zip(cases, ours[half:]):
        expected = np.random.RandomState(seed).randint(0, m + 1, size=500, dtype=np.uint64)
        assert_same(got, expected, f"RandomState({seed}) interval {m}")


def test_advance_drops_the_buffered_half():
    deltas = [0, 1, 2, 1000, 2**40 + 3, 2**64 - 1]
    ours = dump([f"advance {seed} {d} 50" for seed in (0, 5) for d in deltas])
    for (seed, d), got in zip([(s, d) for s in (0, 5) for d in deltas], ours):
        rng = np.random.default_rng(seed)
        rng.integers(0, 2**32, dtype=np.uint32)  # leaves the high half waiting
        rng.bit_generator.advance(d)
        assert_same(got, rng.integers(0, 2**32, size=50, dtype=np.uint32), f"default_rng({seed}).advance({d})")


def test_one_generator_across_calls():
    # A shuffle of an even length leaves half a draw waiting; the next 32-bit request must get it.
    cases = [(seed, n) for seed in (0, 3, 12345678901) for n in (0, 1, 2, 3, 10, 1000, 1001)]
    ours = dump([f"chain {seed} {n} 20" for seed, n in cases])
    for (seed, n), got in zip(cases, ours):
        rng = np.random.default_rng(seed)
        indices = np.arange(n, dtype=np.uint32)
        rng.shuffle(indices)
        expected = np.concatenate([indices, rng.integers(0, 2**32, size=20, dtype=np.uint32)])
        assert_same(got, expected, f"default_rng({seed}): shuffle({n}) then next_uint32")
    # Megatron-Core shuffles its document index and then its sample index with one RandomState.
    rs_cases = [(seed, n, m) for seed in (0, 1234) for n, m in ((0, 5), (7, 100), (1000, 65537))]
    ours = dump([f"rschain {seed} {n} {m}" for seed, n, m in rs_cases])
    for (seed, n, m), got in zip(rs_cases, ours):
        rs = np.random.RandomState(seed)
        first = rs.permutation(n)
        second = np.arange(m, dtype=np.int32)
        rs.shuffle(second)
        assert_same(got, np.concatenate([first, second]), f"RandomState({seed}): permutation({n}), shuffle({m})")


def test_randomstate_seed_range():
    # numpy raises for a RandomState seed above 2**32 - 1; so does archspace, rather than wrap it.
    with pytest.raises(ValueError):
        np.random.RandomState(2**32)
    result = subprocess.run([str(DUMP)], input=f"randomstate {2**32} 5\n", capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "out of range" in result.stderr
