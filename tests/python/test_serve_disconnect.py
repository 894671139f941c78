"""Issue 22 item 4: a client that leaves frees its sequences, however it leaves (a reset, or a normal close of a
non-streaming request, waiting in the queue or decoding), while a client that only half-closed after its request
(item 6) still gets its answer. EOF alone cannot tell the two apart; the server answers an HTTP/1.1 client's EOF
with one "100 Continue" probe (RFC 9110 section 15.2: clients must parse 1xx), which a closed socket answers with a
reset. Every client here must parse an answer that carries the probe: http.client (and so requests), httpx (the
openai package's) and curl, each behind a relay that half-closes the connection after the request, which forces
the probe."""
import json
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from test_serve import PROMPTS, Server, model_dir  # noqa: F401 (model_dir: the fixture)
from test_serve_hostile import request_bytes, wait_for_health

PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.fixture(scope="module")
def server(model_dir):  # noqa: F811
    s = Server(model_dir[0], "--max-batch", 2)
    yield s
    assert s.stop() == 0


def address(server):
    host, port = server.url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def health(server):
    return requests.get(server.url + "/health", timeout=10).json()


def greedy_body(i, max_tokens=12):
    return {"prompt": PROMPTS[i], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def answer_alone(server, i):
    r = requests.post(server.url + "/v1/completions", json=greedy_body(i), timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


class Blocker:
    """A streamed request of n=2 that takes both decoding slots until closed: what is sent meanwhile waits."""

    def __init__(self, server):
        self.sock = open_request(server, {"prompt": PROMPTS[0], "max_tokens": 20000, "temperature": 0,
                                          "stream": True, "n": 2, "ignore_eos": True})
        received = b""
        while b"data: " not in received:
            received += self.sock.recv(65536)
        wait_for_health(server, lambda h: h["running"] == 2)

    def close(self):
        self.sock.close()


def recv_exactly(sock, n):
    received = b""
    while len(received) < n:
        chunk = sock.recv(n - len(received))
        assert chunk, received
        received += chunk
    return received


def open_request(server, body, version="HTTP/1.1"):
    data = json.dumps(body).encode()
    sock = socket.create_connection(address(server), timeout=60)
    head = request_bytes("/v1/completions", data, [f"Content-Length: {len(data)}"])
    sock.sendall(head.replace(b"HTTP/1.1\r\n", version.encode() + b"\r\n", 1))
    return sock


def read_all(sock):
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_closed_client_frees_its_sequences_decoding_or_waiting(server):
    """A normal close (FIN) of a non-streaming request: while decoding, its 2 sequences leave within a few steps,
    none of them finished (generated_tokens counts finished ones only; they asked for 3,000 tokens each); while
    waiting behind a blocker, it leaves the queue. A reset (SO_LINGER 0) of one waiting, streamed or not, leaves
    the queue too."""
    wait_for_health(server, lambda h: h["running"] == 0)
    sock = open_request(server, {**greedy_body(1, 3000), "n": 2})
    before = wait_for_health(server, lambda h: h["running"] == 2)["generated_tokens"]
    sock.close()
    left = time.time()
    h = wait_for_health(server, lambda h: h["running"] == 0, timeout=10)
    assert time.time() - left < 5
    assert h["generated_tokens"] == before, h

    blocker = Blocker(server)
    try:
        for stream, reset in ((False, False), (False, True), (True, True)):
            sock = open_request(server, {**greedy_body(2, 50), "stream": stream})
            wait_for_health(server, lambda h: h["waiting"] == 1)
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            wait_for_health(server, lambda h: h["waiting"] == 0, timeout=10)
            assert health(server)["running"] == 2  # the blocker still decodes
    finally:
        blocker.close()
    wait_for_health(server, lambda h: h["running"] == 0)


def test_neighbours_of_a_leaving_client_are_unaffected(server):
    """One request of 3,000 tokens leaves (FIN) while greedy neighbours decode beside it: each neighbour answers
    as it does alone, and the tokens finished meanwhile are exactly the neighbours' (the leaver's were dropped)."""
    alone = [answer_alone(server, i) for i in (3, 4)]
    wait_for_health(server, lambda h: h["running"] == 0)
    before = health(server)["generated_tokens"]
    sock = open_request(server, greedy_body(1, 3000))
    wait_for_health(server, lambda h: h["running"] == 1)

    def neighbour(i):
        r = requests.post(server.url + "/v1/completions", json=greedy_body(i), timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(neighbour, 3)
        time.sleep(0.05)
        sock.close()
        results = [first.result(), neighbour(4)]
    assert [text for text, _ in results] == alone
    h = wait_for_health(server, lambda h: h["running"] == 0, timeout=10)
    assert h["generated_tokens"] - before == sum(n for _, n in results), h


def test_a_half_closed_client_gets_its_answer_after_the_probe(server):
    """HTTP/1.1, half-closed (shutdown(SHUT_WR)) while waiting: the probe, then the 200 with the text it gets alone.
    HTTP/1.0 likewise gets its 200, without any 1xx (RFC 9110 forbids them to 1.0 clients)."""
    want = answer_alone(server, 5)
    blocker = Blocker(server)
    socks = []
    try:
        for version in ("HTTP/1.1", "HTTP/1.0"):
            sock = open_request(server, greedy_body(5), version)
            sock.shutdown(socket.SHUT_WR)
            socks.append(sock)
        wait_for_health(server, lambda h: h["waiting"] == 2)
        # The scheduler checks the waiting requests at each step: the 1.1 client's probe comes while it waits.
        probe = recv_exactly(socks[0], len(PROBE))
    finally:
        blocker.close()
    for sock, version in zip(socks, ("HTTP/1.1", "HTTP/1.0")):
        with sock:
            received = (probe if version == "HTTP/1.1" else b"") + read_all(sock)
        if version == "HTTP/1.1":
            assert received.startswith(PROBE + b"HTTP/1.1 200"), received[:200]
        else:
            assert received.startswith(b"HTTP/1.1 200") and b" 100 " not in received.split(b"\r\n")[0], received[:200]
        body = received.partition(b"\r\n\r\n" + b"{")[2]
        assert json.loads(b"{" + body)["choices"][0]["text"] == want


class HalfClosingRelay:
    """Forwards each connection's one request to the server, half-closes towards the server (so that the server
    probes), and relays the answer back byte for byte; `upstream` keeps what the server sent on each."""

    def __init__(self, server):
        self.target = address(server)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.upstream = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client):
        with client, socket.create_connection(self.target, timeout=120) as up:
            data = b""
            while b"\r\n\r\n" not in data:
                data += client.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(body) < length:
                body += client.recv(65536)
            up.sendall(head + b"\r\n\r\n" + body)
            up.shutdown(socket.SHUT_WR)
            got = b""
            self.upstream.append(got)
            index = len(self.upstream) - 1
            while chunk := up.recv(65536):
                got += chunk
                self.upstream[index] = got
                client.sendall(chunk)

    def close(self):
        self.listener.close()


def test_clients_parse_answers_that_carry_the_probe(server):
    """Through the half-closing relay, while a blocker makes each request wait (so each is probed): http.client,
    requests, httpx and curl each get the 200 and the text the request gets alone; each answer the server sent
    began with the probe."""
    import http.client

    import httpx

    want = answer_alone(server, 6)
    body = json.dumps(greedy_body(6))
    relay = HalfClosingRelay(server)

    def with_http_client():
        conn = http.client.HTTPConnection(*relay.url[7:].split(":"), timeout=120)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())

    def with_requests():
        r = requests.post(relay.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"},
                          timeout=120)
        return r.status_code, r.json()

    def with_httpx():
        r = httpx.post(relay.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"},
                       timeout=120)
        return r.status_code, r.json()

    def with_curl():
        out = subprocess.run(["curl", "-sS", "--http1.1", "-w", "\n%{http_code}", "-H",
                              "Content-Type: application/json", "-d", body, relay.url + "/v1/completions"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        text, _, code = out.rpartition("\n")
        return int(code), json.loads(text)

    clients = [with_http_client, with_requests, with_httpx, with_curl]
    blocker = Blocker(server)
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            futures = [pool.submit(c) for c in clients]
            deadline = time.time() + 60
            while not (len(relay.upstream) == len(clients) and all(u.startswith(PROBE) for u in relay.upstream)):
                assert time.time() < deadline, relay.upstream
                assert not any(f.done() for f in futures), [f.result() for f in futures if f.done()]
                time.sleep(0.02)
            blocker.close()
            results = [f.result() for f in futures]
    finally:
        blocker.close()
        relay.close()
    for client, (status, answer) in zip(clients, results):
        assert status == 200 and answer["choices"][0]["text"] == want, (client.__name__, status, answer)
    for sent in relay.upstream:
        assert sent.startswith(PROBE + b"HTTP/1.1 200 OK\r\n"), sent[:200]
        assert sent.count(b"100 Continue") == 1
