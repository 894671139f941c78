"""`archspace serve` as vLLM users start it (issue 26): the model positional or `--model`, the served id named
after the run (or `--served-model-name`), and its stderr log: one access line per request with the status and
the token counts of the answer's usage, and a periodic throughput line; `--no-access-log` and
`--disable-log-stats` silence them."""
import json
import re
import socket
import struct
import time

import pytest
import requests

from conftest import run_cli
from test_serve import PROMPTS, Server, model_dir  # noqa: F401 (model_dir: the fixture)
from test_serve_hostile import wait_for_health

ACCESS = re.compile(r'^archspace serve: 127\.0\.0\.1:(\d+) "(\S+) (\S+) (HTTP/1\.[01])" (\d+) '
                    r"prompt_tokens=(\S+) completion_tokens=(\S+) latency_ms=(\d+)( \(client gone\))?$")
THROUGHPUT = re.compile(r"^archspace serve: last ([\d.]+) s: prompt ([\d.]+) tokens/s, generation ([\d.]+) tokens/s; "
                        r"sequences running (\d+), waiting (\d+)$")


@pytest.fixture(scope="module")
def run_dir(model_dir, tmp_path_factory):  # noqa: F811
    """runs/demo as `train` leaves it: checkpoints/final names the checkpoint whose model/ is the model."""
    run = tmp_path_factory.mktemp("runs") / "demo"
    step = run / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / "model").symlink_to(model_dir[0])
    (run / "checkpoints" / "final").write_text("step-00000010\n")
    return run


def started_id(server):
    match = re.search(r"model '([^']+)'", server.startup)
    assert match, server.startup
    return match.group(1)


@pytest.mark.parametrize("where,flag,expected", [
    ("run", False, "demo"),
    ("run", True, "demo"),
    ("checkpoint", False, "demo"),
    ("checkpoint/model", False, "demo"),
    ("model", False, "tiny-olmo3"),
])
def test_model_positional_or_flag_and_the_id_named_after_the_run(run_dir, model_dir, where, flag,  # noqa: F811
                                                                 expected):
    path = {"run": run_dir, "checkpoint": run_dir / "checkpoints" / "step-00000010",
            "checkpoint/model": run_dir / "checkpoints" / "step-00000010" / "model", "model": model_dir[0]}[where]
    s = Server(path, "--disable-log-stats", model_flag=flag)
    try:
        assert started_id(s) == expected
        models = requests.get(s.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [expected]
        r = requests.post(s.url + "/v1/completions", timeout=60,
                          json={"model": expected, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == expected, r.text
        r = requests.post(s.url + "/v1/completions", timeout=60, json={"model": "model", "prompt": "hi"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found"
        assert f"this server serves '{expected}'" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("flag", ["--served-model-name", "--model-name"])
def test_served_model_name_and_its_alias(run_dir, flag):
    s = Server(run_dir, flag, "olmo-demo", "--disable-log-stats", model_flag=False)
    try:
        assert started_id(s) == "olmo-demo"
        r = requests.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"model": "olmo-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "olmo-demo", r.text
    finally:
        assert s.stop() == 0


def test_model_given_twice_or_not_at_all(run_dir):
    r = run_cli("serve", run_dir, "--model", run_dir, check=False)
    assert r.returncode != 0 and "excludes" in r.stderr, r.stderr
    r = run_cli("serve", "--port", "0", check=False)
    assert r.returncode != 0 and "archspace serve MODEL" in r.stderr, r.stderr


def log_lines(server, pattern, count, timeout=30):
    """The first `count` lines of the server's stderr matching `pattern` (they come after the answer)."""
    deadline = time.time() + timeout
    while True:
        found = [m for m in map(pattern.match, (line.rstrip("\n") for line in list(server.log))) if m]
        if len(found) >= count:
            return found
        assert time.time() < deadline, "".join(server.log)
        time.sleep(0.02)


def test_one_access_line_per_request_and_a_throughput_line(model_dir):  # noqa: F811
    s = Server(model_dir[0], "--log-stats-interval", 1)
    try:
        url = s.url + "/v1/completions"
        start = time.time()
        r = requests.post(url, json={"prompt": [PROMPTS[0], PROMPTS[1]], "max_tokens": 9, "n": 2, "temperature": 0,
                                     "ignore_eos": True}, timeout=120)
        elapsed_ms = (time.time() - start) * 1000
        assert r.status_code == 200
        plain = r.json()["usage"]
        # A stream, with usage asked for: the log's counts equal its last event's.
        with requests.post(s.url + "/v1/chat/completions", stream=True, timeout=120, json={
                "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 7, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}) as stream:
            events = [json.loads(line[6:]) for line in stream.iter_lines() if line and line != b"data: [DONE]"]
        streamed = events[-1]["usage"]
        assert requests.post(url, json={"model": "nope", "prompt": "hi"}, timeout=10).status_code == 404
        assert requests.get(s.url + "/health", timeout=10).status_code == 200
        # A client that resets its non-streaming request while it decodes: 499, (client gone).
        host, port = s.url.rsplit("//", 1)[1].split(":")
        body = json.dumps({"prompt": PROMPTS[3], "max_tokens": 3000, "ignore_eos": True}).encode()
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        # Reset once it has sampled a token (running == 1 comes at admission, before its prefill has made one).
        wait_for_health(s, lambda h: h["running"] == 1 and h["sampled_tokens"] > 4 * 9 + 7)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

        log_lines(s, re.compile(r".* 499 .*"), 1)
        lines = log_lines(s, ACCESS, 1)
        got = [(m[2], m[3], int(m[5]), m[6], m[7]) for m in lines]
        assert ("GET", "/health", 200, "-", "-") in got
        # One line per request, matched by content: a line is written after its answer is (httplib's logger, on the
        # connection's thread), so the stream's line may follow the next request's, which the client sent as soon
        # as it had read [DONE].
        generations = {g: m for m, g in zip(lines, got) if g[1] != "/health"}
        expected = [
            ("POST", "/v1/completions", 200, str(plain["prompt_tokens"]), str(plain["completion_tokens"])),
            ("POST", "/v1/chat/completions", 200, str(streamed["prompt_tokens"]), str(streamed["completion_tokens"])),
            ("POST", "/v1/completions", 404, "-", "-"),
            ("POST", "/v1/completions", 499, "-", "-")]
        assert sorted(g for g in got if g[1] != "/health") == sorted(expected), got
        assert plain["completion_tokens"] == 4 * 9 and streamed["completion_tokens"] == 7
        assert int(generations[expected[0]][8]) <= elapsed_ms + 1
        assert generations[expected[3]][9] == " (client gone)" and not any(generations[e][9] for e in expected[:3])

        # The throughput lines: their generation tokens (seconds x rate, each printed to 0.1) add up to what
        # was sampled, once the line after the last token has come.
        wait_for_health(s, lambda h: h["running"] == 0)
        sampled = requests.get(s.url + "/health", timeout=10).json()["sampled_tokens"]
        assert sampled > 4 * 9 + 7  # the reset request's tokens too
        deadline = time.time() + 30
        while True:
            stats = log_lines(s, THROUGHPUT, 1)
            total = sum(float(m[1]) * float(m[3]) for m in stats)
            slack = sum(0.05 * float(m[1]) + 0.05 * float(m[3]) + 0.01 for m in stats)
            if abs(total - sampled) <= slack:
                break
            assert time.time() < deadline, (total, sampled, [m[0] for m in stats])
            time.sleep(0.2)
        assert any(float(m[2]) > 0 for m in stats)  # prompt throughput too
    finally:
        assert s.stop() == 0


def test_quiet_flags(model_dir):  # noqa: F811
    s = Server(model_dir[0], "--no-access-log", "--disable-log-stats")
    try:
        assert requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                             timeout=60).status_code == 200
        time.sleep(1.5)
    finally:
        assert s.stop() == 0
    s._reader.join(10)
    assert not [line for line in s.log if ACCESS.match(line.rstrip("\n")) or THROUGHPUT.match(line.rstrip("\n"))]
    assert any("stopped" in line for line in s.log)  # the log was read: the lifecycle lines are there
