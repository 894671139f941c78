"""README.md's five-minute tour, run as written, and every relative link of README.md and docs/*.md.

The tour's blocks come from scripts/readme_tour.py (the same extraction `make demo` prints as its "Next:"
list). They run in a scratch directory laid out like the repository root (build/, data/, reproduce/, .venv
linked) whose runs/demo is a demo-like run trained here: reproduce/demo.toml cut to a few steps, so the
test stays within minutes; what each command prints is checked for a property that a broken command
cannot fake, never for the text a 10-step model happens to write. The only change to a block: the serve
steps' port 8000 becomes a free port, since other test runs may share the machine.
"""
import json
import math
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import BINARY, REPO

sys.path.insert(0, str(REPO / "scripts"))
from docs_toc import anchors, with_toc  # noqa: E402
from readme_tour import render, tour_blocks  # noqa: E402

STEP_TIMEOUT = 240  # seconds for any one step; the whole file took 3 min 8 s on 2 cores at load average 7
PORT = "8000"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory):
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_corpus.sh")], check=True, capture_output=True)
    work = tmp_path_factory.mktemp("tour")
    (work / "build").symlink_to(BINARY.parent)
    for name in ("data", "reproduce", ".venv"):
        (work / name).symlink_to(REPO / name)
    # The demo's run, 10 steps instead of 200 (warm-up shortened to fit): the same preset, data and layout.
    result = subprocess.run([str(BINARY), "train", "--config", "reproduce/demo.toml", "--set", "train.max_steps=10",
                             "--set", "optim.warmup_steps=2"], cwd=work, capture_output=True, text=True,
                            timeout=STEP_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert (work / "runs" / "demo" / "checkpoints" / "final").exists()
    return work


def run_block(code, cwd, timeout=STEP_TIMEOUT):
    return subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def ok(result, name):
    assert result.returncode == 0, f"tour step '{name}' failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def nonblank_text(s):
    return len(s.strip()) >= 1 and any(c.isalnum() for c in s)


def check_generate(r, work):
    # Sampled text, not the run of spaces a greedy decode of a model this small gives; and the speed line.
    assert nonblank_text(r.stdout), repr(r.stdout)
    assert re.search(r"decode .*tok/s", r.stderr), r.stderr


def check_ppl(r, work):
    result = json.loads(r.stdout)
    ppl = result["perplexity"]
    assert math.isfinite(ppl) and 1 < ppl < 100278, result  # a trained model is far below the uniform 100,278
    assert result["context"] == 128 and result["scored_tokens"] >= 1000, result
    assert abs(math.log(ppl) - result["nll_sum"] / result["scored_tokens"]) <= 1e-9 * math.log(ppl), result


def check_downstream(r, work):
    for task in ("arc_easy", "piqa"):
        row = next((l for l in r.stdout.splitlines() if l.split()[:1] == [task]), None)
        assert row is not None and re.search(r"\b20\b", row), (task, r.stdout)


def check_curl(r, work):
    body = json.loads(r.stdout)
    assert body["model"] == "demo", body
    assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] >= 1, body


def check_openai(r, work):
    assert nonblank_text(r.stdout), repr(r.stdout)


def check_transformers(r, work):
    assert r.stdout.startswith("The Python"), repr(r.stdout)
    assert len(r.stdout.strip()) > len("The Python interpreter"), repr(r.stdout)
    assert "Do you wish to run the custom code" not in r.stdout + r.stderr
    assert (work / "runs" / "demo-hf" / "config.json").exists()


def check_analyze(r, work):
    out = work / "runs" / "demo" / "analysis"
    analysis = json.loads((out / "analysis.json").read_text())
    assert math.isfinite(analysis["loss"]) and len(analysis["pruning"]) == 4, analysis.keys()  # micro: 4 layers
    for p in analysis["pruning"]:  # each pruned loss is the full loss plus its delta
        assert abs(p["loss"] - analysis["loss"] - p["delta"]) <= 1e-9 * abs(p["loss"]), p
    assert (out / "analysis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_plot(r, work):
    assert (work / "runs" / "demo" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_torchrun(r, work):
    runs = [p.parent.parent for p in (work / "runs").glob("**/checkpoints/final") if "demo" not in p.parts[-3]]
    assert runs, list((work / "runs").iterdir())
    state = json.loads(next(runs[0].glob("checkpoints/step-*/trainer_state.json")).read_text())
    assert state["world_size"] == 2, state


def check_compare(r, work):
    out = work / "runs" / "compare" / "report"
    report = json.loads((out / "compare.json").read_text())
    assert report["matched"] is True, report["differences"]  # same config but the variant: matched
    assert (out / "compare.md").read_text() in r.stdout and "**Matched**" in r.stdout
    assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CHECKS = {
    "generate": check_generate,
    "chat": check_generate,
    "eval-ppl": check_ppl,
    "eval-downstream": check_downstream,
    "serve": None,  # started in the background; the steps that follow it talk to it
    "curl": check_curl,
    "openai": check_openai,
    "transformers": check_transformers,
    "analyze": check_analyze,
    "plot": check_plot,
    "torchrun": check_torchrun,
    "compare": check_compare,
}
SERVED = ("curl", "openai")  # the steps that need the server


def test_tour_has_every_step():
    names = [n for n, _ in tour_blocks()]
    assert sorted(names) == sorted(CHECKS), f"README tour steps {names}; this test checks {sorted(CHECKS)}"
    assert names.index("serve") < min(names.index(n) for n in SERVED)


def test_demo_prints_the_tour():
    """`make demo`'s "Next:" is scripts/readme_tour.py's rendering of the README, and that rendering holds every
    line of every block."""
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert "scripts/readme_tour.py" in demo
    printed = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_tour.py")], capture_output=True,
                             text=True, check=True).stdout
    assert printed == render(tour_blocks())
    for _, code in tour_blocks():
        assert code in printed


def test_tour_runs_as_written(tour_dir):
    port = str(free_port())
    server = None
    try:
        for name, code in tour_blocks():
            if name in ("serve",) + SERVED:
                code = code.replace(f"--port {PORT}", f"--port {port}").replace(f":{PORT}/", f":{port}/")
            if name == "serve":
                server = subprocess.Popen(["bash", "-c", "exec " + code], cwd=tour_dir, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True)
                ready, _, _ = select.select([server.stdout], [], [], STEP_TIMEOUT)
                line = server.stdout.readline() if ready else ""
                assert f"http://127.0.0.1:{port}" in line, f"serve did not start: {line!r}\n{server.stderr.read()}"
                assert "'demo'" in line, f"the served model id should be the run's name, 'demo': {line!r}"
                continue
            if name in SERVED:
                assert server is not None and server.poll() is None, f"'{name}' needs the server"
            result = ok(run_block(code, tour_dir), name)
            CHECKS[name](result, tour_dir)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                raise


# ---- links ---------------------------------------------------------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_github_anchors():
    md = "# A b\n## Command line: `build/archspace`\n```\n# not a heading\n```\n## A b\n## The seed's table: `--suite x`\n"
    assert anchors(md) == {"a-b", "command-line-buildarchspace", "a-b-1", "the-seeds-table---suite-x"}


def outside_code(markdown):
    """The text outside fenced blocks and inline code, where a link is a link."""
    kept, fence = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence and not line.startswith("    "):
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(doc):
    bad = []
    for target in LINK.findall(outside_code(doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            bad.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(REPO)}")
    assert not bad, f"{doc.relative_to(REPO)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS[1:], ids=lambda p: p.name)
def test_docs_have_a_current_table_of_contents(doc):
    text = doc.read_text()
    assert with_toc(text, doc.name) == text, f"docs/{doc.name}: run scripts/docs_toc.py"
    assert text.count("](#") >= 2, f"docs/{doc.name}: a table of contents of fewer than two entries"


def test_every_docs_file_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    for doc in DOCS[1:]:
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"


def test_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text().splitlines()) <= 260
