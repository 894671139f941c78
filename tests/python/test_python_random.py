"""archspace's copy of CPython's random.Random (src/data/python_random.cpp: MT19937 seeded by init_by_array,
getrandbits, _randbelow, sample) against Python's own `random`, draw for draw: OLMES picks drop::llama3's shots with
random.Random(1234).sample of DROP's training documents. The C++ side is build/python_random_dump
(tests/tools/python_random_dump.cpp), or the binary ARCHSPACE_PYTHON_RANDOM_DUMP names."""
import os
import pathlib
import random
import subprocess

from conftest import REPO

DUMP = pathlib.Path(os.environ.get("ARCHSPACE_PYTHON_RANDOM_DUMP", REPO / "build" / "python_random_dump"))

SEEDS = list(range(-3, 40)) + [1234, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 5, 12345678901, 2**63 - 1, -(2**63 - 1)]
# Both of sample's ways: a pool while n <= 21 (k <= 5) or 21 + 4**ceil(log4(3k)), a set of positions beyond it;
# sizes on both sides of each switch, k = 0 and k = n, and DROP's training split (77,409 documents) with k = 3.
SAMPLES = [(0, 0), (1, 1), (5, 3), (21, 5), (22, 5), (23, 3), (30, 6), (85, 6), (86, 6), (1000, 3), (1000, 1000),
           (77409, 3), (77409, 5), (100000, 40), (3, 3), (2**40 + 3, 4)]


def dump(requests):
    assert DUMP.exists(), f"{DUMP} is missing: build the python_random_dump target (or set ARCHSPACE_PYTHON_RANDOM_DUMP)"
    result = subprocess.run([str(DUMP)], input="\n".join(requests) + "\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == len(requests), (len(lines), len(requests))
    return [[int(v) for v in line.split()] if not line.startswith("error") else line for line in lines]


def test_sample_equals_python_over_seeds_and_sizes():
    cases = [(seed, n, k) for seed in SEEDS for n, k in SAMPLES]
    ours = dump([f"sample {seed} {n} {k}" for seed, n, k in cases])
    for (seed, n, k), got in zip(cases, ours):
        assert got == random.Random(seed).sample(range(n), k), (seed, n, k)


def test_one_generator_across_many_samples_equals_python():
    """Several samples from one generator (OLMES keeps drawing from one Random across documents if it does): the
    state carried from one call to the next, block twists included (2,000 samples of 3 use over 624 words)."""
    cases = [(1234, 77409, 3, 2000), (1234, 9, 3, 500), (7, 300, 30, 50)]
    ours = dump([f"chain {seed} {n} {k} {m}" for seed, n, k, m in cases])
    for (seed, n, k, m), got in zip(cases, ours):
        rng = random.Random(seed)
        expected = [v for _ in range(m) for v in rng.sample(range(n), k)]
        assert got == expected, (seed, n, k, m)


def test_getrandbits_and_randbelow_equal_python():
    cases = [(seed, k) for seed in SEEDS[:12] + [1234, 2**63 - 1] for k in (0, 1, 5, 17, 31, 32, 33, 48, 63, 64)]
    ours = dump([f"bits {seed} {k} 700" for seed, k in cases])
    for (seed, k), got in zip(cases, ours):
        rng = random.Random(seed)
        assert got == [rng.getrandbits(k) for _ in range(700)], (seed, k)
    bounds = [1, 2, 3, 7, 1000, 77409, 2**32 - 1, 2**32, 2**32 + 1, 2**63 + 7]
    ours = dump([f"below 1234 {n} 500" for n in bounds])
    for n, got in zip(bounds, ours):
        rng = random.Random(1234)
        assert got == [rng._randbelow(n) for _ in range(500)], n


def test_sample_larger_than_population_is_refused():
    (line,) = dump(["sample 1 3 4"])
    assert isinstance(line, str) and "Sample larger than population" in line
