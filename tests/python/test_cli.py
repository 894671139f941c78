"""The CLI's contracts: `info` output, `logits` file format, `init`, and clear errors for bad input
(each names the file and the field or tensor, exits 1, and prints no backtrace)."""
import json
import pathlib
import shutil

import numpy as np
import pytest
from safetensors import safe_open

from conftest import (REPO, engine_logits, hf_logits, run_cli, save_random_olmo3, tiny_olmo3_config,
                      without_startup_note)
from tolerances import forward_bound

REFERENCE = REPO / "tests" / "data"


@pytest.fixture
def model_dir(tmp_path):
    config = tiny_olmo3_config(num_key_value_heads=2)
    save_random_olmo3(config, tmp_path / "model")
    return tmp_path / "model"


def expect_error(args, *fragments):
    result = run_cli(*args, check=False)
    assert result.returncode == 1, f"exit {result.returncode}; stderr:\n{result.stderr}"
    assert without_startup_note(result.stderr).startswith("error"), result.stderr
    for f in fragments:
        assert str(f) in result.stderr, f"'{f}' not in:\n{result.stderr}"
    assert "Exception raised from" not in result.stderr  # no LibTorch backtrace for user errors
    return result.stderr


def test_logits_file_contract(model_dir, tmp_path):
    out = tmp_path / "out.safetensors"
    run_cli("logits", "--model", model_dir, "--tokens", "5 6 7", "--out", out)
    with safe_open(str(out), "np") as f:
        assert list(f.keys()) == ["logits"]
        logits = f.get_tensor("logits")
    assert logits.shape == (3, 96) and logits.dtype == np.float32


def test_bf16_logits_are_fp32_and_close(tmp_path):
    """--dtype bf16 writes fp32 logits whose error against transformers' fp32 logits is no larger than
    transformers' own bf16 error (the model cast to bf16) by more than 1.5x: both round the weights and
    activations to bf16 (8-bit mantissa), at not quite the same points (seen: ratio 0.83-1.10 over three
    seeds, errors ~0.04 on logits up to ~2.4)."""
    import torch

    model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "model")
    tokens = list(range(10, 30))
    reference = hf_logits(model, tokens)
    bf16 = engine_logits(tmp_path / "model", tokens, tmp_path, "--dtype", "bf16")
    assert bf16.dtype == np.float32
    hf_error = np.abs(hf_logits(model.to(torch.bfloat16), tokens) - reference).max()
    engine_error = np.abs(bf16 - reference).max()
    assert 0 < engine_error <= 1.5 * hf_error, (engine_error, hf_error)  # > 0: bf16 was really used


def test_info_on_published_config_without_weights(tmp_path):
    shutil.copy(REFERENCE / "archspace-1b-siamese-depth-stage4.config.json", tmp_path / "config.json")
    out = run_cli("info", tmp_path).stdout
    assert "siamese_depth" in out
    assert "[S, S, S, F] x 4" in out
    assert "yarn" in out and "ramp dims 18..35" in out and "1.20794" in out
    assert "head_dim 128" in out


def test_info_on_model(model_dir):
    out = run_cli("info", model_dir).stdout
    assert "base (model_type olmo3)" in out
    assert "GQA" in out
    assert "F32 (47 tensors)" in out


def test_info_preset():
    out = run_cli("info", "--preset", "190M").stdout
    assert "layers:             12" in out and "hidden size:        768" in out


def test_init_writes_a_model_transformers_loads(tmp_path):
    from transformers import Olmo3ForCausalLM

    run_cli("init", "--preset", "tiny", "--out", tmp_path / "m", "--seed", "3")
    model = Olmo3ForCausalLM.from_pretrained(tmp_path / "m").eval()
    tokens = [1, 2, 3, 50, 400, 7, 8, 9, 10, 11, 12]
    got = engine_logits(tmp_path / "m", tokens, tmp_path)
    assert np.abs(got - hf_logits(model, tokens)).max() <= forward_bound(model, len(tokens))


# ---- bad input ------------------------------------------------------------------------------------


def test_malformed_config_json(model_dir, tmp_path):
    (model_dir / "config.json").write_text('{"model_type": "olmo3", "hidden_size": ')
    expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x"],
                 model_dir / "config.json", "malformed JSON")


def test_missing_field(model_dir, tmp_path):
    cfg = json.loads((model_dir / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(["info", model_dir], model_dir / "config.json", "'num_hidden_layers'", "missing")


def test_inconsistent_dimensions(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (model_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(["info", model_dir], "'num_key_value_heads'", "does not divide num_attention_heads 4")


def test_weights_do_not_match_config(model_dir, tmp_path):
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (model_dir / "config.json").write_text(json.dumps(cfg))
    err = expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x"],
                       "12 mis-shaped", "model.layers.0.mlp.gate_proj.weight (file [160, 64], model [128, 64])")
    assert "model.layers.3.mlp.down_proj.weight" in err


def test_truncated_header(model_dir, tmp_path):
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x"],
                 weights, "header length", "past the end of the file")


def test_truncated_data(model_dir, tmp_path):
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x"],
                 weights, "out of bounds")


def test_missing_shard(tmp_path):
    config = tiny_olmo3_config()
    model = save_random_olmo3(config, tmp_path / "unused")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    expect_error(["logits", "--model", tmp_path / "sharded", "--tokens", "1", "--out", tmp_path / "x"],
                 "model.safetensors.index.json", shards[-1].name, "missing")


def test_sharded_checkpoint_loads(tmp_path):
    config = tiny_olmo3_config()
    model = save_random_olmo3(config, tmp_path / "unused")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    tokens = list(range(1, 15))
    got = engine_logits(tmp_path / "sharded", tokens, tmp_path)
    assert np.abs(got - hf_logits(model, tokens)).max() <= forward_bound(model, len(tokens))


def test_bf16_checkpoint_loads(tmp_path):
    import torch

    config = tiny_olmo3_config()
    model = save_random_olmo3(config, tmp_path / "fp32")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    # The bf16-rounded weights, computed in fp32 on both sides (reloaded, so RoPE buffers are fresh fp32).
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    tokens = list(range(1, 15))
    got = engine_logits(tmp_path / "bf16", tokens, tmp_path)
    assert np.abs(got - hf_logits(model, tokens)).max() <= forward_bound(model, len(tokens))


@pytest.mark.parametrize("tokens,fragment", [("1 2 96", "token id 96 is out of range [0, 96)"),
                                              ("1 -3", "token id -3 is out of range"),
                                              ("1 two 3", "'two' is not an integer"),
                                              ("  ", "no token ids")])
def test_bad_tokens(model_dir, tmp_path, tokens, fragment):
    expect_error(["logits", "--model", model_dir, "--tokens", tokens, "--out", tmp_path / "x"], "--tokens", fragment)


def test_not_a_model_directory(tmp_path):
    expect_error(["info", tmp_path / "nope"], tmp_path / "nope", "not a model directory")
    (tmp_path / "empty").mkdir()
    expect_error(["info", tmp_path / "empty"], "no config.json")


def test_unwritable_output_keeps_nothing_half_written(model_dir, tmp_path):
    out = tmp_path / "no_such_dir" / "x.safetensors"
    expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", out], "cannot open for writing")


def test_info_reads_a_config_json_file(model_dir):
    """`info` on a config.json describes the same model as on its directory (less the weights' dtype)."""
    from_dir = run_cli("info", model_dir).stdout.splitlines()
    from_file = run_cli("info", model_dir / "config.json").stdout.splitlines()
    assert [l for l in from_dir if not l.startswith("dtype:")] == [l for l in from_file if not l.startswith("dtype:")]
    assert "dtype:              F32 (" in "\n".join(from_dir)
    assert "dtype:              (a config file: no weights)" in from_file
    (model_dir / "config.json").write_text("{")
    expect_error(["info", model_dir / "config.json"], model_dir / "config.json", "malformed JSON")


def test_help_lists_every_command():
    """`archspace --help` lists each command with its line; a command file that forgot to register shows."""
    out = run_cli("--help").stdout
    commands = [line.split()[0] for line in out.split("Subcommands:")[1].strip().splitlines() if line.strip()]
    assert commands == ["info", "logits", "trace", "init", "encode", "tokenize", "train", "schedule", "sweep", "plan", "export-hf", "plot", "compare", "generate",
                        "eval", "analyze", "serve"]
    for tool in (REPO / "tools").glob("*.cpp"):
        if tool.stem not in ("main", "command"):
            assert tool.stem.replace("_", "-") in commands, f"tools/{tool.name} registers no command in --help"


@pytest.mark.parametrize("args,fragment", [
    (["--dtype", "fp8"], "unknown dtype 'fp8' (valid: fp32, bf16)"),
    (["--device", "tpu"], "unknown device 'tpu' (valid: cpu, cuda, cuda:N)"),
    (["--attention", "flash"], "--attention"),
])
def test_bad_choices_are_refused_with_the_valid_ones(model_dir, tmp_path, args, fragment):
    expect_error(["logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x", *args], fragment)


def test_bad_variant_for_init(tmp_path):
    expect_error(["init", "--preset", "tiny", "--variant", "siamese", "--out", tmp_path / "m"], "--variant", "siamese")
    expect_error(["init", "--preset", "tiny", "--depth-stride", "2", "--out", tmp_path / "m"],
                 "switches need the siamese_depth variant")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("edit,fragment", [
    ({"rms_norm_eps": 1e300}, "'rms_norm_eps' must be in (0, 0.1]"),
    ({"rms_norm_eps": 0}, "'rms_norm_eps' must be in (0, 0.1]"),
    ({"eos_token_id": 96}, "'eos_token_id' is 96, outside the vocabulary [0, 96)"),
    ({"pad_token_id": -1}, "'pad_token_id' is -1, outside the vocabulary"),
    ({"num_hidden_layers": 10000000, "layer_types": None}, "'num_hidden_layers' is 10000000; at most 4096"),
    ({"hidden_size": 1e300}, "'hidden_size' must be an integer"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                          "attention_factor": 1e300}}, "'rope_scaling.attention_factor' must be in (0, 10]"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                          "attention_factor": 0}}, "'rope_scaling.attention_factor' must be in (0, 10]"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                          "beta_fast": 1.0, "beta_slow": 32.0}}, "'rope_scaling.beta_fast' must be finite and greater than beta_slow"),
])
def test_implausible_config_values_are_refused(model_dir, edit, fragment):
    """Values that used to be accepted and then computed nonsense (or ran for minutes) name the field and range."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(edit)
    (model_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(["info", model_dir], model_dir / "config.json", fragment)


def test_a_misspelled_config_key_warns(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["sliding_windw"] = 3
    cfg["some_hf_field_we_ignore"] = 1
    (model_dir / "config.json").write_text(json.dumps(cfg))
    err = run_cli("info", model_dir).stderr
    assert "unknown key 'sliding_windw' (did you mean 'sliding_window'?" in err
    assert "some_hf_field_we_ignore" not in err


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_weights_are_refused_naming_the_tensor(model_dir, tmp_path, value):
    """A NaN or Inf weight used to load silently (generate then printed nothing and exited 0)."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    weights["model.layers.2.mlp.up_proj.weight"][3, 5] = value
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    expect_error(["logits", "--model", model_dir, "--tokens", "1 2", "--out", tmp_path / "x"],
                 "model.safetensors", "'model.layers.2.mlp.up_proj.weight'", "--allow-nonfinite")
    run_cli("logits", "--model", model_dir, "--tokens", "1 2", "--out", tmp_path / "x", "--allow-nonfinite")
    assert not np.isfinite(load_file(str(tmp_path / "x"))["logits"]).all()


@pytest.mark.parametrize("args", [
    ["encode", "--file", "{d}"],
    ["train", "--config", "{d}"],
    ["encode", "--tokenizer", "dolma2", "--messages", "{d}"],
])
def test_a_directory_given_as_a_file_is_named(tmp_path, args):
    """A directory where a file belongs used to end in iostream's 'basic_filebuf::underflow'."""
    (tmp_path / "x.jsonl").mkdir()
    err = expect_error([a.format(d=tmp_path / "x.jsonl") for a in args], "is a directory")
    assert "basic_filebuf" not in err


def test_more_tokens_than_the_model_has_positions(tmp_path):
    save_random_olmo3(tiny_olmo3_config(max_position_embeddings=8), tmp_path / "m")
    run_cli("logits", "--model", tmp_path / "m", "--tokens", " ".join(["5"] * 8), "--out", tmp_path / "ok")
    expect_error(["logits", "--model", tmp_path / "m", "--tokens", " ".join(["5"] * 9), "--out", tmp_path / "x"],
                 "9 positions", "max_position_embeddings 8")


def test_tokenize_refuses_a_negative_shard_size(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    expect_error(["tokenize", "--out", tmp_path / "s", "--shard-tokens", "-1", tmp_path / "a.txt"], "--shard-tokens")
    assert not (tmp_path / "s").exists()


# ---- habits of other tools (tools/command.h normalize_flags) ---------------------------------------------

def test_an_unknown_flag_names_the_nearest_one(model_dir, tmp_path):
    err = expect_error(("logits", "--model", model_dir, "--tokens", "1 2", "--outt", tmp_path / "x"),
                       "unknown flag --outt for `archspace logits` (did you mean --out?)")
    assert "The following arguments were not expected" not in err and "error: error:" not in err
    # Near a synonym: suggested as our flag.
    expect_error(("eval", "downstream", "--model", model_dir, "--tasks", "arc_easy", "--num_fewshots", "1"),
                 "unknown flag --num_fewshots for `archspace eval downstream` (did you mean --shots?)")
    # Far from everything: no guess.
    err = expect_error(("logits", "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x", "--zzzzzzzz"),
                       "unknown flag --zzzzzzzz for `archspace logits`")
    assert "did you mean" not in err
    # A flag that means something else here gets a hint instead.
    expect_error(("logits", "--model_args", f"pretrained={model_dir}", "--tokens", "1", "--out", tmp_path / "x"),
                 "lm-eval's --model_args", "give the model as --model PATH")


def test_other_tools_spellings_and_a_positional_model_are_read_as_ours(model_dir, tmp_path):
    """transformers' --model_name_or_path, lm-eval's --output_path, underscores for dashes and the model given
    positionally all run the same command as the canonical flags: the same logits file."""
    tokens = "3 1 4 1 5"
    run_cli("logits", "--model", model_dir, "--tokens", tokens, "--out", tmp_path / "canonical.safetensors")
    variants = {
        "hf": ("--model_name_or_path", model_dir, "--tokens", tokens, "--output_path", tmp_path / "hf.safetensors"),
        "path": ("--model_path", model_dir, "--tokens", tokens, "--out", tmp_path / "path.safetensors"),
        "positional": (model_dir, "--tokens", tokens, "--out", tmp_path / "positional.safetensors"),
        "eq": (model_dir, f"--tokens={tokens}", f"--output_path={tmp_path / 'eq.safetensors'}"),
    }
    canonical = (tmp_path / "canonical.safetensors").read_bytes()
    for name, args in variants.items():
        run_cli("logits", *args)
        assert (tmp_path / f"{name}.safetensors").read_bytes() == canonical, name
    expect_error(("logits", model_dir, "--model", model_dir, "--tokens", "1", "--out", tmp_path / "x"),
                 "excludes")
    expect_error(("logits", "--tokens", "1", "--out", tmp_path / "x"), "MODEL (or --model MODEL) is required")


@pytest.mark.parametrize("command", ["generate", "eval ppl", "eval downstream", "trace", "logits", "analyze",
                                     "info", "export-hf"])
def test_every_model_command_takes_the_model_both_ways(command):
    """--help of each command that runs a model shows it positionally and as --model."""
    out = run_cli(*command.split(), "--help").stdout
    assert "--model" in out, out
    assert any(word in out for word in ("MODEL", "MODEL_DIR", "CHECKPOINT")), out


def test_set_that_conflicts_with_the_file_names_the_override_both_values_and_the_fix():
    """The issue's case: reproduce/demo.toml has optim.warmup_steps = 20; --set train.max_steps=10 is blamed,
    with both values and the override that fixes it (which then loads: it fails later, at the data)."""
    err = expect_error(("train", "--config", REPO / "reproduce" / "demo.toml", "--set", "train.max_steps=10"),
                       "--set train.max_steps=10 conflicts with ", "demo.toml's optim.warmup_steps = 20",
                       "optim.warmup_steps = 20, train.max_steps = 10", "--set optim.warmup_steps=1 (any value <= 10)")
    assert err.count("error") == 1, err


def test_lm_eval_and_vllm_flag_names_reach_the_command(tmp_path):
    """lm-eval's --num_fewshot is --shots (asking for 3 shots names the missing rc_3shot files); vLLM's
    --max_tokens is generate's --max-new-tokens (the same greedy text, 3 tokens decoded)."""
    from test_tokenizer import DOLMA2

    run_cli("init", "--preset", "micro", "--out", tmp_path / "m")
    expect_error(("eval", "downstream", tmp_path / "m", "--tasks", "arc_easy", "--num_fewshot", "3", "--limit", "1"),
                 "task arc_easy: no rc_3shot files")
    common = ("generate", tmp_path / "m", "--tokenizer", DOLMA2, "--prompt", "Hi there", "--temperature", "0")
    vllm = run_cli(*common, "--max_tokens", "3")
    ours = run_cli(*common, "--max-new-tokens", "3")
    assert vllm.stdout == ours.stdout and "decode 3 tokens" in vllm.stderr, vllm.stderr
