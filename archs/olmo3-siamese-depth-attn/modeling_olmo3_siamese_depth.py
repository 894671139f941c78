"""OLMo 3 + SiameseNorm + Depth-Attention (archspace SPEC.md section 3), as transformers remote code.

Built on transformers' Olmo3 classes; only what differs is written here:
- Depth-Attention: inside attention, after Q/K norm and RoPE and before token attention (and before the
  KV cache), each layer's values are replaced by a softmax mix over earlier layers' mixed values. The
  cache therefore stores mixed values; state lives for one forward call only.
- SiameseNorm ("hybrid_pre"): two residual streams X (bounded) and Y (identity) replace the single
  stream with its post-sublayer norms, and the final norm reads both.
With both switches off the model is Olmo3ForCausalLM exactly.

`capture_activations(model)` records every intermediate under the names archspace's engine uses
(include/archspace/model/trace.h), to find the first tensor where two implementations part.
"""
import contextlib
import contextvars
import math

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.olmo3.modeling_olmo3 import (
    Olmo3Attention,
    Olmo3DecoderLayer,
    Olmo3ForCausalLM,
    Olmo3Model,
    Olmo3PreTrainedModel,
    Olmo3RMSNorm,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from .configuration_olmo3_siamese_depth import Olmo3SiameseDepthConfig


_ACTIVATIONS = contextvars.ContextVar("archspace_activations", default=None)


def _record(name, tensor):
    """Keeps a named activation while capture_activations is active (one ContextVar lookup otherwise)."""
    store = _ACTIVATIONS.get()
    if store is not None:
        store[name] = tensor.detach()


@contextlib.contextmanager
def capture_activations(model):
    """Within the block, forwards of this variant record into the yielded dict, in forward order:
    model.embeddings; per layer l, model.layers.{l}.: attn_input, q [B, H, T, D] and k [B, G, T, D]
    (after norm and RoPE), v [B, G, T, D], v_mixed (Depth-Attention on), attn_output (after o_proj),
    mlp_output, then hidden (SiameseNorm off) or X and Y; model.final_hidden (after the final norm).
    The names and layouts are those of archspace's engine (model/trace.h). Every model of this class that
    runs inside the block records into the same dict: trace one model at a time."""
    backbone = model.model if hasattr(model, "model") else model
    store = {}
    token = _ACTIVATIONS.set(store)
    # The base block runs Olmo3DecoderLayer.forward unchanged, so the MLP output is taken by a hook.
    hooks = [
        layer.mlp.register_forward_hook(lambda module, args, out, i=i: _record(f"model.layers.{i}.mlp_output", out))
        for i, layer in enumerate(backbone.layers)
    ]
    try:
        yield store
    finally:
        _ACTIVATIONS.reset(token)
        for hook in hooks:
            hook.remove()


def depth_sources(layer_idx, stride, recent_window):
    """Layers whose (key, mixed value) layer `layer_idx` mixes: j < l with j % stride == 0 or j >= l - recent."""
    return [j for j in range(layer_idx) if j % stride == 0 or j >= layer_idx - recent_window]


class DepthAttentionState:
    """Keys and mixed values of the layers later layers read, for one forward call."""

    def __init__(self, config):
        self.stride = config.depth_attention_stride
        self.recent_window = config.depth_attention_recent_window
        n = config.num_hidden_layers
        self.kept = {j for l in range(1, n) for j in depth_sources(l, self.stride, self.recent_window)}
        self.records = {}

    def mix(self, layer_idx, query, key, value):
        """query [B, H, T, h]; key, value [B, G, T, h] (post-norm, post-RoPE keys). Returns vhat [B, G, T, h]."""
        batch, heads, length, head_dim = query.shape
        groups = key.shape[1]
        # Depth query: the mean of the query heads that share a kv head.
        qbar = query.view(batch, groups, heads // groups, length, head_dim).mean(2)
        sources = depth_sources(layer_idx, self.stride, self.recent_window)
        keys = torch.stack([self.records[j][0] for j in sources] + [key], dim=-2)  # [B, G, T, S+1, h]
        values = torch.stack([self.records[j][1] for j in sources] + [value], dim=-2)
        scores = (qbar.unsqueeze(-2) * keys).sum(-1) / math.sqrt(head_dim)  # own key last
        alpha = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(value.dtype)
        mixed = (alpha.unsqueeze(-1) * values).sum(-2)
        if layer_idx in self.kept:
            self.records[layer_idx] = (key, mixed)
        return mixed


class Olmo3SiameseDepthAttention(Olmo3Attention):
    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                depth_state=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        prefix = f"model.layers.{self.layer_idx}."
        _record(prefix + "attn_input", hidden_states)

        query_states = self.q_norm(self.q_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        _record(prefix + "q", query_states)
        _record(prefix + "k", key_states)
        _record(prefix + "v", value_states)

        # The only change to Olmo3Attention: mix the values across depth before caching and attending.
        if depth_state is not None:
            value_states = depth_state.mix(self.layer_idx, query_states, key_states, value_states)
            _record(prefix + "v_mixed", value_states)

        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1).contiguous())
        _record(prefix + "attn_output", attn_output)
        return attn_output, attn_weights


class Olmo3SiameseDepthDecoderLayer(Olmo3DecoderLayer):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.self_attn = Olmo3SiameseDepthAttention(config=config, layer_idx=layer_idx)
        self.use_siamese_norm = config.use_siamese_norm
        if self.use_siamese_norm:
            d, eps = config.hidden_size, config.rms_norm_eps
            del self.post_attention_layernorm
            del self.post_feedforward_layernorm
            self.pre_mlp_layernorm = Olmo3RMSNorm(d, eps=eps)  # the post-norm of the X stream
            self.siamese_attn_pre_norm = Olmo3RMSNorm(d, eps=eps)
            self.siamese_mlp_pre_norm = Olmo3RMSNorm(d, eps=eps)
            self.siamese_mlp_input_norm = Olmo3RMSNorm(d, eps=eps)
            self.siamese_hybrid_attn_scale = nn.Parameter(torch.ones(d))
            self.branch_scale = 1.0 / math.sqrt(2 * (layer_idx + 1))

    def forward(self, hidden_states, siamese_y=None, **kwargs):
        """hidden_states is X (the only stream without SiameseNorm); siamese_y is Y. Returns (X, Y)."""
        prefix = f"model.layers.{self.self_attn.layer_idx}."
        if not self.use_siamese_norm:
            hidden_states = super().forward(hidden_states, **kwargs)
            _record(prefix + "hidden", hidden_states)
            return hidden_states, None
        x, y = hidden_states, siamese_y
        c = self.branch_scale
        out, _ = self.self_attn(
            hidden_states=self.siamese_attn_pre_norm(y) + self.siamese_hybrid_attn_scale * x, **kwargs
        )
        x, y = x + c * out, y + out
        x = self.pre_mlp_layernorm(x)
        out = self.mlp(self.siamese_mlp_input_norm(x + self.siamese_mlp_pre_norm(y)))
        x, y = x + c * out, y + out
        _record(prefix + "X", x)
        _record(prefix + "Y", y)
        return x, y


class Olmo3SiameseDepthPreTrainedModel(Olmo3PreTrainedModel):
    config_class = Olmo3SiameseDepthConfig
    config: Olmo3SiameseDepthConfig
    _no_split_modules = ["Olmo3SiameseDepthDecoderLayer"]
    _can_record_outputs = {"attentions": Olmo3SiameseDepthAttention}

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Olmo3SiameseDepthDecoderLayer) and module.use_siamese_norm:
            with torch.no_grad():
                module.siamese_hybrid_attn_scale.fill_(1.0)

    @classmethod
    def from_pretrained(cls, *args, strict=True, **kwargs):
        """Strict by default: a checkpoint whose keys are not exactly this model's (a base OLMo 3
        checkpoint, or the variant with other switches) is refused with every missing and unexpected key."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing, unexpected = sorted(info.get("missing_keys", [])), sorted(info.get("unexpected_keys", []))
        if not hasattr(model, "lm_head"):  # the backbone alone: a causal LM checkpoint's head is not ours to load
            unexpected = [k for k in unexpected if not k.startswith("lm_head.")]
        mismatched = info.get("mismatched_keys", [])
        if strict and (missing or unexpected or mismatched):
            raise ValueError(
                f"checkpoint keys do not match {cls.__name__} (use_siamese_norm={model.config.use_siamese_norm}, "
                f"use_depth_attention={model.config.use_depth_attention}): "
                f"{len(missing)} missing {missing}; {len(unexpected)} unexpected {unexpected}; "
                f"{len(mismatched)} mis-shaped {list(mismatched)}"
            )
        return (model, info) if want_info else model


class Olmo3SiameseDepthModel(Olmo3SiameseDepthPreTrainedModel, Olmo3Model):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList(
            [Olmo3SiameseDepthDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        if config.use_siamese_norm:
            self.siamese_post_final_layernorm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.siamese_pre_final_layernorm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, **kwargs):
        # Olmo3Model.forward, with the two streams and a fresh Depth-Attention state per call.
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        _record("model.embeddings", inputs_embeds)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        if position_ids is None:
            past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen).unsqueeze(0)
        if not isinstance(causal_mask_mapping := attention_mask, dict):
            mask_kwargs = {
                "config": self.config,
                "inputs_embeds": inputs_embeds,
                "attention_mask": attention_mask,
                "past_key_values": past_key_values,
                "position_ids": position_ids,
            }
            causal_mask_mapping = {
                "full_attention": create_causal_mask(**mask_kwargs),
                "sliding_attention": create_sliding_window_causal_mask(**mask_kwargs),
            }
        position_embeddings = {
            t: self.rotary_emb(inputs_embeds, position_ids, t) for t in set(self.config.layer_types)
        }
        depth_state = DepthAttentionState(self.config) if self.config.use_depth_attention else None

        x = inputs_embeds
        y = inputs_embeds if self.config.use_siamese_norm else None
        for i, layer in enumerate(self.layers[: self.config.num_hidden_layers]):
            layer_type = self.config.layer_types[i]
            x, y = layer(
                x,
                siamese_y=y,
                attention_mask=causal_mask_mapping[layer_type],
                position_ids=position_ids,
                past_key_values=past_key_values,
                position_embeddings=position_embeddings[layer_type],
                depth_state=depth_state,
                **kwargs,
            )
        if self.config.use_siamese_norm:
            x = self.siamese_post_final_layernorm(x) + self.siamese_pre_final_layernorm(y)
        x = self.norm(x)
        _record("model.final_hidden", x)
        return BaseModelOutputWithPast(last_hidden_state=x, past_key_values=past_key_values)


class Olmo3SiameseDepthForCausalLM(Olmo3SiameseDepthPreTrainedModel, Olmo3ForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model = Olmo3SiameseDepthModel(config)
        self.post_init()


__all__ = [
    "capture_activations",
    "Olmo3SiameseDepthForCausalLM",
    "Olmo3SiameseDepthModel",
    "Olmo3SiameseDepthPreTrainedModel",
]
