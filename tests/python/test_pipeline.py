"""The tiny four-stage pipeline (reproduce/tiny) end to end for both variants: pretraining, mid-training
from stage 1, long context with YaRN switched on for full layers, and both SFT stages on chat data. One
set of stage files serves both variants (`--set model.variant=siamese_depth`, runs under runs/tiny/VARIANT)."""
import hashlib
import json
import os
import pathlib
import subprocess

import pytest

from conftest import BINARY, REPO, fnv1a_batch_hash, install_remote_code
from tolerances import forward_bound, logprob_bound

FNV_PRIME_INVERSE = pow(1099511628211, -1, 1 << 64)


def sft_example(tokenizer, messages, seq_len, pad_id):
    """One SFT row rebuilt from the chat data and the docs/SPEC rules, independently of the engine's code:
    the conversation up to its last assistant turn rendered by the exported chat template (no generation
    prompt) and tokenized whole by transformers; a token is trained when its characters lie inside an
    assistant content or the end token that follows it (<|im_end|>, or <|endoftext|> for the last one);
    label[t] = id[t+1] where token t+1 is trained; cut to seq_len, padded with pad_id, -100 = no label."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    messages = messages[: last + 1]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, at = [], 0
    for i, m in enumerate(messages):
        header = f"<|im_start|>{m['role']}\n"
        at = text.index(header, at) + len(header)
        end = "<|endoftext|>" if i == last else "<|im_end|>"
        assert text.startswith(m["content"] + end, at)
        if m["role"] == "assistant":
            spans.append((at, at + len(m["content"]) + len(end)))
        at += len(m["content"]) + len(end)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:seq_len]
    trained = [any(a <= s and e <= b for a, b in spans) and e > s for s, e in enc["offset_mapping"][:seq_len]]
    labels = [ids[t + 1] if t + 1 < len(ids) and trained[t + 1] else -100 for t in range(len(ids))]
    pad = seq_len - len(ids)
    return ids + [pad_id] * pad, labels + [-100] * pad


def find_batch(rows, batch_hash, size):
    """The ordered choice of `size` distinct rows (size 4: two from the front, two from the back) whose FNV-1a
    batch hash is `batch_hash`: meet in the middle, hashing forward over the first two rows and undoing the
    hash backward over the last two (FNV-1a is invertible: an odd multiplier modulo 2^64)."""
    assert size == 4

    def forward(h, row):
        for t in row:
            h = ((h ^ t) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return h

    def backward(h, row):
        for t in reversed(row):
            h = ((h * FNV_PRIME_INVERSE) & 0xFFFFFFFFFFFFFFFF) ^ t
        return h

    n = len(rows)
    front = {}
    for a in range(n):
        ha = forward(1469598103934665603, rows[a])
        for b in range(n):
            if b != a:
                front.setdefault(forward(ha, rows[b]), []).append((a, b))
    found = []
    target = int(batch_hash, 16)
    for d in range(n):
        hd = backward(target, rows[d])
        for c in range(n):
            if c != d:
                for a, b in front.get(backward(hd, rows[c]), []):
                    if len({a, b, c, d}) == 4:
                        found.append((a, b, c, d))
    return found


def check_first_sft_step(workdir, stage_run, variant, tmp_path):
    """The first logged step of an SFT stage equals transformers on the same batch with the previous stage's
    weights: the batch (rebuilt from the chat data, found by its batch_hash) has the logged hash, and the
    logged loss (summed cross-entropy over labelled tokens / their count) and z_loss (coefficient x mean
    squared log-sum-exp) equal transformers' within 1e-5 absolute and 1e-5 relative (fp32 logits on both sides
    agree to ~1e-6; the loss is a mean of per-token differences of them)."""
    import tomllib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = (stage_run / "checkpoints" / "final").read_text().strip()
    cfg = tomllib.loads((stage_run / "checkpoints" / final / "train_config.toml").read_text())
    seq, micro, accum = cfg["train"]["sequence_length"], cfg["train"]["micro_batch"], cfg["train"].get("grad_accum", 1)
    hf = tmp_path / (stage_run.name + "-init")
    subprocess.run([str(BINARY), "export-hf", cfg["model"]["init_from"], str(hf)], cwd=workdir, check=True, capture_output=True)
    if variant != "base":
        install_remote_code(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=True).float().eval()
    pad = model.config.pad_token_id
    chats = [json.loads(l)["messages"] for l in (workdir / cfg["data"]["train"]).read_text().splitlines() if l.strip()]
    examples = [sft_example(tokenizer, m, seq, pad) for m in chats]
    first = next(json.loads(l) for l in (stage_run / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(l))
    found = find_batch([ids for ids, _ in examples], first["batch_hash"], micro * accum)
    assert len(found) == 1, f"{len(found)} orders of the chat examples give the first step's batch hash"
    ids = torch.tensor([examples[i][0] for i in found[0]])
    labels = torch.tensor([examples[i][1] for i in found[0]])
    assert fnv1a_batch_hash(ids.tolist()) == first["batch_hash"]
    with torch.no_grad():
        logits = model(ids).logits.double()
    mask = labels != -100
    lse = torch.logsumexp(logits, -1)[mask]
    picked = logits.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)[mask]
    loss = float((lse - picked).mean())
    z_loss = float(cfg["optim"]["z_loss"] * (lse ** 2).mean())
    # The engine's first step and transformers' forward on the same weights: two fp32 computations of every
    # log-probability (logprob_bound), so of their mean; each log-sum-exp moves by that bound too, its square by
    # 2 |lse| times it (relative to z_loss: 2 bound / min|lse|).
    per_token = logprob_bound(forward_bound(model, seq), model.config.vocab_size, float((lse - picked).abs().max()))
    assert abs(first["loss"] - loss) <= per_token, (first, loss, per_token)
    assert abs(first["z_loss"] - z_loss) <= 2 * per_token / float(lse.abs().min()) * z_loss, (first, z_loss)

STAGES = ["stage1", "stage2", "stage3", "stage4-think", "stage4-instruct"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_corpus.sh")], check=True, capture_output=True)
    work = tmp_path_factory.mktemp("pipeline")
    (work / "data").symlink_to(REPO / "data")
    (work / "reproduce").symlink_to(REPO / "reproduce")
    return work


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_tiny_pipeline(variant, workdir, tmp_path):
    for stage in STAGES:  # the documented commands: the files say base; the other variant is one --set away
        variant_set = [] if variant == "base" else ["--set", f"model.variant={variant}"]
        result = subprocess.run([str(BINARY), "train", "--config", f"reproduce/tiny/{stage}.toml", *variant_set],
                                cwd=workdir, capture_output=True, text=True)
        assert result.returncode == 0, f"{stage}:\n{result.stderr}"
    runs = workdir / "runs" / "tiny" / variant

    def final_config(stage):
        name = (runs / stage / "checkpoints" / "final").read_text().strip()
        return json.loads((runs / stage / "checkpoints" / name / "model" / "config.json").read_text())

    def losses(stage):
        return [json.loads(l) for l in (runs / stage / "metrics.jsonl").read_text().splitlines()]

    assert final_config("stage1")["model_type"] == ("olmo3" if variant == "base" else "olmo3_siamese_depth")
    assert final_config("stage2")["rope_scaling"] is None
    for stage in ("stage3", "stage4-think", "stage4-instruct"):  # YaRN switched on at stage 3 and kept
        assert final_config(stage)["rope_scaling"]["factor"] == 4.0
    first = [m["loss"] for m in losses("stage1") if "loss" in m]
    assert first[-1] < first[0]  # pretraining learns
    assert any("valid_loss" in m for m in losses("stage2"))
    # Stage 2 continues from stage 1's weights: it starts near where stage 1 ended, not from scratch.
    assert [m["loss"] for m in losses("stage2") if "loss" in m][0] < first[0] - 0.5
    # Each stage's schedule starts again from its own warm-up (a stage is a run of its own, as in OLMo-core's
    # stage scripts): every logged lr is OLMo-core's CosWithWarmup's for that stage's file (recipe "olmo-core").
    import tomllib

    from test_recipes import assert_same_lrs, olmo_core_lrs
    for stage in STAGES:
        cfg = tomllib.loads((REPO / "reproduce" / "tiny" / f"{stage}.toml").read_text())
        assert cfg["optim"]["recipe"] == "olmo-core"
        logged = [m["lr"] for m in losses(stage) if "loss" in m]
        expected = olmo_core_lrs("cosine", cfg["optim"]["lr"], cfg["train"]["max_steps"], cfg["optim"]["warmup_steps"],
                                 cfg["optim"]["final_lr_factor"])
        assert_same_lrs(logged, expected, stage)
    for stage in ("stage4-think", "stage4-instruct"):
        # SFT starts from stage 3's weights on chat data: its first step's loss is transformers' on that batch.
        check_first_sft_step(workdir, runs / stage, variant, tmp_path)
    # Every stage's checkpoint carries the run's tokenizer (the corpus's dolma2 file), so it serves alone.
    dolma2 = json.loads((REPO / "data" / "corpus" / "train" / "manifest.json").read_text())["tokenizer"]["sha256"]
    for stage in STAGES:
        name = (runs / stage / "checkpoints" / "final").read_text().strip()
        carried = (runs / stage / "checkpoints" / name / "model" / "tokenizer.json").read_bytes()
        assert hashlib.sha256(carried).hexdigest() == dolma2, stage


def test_stage_of_the_other_variant_is_refused(workdir):
    # Stage 2 of siamese_depth must not start from base weights: the stage repeats its architecture.
    if not (workdir / "runs" / "tiny" / "base" / "stage1" / "checkpoints" / "final").exists():  # when run alone
        subprocess.run([str(BINARY), "train", "--config", "reproduce/tiny/stage1.toml"], cwd=workdir, check=True, capture_output=True)
    result = subprocess.run([str(BINARY), "train", "--config", "reproduce/tiny/stage2.toml", "--set", "model.variant=siamese_depth",
                             "--set", "model.init_from=runs/tiny/base/stage1", "--set", "train.run_dir=runs/tiny/mixed"],
                            cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 1 and "variant base -> siamese_depth" in result.stderr, result.stderr
