"""Data-parallel training (docs/distributed.md, "Data-parallel training"): 2 Gloo ranks equal one process, resume across
rank counts, and a rank killed with SIGKILL.

Tolerance: 2 ranks sum the same per-micro-batch gradients as one process, but in another order: one
process accumulates g0+g1+g2+g3 in turn, 2 ranks compute (g0+g1) and (g2+g3) and all-reduce the sum (the
x2 loss scale and the reducer's /2 are exact). fp32 rounding of that reassociation, carried through AdamW,
stays far below 1e-5; a wrong slice, normaliser or scale would be off by percents.
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

from conftest import BINARY, REPO, run_cli, save_random_olmo3, tiny_olmo3_config
from test_train import VOCAB, base_sections, final_weights, metrics, synthetic_tokens, write_shards, write_toml

TORCHRUN = REPO / ".venv" / "bin" / "torchrun"
STEPS = 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    write_shards(tmp / "shards", synthetic_tokens(6000), per_shard=2500)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp / "init")

    def config(run, grad_accum, **train):
        # 2 ranks x grad_accum 2 and 1 process x grad_accum 4: the same global batch of 8 instances.
        s = base_sections(tmp, tmp / "init", run=run, data={"shuffle": True},
                          train={"max_steps": STEPS, "grad_accum": grad_accum, "threads": 1, **train},
                          checkpoint={"interval": 2, "keep_last": 5}, debug={"dump_gradients_steps": 1})
        return write_toml(tmp / f"{run}.toml", s)

    config.tmp = tmp
    run_cli("train", "--config", config("single", 4))
    return config


def torchrun(*args, check=True):
    result = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--no-python", str(BINARY),
                             *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"torchrun archspace {' '.join(map(str, args))} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def assert_close_runs(expected, got, what, steps=STEPS):
    """Same batches; losses, gradient norms and final weights within 1e-5 (see the module docstring)."""
    me, mg = metrics(expected), metrics(got)
    assert [m["step"] for m in mg] == list(range(1, steps + 1)), what
    assert [m["batch_hash"] for m in me] == [m["batch_hash"] for m in mg], what
    le, lg = np.array([m["loss"] for m in me]), np.array([m["loss"] for m in mg])
    loss_rel = np.abs(lg - le).max() / np.abs(le).max()
    assert loss_rel <= 1e-5, f"{what}: losses differ by {loss_rel:.3g} (relative): {le} vs {lg}"
    # AdamW hardly sees a wrong gradient scale; the norm (before clipping) does.
    ne, ng = np.array([m["grad_norm"] for m in me]), np.array([m["grad_norm"] for m in mg])
    assert np.abs(ng - ne).max() / np.abs(ne).max() <= 1e-5, f"{what}: gradient norms differ: {ne} vs {ng}"
    we, wg = final_weights(expected), final_weights(got)
    assert set(we) == set(wg)
    weight_diff = max(np.abs(we[n] - wg[n]).max() for n in we)
    assert weight_diff <= 1e-5, f"{what}: final weights differ by {weight_diff:.3g}"
    print(f"{what}: loss relative difference {loss_rel:.3g}, final weights max difference {weight_diff:.3g}")


def test_two_ranks_equal_one_process_with_double_accumulation(setup):
    torchrun("train", "--config", setup("ranks2", 2))
    tmp = setup.tmp
    assert_close_runs(tmp / "single", tmp / "ranks2", "2 ranks vs 1 process")
    # Step 1's reduced gradients (rank 0 dumps them) are the one-process gradients of the whole batch.
    name = "debug/grads-step-000001.safetensors"
    ge, gg = load_file(str(tmp / "single" / name)), load_file(str(tmp / "ranks2" / name))
    assert set(ge) == set(gg)
    scale = max(np.abs(ge[n]).max() for n in ge)
    grad_rel = max(np.abs(ge[n] - gg[n]).max() for n in ge) / scale
    print(f"step 1 gradients: max difference {grad_rel:.3g} of the largest")
    assert grad_rel <= 1e-6, f"step 1 gradients differ by {grad_rel:.3g} of the largest"
    # Only rank 0 writes: one metrics line per step; the checkpoint records the ranks.
    ckpt = tmp / "ranks2" / "checkpoints" / (tmp / "ranks2" / "checkpoints" / "final").read_text().strip()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert (state["world_size"], state["grad_accum"], state["global_batch"]) == (2, 2, 8)
    assert "trained on 2 data-parallel ranks" in (ckpt / "train_config.toml").read_text()
    # The weights moved: the comparison above is not between two untrained models.
    init = load_file(str(tmp / "init" / "model.safetensors"))
    assert max(np.abs(init[n] - final_weights(tmp / "ranks2")[n]).max() for n in init) > 1e-3


def test_sft_two_ranks_equal_one_process(tmp_path):
    """Chat data: the ranks' slices hold different numbers of assistant (labelled) tokens, so each rank must
    normalise by the count of the whole global batch, not its own."""
    run_cli("init", "--preset", "micro", "--out", tmp_path / "init", "--seed", "3")

    def config(run, grad_accum):
        s = {"model": {"init_from": str(tmp_path / "init")},
             "data": {"format": "chat", "train": str(REPO / "reproduce" / "tiny" / "chat.jsonl"), "tokenizer": "dolma2"},
             "train": {"run_dir": str(tmp_path / run), "sequence_length": 64, "micro_batch": 2,
                       "grad_accum": grad_accum, "max_steps": 3, "threads": 1},
             "optim": {"lr": 1e-3, "warmup_steps": 1}}
        return write_toml(tmp_path / f"{run}.toml", s)

    run_cli("train", "--config", config("single", 4))
    torchrun("train", "--config", config("ranks2", 2))
    assert_close_runs(tmp_path / "single", tmp_path / "ranks2", "SFT: 2 ranks vs 1 process", steps=3)


@pytest.mark.parametrize("first, then", [(1, 2), (2, 1)])
def test_resume_on_another_number_of_ranks(setup, first, then):
    run = f"resume{first}to{then}"
    cfg = setup(run, 4 if first == 1 else 2)

    def train(ranks, *extra):
        accum = "train.grad_accum=4" if ranks == 1 else "train.grad_accum=2"
        args = ["train", "--config", cfg, "--set", accum, *extra]
        return run_cli(*args) if ranks == 1 else torchrun(*args)

    train(first, "--stop-after", "3")  # checkpoint at step 2; step 3 is lost
    assert (setup.tmp / run / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    train(then, "--resume")
    assert_close_runs(setup.tmp / "single", setup.tmp / run, f"resume {first} -> {then} ranks")


def test_resume_with_another_global_batch_is_refused(setup):
    run_cli("train", "--config", setup("geometry", 4), "--stop-after", "2")
    result = torchrun("train", "--config", setup("geometry", 4), "--resume", check=False)
    assert result.returncode != 0
    assert "global_batch 8" in result.stderr and "says 16 (micro_batch 2 x grad_accum 4 x 2 ranks)" in result.stderr


def optimizer_state(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "optimizer.safetensors"))


def test_sharded_optimizer_equals_unsharded_and_resumes_on_other_rank_counts(setup):
    """ZeRO-1 changes where the AdamW moments live and which rank computes each update, not the arithmetic:
    the losses, weights and (gathered) optimizer state of unsharded 2 ranks, bit for bit."""
    tmp = setup.tmp
    torchrun("train", "--config", setup("zero-off", 2))
    note = torchrun("train", "--config", setup("zero-on", 2, shard_optimizer=True)).stderr
    shares = [int(x) for x in note.split("AdamW moments of ")[1].split(" parameter")[0].split(" / ")]
    total = sum(a.size for a in final_weights(tmp / "single").values())
    assert len(shares) == 2 and sum(shares) == total and min(shares) > 0.3 * total, shares  # both hold a share
    assert [m["loss"] for m in metrics(tmp / "zero-on")] == [m["loss"] for m in metrics(tmp / "zero-off")]
    wa, wb = final_weights(tmp / "zero-off"), final_weights(tmp / "zero-on")
    assert all(np.array_equal(wa[n], wb[n]) for n in wa)
    for step in (2, STEPS):
        oa, ob = optimizer_state(tmp / "zero-off", step), optimizer_state(tmp / "zero-on", step)
        assert set(oa) == set(ob) and all(np.array_equal(oa[n], ob[n]) for n in oa), f"step {step}"
    assert_close_runs(tmp / "single", tmp / "zero-on", "ZeRO-1 2 ranks vs 1 process")
    # The checkpoint holds the whole state: a sharded run resumes on 1 process, an unsharded one sharded.
    for first, then in ((2, 1), (1, 2)):
        run = f"zero-resume{first}to{then}"
        cfg = setup(run, 4, shard_optimizer=True)
        for ranks, extra in ((first, ["--stop-after", "3"]), (then, ["--resume"])):
            args = ["train", "--config", cfg, "--set", f"train.grad_accum={4 // ranks}", *extra]
            run_cli(*args) if ranks == 1 else torchrun(*args)
        assert_close_runs(tmp / "single", tmp / run, f"ZeRO-1 resume {first} -> {then} ranks")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("killed, sig", [(1, signal.SIGKILL), (0, signal.SIGKILL), (1, signal.SIGSTOP)],
                         ids=["kill-rank1", "kill-rank0", "stop-rank1"])
def test_failed_rank_stops_the_other_within_bounds(setup, killed, sig):
    """Two ranks started by hand (rank 0 serves the store): under torchrun the agent would stop the
    survivor itself, which would not test the engine's own bound on waiting for a peer. SIGKILL closes
    the peer's sockets (noticed at once); SIGSTOP leaves a hung peer (noticed after train.dist_timeout_s)."""
    run = f"fault{killed}-{sig.name}"
    cfg = setup(run, 2, max_steps=100000, dist_timeout_s=5)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([str(BINARY), "train", "--config", str(cfg)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    log = setup.tmp / run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 5):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the ranks did not start"
        time.sleep(0.05)
    procs[killed].send_signal(sig)
    killed_at = time.monotonic()
    survivor = procs[1 - killed]
    try:
        _, stderr = survivor.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        survivor.kill()
        raise AssertionError(f"the surviving rank still runs 120 s after its peer got {sig.name}")
    finally:
        procs[killed].kill()  # a stopped rank too
        procs[killed].wait()
    took = time.monotonic() - killed_at
    print(f"rank {1 - killed} exited {took:.2f} s after rank {killed} got {sig.name}: {stderr.strip()[-300:]}")
    assert took < (90 if sig == signal.SIGKILL else 5 + 30)
    assert survivor.returncode == 1
    assert f"error: rank {1 - killed} of 2:" in stderr and "failed (a peer rank died" in stderr, stderr

    # The last checkpoint is whole (resume verifies its checksums) and the run continues from it on one
    # process: steps 1..latest+2 (2 ranks, then 1) match an uninterrupted one-process run. "The last" is the
    # newest published step directory, which --resume takes: a kill between a checkpoint's rename and the
    # `latest` pointer's update leaves the pointer one checkpoint behind (CI once hit that window).
    latest = max(int(d.name.split("-")[1]) for d in (setup.tmp / run / "checkpoints").glob("step-*")
                 if (d / "checksums.json").exists())
    assert latest >= 2
    stop = str(latest + 2)
    run_cli("train", "--config", cfg, "--set", "train.grad_accum=4", "--resume", "--stop-after", stop)
    run_cli("train", "--config", cfg, "--set", "train.grad_accum=4", "--set", f"train.run_dir={setup.tmp / run}-ref",
            "--stop-after", stop)
    got, ref = metrics(setup.tmp / run), metrics(setup.tmp / f"{run}-ref")
    assert [m["step"] for m in got] == list(range(1, latest + 3))
    assert [m["batch_hash"] for m in got] == [m["batch_hash"] for m in ref]
    lg, lr = np.array([m["loss"] for m in got]), np.array([m["loss"] for m in ref])
    assert np.abs(lg - lr).max() / np.abs(lr).max() <= 1e-5, (lg, lr)


def test_rank_logs_on_request(setup):
    """Rank 0 alone reports by default; train.log_all_ranks = true makes every rank report, labelled."""
    quiet = torchrun("train", "--config", setup("logs-default", 2, max_steps=2)).stderr
    assert "[train] step 2/2" in quiet and "rank 1]" not in quiet
    loud = torchrun("train", "--config", setup("logs-all", 2, max_steps=2, log_all_ranks=True)).stderr
    assert "[train rank 0] step 2/2" in loud and "[train rank 1] step 2/2" in loud


def test_under_torchrun_rank_0_speaks_and_an_error_prints_once(setup):
    """The run's messages (the checkpoint line) come from rank 0 alone; a config error, the same on every rank,
    is printed once, without a rank label and without a doubled "error:"."""
    ok = torchrun("train", "--config", setup("speaks", 2, max_steps=2)).stderr
    assert ok.count("checkpoint: ") == 1, ok
    bad = torchrun("train", "--config", setup("conflict", 2, max_steps=2), "--set", "train.max_steps=1", check=False)
    assert bad.returncode != 0
    text = bad.stdout + bad.stderr
    errors = [line for line in text.splitlines() if "error:" in line and "conflicts with" in line]
    assert len(errors) == 1 and errors[0].startswith("error: --set train.max_steps=1 conflicts with "), text
    assert "error: error:" not in text and "error: rank" not in text, text


def test_an_error_every_rank_meets_after_joining_prints_once(setup):
    """Shards tokenized for a larger vocabulary fail every rank alike after the ranks joined (data comes after the
    process group): one line, unlabelled. A rank's own failure is labelled with its rank (the dead-peer test)."""
    write_shards(setup.tmp / "wide-shards", synthetic_tokens(3000), vocab=VOCAB * 2)
    cfg = setup("wide", 2, max_steps=2)
    cfg.write_text(cfg.read_text().replace(str(setup.tmp / "shards"), str(setup.tmp / "wide-shards")))
    bad = torchrun("train", "--config", cfg, check=False)
    assert bad.returncode != 0
    text = bad.stdout + bad.stderr
    assert "data-parallel ranks" in text, text  # the ranks did join before the error
    errors = [line for line in text.splitlines() if "vocabulary mismatch" in line]
    assert len(errors) == 1 and errors[0].startswith("error: ") and not errors[0].startswith("error: rank"), text
    assert "error: error:" not in text, text


def test_two_nodes_through_torchrun_rendezvous(setup):
    """The multi-node command of docs/distributed.md, as two 'nodes' on this machine: two torchrun agents (one rank each)
    meet through the c10d rendezvous on a TCP endpoint; the run equals one process with the same global batch."""
    port = free_port()
    command = [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{port}", "--rdzv-id", "archspace-test", "--no-python", str(BINARY), "train", "--config",
               str(setup("nodes2", 2))]
    nodes = [subprocess.Popen(command + [], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
    assert_close_runs(setup.tmp / "single", setup.tmp / "nodes2", "2 nodes vs 1 process")


def test_two_ranks_with_activation_checkpointing_equal_one_process(setup):
    """Checkpointed blocks hand their parameters' gradients to autograd as ordinary node outputs, so the
    reducer's per-parameter hooks fire as without checkpointing: 2 checkpointing ranks equal one process
    (which does not checkpoint), within the module's 1e-5."""
    torchrun("train", "--config", setup("ranks2-ckpt", 2, activation_checkpointing=True))
    assert_close_runs(setup.tmp / "single", setup.tmp / "ranks2-ckpt", "2 checkpointing ranks vs 1 process")
