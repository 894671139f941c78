"""Intra-document masking (train.document_masking) against transformers given the equivalent masks.

The reference: transformers' Olmo3ForCausalLM (and the variant's remote code, archs/) called with
attention_mask = {"full_attention": M_full, "sliding_attention": M_sliding}, two 4-D additive masks built here
from the definition (a document ends with its EOS; query i sees key j in its own document, j <= i, and on
sliding layers i - j < sliding_window), positions 0 .. T-1 running across the instance (OLMo-core for OLMo 3).
A dict, because transformers 5.17's masking_utils returns a 4-D tensor mask as-is for every layer type
(_preprocess_mask_arguments: "If the mask is already 4D, simply return as-is"), so one 4-D mask would take
the window off the sliding layers; the models' forward skips mask creation for a dict and gives each layer
its type's mask (test_one_4d_mask_would_drop_the_window shows the difference).

Compared: the first training step's loss and every parameter's gradient, as tests/python/test_train.py
compares unmasked training (the same bounds: tolerances.py's logprob_bound and gradient_bound, two fp32
computations of the same forward and backward in different summation orders).
"""
import copy
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from test_train import base_sections, expect_error, metrics, write_shards, write_toml
from tolerances import forward_bound, gradient_bound, logprob_bound

SEQ = 16
EOS = 0
# Documents per instance (16 tokens each; the sliding window is 6): shorter and longer than the window, a
# one-token document, an instance that is one document, one that ends with its EOS. Two steps of four.
INSTANCES = [[4, 9, 3], [1, 15], [16], [10, 6], [6, 6, 4], [2, 14], [15, 1], [3, 3, 10]]


def document_tokens(seed=0):
    """The token stream: instances of INSTANCES laid end to end, each document but an instance's last ended by
    EOS (the last ends with the instance; [15, 1]'s lone last token is a document of its own after an EOS)."""
    rng = np.random.default_rng(seed)
    stream = []
    for lengths in INSTANCES:
        assert sum(lengths) == SEQ
        for i, n in enumerate(lengths):
            doc = list(rng.integers(2, 96, n))
            if i + 1 < len(lengths):
                doc[-1] = EOS
            stream += doc
    return np.array(stream)


def document_masks(ids, window):
    """{"full_attention", "sliding_attention"} -> additive [B, 1, T, T] fp32 masks for ids [B, T]."""
    ends = (ids == EOS).long()
    doc = torch.cumsum(ends, 1) - ends  # an EOS belongs to the document it ends
    T = ids.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    full = (doc[:, :, None] == doc[:, None, :]) & (j <= i)
    sliding = full & (i - j < window)
    additive = lambda allowed: torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None]
    return {"full_attention": additive(full), "sliding_attention": additive(sliding)}


def reference_step(model, tokens, z=1e-4, micro=2, masks=document_masks):
    """Step 1 of test_train's reference loop (global batch 4, micro-batches of 2, labels across the whole
    instance, boundaries included, as OLMo-core's get_labels), with the document masks: loss and gradients."""
    windows = torch.tensor(tokens[: 4 * SEQ], dtype=torch.long).view(-1, SEQ)
    labelled = 4 * (SEQ - 1)
    total_ce = 0.0
    for m in range(0, 4, micro):
        ids = windows[m:m + micro]
        logits = model(ids, attention_mask=masks(ids, model.config.sliding_window)).logits[:, :-1].float()
        target = ids[:, 1:]
        lse = torch.logsumexp(logits, -1)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                               reduction="sum")
        ((ce + z * (lse ** 2).sum()) / labelled).backward()
        total_ce += ce.item()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return total_ce / labelled, grads


def engine_step(tmp_path, model_dir, masking=True):
    write_shards(tmp_path / "shards", document_tokens())
    sections = base_sections(tmp_path, model_dir, train={"max_steps": 2, "document_masking": masking,
                                                         "loss_chunk_tokens": 0},
                             optim={"warmup_steps": 1})
    run_cli("train", "--config", write_toml(tmp_path / "run.toml", sections))
    loss = metrics(tmp_path / "run")[0]["loss"]
    return loss, load_file(str(tmp_path / "run" / "debug" / "grads-step-000001.safetensors"))


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_first_step_matches_transformers_with_document_masks(variant, tmp_path):
    if variant == "base":
        model = save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp_path / "init")
    else:  # 7 layers, Depth-Attention over layers 0, 2, 4, YaRN on the full layers
        model = save_random_variant(tmp_path / "init", depth_attention_recent_window=1)
    model.train()
    initial = copy.deepcopy(model)
    got_loss, got_grads = engine_step(tmp_path, tmp_path / "init")
    expected_loss, expected_grads = reference_step(model, document_tokens())
    unmasked_loss, unmasked_grads = reference_step(initial, document_tokens(), masks=lambda ids, w: None)

    bound = logprob_bound(forward_bound(initial, SEQ), initial.config.vocab_size, 2 * SEQ * 4 * expected_loss)
    assert abs(got_loss - expected_loss) <= bound, (got_loss, expected_loss, bound)
    largest = max(float(g.abs().max()) for g in expected_grads.values())
    tol = gradient_bound(initial.config, SEQ, 4 * (SEQ - 1), largest)
    assert set(got_grads) == set(expected_grads)
    worst = max(np.abs(got_grads[n] - expected_grads[n].numpy()).max() for n in got_grads)
    print(f"{variant}: loss {got_loss:.7f} vs {expected_loss:.7f} (bound {bound:.3g}; unmasked {unmasked_loss:.7f}), "
          f"gradients within {worst:.3g} (bound {tol:.3g})")
    assert worst <= tol, f"max gradient difference {worst:.3g} > {tol:.3g}"
    # The comparison tells masked from unmasked training, so it can fail.
    assert max(np.abs(got_grads[n] - unmasked_grads[n].numpy()).max() for n in got_grads) > 100 * tol


def test_one_4d_mask_would_drop_the_window(tmp_path):
    """Why the reference passes a dict: a single 4-D mask reaches the sliding layers unchanged, windowless."""
    model = save_random_olmo3(tiny_olmo3_config(), tmp_path / "m")
    ids = torch.tensor(document_tokens()[:2 * SEQ], dtype=torch.long).view(2, SEQ)
    masks = document_masks(ids, model.config.sliding_window)
    with torch.no_grad():
        honest = model(ids, attention_mask=masks).logits
        windowless = model(ids, attention_mask=masks["full_attention"]).logits
    assert (honest - windowless).abs().max() > 1e-3


def test_document_masking_needs_token_data_with_an_eos(tmp_path):
    # Chat examples are one per instance: the key is refused, naming it.
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    toml = write_toml(tmp_path / "chat.toml", {
        "model": {"preset": "tiny"}, "data": {"train": str(tmp_path / "chat.jsonl"), "format": "chat"},
        "train": {"run_dir": str(tmp_path / "run"), "sequence_length": 16, "max_steps": 1, "document_masking": True}})
    expect_error(["train", "--config", toml], "chat.toml: key 'train.document_masking'", 'data.format = "tokens"')
    # OLMo-core token files without metadata and a model without eos_token_id: no EOS to find documents by.
    model_dir = tmp_path / "no-eos"
    save_random_olmo3(tiny_olmo3_config(eos_token_id=None), model_dir)
    np.asarray(document_tokens(), dtype="<u4").tofile(tmp_path / "part-0.npy")
    sections = base_sections(tmp_path, model_dir, data={"train": str(tmp_path / "part-0.npy"), "token_dtype": "uint32"},
                             train={"document_masking": True})
    expect_error(["train", "--config", write_toml(tmp_path / "run.toml", sections)], "key 'train.document_masking'",
                 "EOS id", "eos_token_id")


def test_plan_counts_document_masking():
    def plan(*extra):
        return json.loads(run_cli("plan", "--preset", "1B", "--sequence-length", "8192", "--micro-batch", "2",
                                  "--json", *extra).stdout)

    cpu, cpu_masked = plan("--device", "cpu"), plan("--device", "cpu", "--document-masking")
    assert cpu_masked["options"]["document_masking"] and not cpu["options"]["document_masking"]
    # Off the flash kernel: per-row, per-document masks at their worst case and the concatenated outputs.
    assert cpu_masked["activation_bytes"]["attention_masks"] > cpu["activation_bytes"]["attention_masks"]
    assert cpu_masked["activation_bytes"]["document_masking"] > 0
    cuda, cuda_masked = plan(), plan("--document-masking")
    assert cuda_masked["activation_bytes"]["document_masking"] == 4 * (2 * 8192 + 1)  # the int32 offsets
    assert cuda_masked["bytes"]["activations"] - cuda["bytes"]["activations"] == 4 * (2 * 8192 + 1)
