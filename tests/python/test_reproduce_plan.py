"""reproduce/olmo3-3b and reproduce/olmo3-7b: the seeds' four stages at the larger sizes, each checked by `archspace
plan` for one node of 8 x 80 GB GPUs (both variants), against the 1B stages they scale up, and loaded as `train`
would load them (sweep --dry-run)."""
import json
import subprocess
import tomllib

import pytest
from conftest import BINARY, REPO, run_cli

GiB = 1 << 30
NODE_RANKS = 8
GPU_MEMORY = "80GiB"
# plan counts tensors only; the CUDA context, NCCL's buffers and the allocator's fragmentation need a few GiB more.
SPARE = 8 * GiB
STAGES = ("stage1", "stage2", "stage3", "stage4-instruct", "stage4-think")
SIZES = {"olmo3-3b": "3B", "olmo3-7b": "7B"}
VARIANTS = ("base", "siamese_depth")


def load(size, stage):
    return tomllib.loads((REPO / "reproduce" / size / f"{stage}.toml").read_text())


def plan_args(config, variant):
    """The plan flags that the config's [model] and [train] tables amount to on one node."""
    train = config["train"]
    args = ["plan", "--preset", config["model"]["preset"], "--variant", variant, "--world", str(NODE_RANKS),
            "--sequence-length", str(train["sequence_length"]), "--micro-batch", str(train["micro_batch"]),
            "--grad-accum", str(train["grad_accum"]), "--sharding", train.get("sharding", "none"),
            "--context-parallel", str(train.get("context_parallel", 1)), "--dtype", train["dtype"],
            "--device", train["device"], "--gpu-memory", GPU_MEMORY, "--json"]
    if train.get("activation_checkpointing", False):
        args.append("--activation-checkpointing")
    if train.get("document_masking", False):
        args.append("--document-masking")
    if "loss_chunk_tokens" in train:
        args += ["--loss-chunk-tokens", str(train["loss_chunk_tokens"])]
    if not train.get("reduce_each_micro_batch", True):
        args.append("--reduce-once-per-step")
    return args


def test_each_size_has_the_four_stages():
    one_b = sorted(p.name for p in (REPO / "reproduce" / "olmo3-1b").glob("*.toml"))
    assert one_b == sorted(f"{s}.toml" for s in STAGES)
    for size in SIZES:
        assert sorted(p.name for p in (REPO / "reproduce" / size).glob("*.toml")) == one_b, size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("stage", STAGES)
def test_stage_fits_one_node_for_both_variants(size, stage):
    """plan on the config's shape: it fits 80 GiB per rank with SPARE left, and a step holds the tokens of the 1B
    stage's step (its micro-batch x grad_accum x sequence length on one rank), so the stages keep SPEC.md's token
    counts; the recipe (steps, optimizer, data, RoPE) is the 1B stage's, with the preset and run paths changed."""
    config, one_b = load(size, stage), load("olmo3-1b", stage)
    assert config["model"]["preset"] == SIZES[size]
    b = one_b["train"]
    for variant in VARIANTS:
        plan = json.loads(run_cli(*plan_args(config, variant)).stdout)
        fit = plan["fit"]
        assert plan["variant"] == variant
        assert fit["gpu_memory"] == 80 * GiB
        assert fit["fits"] and fit["margin"] >= SPARE, (size, stage, variant, fit)
        assert plan["tokens_per_step"] == b["micro_batch"] * b["grad_accum"] * b["sequence_length"], plan
        assert plan["options"]["sharding"] == config["train"].get("sharding", "none")
    for table in ("optim", "checkpoint", "eval"):
        assert config[table] == one_b[table], table
    assert config["data"] == one_b["data"]
    model = {k: v for k, v in config["model"].items() if k not in ("preset", "init_from")}
    assert model == {k: v for k, v in one_b["model"].items() if k not in ("preset", "init_from")}
    same = {k: v for k, v in b.items() if k not in ("run_dir", "micro_batch", "grad_accum")}
    assert {k: config["train"][k] for k in same} == same
    assert config["train"]["run_dir"] == b["run_dir"].replace("olmo3-1b", size)
    if "init_from" in one_b["model"]:
        assert config["model"]["init_from"] == one_b["model"]["init_from"].replace("olmo3-1b", size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("stage", STAGES)
def test_stage_loads_as_train_would(size, stage, tmp_path):
    """sweep --dry-run loads each variant's config as train does (keys, values, sharding with context parallelism),
    its data paths made to exist in a scratch directory."""
    config = load(size, stage)
    data = config["data"]
    paths = [p for s in data.get("sources", []) for p in s.get("paths", [s.get("path")])]
    paths += [data[k] for k in ("train", "valid") if k in data]
    for p in paths:
        target = tmp_path / p
        if target.suffix == ".jsonl":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
        else:
            target.mkdir(parents=True, exist_ok=True)
    (tmp_path / "reproduce").symlink_to(REPO / "reproduce")
    result = subprocess.run([str(BINARY), "sweep", "--config", f"reproduce/{size}/{stage}.toml", "--grid",
                             "model.variant=" + ",".join(VARIANTS), "--dry-run"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    for variant in VARIANTS:
        assert f"variant={variant}" in result.stdout + result.stderr
