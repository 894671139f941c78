"""`archspace plan`: the per-rank memory figures, their JSON form, and errors that name the flag."""
import json

from conftest import run_cli


def expect_error(args, *fragments):
    result = run_cli(*args, check=False)
    assert result.returncode == 1, f"exit {result.returncode}; stderr:\n{result.stderr}"
    assert result.stderr.startswith("error"), result.stderr
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
