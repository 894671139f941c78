"""Named activations on the Python side, under the names of archspace's engine (model/trace.h), and the
comparison that names the first tensor where the engine and transformers part.

- The variant (archs/ remote code) records them itself: its module's capture_activations(model).
- transformers' Olmo3ForCausalLM has no such facility; olmo3_activations(model) takes them with forward
  hooks. Olmo3Attention applies RoPE inside its forward, so q and k are recomputed from the q_norm/k_norm
  outputs with the cos/sin tables the layer received (transformers' own apply_rotary_pos_emb).
"""
import contextlib
import sys

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers.models.olmo3.modeling_olmo3 import apply_rotary_pos_emb

from conftest import run_cli


def activation_names(num_layers, siamese=False, depth=False):
    """The documented names in forward order (model/trace.h), without "logits"."""
    names = ["model.embeddings"]
    for l in range(num_layers):
        per_layer = ["attn_input", "q", "k", "v"] + (["v_mixed"] if depth else []) + ["attn_output", "mlp_output"]
        per_layer += ["X", "Y"] if siamese else ["hidden"]
        names += [f"model.layers.{l}.{n}" for n in per_layer]
    return names + ["model.final_hidden"]


@contextlib.contextmanager
def olmo3_activations(model):
    """transformers' Olmo3ForCausalLM: every named activation through forward hooks, in forward order."""
    store, hooks = {}, []
    backbone = model.model

    def keep(name):
        return lambda module, args, out: store.__setitem__(name, out.detach())

    hooks.append(backbone.embed_tokens.register_forward_hook(keep("model.embeddings")))
    for i, layer in enumerate(backbone.layers):
        prefix, attn, rope = f"model.layers.{i}.", layer.self_attn, {}

        def attention_input(module, args, kwargs, prefix=prefix, rope=rope):
            store[prefix + "attn_input"] = kwargs["hidden_states"].detach()
            rope["cos"], rope["sin"] = kwargs["position_embeddings"]

        def heads(out, head_dim):  # [B, T, n * D] -> [B, n, T, D], as Olmo3Attention splits them
            return out.detach().view(*out.shape[:-1], -1, head_dim).transpose(1, 2)

        def rotated(name, prefix=prefix, rope=rope, head_dim=attn.head_dim):
            def hook(module, args, out):
                x = heads(out, head_dim)
                store[prefix + name] = apply_rotary_pos_emb(x, x, rope["cos"], rope["sin"])[0]
            return hook

        hooks += [
            attn.register_forward_pre_hook(attention_input, with_kwargs=True),
            attn.q_norm.register_forward_hook(rotated("q")),
            attn.k_norm.register_forward_hook(rotated("k")),
            attn.v_proj.register_forward_hook(
                lambda m, a, out, prefix=prefix, h=attn.head_dim: store.__setitem__(prefix + "v", heads(out, h))),
            attn.register_forward_hook(  # Olmo3Attention returns (output after o_proj, weights)
                lambda m, a, out, prefix=prefix: store.__setitem__(prefix + "attn_output", out[0].detach())),
            layer.mlp.register_forward_hook(keep(prefix + "mlp_output")),
            layer.register_forward_hook(keep(prefix + "hidden")),
        ]
    hooks.append(backbone.norm.register_forward_hook(keep("model.final_hidden")))
    try:
        yield store
    finally:
        for hook in hooks:
            hook.remove()


def capture(model):
    """The variant's own capture_activations, else the hooks for transformers' Olmo3."""
    remote = getattr(sys.modules[type(model).__module__], "capture_activations", None)
    return remote(model) if remote else olmo3_activations(model)


def reference_trace(model, tokens):
    """name -> fp32 numpy array [1, ...], in forward order, then "logits" [1, T, V]."""
    with torch.no_grad(), capture(model) as store:
        logits = model(torch.tensor([tokens])).logits
    trace = {name: t.float().numpy() for name, t in store.items()}
    trace["logits"] = logits.float().numpy()
    return trace


def engine_trace(model_dir, tokens, tmp_path, *extra):
    """`archspace trace`: name -> fp32 numpy array [1, ...] (the file's order is not the forward order)."""
    out = tmp_path / "trace.safetensors"
    run_cli("trace", "--model", model_dir, "--tokens", " ".join(map(str, tokens)), "--out", out, *extra)
    return load_file(str(out))


def first_difference(engine, reference, tol):
    """'first difference: NAME (max abs diff X)' for the first tensor in the reference's forward order
    that is missing, mis-shaped or further than `tol` from the engine's; None when every tensor agrees.
    `tol`: a number, or a function (name, reference tensor) -> bound (tolerances.activation_bound)."""
    for name, want in reference.items():
        if name not in engine:
            return f"first difference: {name} (missing from the engine's trace)"
        got = engine[name]
        if got.shape != want.shape:
            return f"first difference: {name} (shape {list(got.shape)}, reference {list(want.shape)})"
        diff = float(np.abs(got - want).max())
        bound = tol(name, want) if callable(tol) else tol
        if not diff <= bound:  # NaN counts as a difference
            return f"first difference: {name} (max abs diff {diff:.2g}, bound {bound:.2g})"
    extra = [name for name in engine if name not in reference]
    return f"first difference: {extra[0]} (missing from the reference trace)" if extra else None


def explain_logit_difference(model_dir, model, tokens, tmp_path, tol, *extra):
    """For an assertion message when the logits differ: where the two traces first part."""
    found = first_difference(engine_trace(model_dir, tokens, tmp_path, *extra), reference_trace(model, tokens), tol)
    return found or "every named activation agrees within its bound"
