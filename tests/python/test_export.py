"""export-hf: a training checkpoint becomes a Hugging Face directory that transformers loads (base: no
remote code; siamese_depth: trust_remote_code=True) with the same logits as the engine, and a tokenizer."""
import json
import subprocess

import numpy as np
import pytest
import torch

from conftest import REPO, engine_logits, run_cli


@pytest.fixture(scope="module")
def corpus():
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_corpus.sh")], check=True, capture_output=True)
    return REPO / "data" / "corpus"


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_export_loads_in_transformers(variant, corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Olmo3ForCausalLM

    toml = tmp_path / "run.toml"
    toml.write_text(f"""
[model]
preset = "micro"
variant = "{variant}"
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
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    text = "The Python tutorial introduces the reader informally to the basic concepts."
    ids = tokenizer(text)["input_ids"]
    assert list(map(int, run_cli("encode", "--tokenizer", tmp_path / "hf", "--text", text).stdout.split())) == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(engine_logits(tmp_path / "hf", ids, tmp_path) - expected).max() <= 1e-4
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_export_refuses_a_tokenizer_larger_than_the_model(tmp_path):
    run_cli("init", "--preset", "tiny", "--out", tmp_path / "m")
    result = run_cli("export-hf", tmp_path / "m", tmp_path / "out", check=False)
    assert result.returncode == 1 and "100278 ids" in result.stderr and "vocab_size is 512" in result.stderr
