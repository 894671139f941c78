"""Sharded parameters (docs/distributed.md, "Data-parallel training"): train.sharding = "full" (FSDP) and
train.replicate_groups (HSDP) against train.sharding = "none" on the same ranks and global batch, step for step:
the batches (batch_hash, which must not depend on the sharding), the losses, every step's reduced gradients
(dumped by rank 0), the gradient norms and the final weights; resume across rank counts and sharding modes; a
rank dying inside a sharded collective; and mutation runs (ARCHSPACE_TEST_FAULT, test-only) showing that each
equivalence check fails on a dropped reduce-scatter and on a wrong shard offset.

Bitwise: at 2 ranks with one micro-batch per step, or with several and train.reduce_each_micro_batch = false
(each rank adds its micro-batches' gradients in order, as autograd adds "none"'s, and reduces the sum once);
both variants, fp32 and bf16, with and without activation checkpointing, SFT masking. The forward reads the same
values (fp32 shards gathered unchanged, bf16 gathers are autocast's own cast); a 2-rank reduce-scatter is the
all-reduce's slice bit for bit (a two-term sum has one order) and "none"'s x2 loss scale and /2 average are
exact; AdamW is elementwise. These runs leave clipping off, because the clipping coefficient comes from the
gradient norm, which the two modes compute differently (below): with it on, a rounding-level difference of the
coefficient reaches every weight.

Not bitwise, and the tolerances:
- Gradient norms. Both modes report the fp64 norm of their gradients rounded once to fp32
  (src/kernels/gradient_norm.cpp): "none" sums each whole gradient's fp64 squares, "full" its shards' and then
  the ranks'. The checks: "full"'s norm is the fp64 norm of its own dumped gradients within 1e-7 (2^-24 of
  rounding to fp32), and the two reported norms differ by no more than "none"'s own error (measured from its
  dumped gradients the same way) plus the two gradients' fp64 norms' difference plus 1e-7.
- Gradient accumulation reduced every micro-batch (the default), 3 ranks, HSDP: FSDP reduces each micro-batch
  (gradients are sharded between micro-batches) and adds the reduced shards, (a1 + b1) + (a2 + b2) where "none"
  forms (a1 + a2) + (b1 + b2) (measured 5.5e-8 of the largest at step 1 for siamese_depth at 2 ranks; no bound
  below a few roundings of the largest partial sum follows from the arithmetic, so 1e-6 is what is checked); at
  3 ranks the reduce-scatter's sums depend on the position in the buffer and "none" scales by 3 and divides by 3;
  HSDP adds (a + b) + (c + d). Step 1's gradients (the same weights) then differ by a few fp32 roundings of
  sums of a few terms of the size of the largest gradient: within 1e-6 of it (ROUNDING). From step 2 on the
  weights differ by such roundings too, so the later steps are compared through their losses and the final
  weights, within the same 1e-6. Those runs use optim.eps = 1e-3: AdamW's update
  g / (sqrt(v) + eps) has slope up to 1 / eps at g = 0, so with the default 1e-8 a rounding-level difference of a
  gradient element near zero moves its weight by up to lr x 1e-2 (measured: 1.9e-4 after 4 steps at 3 ranks);
  with 1e-3 the slope is at most 1e3 and the weights stay within steps x lr x 1e3 x 1e-10, far below 1e-6.
"""
import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import BINARY, REPO, run_cli, variant_config_dict
from test_train import expect_error, final_weights, metrics, synthetic_tokens, write_shards, write_toml

TORCHRUN = REPO / ".venv" / "bin" / "torchrun"
STEPS = 4
ROUNDING = 1e-6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    write_shards(tmp / "shards", synthetic_tokens(6000), per_shard=2500)
    # base: the tiny preset with the data's vocabulary; siamese_depth: 7 layers, Depth-Attention every 2nd layer,
    # a sliding window shorter than the sequence, YaRN (conftest's variant config).
    run_cli("init", "--preset", "tiny", "--out", tmp / "preset")
    base = json.loads((tmp / "preset" / "config.json").read_text())
    base.update(vocab_size=96, padded_vocab_size=96, sliding_window=6)
    configs = {"base": base, "siamese_depth": variant_config_dict()}
    for variant, config in configs.items():
        (tmp / f"{variant}.json").write_text(json.dumps(config))
        run_cli("init", "--config", tmp / f"{variant}.json", "--out", tmp / f"{variant}-init", "--seed", "1")

    def config(run, variant="base", optim=None, **train):
        s = {"model": {"init_from": str(tmp / f"{variant}-init")},
             "data": {"train": str(tmp / "shards"), "shuffle": True},
             "train": {"run_dir": str(tmp / run), "sequence_length": 16, "micro_batch": 2, "grad_accum": 1,
                       "max_steps": STEPS, "seed": 0, "threads": 1, "loss_chunk_tokens": 7, **train},
             "optim": {"lr": 1e-2, "warmup_steps": 1, "weight_decay": 0.1, "clip_grad_norm": 0.5, "z_loss": 1e-4,
                       **(optim or {})},
             "checkpoint": {"interval": 2, "keep_last": 5},
             # Validation (a sharded forward without grad) and per-layer gradient norms every 2 steps.
             "eval": {"interval": 2, "batches": 2},
             "debug": {"dump_gradients_steps": STEPS}}
        s["data"]["valid"] = s["data"]["train"]
        s["train"]["grad_norm_interval"] = 2
        return write_toml(tmp / f"{run}.toml", s)

    config.tmp = tmp
    return config


def torchrun(ranks, *args, env=None, check=True):
    result = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), "--no-python", str(BINARY),
                             *map(str, args)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **(env or {})))
    if check and result.returncode != 0:
        raise AssertionError(f"torchrun archspace {' '.join(map(str, args))} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def gradients(run, step):
    return load_file(str(run / "debug" / f"grads-step-{step:06d}.safetensors"))


def max_relative(expected, got):
    """max |got - expected| over every element, over the largest |expected|."""
    scale = max(float(np.abs(t).max()) for t in expected.values())
    return max(float(np.abs(expected[n].astype(np.float64) - got[n]).max()) for n in expected) / scale


def assert_equivalent(expected, got, what, bitwise=False, tolerance=ROUNDING, steps=STEPS, sharded_norms=True):
    """The same batches; with `bitwise` the same losses, every step's gradients and the final weights bit for
    bit, else losses, step 1's gradients and the final weights within `tolerance` of the largest value; gradient
    norms as the module docstring says (`sharded_norms`: `got` computed them from shards). Compares the first
    `steps` steps (the final weights when both runs end at the same step)."""
    me, mg = metrics(expected)[:steps], metrics(got)
    assert [m["step"] for m in mg] == list(range(1, steps + 1)), what
    assert [m["batch_hash"] for m in me] == [m["batch_hash"] for m in mg], f"{what}: other batches"
    le, lg = np.array([m["loss"] for m in me]), np.array([m["loss"] for m in mg])
    losses = float(np.abs(lg - le).max() / np.abs(le).max())
    grads, norms, own = 0.0, 0.0, 0.0
    for m_none, m_full in zip(me, mg):
        ge, gg = gradients(expected, m_none["step"]), gradients(got, m_full["step"])
        assert set(ge) == set(gg), what
        if bitwise and not all(np.array_equal(ge[n], gg[n]) for n in ge):
            raise AssertionError(f"{what}: step {m_none['step']} gradients differ by {max_relative(ge, gg):.3g}")
        if m_none["step"] == 1:  # the same weights; later, rounding-level differences of the weights show too
            grads = max_relative(ge, gg)
        exact_none, exact_full = (float(np.sqrt(sum((t.astype(np.float64) ** 2).sum() for t in g.values())))
                                  for g in (ge, gg))
        norms = max(norms, abs(m_full["grad_norm"] - exact_full) / exact_full)
        own = max(own, abs(m_none["grad_norm"] - exact_none) / exact_none)
        slack = abs(m_none["grad_norm"] - exact_none) + abs(exact_none - exact_full) + 1e-7 * exact_full
        assert abs(m_full["grad_norm"] - m_none["grad_norm"]) <= slack, f"{what}: step {m_none['step']} gradient norms differ"
    assert own <= 1e-7, f"{what}: the expected run's gradient norm is {own:.3g} off its gradients' fp64 norm"
    weights = None
    # Validation losses and per-layer gradient norms (fp64 sums of squares either way, so within 1e-12 when
    # the gradients are equal).
    lines = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (expected, got)]
    by_step = [{key: {m["step"]: m[key] for m in ms if key in m} for key in ("valid_loss", "grad_norms")} for ms in lines]
    common = {key: sorted(set(by_step[0][key]) & set(by_step[1][key])) for key in ("valid_loss", "grad_norms")}
    valid = [[runs["valid_loss"][step] for step in common["valid_loss"]] for runs in by_step]
    layers = [[runs["grad_norms"][step] for step in common["grad_norms"]] for runs in by_step]
    if steps == STEPS:  # full-length runs: every evaluation and per-layer norm line in both
        assert len(valid[0]) == 2 and len(layers[0]) == 2, what
    if bitwise:
        assert valid[0] == valid[1], f"{what}: validation losses differ: {valid}"
        for a, b in zip(*layers):
            for key in ("embed", "head", "layers"):
                assert np.allclose(a[key], b[key], rtol=1e-12, atol=0), f"{what}: per-layer gradient norms differ"
    elif valid[0]:
        gap = float(np.abs(np.subtract(valid[0], valid[1])).max() / np.abs(valid[0]).max())
        assert gap <= tolerance, f"{what}: validation losses differ by {gap:.3g}"
    finals = [(run / "checkpoints" / "final").read_text().strip() for run in (expected, got)]
    if finals[0] == finals[1]:  # not a shorter run's
        we, wg = final_weights(expected), final_weights(got)
        assert set(we) == set(wg), what
        weights = max_relative(we, wg)
    print(f"{what}: relative differences: losses {losses:.3g}, step 1 gradients {grads:.3g}, final weights "
          f"{weights if weights is None else f'{weights:.3g}'}; gradient norm of full vs the fp64 norm {norms:.3g} "
          f"(none's own: {own:.3g})")
    assert lg[0] == le[0], f"{what}: step 1's loss differs: {le[0]} vs {lg[0]}"
    assert grads <= (0 if bitwise else tolerance), f"{what}: step 1 gradients differ by {grads:.3g}"
    # fp32 rounding of the fp64 norm: 2^-24 relative, and the fp64 sums' own (about 1e-16 per term).
    assert norms <= 1e-7 or not sharded_norms, f"{what}: the gradient norm is {norms:.3g} off its gradients' fp64 norm"
    assert losses <= (0 if bitwise else tolerance), f"{what}: losses differ by {losses:.3g}"
    if weights is not None:
        assert weights <= (0 if bitwise else tolerance), f"{what}: final weights differ by {weights:.3g}"


def pair(setup, name, ranks=2, full_only=None, **train):
    """The same run with sharding "none" and "full" (cached: several checks share the references); `full_only`:
    train keys of the "full" run alone."""
    runs = {}
    for sharding in ("none", "full"):
        run = f"{name}-{sharding}"
        if not (setup.tmp / run / "metrics.jsonl").exists():
            extra = (full_only or {}) if sharding == "full" else {}
            torchrun(ranks, "train", "--config", setup(run, sharding=sharding, **train, **extra))
        runs[sharding] = setup.tmp / run
    return runs["none"], runs["full"]


EXACT = dict(grad_accum=1, optim={"clip_grad_norm": 0})
ROUNDED = dict(optim={"eps": 1e-3})
# Gradient accumulation with the reduction deferred to the step's last micro-batch (train.reduce_each_micro_batch
# = false): each rank sums its micro-batches first, as "none" does, so 2 ranks stay bitwise.
ONCE_PER_STEP = dict(grad_accum=2, optim={"clip_grad_norm": 0}, full_only={"reduce_each_micro_batch": False})
# Between them, the checks cover both variants, activation checkpointing (the gather inside the recomputed
# block: base-checkpointing, 3 ranks, HSDP) and its absence (a block gathered again before its backward, with
# Depth-Attention's values crossing blocks: siamese_depth below), fp32 and bf16 autocast (bf16 gathers of the
# matmul weights), gradient accumulation (reduced once per step: bitwise below; reduced every micro-batch: 3
# ranks, SFT) and SFT masking.
BITWISE = {
    "base-bf16": dict(variant="base", dtype="bf16", **EXACT),
    "siamese_depth": dict(variant="siamese_depth", **EXACT),
    "base-checkpointing": dict(variant="base", activation_checkpointing=True, **EXACT),
    "siamese_depth-accumulation": dict(variant="siamese_depth", activation_checkpointing=True, **ONCE_PER_STEP),
}


@pytest.mark.parametrize("case", BITWISE)
def test_full_sharding_equals_none_bit_for_bit_on_two_ranks(setup, case):
    none, full = pair(setup, case, **BITWISE[case])
    assert_equivalent(none, full, f"2 ranks, {case}: full vs none", bitwise=True)
    state = json.loads((full / "checkpoints" / f"step-{STEPS:08d}" / "trainer_state.json").read_text())
    assert (state["sharding"], state["world_size"]) == ("full", 2)
    # The checkpoints hold the whole state as one process would: "none"'s tensors, the optimizer's too.
    for what in ("model/model.safetensors", "optimizer.safetensors"):
        a, b = (load_file(str(run / "checkpoints" / "step-00000002" / what)) for run in (none, full))
        assert set(a) == set(b) and all(np.array_equal(a[n], b[n]) for n in a), what


def test_sft_full_sharding_equals_none(tmp_path):
    """Chat data: the ranks' slices hold different numbers of labelled (assistant) tokens; the loss is normalised by
    the whole global batch's count in both modes, and the masked rows skip the chunked head. Two micro-batches a
    step: reduced every micro-batch (the default, clipping on) within ROUNDING, as the module docstring says;
    reduced once per step with clipping off, bit for bit."""
    run_cli("init", "--preset", "micro", "--out", tmp_path / "init", "--seed", "3")

    def config(run, sharding, **train):
        s = {"model": {"init_from": str(tmp_path / "init")},
             "data": {"format": "chat", "train": str(REPO / "reproduce" / "tiny" / "chat.jsonl"), "tokenizer": "dolma2"},
             "train": {"run_dir": str(tmp_path / run), "sequence_length": 64, "micro_batch": 2, "grad_accum": 2,
                       "max_steps": 2, "threads": 1, "sharding": sharding, "loss_chunk_tokens": 16,
                       **{k: v for k, v in train.items() if k != "clip"}},
             "optim": {"lr": 1e-3, "warmup_steps": 1, "eps": 1e-3, **({"clip_grad_norm": 0} if train.get("clip") == 0 else {})},
             "debug": {"dump_gradients_steps": 2}}
        return write_toml(tmp_path / f"{run}.toml", s)

    for sharding in ("none", "full"):
        torchrun(2, "train", "--config", config(sharding, sharding))
    assert_equivalent(tmp_path / "none", tmp_path / "full", "SFT, 2 ranks: full vs none", steps=2)
    torchrun(2, "train", "--config", config("none-noclip", "none", clip=0))
    torchrun(2, "train", "--config", config("full-once", "full", clip=0, reduce_each_micro_batch=False))
    assert_equivalent(tmp_path / "none-noclip", tmp_path / "full-once", "SFT, 2 ranks: full (reduced once per step) vs none",
                      steps=2, bitwise=True)


RANKS3 = dict(variant="siamese_depth", activation_checkpointing=True, grad_accum=2, **ROUNDED)
HSDP = dict(variant="base", activation_checkpointing=True, **ROUNDED)


def test_full_sharding_equals_none_on_three_ranks(setup):
    """3 ranks, two micro-batches a step, clipping on: parameters cut at uneven places and padded shards (the
    units are not multiples of 3)."""
    none, full = pair(setup, "ranks3", ranks=3, **RANKS3)
    assert_equivalent(none, full, "3 ranks: full vs none")


def test_hsdp_two_by_two_equals_none_on_four_ranks(setup):
    """HSDP: 2 shard groups of 2 consecutive ranks (reduce-scatter within, all-reduce across) against "none" on
    the same 4 ranks."""
    none = pair(setup, "hsdp", ranks=4, **HSDP)[0]
    hsdp = setup.tmp / "hsdp-2x2"
    torchrun(4, "train", "--config", setup("hsdp-2x2", sharding="full", replicate_groups=2, **HSDP))
    assert_equivalent(none, hsdp, "4 ranks: HSDP 2 x 2 vs none")
    state = json.loads((hsdp / "checkpoints" / f"step-{STEPS:08d}" / "trainer_state.json").read_text())
    assert (state["sharding"], state["replicate_groups"]) == ("full", 2)


@pytest.mark.parametrize("fault", ["drop_reduce_scatter", "shard_offset"])
def test_each_equivalence_check_catches_a_dropped_reduce_scatter_and_a_wrong_shard_offset(setup, fault):
    """Mutation runs (ARCHSPACE_TEST_FAULT, read only by src/dist/test_fault.cpp): ranks that keep their own
    gradient instead of the sum, or cut their shards one element off, fail the checks above at 2 ranks, 3 ranks
    and under HSDP (a dropped reduction breaks step 1's gradients, a wrong offset the weights the first forward
    reads). One step each: the check's first step already fails."""
    checks = [("2 ranks", 2, "base-bf16", BITWISE["base-bf16"], True),
              ("2 ranks, reduced once per step", 2, "siamese_depth-accumulation",
               BITWISE["siamese_depth-accumulation"], True),
              ("3 ranks", 3, "ranks3", RANKS3, False),
              ("HSDP 2 x 2", 4, "hsdp", dict(replicate_groups=2, **HSDP), False)]
    for what, ranks, reference, train, bitwise in checks:
        none = pair(setup, reference, ranks=ranks, **{k: v for k, v in train.items() if k != "replicate_groups"})[0]
        run = f"{reference}-fault-{fault}"
        train = {k: v for k, v in train.items() if k != "full_only"} | train.get("full_only", {})
        torchrun(ranks, "train", "--config", setup(run, sharding="full", **{**train, "max_steps": 1}),
                 env={"ARCHSPACE_TEST_FAULT": fault})
        with pytest.raises(AssertionError, match="differ"):
            assert_equivalent(none, setup.tmp / run, f"{what}, {fault}", bitwise=bitwise, steps=1)


def test_resume_across_rank_counts_and_sharding_modes(setup):
    """Checkpoints hold whole fp32 parameters and moments, whatever the sharding: "full" on 2 ranks resumes a
    1-process run and the reverse (one process trains as "none": the checkpoint crosses rank counts and sharding
    modes at once). Each against the uninterrupted 2-rank "none" run, bit for bit (one process with grad_accum 2
    adds the same two micro-batch gradients in the same order)."""
    train = BITWISE["base-bf16"]
    none = pair(setup, "base-bf16", **train)[0]
    for first, then in (("1", "full"), ("full", "1")):
        run = f"resume-{first}-to-{then}"
        for part, extra in ((first, ["--stop-after", "3"]), (then, ["--resume"])):
            if part == "1":
                run_cli("train", "--config", setup(run, **{**train, "grad_accum": 2}), *extra)
            else:
                torchrun(2, "train", "--config", setup(run, sharding=part, **train), *extra)
        assert (setup.tmp / run / "checkpoints" / "latest").read_text().strip() == f"step-{STEPS:08d}"
        assert_equivalent(none, setup.tmp / run, f"resume {first} -> {then}", bitwise=True, sharded_norms=then == "full")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fault, collective", [("die_in_all_gather@3", "the all-gather of the embedding (step 3)"),
                                               ("die_in_reduce_scatter@3",
                                                "the reduce-scatter of the gradients of the embedding (step 3)")])
def test_a_rank_dying_in_a_sharded_collective_ends_the_other(setup, fault, collective):
    """Rank 1 kills itself (SIGKILL) where rank 0 waits in an all-gather or a reduce-scatter; started by hand
    (rank 0 serves the store), so nothing but the engine's own bound ends rank 0."""
    cfg = setup(f"dies-{fault.split('@')[0]}", sharding="full", max_steps=100, dist_timeout_s=5)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if rank == 1:
            env["ARCHSPACE_TEST_FAULT"] = fault
        procs.append(subprocess.Popen([str(BINARY), "train", "--config", str(cfg)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    started = time.monotonic()
    try:
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    took = time.monotonic() - started
    print(f"rank 0 ended {took:.1f} s after the start: {err.strip()[-300:]}")
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode == 1, err
    assert f"error: rank 0 of 2: {collective} failed (a peer rank died" in err, err
    assert len(metrics(cfg.parent / cfg.stem)) == 2  # steps 1 and 2 done, step 3 not


def test_sharding_keys_are_checked(setup):
    cfg = setup("keys")
    expect_error(["train", "--config", cfg, "--set", "train.sharding=zero3"], "key 'train.sharding'",
                 "unknown sharding 'zero3' (valid: none, optimizer, full)")
    expect_error(["train", "--config", cfg, "--set", "train.sharding=full", "--set", "train.shard_optimizer=true"],
                 "train.shard_optimizer' is true but train.sharding is \"full\": they disagree")
    expect_error(["train", "--config", cfg, "--set", "train.replicate_groups=2"], "train.replicate_groups",
                 "HSDP replicates shard groups of train.sharding = \"full\"")
    expect_error(["train", "--config", cfg, "--set", "train.replicate_groups=0"], "train.replicate_groups",
                 "must be >= 1")
    expect_error(["train", "--config", cfg, "--set", "train.reduce_each_micro_batch=false"],
                 "train.reduce_each_micro_batch", "applies to train.sharding = \"full\" only")
    # Checked before the rank joins the others: one rank of 2 started alone says it.
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    expect_error(["train", "--config", setup("keys-hsdp", sharding="full", replicate_groups=3)],
                 "key 'train.replicate_groups' is 3, which does not divide the 2 ranks into equal shard groups", env=env)
