"""`archspace plan`: the per-rank memory figures, their JSON form, and errors that name the flag."""
import json

from conftest import run_cli, without_startup_note


def expect_error(args, *fragments):
    result = run_cli(*args, check=False)
    assert result.returncode == 1, f"exit {result.returncode}; stderr:\n{result.stderr}"
    assert without_startup_note(result.stderr).startswith("error"), result.stderr
    for f in fragments:
        assert f in result.stderr, f"'{f}' not in:\n{result.stderr}"


def test_plan_prints_every_figure():
    out = run_cli("plan", "--preset", "7B", "--world", "64", "--sequence-length", "8192", "--micro-batch", "1").stdout
    for label in ("parameters:", "tokens per step:", "gradients", "optimizer state", "autocast weights",
                  "activations", "head and loss", "total"):
        assert label in out, f"'{label}' not in:\n{out}"
    assert "524288" in out  # tokens per step: 1 x 1 x 64 x 8192


def test_plan_json_is_consistent():
    args = ["plan", "--preset", "1B", "--variant", "siamese_depth", "--world", "8", "--sequence-length", "8192",
            "--grad-accum", "4", "--json"]
    plan = json.loads(run_cli(*args).stdout)
    b, p = plan["bytes"], plan["parameter_count"]
    assert plan["variant"] == "siamese_depth"
    assert plan["tokens_per_step"] == 1 * 4 * 8 * 8192
    assert b["parameters"] == 4 * p and b["gradients"] == 4 * p and b["optimizer_state"] == 8 * p
    assert b["total"] == sum(b[k] for k in ("parameters", "gradients", "optimizer_state", "autocast_weights",
                                            "activations"))
    a = plan["activation_bytes"]
    assert b["activations"] == a["layers"] + a["head_and_loss"] + a["rope_tables"]
    assert a["depth_attention"] > 0

    sharded = json.loads(run_cli(*args, "--shard-optimizer").stdout)["bytes"]
    assert sharded["optimizer_state"] == -(-8 * p // 8)
    fp32 = json.loads(run_cli(*args, "--dtype", "fp32").stdout)["bytes"]
    assert fp32["autocast_weights"] == 0
    ckpt = json.loads(run_cli(*args, "--activation-checkpointing").stdout)["bytes"]
    assert ckpt["activations"] < b["activations"]


def test_plan_from_a_config_file(tmp_path):
    info = json.loads(run_cli("plan", "--preset", "tiny", "--sequence-length", "16", "--json").stdout)
    run_cli("init", "--preset", "tiny", "--out", tmp_path / "m")
    from_file = json.loads(run_cli("plan", "--config", tmp_path / "m" / "config.json", "--sequence-length", "16",
                                   "--json").stdout)
    assert from_file["bytes"] == info["bytes"]


def test_plan_bad_input_names_the_flag():
    base = ["plan", "--preset", "1B", "--sequence-length", "8192"]
    expect_error([*base, "--world", "0"], "--world")
    expect_error([*base, "--micro-batch", "0"], "--micro-batch")
    expect_error([*base, "--grad-accum", "-2"], "--grad-accum")
    expect_error(["plan", "--preset", "1B", "--sequence-length", "0"], "--sequence-length")
    expect_error(["plan", "--preset", "nope", "--sequence-length", "8"], "--preset")
    expect_error([*base, "--dtype", "fp8"], "--dtype")
    expect_error([*base, "--variant", "other"], "--variant")
    expect_error(["plan", "--sequence-length", "8"], "--preset")


def plan_json(*args):
    return json.loads(run_cli("plan", *args, "--json").stdout)


def test_gpu_memory_verdict_margin_and_the_cheapest_change_that_fits():
    """--gpu-memory: fits or not with the margin (capacity - total), and for a plan that does not fit the first
    change in the documented order (ZeRO-1, activation checkpointing, smaller micro-batch, more ranks) whose own
    plan, asked of `plan` itself, fits, while the cheaper ones' plans do not."""
    GiB = 1 << 30
    base = {"--preset": "7B", "--sequence-length": "4096", "--micro-batch": "8", "--world": "8"}

    def args(options, *flags):
        return [w for k, v in options.items() for w in (k, v)] + list(flags)

    total = plan_json(*args(base))["bytes"]["total"]
    roomy = plan_json(*args(base), "--gpu-memory", f"{total // GiB + 1}GiB")["fit"]
    assert roomy["fits"] and roomy["margin"] == (total // GiB + 1) * GiB - total
    assert "fits in" in run_cli("plan", *args(base), "--gpu-memory", f"{total // GiB + 1}GiB").stdout
    text = run_cli("plan", *args(base), "--gpu-memory", "80GiB").stdout
    verdict = plan_json(*args(base), "--gpu-memory", "80GiB")["fit"]
    assert verdict["gpu_memory"] == 80 * GiB and verdict["margin"] == 80 * GiB - total
    assert not verdict["fits"] and "does not fit in 80.00 GiB per rank" in text, text
    change = verdict["change"]
    assert change and f"cheapest change that fits: {change}" in text
    # The change applied: its plan fits, with the total the verdict gave.
    words, changed, flags = change.split(), dict(base), []
    while words:
        w = words.pop(0)
        if words and not words[0].startswith("--"):
            changed[w] = words.pop(0)
        else:
            flags.append(w)
    applied = plan_json(*args(changed, *flags), "--gpu-memory", "80GiB")["fit"]
    assert applied["fits"] and verdict["changed_total"] == 80 * GiB - applied["margin"]
    # Cheaper changes (earlier in the order) do not fit.
    for cheaper in (["--shard-optimizer"], ["--shard-optimizer", "--activation-checkpointing"]):
        if cheaper != flags or changed != base:
            assert not plan_json(*args(base, *cheaper), "--gpu-memory", "80GiB")["fit"]["fits"], cheaper
    # Units as nvidia-smi and vendors write them; bad ones name the flag.
    assert plan_json(*args(base), "--gpu-memory", "81920MiB")["fit"]["gpu_memory"] == 80 * GiB
    assert plan_json(*args(base), "--gpu-memory", "80 GB")["fit"]["gpu_memory"] == 80 * GiB
    expect_error(["plan", *args(base), "--gpu-memory", "eighty"], "--gpu-memory", "not a memory size")
    # Nothing fits: said.
    assert "no change the plan models fits" in run_cli("plan", *args(base), "--gpu-memory", "1GiB").stdout


def test_plan_counts_one_chunk_of_the_loss():
    """The head and loss row with train.loss_chunk_tokens' default (1024) against --loss-chunk-tokens 0: the
    unchunked row holds the logits [T, V] (bf16 and fp32), the chunked one chunk's working set, so the two
    differ by more than the fp32 logits of the T - 1024 other positions. On CUDA (plan's default device) the
    chunked form's matmuls run on the head padded to 100,352 rows (model/loss.h): its chunks are that wide, and
    the padded bf16 copy of the weight is counted."""
    base = ["--preset", "1B", "--sequence-length", "65536"]
    chunked, whole = plan_json(*base), plan_json(*base, "--loss-chunk-tokens", "0")
    V, Vp, T, d = 100278, 100352, 65536, 2048
    a, b = chunked["activation_bytes"], whole["activation_bytes"]
    assert chunked["options"]["loss_chunk_tokens"] == 1024 and whole["options"]["loss_chunk_tokens"] == 0
    assert a["loss_chunk"] == max(8 * 1024 * Vp, 2 * 1024 * Vp + 2 * Vp * d) and b["loss_chunk"] == 0
    assert b["head_and_loss"] - a["head_and_loss"] > (T - 1024) * V * 4
    assert whole["bytes"]["total"] - chunked["bytes"]["total"] == b["head_and_loss"] - a["head_and_loss"]
    assert "one chunk of 1024 tokens" in run_cli("plan", *base).stdout
    cpu = plan_json(*base, "--device", "cpu")["activation_bytes"]
    assert cpu["loss_chunk"] == max(8 * 1024 * V, 2 * 1024 * V + 2 * V * d)
    assert a["head_and_loss"] - cpu["head_and_loss"] == 2 * Vp * d + a["loss_chunk"] - cpu["loss_chunk"]
    # A micro-batch of at most one chunk keeps that chunk's bf16 logits for backward, without the unchunked form's
    # fp32 copy (4 bytes a logit) and label mask, at the cost of the bf16 [V, d] weight-gradient product (the
    # CPU's figures: no padding there).
    short = ["--preset", "1B", "--sequence-length", "1024", "--device", "cpu"]
    one, whole = plan_json(*short)["activation_bytes"], plan_json(*short, "--loss-chunk-tokens", "0")["activation_bytes"]
    assert one["loss_chunk"] == 2 * V * d
    assert whole["head_and_loss"] - one["head_and_loss"] >= 1024 * V * 4 - 2 * V * d
    expect_error(["plan", *base, "--loss-chunk-tokens", "-1"], "--loss-chunk-tokens")


def test_plan_models_fsdp_and_hsdp():
    """--sharding full divides weights, gradients and AdamW state by the shard group (--world, or world /
    --replicate-groups under HSDP), each unit's flat groups padded to a multiple of it (less than one element per
    group and rank); it keeps no autocast copies (bf16 matmul weights arrive per unit) and adds one gathered unit
    with the whole gradients autograd forms for it, plus 2 fp32 gradient buffers being reduce-scattered with their
    1/S outputs (the 1B's largest units are the embedding and the head, [V, d]; tests/unit/test_plan_sharded.cpp
    measures these on CPU ranks); the activations are those of the unsharded run."""
    base = ["--preset", "1B", "--sequence-length", "8192", "--world", "8", "--activation-checkpointing"]
    none, full = plan_json(*base), plan_json(*base, "--sharding", "full")
    hsdp = plan_json(*base, "--sharding", "full", "--replicate-groups", "2")
    P, L, V, d = none["parameter_count"], 16, 100278, 2048
    groups = 1 + 2 * L + 1  # the embedding; per block the matmul weights and the rest; the head
    for plan, S in ((full, 8), (hsdp, 4)):
        b = plan["bytes"]
        assert 4 * P / S <= b["parameters"] < 4 * (P / S + groups), (S, b)
        assert b["gradients"] == b["parameters"] and b["optimizer_state"] == 2 * b["parameters"]
        assert b["autocast_weights"] == 0
        head = 4 * V * d * (2 + 2 + 2 / S)  # the head gathered and its gradient; it and the embedding reducing
        assert head <= b["sharding_buffers"] < 1.001 * head, (S, b)
        assert plan["activation_bytes"] == none["activation_bytes"]
        assert b["total"] == sum(b[k] for k in ("parameters", "gradients", "optimizer_state", "sharding_buffers",
                                                 "activations"))
    assert hsdp["options"]["replicate_groups"] == 2 and full["options"]["sharding"] == "full"
    assert full["bytes"]["total"] < 0.5 * none["bytes"]["total"]
    assert "FSDP over 4 ranks x 2 replicas (HSDP)" in run_cli("plan", *base, "--sharding", "full",
                                                              "--replicate-groups", "2").stdout
    # ZeRO-1 is --sharding optimizer.
    assert plan_json(*base, "--sharding", "optimizer")["bytes"] == plan_json(*base, "--shard-optimizer")["bytes"]
    expect_error(["plan", *base, "--replicate-groups", "3", "--sharding", "full"], "--replicate-groups 3",
                 "does not divide --world 8")
    expect_error(["plan", *base, "--replicate-groups", "2"], "--replicate-groups 2", "--sharding full")
    expect_error(["plan", *base, "--shard-optimizer", "--sharding", "full"], "--shard-optimizer", "conflicts")
    expect_error(["plan", *base, "--sharding", "zero3"], "--sharding")


def test_plan_context_parallel():
    """--context-parallel 8 over --world 8 (one data-parallel rank): tokens per step count the data-parallel ranks, the
    activations are one slice's (8,192 of 65,536 positions) plus the keys and values it reads from the others: at the
    1B's 4 full layers the 57,344 other positions, at its 12 sliding ones the window's 4,095 (bf16, k and v, kv width
    2,048). tests/unit/test_plan.cpp checks the slice's account against the counting allocator."""
    base = ["--preset", "1B", "--sequence-length", "65536", "--world", "8"]
    whole, cp = plan_json(*base, "--activation-checkpointing"), plan_json(*base, "--activation-checkpointing",
                                                                          "--context-parallel", "8")
    assert whole["tokens_per_step"] == 8 * 65536 and cp["tokens_per_step"] == 65536
    assert cp["options"]["context_parallel"] == 8
    assert cp["bytes"]["activations"] < whole["bytes"]["activations"] / 4
    assert cp["bytes"]["parameters"] == whole["bytes"]["parameters"]
    keys = plan_json(*base, "--context-parallel", "8")["activation_bytes"]["context_keys"]
    assert keys == 2 * 2 * 2048 * (4 * (65536 - 8192) + 12 * 4095)
    text = run_cli("plan", *base, "--context-parallel", "8").stdout
    assert "world 8 (1 data-parallel x 8 context-parallel)" in text and "other slices' keys/values" in text, text
    expect_error(["plan", *base, "--context-parallel", "3"], "--context-parallel 3", "--world 8")
    expect_error(["plan", "--preset", "1B", "--sequence-length", "1004", "--world", "8", "--context-parallel", "8"],
                 "--sequence-length 1004")
    expect_error(["plan", *base, "--context-parallel", "0"], "--context-parallel")
    # Folded into FSDP's shard group: the state of "--sharding full" over all 8 ranks, the activations of a slice.
    both = plan_json(*base, "--activation-checkpointing", "--context-parallel", "8", "--sharding", "full")["bytes"]
    full = plan_json(*base, "--activation-checkpointing", "--sharding", "full")["bytes"]
    assert both["activations"] == cp["bytes"]["activations"]
    assert all(both[k] == full[k] for k in ("parameters", "gradients", "optimizer_state", "sharding_buffers"))
    expect_error(["plan", *base, "--context-parallel", "8", "--document-masking"], "--context-parallel 8",
                 "--document-masking: not supported together")


def test_plan_fused_kernels():
    """--fused-kernels (train.fused_kernels): the norms keep their inputs and an fp32 rstd a row, the SwiGLU its gate
    and up, so only the activations shrink; it combines with --fp8 and --dtype fp32, and the text names it.
    tests/unit/test_plan.cpp checks the account against the counting allocator."""
    base = ["--preset", "1B", "--sequence-length", "4096", "--micro-batch", "4"]
    for extra in ([], ["--fp8"], ["--dtype", "fp32"], ["--variant", "siamese_depth"]):
        composite, fused = plan_json(*base, *extra), plan_json(*base, *extra, "--fused-kernels")
        assert composite["options"]["fused_kernels"] is False and fused["options"]["fused_kernels"] is True
        assert fused["bytes"]["activations"] < composite["bytes"]["activations"], extra
        assert all(fused["bytes"][k] == composite["bytes"][k]
                   for k in ("parameters", "gradients", "optimizer_state", "autocast_weights"))
    assert "fused training kernels" in run_cli("plan", *base, "--fused-kernels").stdout
