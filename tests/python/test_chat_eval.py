"""eval downstream --chat (eval/chat_format.h): the prompt ids of generation and multiple-choice requests equal the
exported tokenizer's apply_chat_template(messages, add_generation_prompt=True) in transformers, for few-shot
contexts split into user/assistant turns (lm-eval's fewshot_as_multiturn) and for OLMES' chat-format request
objects (messages + assistant_prefix); greedy generations equal transformers' generate from those ids, ending at
<|im_end|> or the end of text; multiple-choice log-likelihoods equal lm-eval's HFLM on the chat-rendered contexts;
and the files --chat cannot split fail naming the file, the line and the reason."""
import gzip
import json
import re

import pytest
import torch

import test_downstream as ds
from conftest import run_cli
from test_generation_tasks import read_requests
from test_mmlu import RENDERED

MAX_GEN_TOKS = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat-eval")
    return tmp, ds.export(tmp, "base")


def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def template_ids(tokenizer, messages, prefix=""):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefix
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def write_task(tasks_dir, task, shots, lines, stops=("\n\n",)):
    """One OLMES-style generation variant directory gen_<shots>shot with these request lines."""
    d = tasks_dir / task / f"gen_{shots}shot"
    d.mkdir(parents=True)
    config = {"task_name": task, "task_config": {"task_name": task, "num_shots": shots, "generation_kwargs": {
        "max_gen_toks": MAX_GEN_TOKS, "do_sample": False, "temperature": 0.0, "stop_sequences": list(stops)}}}
    (d / "config.json").write_text(json.dumps(config))
    with gzip.open(d / "requests.jsonl.gz", "wt") as f:
        for i, (context, extra) in enumerate(lines):
            request = {"context": context, "stop_sequences": list(stops),
                       "generation_kwargs": config["task_config"]["generation_kwargs"]}
            f.write(json.dumps({"doc_id": i, "native_id": f"n{i}", "request": request, **extra}) + "\n")


# Known few-shot turns, rendered as OLMES renders a plain context (q + " " + a, shots joined by "\n\n").
GSM8K_SHOTS = [("Question: Ann has 3 apples and buys 2 more. How many apples?\nAnswer:", "3 + 2 = 5. So the answer is 5."),
               ("Question: A café sells 4 cakes a day. How many in 2 days?\nAnswer:", "4 * 2 = 8. So the answer is 8.")]
DROP_DESCRIPTION = "The following are reading comprehension questions.\n\n"
DROP_SHOTS = [("Passage: The Lions scored twice.\nQuestion: How many times did they score?\nAnswer:", "2")]


def plain_context(shots, question, description=""):
    return description + "".join(q + " " + a + "\n\n" for q, a in shots) + question


def expected_messages(shots, question, description=""):
    turns = []
    for q, a in shots:
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    turns.append({"role": "user", "content": question})
    turns[0]["content"] = description + turns[0]["content"]
    return turns


def transformers_generation(model_dir, tokenizer, ids, stops):
    """Greedy generate from the prompt ids, ending at the end of text or <|im_end|>; decoded without special
    tokens and cut before the earliest stop string (lm-eval's until)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ends = [tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_GEN_TOKS, do_sample=False, eos_token_id=ends,
                             pad_token_id=ends[0])
    text = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    for s in stops:
        text = text.split(s)[0]
    return text


def test_chat_prompts_and_generations_equal_transformers(exported, tmp_path):
    tmp, hf = exported
    tasks = tmp_path / "tasks"
    chat_object = {"messages": [{"role": "system", "content": "You solve math."},
                                {"role": "user", "content": "Question: What is 6 * 7?"}],
                   "assistant_prefix": "Answer:"}
    write_task(tasks, "gsm8k", 2, [
        (plain_context(GSM8K_SHOTS, "Question: Bo has 9 pens and loses 4. How many are left?\nAnswer:"),
         {"label": "5"}),
        (chat_object, {"label": "42"}),
    ])
    write_task(tasks, "drop", 1, [
        (plain_context(DROP_SHOTS, "Passage: Rain fell on 3 days.\nQuestion: How many days?\nAnswer:",
                       DROP_DESCRIPTION), {"doc": {"answers": [["3"]]}}),
    ])
    out, rows_path = tmp_path / "chat.json", tmp_path / "chat.jsonl"
    run_cli("eval", "downstream", "--model", hf, "--tasks", "gsm8k,drop", "--tasks-dir", tasks, "--chat",
            "--out", out, "--requests-out", rows_path)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    tokenizer = hf_tokenizer(hf)
    expected = [
        (expected_messages(GSM8K_SHOTS, "Question: Bo has 9 pens and loses 4. How many are left?\nAnswer:"), ""),
        (chat_object["messages"], "Answer:"),
        (expected_messages(DROP_SHOTS, "Passage: Rain fell on 3 days.\nQuestion: How many days?\nAnswer:",
                           DROP_DESCRIPTION), ""),
    ]
    assert len(rows) == 3
    for row, (messages, prefix) in zip(rows, expected):
        assert row["messages"] == messages
        ids = template_ids(tokenizer, messages, prefix)
        assert row["prompt_tokens"] == ids, (row["task"], row["doc_id"])
        assert row["generation"] == transformers_generation(hf, tokenizer, ids, ["\n\n"]), row
    assert json.loads(out.read_text())["chat"] is True


def python_split(context, question_marker, answer_marker):
    """An independent split of an installed plain few-shot context into turns (regular expressions)."""
    blocks = re.split(r"\n\n(?=" + re.escape(question_marker) + ")", context)
    description = ""
    if not blocks[0].startswith(question_marker):
        description = blocks.pop(0) + "\n\n"
    turns = []
    for block in blocks[:-1]:
        q, a = re.match(r"(.*" + re.escape(answer_marker) + r") (.*)\Z", block, re.S).groups()
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    turns.append({"role": "user", "content": blocks[-1]})
    turns[0]["content"] = description + turns[0]["content"]
    return turns


@pytest.mark.parametrize("task,markers", [("gsm8k", ("Question:", "\nAnswer:")),
                                          ("minerva_math_algebra", ("Problem:", "\n\nSolution:")),
                                          ("drop", ("Passage:", "\nAnswer:"))])
def test_installed_few_shot_files_under_chat(exported, task, markers):
    """The wheel's gsm8k (8 shots), Minerva (4 shots, solutions with blank lines) and DROP (5 shots after a
    description): split into the turns an independent regular-expression split finds, with the template's ids."""
    tmp, hf = exported
    _, _, rows = ds.engine(hf, tmp, "--chat", "--max-length", 2048, tasks=task, limit=2, fmt="rc", name=f"chat-{task}")
    tokenizer = hf_tokenizer(hf)
    shots = {"gsm8k": 8, "minerva_math_algebra": 4, "drop": 5}[task]
    for row, request in zip(rows, read_requests(task, 2)):
        messages = python_split(request["request"]["context"], *markers)
        assert len(messages) == 2 * shots + 1
        assert row["messages"] == messages
        assert row["prompt_tokens"] == template_ids(tokenizer, messages)[-len(row["prompt_tokens"]):]
        assert row["truncated"] or row["prompt_tokens"] == template_ids(tokenizer, messages)


def test_multiple_choice_under_chat_equals_lm_eval(exported):
    """MMLU mc 5-shot under --chat: each request's context is the template's rendering of its turns (the subject's
    description opening the first), and its log-likelihoods are lm-eval HFLM's on (that context, continuation)."""
    tmp, hf = exported
    _, _, rows = ds.engine(hf, tmp, "--chat", "--shots", 5, tasks="mmlu_anatomy", limit=2, fmt="mc", name="chat-mc")
    tokenizer = hf_tokenizer(hf)
    plain = {}
    with gzip.open(RENDERED / "mmlu_anatomy" / "mc_5shot" / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            plain[(r["doc_id"], r["idx"])] = r["request"]["context"]
    pairs = []
    for row in rows:
        messages = python_split(plain[(row["doc_id"], row["idx"])], "Question:", "\nAnswer:")
        assert len(messages) == 11
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert row["context"] == text
        pairs.append((text, row["continuation"]))
    expected = ds.lm_eval_loglikelihoods(hf, "base", pairs)
    for row, (ll, greedy, n) in zip(rows, expected):
        assert row["n_continuation_tokens"] == n and row["is_greedy"] == greedy
        assert abs(row["loglikelihood"] - ll) <= 1e-3 * max(1.0, abs(ll)), (row, ll)


@pytest.mark.parametrize("lines,fragment", [
    ([(plain_context(GSM8K_SHOTS[:1], "Question: x?\nAnswer:"), {"label": "1"})],
     "--chat cannot split the few-shot context: it has 2 blocks starting with \"Question:\" after a blank line, "
     "expected 3"),
    ([(plain_context([("Question: y?\nReply:", "1")] + GSM8K_SHOTS[:1], "Question: x?\nAnswer:"), {"label": "1"})],
     "shot 1 has no answer after \"\\nAnswer: \""),
    ([({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, {"label": "1"})],
     "the last message of request.context.messages must be the user's"),
    ([({"messages": [{"role": "robot", "content": "hi"}, {"role": "user", "content": "x"}]}, {"label": "1"})],
     "message 0 has role 'robot'"),
    ([({"messages": [{"role": "user", "content": "x"}], "prefix": "A:"}, {"label": "1"})],
     "request.context has an unknown field \"prefix\""),
])
def test_chat_requests_that_cannot_be_rendered_name_the_line(exported, tmp_path, lines, fragment):
    _, hf = exported
    write_task(tmp_path / "tasks", "gsm8k", 2, lines)
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "gsm8k", "--tasks-dir", tmp_path / "tasks", "--chat",
                check=False)
    assert r.returncode == 1
    assert "gsm8k/gen_2shot/requests.jsonl.gz:1" in r.stderr and fragment in r.stderr, r.stderr


def test_chat_format_files_need_chat(exported, tmp_path):
    _, hf = exported
    write_task(tmp_path / "tasks", "gsm8k", 0, [({"messages": [{"role": "user", "content": "hi"}]}, {"label": "1"})])
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "gsm8k", "--tasks-dir", tmp_path / "tasks",
                check=False)
    assert r.returncode == 1 and "chat-format conversation (OLMES' use_chat_format): add --chat" in r.stderr, r.stderr


# ---- --suite olmo3-sft ---------------------------------------------------------------------------------------------
def test_suite_olmo3_sft_table_lists_every_task_and_the_macro(exported, tmp_path):
    """The eight tasks in one command: the installed ones run (chat format), the others are listed as missing in the
    table and the JSON, and the macro is the mean of the present tasks' primary values, said to be over them."""
    tmp, hf = exported
    out = tmp_path / "suite.json"
    r = run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3-sft", "--limit", 1, "--out", out)
    j = json.loads(out.read_text())
    suite = j["suite"]
    assert j["chat"] is True and suite["name"] == "olmo3-sft"
    assert suite["tasks"] == ["bbh", "drop", "gsm8k", "ifeval", "minerva_math", "mmlu", "popqa", "truthfulqa"]
    present = [t for t in suite["tasks"] if t not in suite["missing"]]
    assert {"drop", "gsm8k", "minerva_math", "mmlu"} <= set(present)
    assert suite["macro_over"] == present
    rows = {row["task"]: row for row in suite["rows"]}
    for task in suite["missing"]:
        assert rows[task]["missing"] and "value" not in rows[task]
        assert re.search(rf"^{task} .* missing: ", r.stdout, re.M), r.stdout
    # Each present value is its task's (or group's macro) primary row among the results.
    results = {(x["task"], x["metric"]): x["value"] for x in j["results"]
               if x["primary"] and x.get("aggregate", "macro") == "macro"}
    for task in present:
        assert rows[task]["value"] == results[(task, rows[task]["metric"])], task
    assert rows["mmlu"]["metric"] == "acc_raw" and rows["drop"]["metric"] == "f1"
    assert suite["macro"] == pytest.approx(sum(rows[t]["value"] for t in present) / len(present), rel=1e-12)
    assert f"over {len(present)} of 8 tasks; missing: " in r.stdout


def test_unknown_suite_and_suite_with_tasks(exported):
    _, hf = exported
    r = run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3", check=False)
    assert r.returncode == 1 and 'unknown suite "olmo3" (suites: olmo3-sft)' in r.stderr
    r = run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3-sft", "--tasks", "gsm8k", check=False)
    assert r.returncode == 1 and "one of --tasks or --suite" in r.stderr


def suite_request_files(root):
    """Request files for the four tasks no package ships, as a user would bring them: chat-format objects for the
    generation tasks (OLMES' use_chat_format), TruthfulQA's 6-shot primer as a plain context split under --chat."""
    from test_sft_metrics import BBH_SUBTASKS, TRUTHFULQA

    def chat_line(doc_id, question, extra):
        request = {"context": {"messages": [{"role": "user", "content": question}]}, "stop_sequences": ["\n\n"],
                   "generation_kwargs": {"max_gen_toks": MAX_GEN_TOKS, "do_sample": False, "temperature": 0.0}}
        return {"doc_id": doc_id, "native_id": doc_id, "request": request, "request_type": "generate_until", **extra}

    def write(task, variant, shots, lines, primary="exact_match"):
        d = root / task / variant
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"task_config": {"num_shots": shots, "primary_metric": primary}}))
        with gzip.open(d / "requests.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)

    doc = {"key": 1, "prompt": "Write about cats without commas.", "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": [{}]}
    write("ifeval", "gen_0shot", 0, [chat_line(0, doc["prompt"], {"doc": doc})], "prompt_level_loose_acc")
    write("popqa", "gen_15shot", 15, [chat_line(0, "Q: Who wrote Hamlet? A:", {"doc": {
        "possible_answers": json.dumps(["William Shakespeare", "Shakespeare"])}})])
    for s in BBH_SUBTASKS:
        write(f"bbh_{s}", "gen_3shot", 3, [chat_line(0, "Q: Pick one. (A) a (B) b\nA:", {"label": "(A)"})])
    primer = "".join(f"Q: primer question {i}?\nA: primer answer {i}.\n\n" for i in range(6))
    lines = []
    for d, (q, choices, labels, mc1, mc2) in enumerate(TRUTHFULQA):
        tq = {"index": d, "question": q, "choices": choices, "labels": labels, "mc1_indices": mc1, "mc2_indices": mc2}
        for i, c in enumerate(choices):
            lines.append({"doc_id": d, "native_id": d, "doc": tq, "label": 0, "request_type": "loglikelihood",
                          "idx": i, "request": {"context": primer + f"Q: {q}\nA:", "continuation": c}})
    write("truthfulqa", "rc_6shot", 6, lines, "mc2")


def test_suite_with_the_users_request_files_has_all_eight(exported, tmp_path):
    tmp, hf = exported
    suite_request_files(tmp_path / "olmes")
    out = tmp_path / "suite.json"
    r = run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3-sft", "--limit", 1, "--tasks-dir",
                tmp_path / "olmes", "--out", out)
    j = json.loads(out.read_text())
    suite = j["suite"]
    assert suite["missing"] == [] and suite["macro_over"] == suite["tasks"]
    rows = {row["task"]: row for row in suite["rows"]}
    results = {(x["task"], x["metric"], x.get("aggregate")): x for x in j["results"]}
    assert rows["bbh"]["value"] == results[("bbh", "exact_match", "micro")]["value"]  # OLMES' suite: bbh micro
    assert rows["bbh"]["n"] == 27 and rows["truthfulqa"]["n"] == 1
    assert rows["truthfulqa"]["value"] == results[("truthfulqa", "mc2", None)]["value"]
    assert rows["ifeval"]["value"] == results[("ifeval", "prompt_level_loose_acc", None)]["value"]
    assert suite["macro"] == pytest.approx(sum(row["value"] for row in rows.values()) / 8, rel=1e-12)
    assert "over 8 of 8 tasks" in r.stdout and "missing:" not in r.stdout
