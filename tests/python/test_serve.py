"""archspace serve, driven by real clients: the `openai` package (completions, chat, streaming), raw HTTP
for every error status and body, threads for continuous batching (greedy tokens of a request alone equal
its tokens amid 7 others, and equal `archspace generate`), echo + logprobs against transformers'
log-softmax (fp32, within tolerances.logprob_bound), the queue limit (429), the API key (401) and SIGTERM finishing a request in flight."""
import json
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch

from conftest import BINARY, run_cli, save_random_olmo3, tiny_olmo3_config
from test_tokenizer import DOLMA2
from tolerances import forward_bound, logprob_bound

PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the river bank",
    "Once upon a time",
    "In 1907 the expedition reached",
    "def fibonacci(n):",
    "Question: What is the capital of France?\nAnswer:",
    "A",
    "The weather today is sunny and warm, so we decided to walk to the old harbour and",
    "Numbers: 1, 2, 3,",
]


class Server:
    """archspace serve on a free port; stop() sends a signal and returns the exit status. Its stderr (the
    access and throughput log) is read as it comes, into `log` (a pipe left unread would block the server)."""

    def __init__(self, model_dir, *args, model_flag=True):
        model = ["--model", str(model_dir)] if model_flag else [str(model_dir)]
        self.proc = subprocess.Popen([str(BINARY), "serve", *model, "--port", "0", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.log = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self.startup = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", self.startup)
        if not match:
            self.proc.kill()
            self._reader.join(10)
            raise AssertionError(f"serve did not start: {self.startup!r}\n{''.join(self.log)}")
        self.url = f"http://127.0.0.1:{match.group(1)}"

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random OLMo 3 (window 6: decoding goes past it) with the dolma2 tokenizer, and its transformers model."""
    directory = tmp_path_factory.mktemp("serve") / "tiny-olmo3"
    model = save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2, eos_token_id=100257,
                                                pad_token_id=100277), directory, seed=3)
    shutil.copy(DOLMA2, directory / "tokenizer.json")
    return directory, model


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir[0], "--max-batch", 8)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def generate_cli(model_dir, *args):
    return subprocess.run([str(BINARY), "generate", "--model", str(model_dir), *map(str, args)], capture_output=True,
                          check=True, text=True).stdout.rstrip("\n")


def test_greedy_completion_equals_generate(model_dir, client):
    for prompt in (PROMPTS[0], PROMPTS[2]):
        out = client.completions.create(model="tiny-olmo3", prompt=prompt, max_tokens=20, temperature=0)
        expected = generate_cli(model_dir[0], "--prompt", prompt, "--max-new-tokens", 20)
        assert out.choices[0].text == expected
        assert out.choices[0].finish_reason in ("length", "stop")
        assert out.usage.completion_tokens >= 1 and out.usage.prompt_tokens >= 1


def test_greedy_tokens_do_not_depend_on_batching(server):
    """Each prompt alone, then all 8 at once from 8 threads (different lengths and max_tokens, so rows join
    and leave the running batch at different steps): the same tokens."""
    def ask(i):
        body = {"prompt": PROMPTS[i], "max_tokens": 12 + 3 * i, "temperature": 0, "logprobs": 0}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return choice["text"], choice["logprobs"]["tokens"]

    alone = [ask(i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    assert sum(len(tokens) for _, tokens in alone) >= 40
    assert together == alone


def test_fixed_shape_steps_give_the_eager_servers_tokens(model_dir, server):
    """serve --decode-steps fixed-shapes (the CPU reference of CUDA graphs: a fixed batch of 4 rows for --max-batch 4,
    steps over buckets of its first rows, rows moved down, later requests taking idle rows or waiting for the next
    batch): the 8 prompts of different lengths and max_tokens sent at once from 8 threads get the eager server's
    greedy tokens. --decode-steps cuda-graph on the CPU is refused naming the device."""
    def ask(url, i):
        body = {"prompt": PROMPTS[i], "max_tokens": 12 + 3 * i, "temperature": 0, "logprobs": 0}
        r = requests.post(url + "/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["logprobs"]["tokens"]

    eager = [ask(server.url, i) for i in range(8)]
    fixed_server = Server(model_dir[0], "--max-batch", 4, "--decode-steps", "fixed-shapes")
    try:
        with ThreadPoolExecutor(8) as pool:
            fixed = list(pool.map(lambda i: ask(fixed_server.url, i), range(8)))
    finally:
        assert fixed_server.stop() == 0
    assert fixed == eager
    r = run_cli("serve", "--model", model_dir[0], "--decode-steps", "cuda-graph", check=False)
    assert r.returncode != 0 and "CUDA graphs need --device cuda" in r.stderr


def test_seeded_sampling_is_the_same_from_generate_and_serve(model_dir, server):
    """One sampler: a prompt, its sampling settings and its seed give the same tokens from `archspace generate`,
    from serve alone, and from serve while 7 other sampled requests decode beside it (each row draws from its
    own generator, seeded from its request's seed)."""
    sampling = {"temperature": 1.3, "top_p": 0.9, "top_k": 40, "seed": 9}

    def ask(prompt, max_tokens, **settings):
        body = {"prompt": prompt, "max_tokens": max_tokens, "logprobs": 0, **settings}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    cli = generate_cli(model_dir[0], "--prompt", PROMPTS[2], "--max-new-tokens", 16, "--temperature", 1.3, "--top-p", 0.9,
                       "--top-k", 40, "--seed", 9)
    assert ask(PROMPTS[2], 16, **sampling) == cli
    assert ask(PROMPTS[2], 16, temperature=0) != cli  # it samples
    with ThreadPoolExecutor(8) as pool:
        others = [pool.submit(ask, p, 10 + 2 * i, temperature=1.0, seed=i) for i, p in enumerate(PROMPTS) if i != 2]
        mine = pool.submit(ask, PROMPTS[2], 16, **sampling)
        assert mine.result() == cli
        for other in others:
            other.result()  # they ran, beside it


def test_echo_logprobs_equal_transformers(model_dir, server):
    """lm-eval's loglikelihood request (token ids, echo, logprobs 1, max_tokens 1) and max_tokens 0 (scoring
    only): every prompt token's log-probability, top_logprobs and the generated token against transformers."""
    _, model = model_dir
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 100256, size=n).tolist() for n in (5, 17, 40)]  # past the window of 6
    for max_tokens in (0, 1):
        body = {"model": "tiny-olmo3", "prompt": prompts, "echo": True, "logprobs": 3, "max_tokens": max_tokens,
                "temperature": 0}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        assert len(choices) == 3
        for ids, choice in zip(prompts, choices):
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            # The server's batched forward and transformers': two fp32 computations of each log-probability.
            bound = logprob_bound(forward_bound(model, len(ids) + max_tokens), logp.shape[-1],
                                  float(logp.abs().max()))
            lp = choice["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids) + max_tokens
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            got = np.array(lp["token_logprobs"][1:len(ids)])
            want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
            assert np.abs(got - want).max() <= bound
            for t in range(1, len(ids)):  # the top 3 at each position, most likely first
                top_want = torch.topk(logp[t - 1], 3).values.numpy()
                top_got = list(lp["top_logprobs"][t].values())  # in the body's order, as a client reads it
                assert np.abs(np.array(top_got) - top_want).max() <= bound
            assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
            if max_tokens == 1:  # greedy: the argmax after the prompt, with its log-probability
                assert abs(lp["token_logprobs"][-1] - float(logp[-1].max())) <= bound
                assert abs(max(lp["top_logprobs"][-1].values()) - float(logp[-1].max())) <= bound
                assert choice["finish_reason"] in ("length", "stop")
            else:
                assert choice["finish_reason"] == "length"
        assert r.json()["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_streaming_completion_and_chat(model_dir, client, server):
    prompt = PROMPTS[6]
    whole = client.completions.create(model="tiny-olmo3", prompt=prompt, max_tokens=24, temperature=0)
    pieces = list(client.completions.create(model="tiny-olmo3", prompt=prompt, max_tokens=24, temperature=0,
                                            stream=True))
    assert len(pieces) >= 3
    assert "".join(p.choices[0].text for p in pieces if p.choices) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason

    # Chat: SPEC.md's format, as `generate --chat` formats it.
    messages = [{"role": "user", "content": "Name three colours."}]
    chat = client.chat.completions.create(model="tiny-olmo3", messages=messages, max_tokens=16, temperature=0)
    expected = generate_cli(model_dir[0], "--chat", "--prompt", "Name three colours.", "--max-new-tokens", 16)
    assert chat.choices[0].message.content == expected
    assert chat.choices[0].message.role == "assistant"
    streamed = list(client.chat.completions.create(model="tiny-olmo3", messages=messages, max_tokens=16,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected
    assert streamed[0].choices[0].delta.role == "assistant"  # the role first, as OpenAI streams it
    assert streamed[-1].usage.completion_tokens == chat.usage.completion_tokens

    # The raw event stream ends with [DONE].
    r = requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "stream": True},
                      timeout=60)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in r.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    first = json.loads(events[0][len("data: "):])  # OpenAI's field order, one choice per event
    assert list(first) == ["id", "object", "created", "model", "choices"] and len(first["choices"]) == 1


def test_stop_strings_and_sampling(client):
    whole = client.completions.create(model="tiny-olmo3", prompt=PROMPTS[0], max_tokens=20, temperature=0).choices[0]
    stop = whole.text[6:9]
    assert len(stop) == 3 and whole.text.find(stop) >= 1
    cut = client.completions.create(model="tiny-olmo3", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                    stop=[stop, "\u2603never"]).choices[0]
    assert cut.text == whole.text[:whole.text.find(stop)]
    assert cut.finish_reason == "stop"
    streamed = client.completions.create(model="tiny-olmo3", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(p.choices[0].text for p in streamed if p.choices) == cut.text

    # Seeded sampling repeats; n choices differ from one another; top_k 1 is greedy.
    kw = dict(model="tiny-olmo3", prompt=PROMPTS[1], max_tokens=12, temperature=1.5, top_p=0.95)
    a = client.completions.create(seed=5, n=3, **kw)
    b = client.completions.create(seed=5, n=3, **kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    greedy = client.completions.create(model="tiny-olmo3", prompt=PROMPTS[1], max_tokens=12, temperature=0)
    top1 = client.completions.create(model="tiny-olmo3", prompt=PROMPTS[1], max_tokens=12, temperature=1.0, seed=1,
                                     extra_body={"top_k": 1})
    assert top1.choices[0].text == greedy.choices[0].text


def test_models_health_and_tokenizer_routes(server):
    from tokenizers import Tokenizer

    import time

    first = requests.get(server.url + "/v1/models", timeout=10)
    models = first.json()
    assert [m["id"] for m in models["data"]] == ["tiny-olmo3"]
    # "created" is when the server began serving the model: the same bytes a second later.
    assert models["data"][0]["created"] <= time.time()
    time.sleep(1.1)
    assert requests.get(server.url + "/v1/models", timeout=10).content == first.content
    assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    text = "Hello world, 1907 caf\u00e9s<|endoftext|>"
    r = requests.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=10)
    assert r.json()["tokens"] == Tokenizer.from_file(str(DOLMA2)).encode(text, add_special_tokens=False).ids
    back = requests.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=10).json()
    assert back["prompt"] == text
    info = requests.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == "<|endoftext|>"


def expect_error(response, status, *fragments, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for f in fragments:
        assert f in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_bad_requests_answer_openai_errors(server):
    url = server.url + "/v1/completions"
    post = lambda body, **kw: requests.post(url, json=body, timeout=30, **kw)
    e = expect_error(requests.post(url, data="{not json", headers={"Content-Type": "application/json"}, timeout=10),
                     400, "not valid JSON")
    assert e["type"] == "invalid_request_error"
    expect_error(post([1, 2]), 400, "must be a JSON object")
    expect_error(post({"max_tokens": 3}), 400, "'prompt' is required", param="prompt")
    expect_error(post({"prompt": 5}), 400, "'prompt' must be", param="prompt")
    expect_error(post({"prompt": "hi", "temperature": "hot"}), 400, "'temperature' must be a number", param="temperature")
    expect_error(post({"prompt": "hi", "max_tokens": 2.5}), 400, "'max_tokens' must be an integer", param="max_tokens")
    expect_error(post({"prompt": "hi", "stop": [1]}), 400, "'stop' must be", param="stop")
    expect_error(post({"prompt": "hi", "echo": "yes"}), 400, "'echo' must be a boolean", param="echo")
    expect_error(post({"prompt": "hi", "top_p": 0}), 400, "'top_p' must be in (0, 1]", param="top_p")
    expect_error(post({"prompt": "hi", "frequency_penalty": 2.5}), 400, "'frequency_penalty' must be in [-2, 2]",
                 param="frequency_penalty")
    expect_error(post({"prompt": "hi", "logit_bias": {"5": 1}}), 400, "not supported", param="logit_bias")
    expect_error(post({"prompt": [5, 100278]}), 400, "token id 100278, outside the vocabulary", param="prompt")
    e = expect_error(post({"prompt": "hi", "max_tokens": 65536}), 400, "max_position_embeddings", "65536")
    assert e["code"] == "context_length_exceeded"
    e = expect_error(post({"model": "gpt-4", "prompt": "hi"}), 404, "'gpt-4' does not exist", param="model")
    assert e["code"] == "model_not_found"
    expect_error(requests.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]},
                               timeout=10), 400, "wizard", param="messages")
    expect_error(requests.post(server.url + "/v1/chat/completions", json={"messages": "hi"}, timeout=10), 400,
                 "'messages' must be a non-empty list", param="messages")
    expect_error(requests.get(server.url + "/v2/nothing", timeout=10), 404, "no route GET /v2/nothing")
    # The server still answers after all that.
    assert post({"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_api_key_queue_limit_and_sigterm(model_dir):
    """One server with --api-key, one decoding slot and one queue place: 401 without the key, 429 once a
    request decodes and another waits; SIGTERM then lets the streaming request in flight finish, exit 0."""
    s = Server(model_dir[0], "--api-key", "sesame", "--max-batch", 1, "--max-queue", 1)
    try:
        url = s.url + "/v1/completions"
        auth = {"Authorization": "Bearer sesame"}
        expect_error(requests.post(url, json={"prompt": "hi"}, timeout=10), 401, "Missing API key")
        expect_error(requests.post(url, json={"prompt": "hi"}, headers={"Authorization": "Bearer nope"}, timeout=10),
                     401, "Incorrect API key")
        assert requests.get(s.url + "/health", timeout=10).status_code == 200  # no key needed
        assert requests.post(url, json={"prompt": "hi", "max_tokens": 2}, headers=auth, timeout=30).status_code == 200

        def health():
            return requests.get(s.url + "/health", timeout=10).json()

        def wait_for(predicate):
            deadline = time.time() + 30
            while not predicate(health()):
                assert time.time() < deadline, health()
                time.sleep(0.01)

        # A long streaming request takes the one decoding slot.
        long_body = {"prompt": PROMPTS[0], "max_tokens": 3000, "temperature": 0, "stream": True}
        stream = requests.post(url, json=long_body, headers=auth, stream=True, timeout=120)
        lines = stream.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith(b"data: ")
        wait_for(lambda h: h["running"] == 1)
        # A second one waits in the queue; a third finds the queue full.
        waiting = ThreadPoolExecutor(1).submit(requests.post, url, json={"prompt": "hi", "max_tokens": 3,
                                                                         "temperature": 0}, headers=auth, timeout=120)
        wait_for(lambda h: h["waiting"] == 1)
        e = expect_error(requests.post(url, json={"prompt": "hi"}, headers=auth, timeout=10), 429, "--max-queue")
        assert e["code"] == "queue_full"

        # SIGTERM while both are in flight: both complete, then the process exits 0.
        s.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
        assert rest[-1] == b"data: [DONE]"
        finals = [json.loads(line[6:]) for line in rest[:-1]]
        assert finals[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        text = json.loads(first[6:])["choices"][0]["text"] + "".join(f["choices"][0]["text"] for f in finals)
        assert len(text) > 100
        assert waiting.result().status_code == 200
        assert s.proc.wait(60) == 0
        s._reader.join(10)
        assert "SIGTERM" in "".join(s.log)
        with pytest.raises(requests.ConnectionError):
            requests.get(s.url + "/health", timeout=5)
    finally:
        s.stop()


def test_serve_bad_flags(model_dir, tmp_path):
    r = run_cli("serve", "--model", tmp_path / "missing", check=False)
    assert r.returncode == 1 and "missing" in r.stderr
    r = run_cli("serve", "--model", model_dir[0], "--max-batch", 0, check=False)
    assert r.returncode != 0 and "--max-batch" in r.stderr
