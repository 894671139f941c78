"""export-hf: a training checkpoint becomes a Hugging Face directory that transformers loads (base: no
remote code; siamese_depth: trust_remote_code=True) with the same logits as the engine, and a tokenizer
whose chat template renders, token for token, what the engine encodes for the same conversation."""
import json
import subprocess

import numpy as np
import pytest
import torch

from conftest import REPO, engine_logits, fnv1a_batch_hash, run_cli
from tolerances import forward_bound


@pytest.fixture(scope="module")
def corpus():
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_corpus.sh")], check=True, capture_output=True)
    return REPO / "data" / "corpus"


# The variant with each normalization topology other than its default (SPEC.md section 7); the remote code
# computes them all from config.json's norm_topology.
TOPOLOGIES = ["pre", "peri", "post", "deepnorm", "hybrid", "residual", "siamese_post_pre"]


@pytest.mark.parametrize("variant", ["base", "siamese_depth"] + [f"siamese_depth:{t}" for t in TOPOLOGIES])
def test_export_loads_in_transformers(variant, corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Olmo3ForCausalLM

    variant, _, topology = variant.partition(":")
    toml = tmp_path / "run.toml"
    toml.write_text(f"""
[model]
preset = "micro"
variant = "{variant}"
{f'norm_topology = "{topology}"' if topology else ""}
[data]
train = "{corpus / 'train'}"
[train]
run_dir = "{tmp_path / 'run'}"
sequence_length = 32
micro_batch = 2
max_steps = 2
""")
    run_cli("train", "--config", toml)
    run_cli("export-hf", tmp_path / "run", tmp_path / "hf")
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    if variant == "base":
        assert "auto_map" not in json.loads((tmp_path / "hf" / "config.json").read_text())
        model = Olmo3ForCausalLM.from_pretrained(tmp_path / "hf").eval()  # no remote code needed
    else:
        assert "modeling_olmo3_siamese_depth.py" in files
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
        assert model.config.resolved_norm_topology() == (topology or "siamese_hybrid_pre")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    text = "The Python tutorial introduces the reader informally to the basic concepts."
    ids = tokenizer(text)["input_ids"]
    assert list(map(int, run_cli("encode", "--tokenizer", tmp_path / "hf", "--text", text).stdout.split())) == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(engine_logits(tmp_path / "hf", ids, tmp_path) - expected).max() <= forward_bound(model, len(ids))


def test_export_refuses_a_tokenizer_larger_than_the_model(tmp_path):
    run_cli("init", "--preset", "tiny", "--out", tmp_path / "m")
    result = run_cli("export-hf", tmp_path / "m", tmp_path / "out", check=False)
    assert result.returncode == 1 and "100278 ids" in result.stderr and "vocab_size is 512" in result.stderr


# ---- the exported chat template against the engine's own chat encoding -----------------------------

SYSTEM = {"role": "system", "content": "You are a careful calculator."}
U1, A1 = {"role": "user", "content": "What is 7 * 35?"}, {"role": "assistant", "content": "7 * 35 = 245."}
U2, A2 = {"role": "user", "content": "And times 9?"}, {"role": "assistant", "content": "245 * 9 = 2205."}
ENV = {"role": "environment", "content": '{"result": 2205}'}
# Conversations ending with an assistant turn (what SFT trains on: the template without a generation prompt).
FINISHED = {
    "one turn, default system": [U1, A1],
    "one turn, own system": [SYSTEM, U1, A1],
    "multi-turn": [U1, A1, U2, A2],
    "multi-turn, own system, environment turn": [SYSTEM, U1, A1, U2, ENV, A2],
    "unicode and spacing": [{"role": "user", "content": "  Grüße, 東京 🤗\n\nTabs\there "},
                            {"role": "assistant", "content": "Hallo!  Ça va?\n- a\n- b"}],
}
# Contents that start with a newline: the template tokenizes the whole text, so "\n" + "\n..." merges across
# the turn header into one token (55 ids here; encoding header and content apart, as the engine once did,
# gives 57).
NEWLINE_FIRST = {"contents that start with a newline": [{"role": "user", "content": "\nWhat is 2 + 2?"},
                                                        {"role": "assistant", "content": "\n\n2 + 2 = 4."}]}
# Conversations waiting for the assistant (what generate --chat/--messages prompts with: the template with a
# generation prompt).
OPEN = {
    "one turn, default system": [U1],
    "one turn, own system": [SYSTEM, U1],
    "multi-turn": [U1, A1, U2],
    "multi-turn, own system, environment turn": [SYSTEM, U1, A1, U2, ENV],
    "content that starts with a newline": [{"role": "user", "content": "\n\nWhat is 2 + 2?"}],
    "ends with an assistant turn (the assistant goes on)": [U1, A1],
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random micro model exported with its (dolma2) tokenizer and chat template."""
    work = tmp_path_factory.mktemp("chat")
    run_cli("init", "--preset", "micro", "--out", work / "m")
    run_cli("export-hf", work / "m", work / "hf")
    return work / "hf"


def template_ids(tokenizer, messages, add_generation_prompt):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_sft_encoding(conversations, exported, tmp_path):
    """Each finished conversation, as one training example (no shuffle, one example a step), is encoded by
    the engine into exactly the ids of the exported template without a generation prompt: the step's
    batch_hash (FNV-1a over the step's input ids, padded with <|pad|> to the sequence length) equals the hash
    of the template's ids padded the same way."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    names = list(conversations)
    expected = [template_ids(tokenizer, conversations[n], add_generation_prompt=False) for n in names]
    seq = max(map(len, expected)) + 8  # padding after every example: a longer engine encoding would show too
    with open(tmp_path / "chat.jsonl", "w") as f:
        for n in names:
            f.write(json.dumps({"messages": conversations[n]}) + "\n")
    (tmp_path / "run.toml").write_text(f"""
[model]
init_from = "{exported}"
[data]
format = "chat"
train = "{tmp_path / 'chat.jsonl'}"
tokenizer = "{exported}"
shuffle = false
[train]
run_dir = "{tmp_path / 'run'}"
sequence_length = {seq}
micro_batch = 1
max_steps = {len(names)}
""")
    run_cli("train", "--config", tmp_path / "run.toml")
    steps = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    got = [m["batch_hash"] for m in steps if "batch_hash" in m]
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    want = [fnv1a_batch_hash([ids + [pad] * (seq - len(ids))]) for ids in expected]
    mismatched = [(n, tokenizer.apply_chat_template(conversations[n], tokenize=False)) for n, g, w in zip(names, got, want) if g != w]
    assert len(got) == len(names) and not mismatched, mismatched


def test_chat_template_equals_the_engine_sft_encoding(exported, tmp_path):
    """SFT path: with and without a system turn, multi-turn, an environment turn, unicode and spacing."""
    check_sft_encoding(FINISHED, exported, tmp_path)


def test_chat_template_equals_the_engine_sft_encoding_newline_first(exported, tmp_path):
    check_sft_encoding(NEWLINE_FIRST, exported, tmp_path)


@pytest.mark.parametrize("generation_prompt", [False, True])
def test_chat_template_equals_engine_encode_messages(generation_prompt, exported, tmp_path):
    """The exact check of both engine chat encoders:
    `archspace encode --tokenizer T --messages FILE` prints the SFT encoding (encode_chat) of the conversation
    in FILE as ids; with `--generation-prompt` the prompt encoding that generate --messages uses
    (encode_chat_prompt). Each must equal the exported template's ids token for token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    for name, messages in (OPEN if generation_prompt else {**FINISHED, **NEWLINE_FIRST}).items():
        (tmp_path / "m.json").write_text(json.dumps(messages))
        args = ["encode", "--tokenizer", exported, "--messages", tmp_path / "m.json"]
        got = list(map(int, run_cli(*args, *(["--generation-prompt"] if generation_prompt else [])).stdout.split()))
        assert got == template_ids(tokenizer, messages, generation_prompt), name


def test_chat_template_matches_the_engine_generation_prompt(exported, tmp_path):
    """Generation path, as far as the current CLI shows it: for each open conversation, a batch row given as
    {"messages": ...} (the engine's chat prompt) and a row given as {"tokens": template ids with the generation
    prompt} have the same prompt length and the same 6 greedy tokens. (The length is compared exactly; the
    ids only through the continuation: the exact check is test_chat_template_equals_engine_encode_messages.)"""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    expected = [template_ids(tokenizer, m, add_generation_prompt=True) for m in OPEN.values()]
    lines = [json.dumps({"messages": m}) for m in OPEN.values()] + [json.dumps({"tokens": ids}) for ids in expected]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    rows = [json.loads(l) for l in run_cli("generate", "--model", exported, "--prompts-file", tmp_path / "p.jsonl",
                                           "--max-new-tokens", 6).stdout.splitlines()]
    n = len(OPEN)
    for name, ids, chat_row, token_row in zip(OPEN, expected, rows[:n], rows[n:]):
        assert chat_row["prompt_tokens"] == len(ids) == token_row["prompt_tokens"], name
        assert chat_row["tokens"] == token_row["tokens"], name


# ---- export-hf --force and the tokenizer as transformers loads it ---------------------------------------

def test_export_into_an_existing_directory_needs_force_and_replaces_it_whole(tmp_path):
    run_cli("init", "--preset", "micro", "--out", tmp_path / "a")
    run_cli("init", "--preset", "micro", "--seed", "7", "--out", tmp_path / "b")
    out = tmp_path / "hf"
    run_cli("export-hf", tmp_path / "a", out)
    first = (out / "model.safetensors").read_bytes()
    (out / "stale.txt").write_text("from an earlier export")
    r = run_cli("export-hf", tmp_path / "b", out, check=False)
    assert r.returncode == 1 and "exists and is not empty (pass --force to replace it)" in r.stderr, r.stderr
    assert (out / "model.safetensors").read_bytes() == first  # untouched
    run_cli("export-hf", tmp_path / "b", out, "--force")
    assert (out / "model.safetensors").read_bytes() != first and not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "hf"]  # no temporary directory left
    # --model / --out (lm-eval's --output_path) in place of the positionals.
    run_cli("export-hf", "--model", tmp_path / "a", "--output_path", out, "--force")
    assert (out / "model.safetensors").read_bytes() == first
    # --force never replaces the directory that holds the checkpoint itself.
    r = run_cli("export-hf", tmp_path / "a", tmp_path / "a", "--force", check=False)
    assert r.returncode == 1 and "holds the checkpoint being exported" in r.stderr, r.stderr
    assert (tmp_path / "a" / "config.json").exists()


LOAD_TOKENIZER = """
import sys
from transformers import {cls}
t = {cls}.from_pretrained(sys.argv[1]{extra})
print("IDS", " ".join(map(str, t(sys.argv[2])["input_ids"])))
"""


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_exported_tokenizer_loads_without_a_prompt_or_a_warning(variant, tmp_path):
    """AutoTokenizer on the export: no "[y/N]" prompt for remote code, no "incorrect regex pattern" warning
    (transformers 5.x gives it to any local directory whose config.json lacks transformers_version), and the ids
    of the engine's own tokenizer. The variant's config.json names remote code, which AutoTokenizer 5.x loads
    before the tokenizer: trust_remote_code=True there (or PreTrainedTokenizerFast, which reads no config)."""
    import sys

    import transformers

    run_cli("init", "--preset", "micro", "--variant", variant, "--out", tmp_path / "m")
    run_cli("export-hf", tmp_path / "m", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["transformers_version"] == transformers.__version__  # the release requirements.txt pins
    text = "Hello world 12345, naïve café {x: [1, 2]}\n\tand  spaces"
    engine_ids = run_cli("encode", "--tokenizer", tmp_path / "hf", "--text", text).stdout.split()
    loads = [("AutoTokenizer", "" if variant == "base" else ", trust_remote_code=True"),
             ("PreTrainedTokenizerFast", "")]
    for cls, extra in loads:
        r = subprocess.run([sys.executable, "-c", LOAD_TOKENIZER.format(cls=cls, extra=extra), tmp_path / "hf", text],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, check=True)
        output = r.stdout + r.stderr
        assert "[y/N]" not in output and "custom code" not in output, output
        assert "regex" not in output and "fix_mistral_regex" not in output, output
        assert "warn" not in output.lower(), output
        ids = next(line for line in r.stdout.splitlines() if line.startswith("IDS")).split()[1:]
        assert ids == engine_ids, (cls, ids, engine_ids)
