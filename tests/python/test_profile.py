"""Profiling (issue 25 item 3): `train.profile_steps = [a, b]` and `--profile FILE` on generate and eval write a
Kineto trace in the Chrome trace format and a table of the ops by self time. The trace is read back by
TensorBoard's PyTorch profiler plugin (torch-tb-profiler's own parser), whose per-op self times must equal the
table's; the spans the engine adds (train_step, optimizer_step, prefill, decode_step, streaming_linear) appear
once per step; profiling does not change the numbers."""
import json
import re
import shutil

import numpy as np
import pytest

from conftest import run_cli, save_random_olmo3, tiny_olmo3_config
from test_tokenizer import DOLMA2
from test_train import VOCAB, write_shards, write_toml

SEQ = 16


def chrome_events(path):
    """The trace's events, checked against the Chrome trace format (what Perfetto and chrome://tracing read):
    a traceEvents list whose complete events ("X") carry a name, a pid, a tid, a start and a duration."""
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete, "no complete events"
    for e in complete:
        assert isinstance(e["name"], str) and "pid" in e and "tid" in e
        assert float(e["ts"]) >= 0 and float(e["dur"]) >= 0
    return complete


def count(events, name):
    return sum(e["name"] == name for e in events)


def table_rows(path):
    """name -> (calls, self ms) from a .top-ops.txt table."""
    rows = {}
    for line in path.read_text().splitlines()[1:-1]:
        m = re.match(r"(.+?)\s+(\d+)\s+([\d.]+)\s+[\d.]+%\s+[\d.]+$", line)
        rows[m.group(1)] = (int(m.group(2)), float(m.group(3)))
    return rows


def plugin_rounding_terms(data):
    """op name -> how many float64 durations the plugin's self time of that op adds up, and the largest time stamp.
    The plugin turns each event into end = ts + dur in float64 microseconds; ts counts from the profiler's clock
    origin (hours or days of uptime), so each end_time - start_time it subtracts carries up to half an ulp of the
    largest time stamp. A node's self time is its duration minus each child's and runtime's duration."""
    from torch_tb_profiler.profiler.node import OperatorNode

    terms, largest = {}, 0.0
    stack = list(data.tid2tree.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.end_time is not None:
            largest = max(largest, abs(node.end_time), abs(node.start_time))
        if isinstance(node, OperatorNode):
            terms[node.name] = terms.get(node.name, 0) + 1 + len(node.children) + len(node.runtimes)
    return terms, largest


def expect_tensorboard_reads(trace_path, tmp_path):
    """torch-tb-profiler (TensorBoard's PyTorch profiler plugin) parses the trace, and its self time per op equals
    the table's. The table computes in integer nanoseconds and prints 3 decimals (0.0005 ms of rounding); the plugin
    sums float64 differences of time stamps, each within half an ulp of the largest stamp (plugin_rounding_terms)."""
    from torch_tb_profiler.profiler.data import RunProfileData

    data = RunProfileData.parse("rank0", "1", str(trace_path), str(tmp_path / "tb-cache"))
    data.process()
    data.analyze()
    tensorboard = {op.name: op.self_host_duration / 1000 for op in data.op_list_groupby_name}
    terms, largest_us = plugin_rounding_terms(data)
    half_ulp_ms = float(np.spacing(largest_us)) / 2 / 1000
    rows = table_rows(trace_path.parent / (trace_path.name + ".top-ops.txt"))
    compared = 0
    for name, (_, self_ms) in rows.items():
        if name.endswith("...") or not name.startswith("aten::"):
            continue  # names cut to fit the column; the engine's spans, which the plugin keeps apart from ops
        assert name in tensorboard, name
        # (+ 1e-9 relative: the float64 sums over calls, each within 2^-53 of its value)
        bound = 0.0005 + terms[name] * half_ulp_ms + 1e-9 * self_ms
        assert abs(tensorboard[name] - self_ms) <= bound, (name, tensorboard[name], self_ms, bound)
        compared += 1
    assert compared >= 5, rows


@pytest.fixture
def train_setup(tmp_path):
    rng = np.random.default_rng(0)
    write_shards(tmp_path / "shards", rng.integers(2, VOCAB, 8 * 4 * SEQ))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    return tmp_path


def train_sections(tmp_path, run, **train):
    return {
        "model": {"init_from": str(tmp_path / "init")},
        "data": {"train": str(tmp_path / "shards"), "shuffle": False},
        "train": {"run_dir": str(tmp_path / run), "sequence_length": SEQ, "micro_batch": 2, "grad_accum": 2,
                  "max_steps": 5, "seed": 0, "threads": 2, **train},
        "optim": {"lr": 1e-2, "warmup_steps": 0},
    }


def losses(run_dir):
    return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss" in l]


def test_training_steps_are_profiled_and_unchanged(train_setup, tmp_path):
    result = run_cli("train", "--config", write_toml(tmp_path / "p.toml", train_sections(tmp_path, "p", profile_steps=[2, 3])))
    trace = tmp_path / "p" / "profile" / "steps-2-3" / "rank0.pt.trace.json"
    assert trace.exists(), result.stderr
    events = chrome_events(trace)
    assert count(events, "archspace::train_step") == 2  # steps 2 and 3, not the others
    assert count(events, "archspace::optimizer_step") == 2
    assert count(events, "aten::mm") > 0 and count(events, "autograd::engine::evaluate_function: MmBackward0") > 0
    assert "op (by self time)" in result.stderr and str(trace) in result.stderr
    # What tracing cost: the traced steps' time and page faults beside the untraced step before them.
    assert re.search(r"page faults\n", result.stderr), result.stderr
    assert re.search(r"traced steps 2-3: [\d.]+ s and \d+ page faults a step \(median\); the 1 untraced step before "
                     r"them: [\d.]+ s and \d+ page faults", result.stderr), result.stderr
    expect_tensorboard_reads(trace, tmp_path)
    # The same run without the profiler: the same losses, bit for bit (the profiler only observes).
    run_cli("train", "--config", write_toml(tmp_path / "q.toml", train_sections(tmp_path, "q")))
    assert losses(tmp_path / "p") == losses(tmp_path / "q")
    assert not (tmp_path / "q" / "profile").exists()


@pytest.mark.parametrize("value,fragment", [
    ([3, 2], "1 <= first <= last"),
    ([0, 2], "1 <= first <= last"),
    ([2], "[first, last]"),
    ("2-3", "must be a list of integers"),
])
def test_bad_profile_steps_are_refused(train_setup, tmp_path, value, fragment):
    result = run_cli("train", "--config", write_toml(tmp_path / "bad.toml", train_sections(tmp_path, "bad", profile_steps=value)),
                     check=False)
    assert result.returncode == 1 and "train.profile_steps" in result.stderr and fragment in result.stderr, result.stderr


def test_profile_steps_can_be_set_from_the_command_line(train_setup, tmp_path):
    run_cli("train", "--config", write_toml(tmp_path / "s.toml", train_sections(tmp_path, "s", max_steps=2)),
            "--set", "train.profile_steps=2,2")
    assert count(chrome_events(tmp_path / "s" / "profile" / "steps-2-2" / "rank0.pt.trace.json"),
                 "archspace::train_step") == 1


@pytest.fixture
def model_dir(tmp_path):
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), tmp_path / "m")
    shutil.copy(DOLMA2, tmp_path / "m" / "tokenizer.json")
    return tmp_path / "m"


def test_generate_profile_has_one_span_per_decode_step(model_dir, tmp_path):
    trace = tmp_path / "prof" / "generate.pt.trace.json"
    result = run_cli("generate", "--model", model_dir, "--prompt-tokens", "300 301 302 303", "--max-new-tokens", 6,
                     "--profile", trace)
    events = chrome_events(trace)
    tokens = int(re.search(r"decode (\d+) tokens", result.stderr).group(1))
    assert tokens == 6
    # The first token comes from the prefill; each further one from one decode forward.
    assert count(events, "archspace::prefill") == 1
    assert count(events, "archspace::decode_step") == tokens - 1
    # The engine's own GEMV (not an ATen op) is named: per layer q/k/v (one call), o, gate/up (one call) and down,
    # and the head, in each forward (the 4-token prefill takes it too: it has few rows). 0 where the CPU has no AVX2.
    layers = tiny_olmo3_config().num_hidden_layers
    assert count(events, "archspace::streaming_linear") in (0, tokens * (4 * layers + 1))
    expect_tensorboard_reads(trace, tmp_path)


def test_eval_ppl_profile(model_dir, tmp_path):
    (tmp_path / "a.txt").write_text("The profile of an evaluation, written where it was asked for. " * 8)
    trace = tmp_path / "ppl.pt.trace.json"
    out = json.loads(run_cli("eval", "ppl", "--model", model_dir, "--data", tmp_path / "a.txt", "--context", 32,
                             "--profile", trace).stdout)
    assert out["scored_tokens"] > 0
    assert count(chrome_events(trace), "aten::log_softmax") + count(chrome_events(trace), "aten::cross_entropy_loss") > 0


def test_unwritable_profile_path_fails_before_the_work(model_dir, tmp_path):
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file" / "t.json", tmp_path):
        result = run_cli("generate", "--model", model_dir, "--prompt-tokens", "300 301", "--max-new-tokens", 2,
                         "--profile", bad, check=False)
        assert result.returncode != 0 and "--profile" in result.stderr and "decode" not in result.stderr, result.stderr


def test_eval_downstream_profile_sees_the_scheduler_thread(model_dir, tmp_path):
    """Generation tasks decode on the scheduler's own thread: the trace holds its spans and ops too."""
    trace = tmp_path / "ds.pt.trace.json"
    run_cli("eval", "downstream", "--model", model_dir, "--tasks", "gsm8k", "--limit", 2, "--batch-size", 2,
            "--profile", trace)
    events = chrome_events(trace)
    assert count(events, "archspace::decode_step") > 0 and count(events, "archspace::prefill") == 2
    threads = {e["tid"] for e in events if e["name"] == "archspace::decode_step"}
    assert threads and all(e["tid"] in threads for e in events if e["name"] == "archspace::prefill")
