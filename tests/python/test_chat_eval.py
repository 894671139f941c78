"""eval downstream --chat (eval/chat_format.h): the prompt ids of generation and multiple-choice requests equal the
exported tokenizer's apply_chat_template(messages, add_generation_prompt=True) in transformers for the messages
OLMES' rules build (its chat-format request objects, messages + assistant_prefix, as written for the suite's
::tulu specs; plain few-shot contexts turned into the conversation OLMES' instruct config of the task builds);
multiple-choice continuations as OLMES' convert_chat_instance leaves them; greedy generations equal transformers'
generate from those ids, ending at <|im_end|> or the end of text; multiple-choice log-likelihoods equal lm-eval's
HFLM on the chat-rendered contexts; and the files --chat cannot split fail naming the file, the line and the
reason. OLMES is not installable here: its rules are restated below with the file and line of olmes (99cf8bb7,
the fork behzadshomali/olmes of allenai/olmes) each follows."""
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


# ---- OLMES' chat rendering, restated ---------------------------------------------------------------------------


def concat_with_space(a, b):
    # olmes oe_eval/utils.py:371-377
    a, b = a.strip(), b.strip()
    return a + " " + b if a and b else a or b


def olmes_chat_context(doc_text, shots, description="", assistant_prefix="", multiturn=False):
    """olmes oe_eval/tasks/base_task.py:517-559, Task.fewshot_context under use_chat_format: `shots` are
    (doc_to_text(shot), doc_to_target(shot)); no ::tulu config of the suite sets a system prompt or a
    final_description."""
    def strip_prefix(msg):  # base_task.py:535-536, 543-544, 556-557
        return re.sub("\\s*" + re.escape(assistant_prefix) + "\\s*$", "", msg) if assistant_prefix else msg

    messages = []
    if not shots:  # base_task.py:521-527
        messages.append({"role": "user", "content": description + doc_text})
    elif multiturn:  # base_task.py:529-547
        for i, (text, target) in enumerate(shots):
            messages.append({"role": "user", "content": strip_prefix((description if i == 0 else "") + text)})
            messages.append({"role": "assistant", "content": concat_with_space(assistant_prefix, target)})
        messages.append({"role": "user", "content": strip_prefix(doc_text)})
    else:  # base_task.py:548-558
        labeled = "\n\n".join(text + target for text, target in shots) + "\n\n"
        messages.append({"role": "user", "content": strip_prefix(description + labeled + doc_text)})
    return {"messages": messages, "assistant_prefix": assistant_prefix}


def olmes_plain_context(doc_text, shots, description=""):
    """base_task.py:560-574: the same prompt without the chat format (what the installed files hold)."""
    if not shots:
        return description + doc_text
    return description + "\n\n".join(text + target for text, target in shots) + "\n\n" + doc_text


def olmes_convert(tokenizer, context, continuation=None):
    """olmes oe_eval/run_eval.py:213-232, convert_chat_instance with the model's own template: a chat-format context
    becomes apply_chat_template(messages, add_generation_prompt=True) + assistant_prefix, and a continuation loses
    its leading whitespace when there is no prefix; a string context stays as it is."""
    if isinstance(context, str):
        return context, continuation
    text = tokenizer.apply_chat_template(context["messages"], tokenize=False, add_generation_prompt=True)
    prefix = context.get("assistant_prefix", "")
    if not prefix and continuation is not None:
        continuation = continuation.lstrip()
    return text + prefix, continuation


# The suite's task specs, from OLMES' tulu_3_dev suite (olmes oe_eval/configs/task_suites.py:671-685), and what their
# configs set for the chat format after the chat_overrides (Task.__init__, base_task.py:112-123): (spec,
# fewshot_as_multiturn, assistant_prefix). drop::llama3 sets no use_chat_format; for a chat model run_eval.py:327-329
# makes it the default, and DROP's chat_overrides change only its stop sequences.
TULU = {
    "gsm8k": ("gsm8k::tulu", True, "Answer:"),  # tasks.py:5678-5692; gsm8k.py:71-80
    "minerva_math_algebra": ("minerva_math_algebra::tulu", True, ""),  # tasks.py:4587-4597; minerva_math.py:86-94
    "drop": ("drop::llama3", False, ""),  # tasks.py:491-499; drop.py:54-58
    "ifeval": ("ifeval::tulu", False, ""),  # tasks.py:5445-5449 (0-shot)
    "popqa": ("popqa::tulu", True, ""),  # tasks.py:7105-7112
    "mmlu_anatomy": ("mmlu_anatomy:mc::tulu", True, ""),  # tasks.py:4999-5009
    "bbh_navigate": ("bbh_navigate:cot-v1::tulu", True, ""),  # tasks.py:4081-4099; bbh.py:100-107
    "truthfulqa": ("truthfulqa::tulu", False, ""),  # tasks.py:5578-5586
}


# Known few-shot turns, rendered as OLMES renders a plain context (q + " " + a, shots joined by "\n\n").
GSM8K_SHOTS = [("Question: Ann has 3 apples and buys 2 more. How many apples?\nAnswer:", "3 + 2 = 5. So the answer is 5."),
               ("Question: A café sells 4 cakes a day. How many in 2 days?\nAnswer:", "4 * 2 = 8. So the answer is 8.")]
DROP_DESCRIPTION = "The following are reading comprehension questions.\n\n"
DROP_SHOTS = [("Passage: The Lions scored twice.\nQuestion: How many times did they score?\nAnswer:", "2")]


def plain_context(shots, question, description=""):
    return description + "".join(q + " " + a + "\n\n" for q, a in shots) + question


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
    # The plain contexts as OLMES' gsm8k::tulu (multiturn, prefix "Answer:") and drop::llama3 (one user turn) build them.
    gsm8k = olmes_chat_context("Question: Bo has 9 pens and loses 4. How many are left?\nAnswer:",
                               [(q, " " + a) for q, a in GSM8K_SHOTS], "", TULU["gsm8k"][2], TULU["gsm8k"][1])
    drop = olmes_chat_context("Passage: Rain fell on 3 days.\nQuestion: How many days?\nAnswer:",
                              [(q, " " + a) for q, a in DROP_SHOTS], DROP_DESCRIPTION, TULU["drop"][2], TULU["drop"][1])
    expected = [
        (gsm8k["messages"], "Answer:"),
        (chat_object["messages"], "Answer:"),
        (drop["messages"], ""),
    ]
    assert gsm8k["messages"][1]["content"].startswith("Answer: ") and len(drop["messages"]) == 1
    assert len(rows) == 3
    for row, (messages, prefix) in zip(rows, expected):
        assert row["messages"] == messages
        assert row["assistant_prefix"] == prefix
        ids = template_ids(tokenizer, messages, prefix)
        assert row["prompt_tokens"] == ids, (row["task"], row["doc_id"])
        assert row["generation"] == transformers_generation(hf, tokenizer, ids, ["\n\n"]), row
    assert json.loads(out.read_text())["chat"] is True


def python_split(context, question_marker, answer_marker):
    """An independent split of an installed plain few-shot context (regular expressions) into its description, its
    shots (doc_to_text, doc_to_target) and the question's doc_to_text."""
    blocks = re.split(r"\n\n(?=" + re.escape(question_marker) + ")", context)
    description = ""
    if not blocks[0].startswith(question_marker):
        description = blocks.pop(0) + "\n\n"
    shots = [re.match(r"(.*" + re.escape(answer_marker) + r")( .*)\Z", block, re.S).groups() for block in blocks[:-1]]
    return description, shots, blocks[-1]


def olmes_messages_of_plain(task, context, markers):
    """The conversation OLMES' ::tulu config of the task builds from the documents behind a plain context."""
    description, shots, question = python_split(context, *markers)
    _, multiturn, prefix = TULU[task]
    return olmes_chat_context(question, shots, description, prefix, multiturn), len(shots)


@pytest.mark.parametrize("task,markers", [("gsm8k", ("Question:", "\nAnswer:")),
                                          ("minerva_math_algebra", ("Problem:", "\n\nSolution:")),
                                          ("drop", ("Passage:", "\nAnswer:"))])
def test_installed_few_shot_files_under_chat(exported, task, markers):
    """The wheel's gsm8k (8 shots), Minerva (4 shots, solutions with blank lines) and DROP (5 shots after a
    description) under --chat: the conversation OLMES' gsm8k::tulu (turns, prefix "Answer:"), minerva_math::tulu
    (turns, its own "Minerva:MATH" shots: test_olmes_prompts.py) and drop::llama3 (one user turn) build from the same
    documents, with the template's ids."""
    from test_olmes_prompts import minerva_query, minerva_shots

    tmp, hf = exported
    _, _, rows = ds.engine(hf, tmp, "--chat", "--max-length", 2048, tasks=task, limit=2, fmt="rc", name=f"chat-{task}")
    tokenizer = hf_tokenizer(hf)
    for row, request in zip(rows, read_requests(task, 2)):
        if task.startswith("minerva_math"):
            shots = minerva_shots("Minerva:MATH")
            context = olmes_chat_context(minerva_query(request["doc"]["problem"]), shots, "", "", True)
            shots = len(shots)
        else:
            context, shots = olmes_messages_of_plain(task, request["request"]["context"], markers)
        assert shots == {"gsm8k": 8, "minerva_math_algebra": 4, "drop": 5}[task]
        messages = context["messages"]
        assert len(messages) == (1 if task == "drop" else 2 * shots + 1)
        assert row["messages"] == messages
        assert row["assistant_prefix"] == context["assistant_prefix"]
        ids = tokenizer(olmes_convert(tokenizer, context)[0], add_special_tokens=False)["input_ids"]
        assert row["prompt_tokens"] == ids[-len(row["prompt_tokens"]):]
        assert row["truncated"] or row["prompt_tokens"] == ids


def test_multiple_choice_under_chat_equals_lm_eval(exported):
    """MMLU mc 5-shot under --chat: each request's context is the template's rendering of the turns mmlu:mc::tulu
    builds (the subject's description opening the first), its continuation without the leading space (OLMES'
    convert_chat_instance), and its log-likelihoods are lm-eval HFLM's on (that context, continuation)."""
    tmp, hf = exported
    _, _, rows = ds.engine(hf, tmp, "--chat", "--shots", 5, tasks="mmlu_anatomy", limit=2, fmt="mc", name="chat-mc")
    tokenizer = hf_tokenizer(hf)
    plain = {}
    with gzip.open(RENDERED / "mmlu_anatomy" / "mc_5shot" / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            plain[(r["doc_id"], r["idx"])] = r["request"]["context"], r["request"]["continuation"]
    pairs = []
    for row in rows:
        context, _ = olmes_messages_of_plain("mmlu_anatomy", plain[(row["doc_id"], row["idx"])][0], ("Question:",
                                                                                                  "\nAnswer:"))
        assert len(context["messages"]) == 11
        text, continuation = olmes_convert(tokenizer, context, plain[(row["doc_id"], row["idx"])][1])
        assert row["context"] == text and row["continuation"] == continuation and not continuation.startswith(" ")
        pairs.append((text, continuation))
    expected = ds.lm_eval_loglikelihoods(hf, "base", pairs)
    for row, (ll, greedy, n) in zip(rows, expected):
        assert row["n_continuation_tokens"] == n and row["is_greedy"] == greedy
        assert abs(row["loglikelihood"] - ll) <= 1e-3 * max(1.0, abs(ll)), (row, ll)


# ---- OLMES' request files for the suite's eight tasks ----------------------------------------------------------
# Each task's documents as OLMES' task code renders them (doc_to_text, doc_to_target; the few-shot examples the same
# for every document), and each line with the fields OLMES' writer gives it: RequestInstance.to_dict (olmes
# oe_eval/components/instances.py:85-95, saved by run_eval.py:782 with --save-raw-requests): request_type, doc,
# request ({context, continuation} or {context, stop_sequences, generation_kwargs}), idx, task_name, doc_id,
# native_id, label.


def mcq(question, choices):  # olmes oe_eval/tasks/utils.py:64-87 make_mcq_prompt, label_prefix " "
    return f"Question: {question}\n" + "\n".join(f" {l}. {c}" for l, c in zip("ABCD", choices)) + "\nAnswer:"


BBH_Q = "Q: If you follow these instructions, do you return to the starting point? {}\nOptions:\n- Yes\n- No\nA: " \
        "Let's think step by step."  # bbh.py:156-170 with short_prefix and use_cot
OLMES_DOCS = {  # task: (description, shots [(text, target)], documents [(doc, text, label or choices)])
    "gsm8k": ("", [("Question: Ann has 3 apples and buys 2 more. How many apples?\nAnswer:", " 3 + 2 = 5.\n#### 5"),
                   ("Question: A café sells 4 cakes a day. How many in 2 days?\nAnswer:", " 4 * 2 = 8.\n#### 8")],
              [({"question": "Bo has 9 pens and loses 4. How many are left?"},
                "Question: Bo has 9 pens and loses 4. How many are left?\nAnswer:", "5"),
               ({"question": "What is 6 * 7?"}, "Question: What is 6 * 7?\nAnswer:", "42")]),
    "minerva_math_algebra": ("", [("Problem:\nSolve $x + 1 = 3$.\n\nSolution:",
                                   " $x = 3 - 1 = 2$.\n\nFinal Answer: The final answer is $2$. I hope it is correct."),
                                  ("Problem:\nWhat is $2 + 2$?\n\nSolution:",
                                   " $2 + 2 = 4$.\nFinal Answer: The final answer is $4$. I hope it is correct.")],
                             [({"problem": "What is $2^3$?"}, "Problem:\nWhat is $2^3$?\n\nSolution:", "8")]),
    "drop": ("", [("Passage: The Lions scored twice.\nQuestion: How many times did they score?\nAnswer:", " 2"),
                  ("Passage: Ann met Bo in 1990.\nQuestion: When did Ann meet Bo?\nAnswer:", " 1990")],
             [({"answers": [["3"]]}, "Passage: Rain fell on 3 days.\nQuestion: How many days?\nAnswer:", [["3"]])]),
    "ifeval": ("", [], [({"key": 1, "prompt": "Write two sentences about cats without commas.",
                          "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
                         "Write two sentences about cats without commas.", None)]),
    "popqa": ("", [("Q: What is the capital of Peru? A:", " Lima"), ("Q: Who wrote Emma? A:", " Jane Austen"),
                   ("Q: What sport does Lionel Messi play? A:", " association football")],
              [({"possible_answers": json.dumps(["William Shakespeare", "Shakespeare"])}, "Q: Who wrote Hamlet? A:",
                ["William Shakespeare", "Shakespeare"])]),
    "mmlu_anatomy": ("The following are multiple choice questions (with answers) about anatomy.\n\n",  # mmlu.py:128
                     [(mcq("Which organ pumps blood?", ["Heart", "Lung", "Liver", "Skin"]), " A"),
                      (mcq("How many chambers has the human heart?", ["Two", "Three", "Four", "Five"]), " C")],
                     [({"gold": 1}, mcq("Which bone is in the thigh?", ["Ulna", "Femur", "Tibia", "Radius"]),
                       ["A", "B", "C", "D"]),
                      ({"gold": 3}, mcq("Where is the cornea?", ["Ear", "Nose", "Skin", "Eye"]), ["A", "B", "C", "D"])]),
    "bbh_navigate": ("Given a series of navigation instructions, determine whether one would end up back at the "
                     "starting point.\n\n",  # bbh.py:72, OLMES' BBH_DESCRIPTIONS
                     [(BBH_Q.format("Take 1 step. Turn around. Take 1 step."),
                       " \nWe take 1 step forward and 1 step back, ending where we started. So the answer is Yes."),
                      (BBH_Q.format("Take 2 steps. Take 1 step."),
                       " \nWe take 3 steps forward and stay there. So the answer is No.")],
                     [({"input": "Take 3 steps. Turn around. Take 3 steps."},
                       BBH_Q.format("Take 3 steps. Turn around. Take 3 steps."), "Yes")]),
    "truthfulqa": ("", [(f"Q: Primer question {i}?\nA:", f" Primer answer {i}.") for i in range(6)],  # 6 shots
                   [({"question": "What is 2 + 2?", "choices": ["4", "5", "four"], "labels": [1, 0, 1],
                      "mc1_indices": [0, 1], "mc2_indices": [0, 1, 2]}, "Q: What is 2 + 2?\nA:", ["4", "5", "four"]),
                    ({"question": "Can pigs fly?", "choices": ["No", "Yes"], "labels": [1, 0], "mc1_indices": [0, 1],
                      "mc2_indices": [0, 1]}, "Q: Can pigs fly?\nA:", ["No", "Yes"])]),
}  # fmt: skip
CHOICE_TASKS = {"mmlu_anatomy": ("mc", "acc_raw"), "truthfulqa": ("rc", "mc2")}


def write_olmes_files(root, tasks, chat):
    """OLMES' request files for `tasks` (bbh_* subtasks take bbh_navigate's documents), chat-format as the ::tulu
    specs write them (chat) or plain; returns {(task, doc_id, idx): (the chat context OLMES builds, continuation)}."""
    expected = {}
    for task in tasks:
        description, shots, docs = OLMES_DOCS["bbh_navigate" if task.startswith("bbh_") else task]
        _, multiturn, prefix = TULU["bbh_navigate" if task.startswith("bbh_") else task]
        fmt, primary = CHOICE_TASKS.get(task, ("gen", "exact_match"))
        d = root / task / f"{fmt}_{len(shots)}shot"
        d.mkdir(parents=True)
        config = {"task_name": task, "num_shots": len(shots), "primary_metric": primary,
                  "generation_kwargs": {"max_gen_toks": MAX_GEN_TOKS, "do_sample": False, "temperature": 0.0}}
        (d / "config.json").write_text(json.dumps({"task_name": task, "task_config": config}))
        lines = []
        for doc_id, (doc, text, gold) in enumerate(docs):
            context = olmes_chat_context(text, shots, description, prefix, multiturn)
            written = context if chat else olmes_plain_context(text, shots, description)
            line = {"doc": doc, "task_name": task, "doc_id": doc_id, "native_id": doc_id}
            if fmt == "gen":
                request = {"context": written, "stop_sequences": ["\n\n"], "generation_kwargs": config["generation_kwargs"]}
                lines.append({"request_type": "generate_until", "request": request, "idx": 0, "label": gold, **line})
                expected[(task, doc_id, None)] = (context, None)
            else:  # TruthfulQA's requests have no label (truthfulqa.py:108-131)
                for idx, choice in enumerate(gold):
                    request = {"context": written, "continuation": " " + choice}
                    lines.append({"request_type": "loglikelihood", "request": request, "idx": idx,
                                  "label": doc.get("gold"), **line})
                    expected[(task, doc_id, idx)] = (context, " " + choice)
        with gzip.open(d / "requests.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return expected


@pytest.mark.parametrize("chat", [True, False], ids=["olmes-chat-files", "plain-files"])
def test_olmes_request_files_of_the_eight_tasks(exported, tmp_path, chat):
    """The suite's eight tasks from OLMES-written request files, chat-format (as its ::tulu specs write them) and
    plain (its non-chat rendering) under --chat: each generation's prompt ids are the template's ids of the messages
    OLMES' rules build (+ the assistant prefix), each multiple-choice request's context and continuation are OLMES'
    converted ones, and their log-likelihoods lm-eval HFLM's on them."""
    _, hf = exported
    expected = write_olmes_files(tmp_path / "tasks", list(TULU), chat)
    out, rows_path = tmp_path / "run.json", tmp_path / "run.jsonl"
    run_cli("eval", "downstream", "--model", hf, "--tasks", ",".join(TULU), "--format", "both", "--tasks-dir",
            tmp_path / "tasks", "--chat", "--out", out, "--requests-out", rows_path)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    tokenizer = hf_tokenizer(hf)
    pairs, choice_rows = [], []
    for row in rows:
        generation = "generation" in row
        context, continuation = expected[(row["task"], row["doc_id"], None if generation else row["idx"])]
        text, continuation = olmes_convert(tokenizer, context, continuation)
        if generation:
            assert row["messages"] == context["messages"], row["task"]
            assert row["prompt_tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"], row["task"]
        else:
            assert (row["context"], row["continuation"]) == (text, continuation), row["task"]
            pairs.append((text, continuation))
            choice_rows.append(row)
    assert {row["task"] for row in rows} == set(TULU) and len(rows) == len(expected)
    truthfulqa = [row for row in rows if row["task"] == "truthfulqa"][0]  # one user turn, no prefix: no space
    assert truthfulqa["context"].endswith("<|im_start|>assistant\n") and truthfulqa["continuation"] == "4"
    gsm8k = [row for row in rows if row["task"] == "gsm8k"][0]  # its prefix follows the generation prompt
    assert tokenizer.decode(gsm8k["prompt_tokens"]).endswith("<|im_start|>assistant\nAnswer:")
    for row, (ll, greedy, n) in zip(choice_rows, ds.lm_eval_loglikelihoods(hf, "base", pairs)):
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
    # A multiple-choice file too (OLMES' truthfulqa::tulu), and a context of neither form names the line.
    write_olmes_files(tmp_path / "mc", ["truthfulqa"], chat=True)
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "truthfulqa", "--tasks-dir", tmp_path / "mc",
                check=False)
    assert r.returncode == 1 and "truthfulqa/rc_6shot/requests.jsonl.gz: document 0: request.context is a " \
        "chat-format conversation (OLMES' use_chat_format): add --chat" in r.stderr, r.stderr
    path = tmp_path / "mc" / "truthfulqa" / "rc_6shot" / "requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    lines[0]["request"]["context"] = ["Q: a list?"]
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "truthfulqa", "--tasks-dir", tmp_path / "mc", "--chat",
                check=False)
    assert r.returncode == 1 and "rc_6shot/requests.jsonl.gz:1 request: field \"context\" must be a string or " \
        "OLMES' chat-format" in r.stderr, r.stderr


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
    """Request files for the four tasks no package ships, as OLMES writes them for the suite's specs
    (bbh:cot-v1::tulu's 27 subtasks, ifeval::tulu, popqa::tulu, truthfulqa::tulu): chat-format contexts, TruthfulQA's
    six shots in one user turn with its choices' continuations " <choice>"."""
    from test_sft_metrics import BBH_SUBTASKS

    return write_olmes_files(root, [f"bbh_{s}" for s in BBH_SUBTASKS] + ["ifeval", "popqa", "truthfulqa"], chat=True)


def test_suite_with_the_users_request_files_has_all_eight(exported, tmp_path):
    tmp, hf = exported
    suite_request_files(tmp_path / "olmes")
    out = tmp_path / "suite.json"
    r = run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3-sft", "--limit", 1, "--tasks-dir",
                tmp_path / "olmes", "--out", out)
    assert truthfulqa_context_is_one_turn(tmp_path / "olmes")
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
    for task in rows:
        # a value on every row (stderr nan where a task has one document)
        assert re.search(rf"^{task} +{rows[task]['metric']} +\d+\.\d \+- (\d+\.\d|nan) ", r.stdout, re.M), r.stdout


def truthfulqa_context_is_one_turn(root):
    """The file is OLMES' chat format (the form the engine refused before): one user message, no prefix."""
    with gzip.open(root / "truthfulqa" / "rc_6shot" / "requests.jsonl.gz", "rt") as f:
        line = json.loads(f.readline())
    context = line["request"]["context"]
    return context["assistant_prefix"] == "" and [m["role"] for m in context["messages"]] == ["user"] and \
        context["messages"][0]["content"].count("\nA:") == 7 and line["request"]["continuation"].startswith(" ")
