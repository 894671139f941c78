"""archspace serve under the probes of issue 22, scaled down to seconds: each hostile request gets its 4xx
with an OpenAI error body (never a crash, a 500 or a C++ backtrace), and greedy requests sent at the same
time still get exactly the answer they get alone."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from test_serve import PROMPTS, Server, expect_error, model_dir  # noqa: F401 (model_dir: the fixture)

DEPTH_LIMIT = 256  # kMaxJsonDepth (include/archspace/util/json_file.h)


@pytest.fixture(scope="module")
def server(model_dir):  # noqa: F811
    s = Server(model_dir[0], "--max-batch", 8)
    yield s
    assert s.stop() == 0


def greedy(url, i):
    body = {"prompt": PROMPTS[i], "max_tokens": 24, "temperature": 0}
    r = requests.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def alone(server):
    return [greedy(server.url, i) for i in range(3)]


def with_neighbours(server, alone, probe):
    """Runs probe() while 3 greedy requests decode; they must answer as they do alone."""
    with ThreadPoolExecutor(4) as pool:
        neighbours = [pool.submit(greedy, server.url, i) for i in range(3)]
        result = probe()
        assert [f.result() for f in neighbours] == alone
    return result


def post_raw(server, route, data):
    return requests.post(server.url + route, data=data, headers={"Content-Type": "application/json"}, timeout=60)


def deep(n):
    return "[" * n + "]" * n


def no_backtrace(response):
    assert "Exception raised from" not in response.text and "frame #" not in response.text, response.text[:2000]


def test_deep_json_is_400_not_a_crash(server, alone):
    """100,000 levels (a 200 KB body) in each place the issue found: 400 naming the limit; the server lives."""
    d = deep(100_000)
    probes = [
        ("/detokenize", '{"tokens": ' + d + "}"),
        ("/v1/completions", '{"prompt": ' + d + "}"),
        ("/v1/chat/completions", '{"messages": [{"role": ' + d + ', "content": "x"}]}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x", "extra": ' + d + "}]}"),
        ("/tokenize", '{"messages": ' + d + "}"),
        ("/v1/completions", '{"prompt": "hi", "x": "' + "[" * 1000 + '", "y": ' + '{"a":' * 300 + "1" + "}" * 300 + "}"),
    ]

    def probe():
        for route, body in probes:
            r = post_raw(server, route, body)
            expect_error(r, 400, f"nested deeper than {DEPTH_LIMIT} levels")
            no_backtrace(r)

    with_neighbours(server, alone, probe)
    # Brackets inside strings do not count; nesting up to the limit parses (and is then judged on its fields).
    r = post_raw(server, "/v1/chat/completions",
                 json.dumps({"messages": [{"role": "user", "content": "[[[" * 500, "extra": json.loads(deep(250))}],
                             "max_tokens": 2, "temperature": 0}))
    assert r.status_code == 200, r.text
    expect_error(post_raw(server, "/detokenize", '{"tokens": ' + deep(DEPTH_LIMIT - 1) + "}"), 400,
                 "token ids must be")  # the object and 255 lists: at the limit
    assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"


def test_numeric_probes_fail_alone_or_not_at_all(server, alone):
    """Tiny temperatures are greedy (below 1e-5, as vLLM); a tiny top_p keeps the most likely token; lengths
    that overflow, numbers beyond int64 or a double, and non-string roles are 400s naming the field."""
    url = server.url + "/v1/completions"
    want = alone[0]

    def ask(**kw):
        r = requests.post(url, json={"prompt": PROMPTS[0], "max_tokens": 24, **kw}, timeout=120)
        no_backtrace(r)
        return r

    def probe():
        for t in (2e-39, 1e-300, 5e-324):
            r = ask(temperature=t, seed=1)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, (t, r.text)
        r = ask(temperature=1.0, top_p=1e-300, seed=2)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, r.text
        e = expect_error(ask(max_tokens=2**63 - 1), 400, "max_position_embeddings", param="prompt")
        assert e["code"] == "context_length_exceeded"
        expect_error(ask(max_tokens=2**64 - 1), 400, "out of range", param="max_tokens")
        expect_error(post_raw(server, "/v1/completions", '{"prompt": "hi", "max_tokens": 1e400}'), 400,
                     "out of range")
        expect_error(ask(top_k=2**64 - 1), 400, "'top_k' is out of range", param="top_k")
        chat = server.url + "/v1/chat/completions"
        for role in (5, [1], None, {"a": 1}):
            r = requests.post(chat, json={"messages": [{"role": role, "content": "x"}]}, timeout=30)
            expect_error(r, 400, "role", param="messages")
            no_backtrace(r)
        r = requests.post(server.url + "/tokenize", json={"messages": [{"role": [1], "content": "x"}]}, timeout=30)
        expect_error(r, 400, "role", param="messages")

    with_neighbours(server, alone, probe)


def test_unknown_and_out_of_range_parameters_are_400_naming_the_field(server):
    url = server.url + "/v1/completions"
    chat = server.url + "/v1/chat/completions"
    msg = [{"role": "user", "content": "hi"}]
    cases = [
        (url, {"prompt": "hi", "bogus_knob": 1}, "bogus_knob", "Unrecognized request argument supplied: 'bogus_knob'"),
        (chat, {"messages": msg, "best_friend": True}, "best_friend", "Unrecognized request argument"),
        (chat, {"messages": msg, "top_logprobs": 10**6}, "top_logprobs", "'top_logprobs' must be in [0, 20]"),
        (chat, {"messages": msg, "top_logprobs": 3}, "top_logprobs", "needs 'logprobs'"),
        (url, {"prompt": "hi", "min_p": 1.5}, "min_p", "'min_p' must be in [0, 1]"),
        (url, {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "'repetition_penalty' must be in (0"),
        (url, {"prompt": "hi", "presence_penalty": -3}, "presence_penalty", "'presence_penalty' must be in [-2, 2]"),
        (url, {"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos", "'ignore_eos' must be a boolean"),
        (server.url + "/tokenize", {"prompt": "hi", "add_bos": True}, "add_bos", "Unrecognized request argument"),
        (server.url + "/detokenize", {"tokens": [1], "skip": 1}, "skip", "Unrecognized request argument"),
    ]
    for route, body, param, fragment in cases:
        r = requests.post(route, json=body, timeout=30)
        expect_error(r, 400, fragment, param=param)
        no_backtrace(r)
    # What lm-eval sends still passes (its loglikelihood and generate_until payloads).
    ok = {"model": "tiny-olmo3", "prompt": "hi", "max_tokens": 2, "temperature": 0, "stop": ["\n"], "seed": 1234,
          "logprobs": 1, "echo": True}
    assert requests.post(url, json=ok, timeout=60).status_code == 200


def hf_greedy(model, ids, n, **kw):
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
    return out[0, len(ids):].tolist()


def decode(ids):
    from tokenizers import Tokenizer

    from test_tokenizer import DOLMA2
    return Tokenizer.from_file(str(DOLMA2)).decode(ids, skip_special_tokens=False)


def test_vllm_extras_equal_transformers_logits_processors(model_dir, server):  # noqa: F811
    """Greedy with repetition_penalty against transformers' RepetitionPenaltyLogitsProcessor; presence and
    frequency penalties against OpenAI's formula as a transformers LogitsProcessor; min_p's samples inside the
    set transformers' MinPLogitsWarper keeps (and, without min_p, outside it)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList, MinPLogitsWarper

    _, model = model_dir
    ids = requests.post(server.url + "/tokenize", json={"prompt": PROMPTS[3]}, timeout=10).json()["tokens"]
    url = server.url + "/v1/completions"

    def served(n, prompt=ids, **kw):
        r = requests.post(url, json={"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw},
                          timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    plain = served(16)
    assert plain == decode(hf_greedy(model, ids, 16))
    # A random model seldom repeats itself: put its next greedy tokens into the prompt, so that the penalty
    # (over the prompt too) changes the answer (chosen by transformers alone).
    ahead = hf_greedy(model, ids, 3)
    prompt = next(p for p in ([ahead[0]] + ids, ahead + ids, ahead * 3 + ids)
                  if hf_greedy(model, p, 16, repetition_penalty=1.8) != hf_greedy(model, p, 16))
    penalised = served(16, prompt, repetition_penalty=1.8)
    assert penalised == decode(hf_greedy(model, prompt, 16, repetition_penalty=1.8))
    assert penalised != served(16, prompt)  # the penalty changed the answer: the comparison above can fail

    class OpenAIPenalties(LogitsProcessor):
        """OpenAI's documented formula over the generated tokens."""
        def __init__(self, presence, frequency):
            self.presence, self.frequency = presence, frequency

        def __call__(self, input_ids, scores):
            counts = torch.zeros_like(scores)
            out = input_ids[:, len(ids):]
            counts.scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
            return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)

    # Negative values reward repeating the output, so they change a random model's answer (positive ones
    # would only act once it repeats itself).
    for presence, frequency in ((-2.0, 0.0), (0.0, -1.5), (1.0, -2.0)):
        got = served(16, presence_penalty=presence, frequency_penalty=frequency)
        want = decode(hf_greedy(model, ids, 16, logits_processor=LogitsProcessorList([OpenAIPenalties(presence,
                                                                                                     frequency)])))
        assert got == want, (presence, frequency)
        assert got != plain, (presence, frequency)

    # min_p: the first sampled token of 16 choices (temperature 1) must be one transformers keeps.
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    kept = MinPLogitsWarper(0.5)(torch.tensor([ids]), logits[None].clone())[0] > float("-inf")
    kept_texts = {decode([i]) for i in torch.nonzero(kept).flatten().tolist()}

    def first_tokens(**kw):
        r = requests.post(url, json={"prompt": ids, "max_tokens": 1, "temperature": 1.0, "n": 16, "seed": 9,
                                     "logprobs": 0, "ignore_eos": True, **kw}, timeout=120)
        assert r.status_code == 200, r.text
        return [c["logprobs"]["tokens"][0] for c in r.json()["choices"]]

    assert int(kept.sum()) < 1000  # a real cut of the 100k-token vocabulary
    assert set(first_tokens(min_p=0.5)) <= kept_texts
    assert not set(first_tokens()) <= kept_texts


def test_ignore_eos(model_dir, tmp_path):  # noqa: F811
    """The same weights with eos_token_id set to a greedy token (its first occurrence, after 2 others): that
    token ends the completion ('stop') unless ignore_eos, which then equals transformers' greedy."""
    import shutil

    directory, model = model_dir
    copy = tmp_path / "tiny-olmo3"
    shutil.copytree(directory, copy)
    s = Server(copy, "--max-batch", 2)
    try:
        ids = requests.post(s.url + "/tokenize", json={"prompt": PROMPTS[2]}, timeout=10).json()["tokens"]
        greedy_ids = hf_greedy(model, ids, 10)
        k = next(i for i in range(2, 10) if greedy_ids[i] not in greedy_ids[:i])
        s.stop()
        config = json.loads((copy / "config.json").read_text())
        config["eos_token_id"] = greedy_ids[k]
        (copy / "config.json").write_text(json.dumps(config))
        s = Server(copy, "--max-batch", 2)
        url = s.url + "/v1/completions"
        body = {"prompt": ids, "max_tokens": 10, "temperature": 0}
        stopped = requests.post(url, json=body, timeout=60).json()["choices"][0]
        assert stopped["finish_reason"] == "stop" and stopped["text"] == decode(greedy_ids[:k])
        free = requests.post(url, json={**body, "ignore_eos": True}, timeout=60).json()["choices"][0]
        assert free["finish_reason"] == "length" and free["text"] == decode(greedy_ids)
    finally:
        s.stop()


def skip_interim(received):
    """The bytes after any 1xx responses (RFC 9110 15.2: a client must parse and may ignore them; the server
    probes a half-closed client with one 100 Continue)."""
    while re.match(rb"HTTP/1\.1 1\d\d ", received) and b"\r\n\r\n" in received:
        received = received.partition(b"\r\n\r\n")[2]
    return received


def raw_exchange(server, data, half_close=False, timeout=30):
    """Sends bytes on one connection; returns (status, headers, body, closed): the first final response, and
    whether the server closed the connection within 1 s after it (keep-alive waits 2 s)."""
    import socket

    host, port = server.url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-send: the answer is still read below
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received, closed = b"", False
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
            head, sep, rest = skip_interim(received).partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if sep and length and len(rest) >= int(length.group(1)):
                sock.settimeout(1)
    head, _, body = skip_interim(received).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines and lines[0].startswith("HTTP/1.1 "), received[:300]
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body, closed


def request_bytes(path, body=b"", headers=(), method="POST"):
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    return head.encode() + body


def rss_mb(server):
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_http_framing_is_400_and_closes(server, alone):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    probes = [
        ([f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 9}"], "conflicting Content-Length"),
        ([f"Content-Length: {len(body)}, {len(body) + 1}"], "conflicting Content-Length"),
        ([f"Content-Length: {len(body)}", "Transfer-Encoding: chunked"], "Transfer-Encoding together with"),
        (["Transfer-Encoding: gzip, chunked"], "other than 'chunked'"),
        ([f"Content-Length: {len(body)}", "X-No-Colon-Here"], "no colon"),
        ([f"Content-Length: {len(body)}", "X-Name : v"], "whitespace before the colon"),
        ([f"Content-Length: {len(body)}", "X-A: 1\nX-B: 2"], "bare CR or LF"),
    ]

    def probe():
        for headers, fragment in probes:
            status, hdrs, raw, closed = raw_exchange(server, request_bytes("/v1/completions", body, headers))
            assert status == 400, (headers, raw)
            assert fragment in json.loads(raw)["error"]["message"], raw
            assert hdrs.get("connection") == "close" and closed, (headers, hdrs)

    with_neighbours(server, alone, probe)
    # Identical duplicates are one length (RFC 9110); the request is answered.
    status, _, raw, _ = raw_exchange(server, request_bytes(
        "/v1/completions", body, [f"Content-Length: {len(body)}", f"Content-Length: {len(body)}", "Connection: close"]))
    assert status == 200, raw


def test_half_closed_client_gets_its_answer_and_range_is_ignored(server, alone):
    """(A half-closed client waiting for its answer may get a 100 Continue first: test_serve_disconnect.py.)"""
    body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}).encode()
    status, _, raw, _ = raw_exchange(server, request_bytes("/v1/completions", body, [f"Content-Length: {len(body)}"]),
                                     half_close=True)
    assert status == 200, raw
    assert json.loads(raw)["choices"][0]["text"] == alone[0]
    whole = requests.get(server.url + "/v1/models", timeout=10)
    ranged = requests.get(server.url + "/v1/models", headers={"Range": "bytes=0-3,6-9"}, timeout=10)
    assert ranged.status_code == 200 and ranged.content == whole.content and "Content-Range" not in ranged.headers
    r = requests.post(server.url + "/v1/completions", json=json.loads(body), headers={"Range": "bytes=0-10"},
                      timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == alone[0]


def test_floods_of_body_and_headers_are_refused_within_bounds(server, alone):
    """A chunked body past --max-body-bytes (16 MiB) is 413 after at most that much; 2 MB of headers is 431
    after 64 KiB; 200 short header lines is 431; the server's RSS grows by less than 150 MB through all."""
    before = rss_mb(server)

    def chunked(total):
        piece = b"[" + b"1," * (1 << 18) + b"1]"  # 512 KiB chunks
        head = request_bytes("/v1/completions", headers=["Transfer-Encoding: chunked"])
        chunks = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(total // len(piece)))
        return head + chunks + b"0\r\n\r\n"

    def probe():
        status, _, raw, closed = raw_exchange(server, chunked(24 << 20))
        assert status == 413 and "--max-body-bytes" in json.loads(raw)["error"]["message"], raw
        status, _, raw, _ = raw_exchange(server, request_bytes("/health", method="GET",
                                                               headers=[f"X-H{i}: {'v' * 90}" for i in range(20000)]))
        assert status == 431 and "--max-header-bytes" in json.loads(raw)["error"]["message"], raw
        status, _, raw, _ = raw_exchange(server, request_bytes("/health", method="GET",
                                                               headers=[f"X-H{i}: v" for i in range(200)]))
        assert status == 431 and "--max-header-lines" in json.loads(raw)["error"]["message"], raw

    with_neighbours(server, alone, probe)
    # A body under the bound but chunked is read (and judged on its JSON).
    small = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    data = request_bytes("/v1/completions", headers=["Transfer-Encoding: chunked", "Connection: close"]) + \
        b"%x\r\n" % len(small) + small + b"\r\n0\r\n\r\n"
    assert raw_exchange(server, data)[0] == 200
    assert rss_mb(server) - before < 150, (before, rss_mb(server))


def test_soak_floods_mixed_with_normal_requests(server, alone):
    """15 s: 3 clients replay the floods above in a loop while 3 send greedy requests. Every greedy answer is
    its answer alone, every flood its 4xx, and the server's RSS stays within 300 MB of where it started."""
    import random
    import time

    deadline = time.time() + 15
    before = rss_mb(server)
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    floods = [
        lambda: post_raw(server, "/v1/completions", '{"prompt": ' + deep(50_000) + "}").status_code == 400,
        lambda: raw_exchange(server, request_bytes("/v1/completions", body, [
            f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 3}"]))[0] == 400,
        lambda: raw_exchange(server, request_bytes("/health", method="GET",
                                                   headers=[f"X-{i}: {'v' * 200}" for i in range(2000)]))[0] == 431,
        lambda: requests.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": "hi", "max_tokens": 2**63 - 1}).status_code == 400,
        lambda: requests.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": ["x"] * 300, "n": 16}).status_code == 400,  # 4,800 sequences > --max-queue 256
        lambda: requests.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": "hi", "stop": ["s" * 100] * 1000}).status_code == 400,
        lambda: requests.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": "hi", "max_tokens": 8, "temperature": 1e-300}).status_code == 200,
    ]

    def flooder(seed):
        rng, count = random.Random(seed), 0
        while time.time() < deadline:
            assert rng.choice(floods)()
            count += 1
        return count

    def normal(i):
        count = 0
        while time.time() < deadline:
            assert greedy(server.url, i) == alone[i]
            count += 1
        return count

    with ThreadPoolExecutor(6) as pool:
        floods_done = [pool.submit(flooder, s) for s in range(3)]
        normal_done = [pool.submit(normal, i) for i in range(3)]
        assert sum(f.result() for f in floods_done) >= 10
        assert all(f.result() >= 1 for f in normal_done)
    assert rss_mb(server) - before < 300, (before, rss_mb(server))


def wait_for_health(server, predicate, timeout=30):
    import time

    deadline = time.time() + timeout
    while True:
        h = requests.get(server.url + "/health", timeout=10).json()
        if predicate(h):
            return h
        assert time.time() < deadline, h
        time.sleep(0.01)


def test_a_client_that_leaves_frees_its_sequences(server):
    """A streaming client that closes, and a non-streaming one that resets its connection: their sequences
    leave the batch within a few decode steps (well under the 3,000 tokens they asked for); the server still
    answers."""
    import socket
    import struct
    import time

    host, port = server.url.rsplit("//", 1)[1].split(":")
    wait_for_health(server, lambda h: h["running"] == 0)
    for stream in (True, False):
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 3000, "temperature": 0, "stream": stream,
                           "n": 4}).encode()
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(request_bytes("/v1/completions", body, [f"Content-Length: {len(body)}"]))
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # decoding has begun
        before = wait_for_health(server, lambda h: h["running"] == 4)["generated_tokens"]
        if not stream:  # an abortive close: RST, which a server can tell from a half-close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        left = time.time()
        h = wait_for_health(server, lambda h: h["running"] == 0, timeout=10)
        assert time.time() - left < 5
        # No sequence finished: they were dropped, not decoded to their 3,000 tokens.
        assert h["generated_tokens"] == before, (stream, before, h)
    assert greedy(server.url, 1)


def test_a_second_sigterm_exits_at_once(model_dir):  # noqa: F811
    """The first SIGTERM lets a long request in flight go on; the second ends the process at once (128 + 15)
    instead of waiting for it."""
    import signal
    import time

    import threading

    s = Server(model_dir[0], "--max-batch", 1)
    try:
        # 60,000 tokens: minutes of decoding, so the first signal cannot see it finish.
        stream = requests.post(s.url + "/v1/completions", stream=True, timeout=120,
                               json={"prompt": PROMPTS[0], "max_tokens": 60000, "temperature": 0, "stream": True})
        lines = stream.iter_lines()
        next(line for line in lines if line)
        def drain():  # keep reading, until the process ends under it
            try:
                for _ in lines:
                    pass
            except requests.RequestException:
                pass
        threading.Thread(target=drain, daemon=True).start()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert s.proc.poll() is None  # still finishing the request
        s.proc.send_signal(signal.SIGTERM)
        start = time.time()
        assert s.proc.wait(10) == 128 + signal.SIGTERM
        assert time.time() - start < 5
    finally:
        s.stop()
