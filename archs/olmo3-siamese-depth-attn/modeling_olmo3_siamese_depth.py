"""OLMo 3 + SiameseNorm + Depth-Attention (archspace SPEC.md section 3), as transformers remote code.

Built on transformers' Olmo3 classes; only what differs is written here:
- Depth-Attention: inside attention, after Q/K norm and RoPE and before token attention (and before the
  KV cache), each layer's values are replaced by a softmax mix over earlier layers' mixed values. The
  cache therefore stores mixed values; state lives for one forward call only.
- SiameseNorm ("hybrid_pre"): two residual streams X (bounded) and Y (identity) replace the single
  stream with its post-sublayer norms, and the final norm reads both.
- `norm_topology` (SPEC.md section 7): the block's normalization topology; "reordered" is Olmo3's block,
  the others (pre, peri, post, deepnorm, hybrid, residual, siamese_post_pre) are written out below with
  the papers they come from.
With both switches off (norm_topology "reordered", no Depth-Attention) the model is Olmo3ForCausalLM exactly.

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
    mlp_output, then hidden (one-stream topologies; with residual also dual) or X and Y (SiameseNorm);
    model.final_hidden (after the final norm).
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
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        if config.resolved_norm_topology() == "hybrid":  # HybridNorm's QKV norm: V too, over its full projection width
            self.v_norm = Olmo3RMSNorm(config.num_key_value_heads * self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                depth_state=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        prefix = f"model.layers.{self.layer_idx}."
        _record(prefix + "attn_input", hidden_states)

        query_states = self.q_norm(self.q_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states)
        if hasattr(self, "v_norm"):
            value_states = self.v_norm(value_states)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
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


# The norms of each topology's block (SPEC.md section 7, "norms per layer"; v_norm lives in attention).
LAYER_NORMS = {
    "reordered": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "pre": ("input_layernorm", "pre_feedforward_layernorm"),
    "peri": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "deepnorm": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "hybrid": ("pre_feedforward_layernorm",),
    "residual": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "siamese_hybrid_pre": ("pre_mlp_layernorm", "siamese_attn_pre_norm", "siamese_mlp_pre_norm", "siamese_mlp_input_norm"),
    "siamese_post_pre": ("siamese_attn_pre_norm", "siamese_attn_input_norm", "post_attention_layernorm",
                         "siamese_mlp_pre_norm", "siamese_mlp_input_norm", "post_feedforward_layernorm"),
}
FUSED_INPUT_NORMS = ("siamese_attn_input_norm", "siamese_mlp_input_norm")  # gone without normalized input


class Olmo3SiameseDepthDecoderLayer(Olmo3DecoderLayer):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.self_attn = Olmo3SiameseDepthAttention(config=config, layer_idx=layer_idx)
        self.topology = config.resolved_norm_topology()
        self.normalized_input = config.siamese_normalized_input
        d, eps = config.hidden_size, config.rms_norm_eps
        del self.post_attention_layernorm
        del self.post_feedforward_layernorm
        for name in LAYER_NORMS[self.topology]:
            if name in FUSED_INPUT_NORMS and not self.normalized_input:
                continue
            setattr(self, name, Olmo3RMSNorm(d, eps=eps))
        if self.topology == "siamese_hybrid_pre":
            self.siamese_hybrid_attn_scale = nn.Parameter(torch.ones(d))
        # SiameseNorm's c_l = 1/sqrt(2(l+1)), 1 without depth-wise scaling.
        self.branch_scale = 1.0 / math.sqrt(2 * (layer_idx + 1)) if config.siamese_depth_scaling else 1.0
        self.deepnorm_alpha = (2 * config.num_hidden_layers) ** 0.25  # DeepNet, decoder-only

    def _fused_input(self, name, fused):
        return getattr(self, name)(fused) if self.normalized_input else fused

    def forward(self, hidden_states, siamese_y=None, residual_dual=None, **kwargs):
        """hidden_states is x (SiameseNorm's X); siamese_y is Y, residual_dual ResiDual's dual stream (None where
        the topology has none). Returns (x, Y, dual)."""
        prefix = f"model.layers.{self.self_attn.layer_idx}."
        t = self.topology
        attn = lambda u: self.self_attn(hidden_states=u, **kwargs)[0]
        x = hidden_states
        if t == "reordered":  # Olmo3DecoderLayer's own forward
            x = x + self.post_attention_layernorm(attn(x))
            x = x + self.post_feedforward_layernorm(self.mlp(x))
        elif t == "pre":  # Pre-LN: x + F(Norm(x))
            x = x + attn(self.input_layernorm(x))
            x = x + self.mlp(self.pre_feedforward_layernorm(x))
        elif t == "peri":  # Peri-LN: x + Norm(F(Norm(x)))
            x = x + self.post_attention_layernorm(attn(self.input_layernorm(x)))
            x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        elif t == "post":  # Post-LN: Norm(x + F(x))
            x = self.post_attention_layernorm(x + attn(x))
            x = self.post_feedforward_layernorm(x + self.mlp(x))
        elif t == "deepnorm":  # DeepNorm: Norm(alpha x + F(x))
            x = self.post_attention_layernorm(x * self.deepnorm_alpha + attn(x))
            x = self.post_feedforward_layernorm(x * self.deepnorm_alpha + self.mlp(x))
        elif t == "hybrid":  # HybridNorm: QKV-norm attention (v_norm), then Post-Norm around the MLP
            h = self.pre_feedforward_layernorm(x + attn(x))
            x = h + self.mlp(h)
        elif t == "residual":  # ResiDual: Post-LN stream x, dual stream d = sum of sublayer outputs
            o = attn(x)
            residual_dual = o if residual_dual is None else residual_dual + o
            x = self.post_attention_layernorm(x + o)
            o = self.mlp(x)
            residual_dual = residual_dual + o
            x = self.post_feedforward_layernorm(x + o)
        elif t == "siamese_hybrid_pre":
            y, c = siamese_y, self.branch_scale
            out = attn(self.siamese_attn_pre_norm(y) + self.siamese_hybrid_attn_scale * x)
            x, y = x + c * out, y + out
            x = self.pre_mlp_layernorm(x)
            out = self.mlp(self._fused_input("siamese_mlp_input_norm", x + self.siamese_mlp_pre_norm(y)))
            x, y = x + c * out, y + out
            siamese_y = y
        elif t == "siamese_post_pre":
            y, c = siamese_y, self.branch_scale
            out = attn(self._fused_input("siamese_attn_input_norm", x + self.siamese_attn_pre_norm(y)))
            x, y = self.post_attention_layernorm(x + c * out), y + out
            out = self.mlp(self._fused_input("siamese_mlp_input_norm", x + self.siamese_mlp_pre_norm(y)))
            x, y = self.post_feedforward_layernorm(x + c * out), y + out
            siamese_y = y
        else:
            raise ValueError(f"unknown norm_topology {t!r}")
        if siamese_y is not None:
            _record(prefix + "X", x)
            _record(prefix + "Y", siamese_y)
        else:
            _record(prefix + "hidden", x)
            if residual_dual is not None:
                _record(prefix + "dual", residual_dual)
        return x, siamese_y, residual_dual


class Olmo3SiameseDepthPreTrainedModel(Olmo3PreTrainedModel):
    config_class = Olmo3SiameseDepthConfig
    config: Olmo3SiameseDepthConfig
    _no_split_modules = ["Olmo3SiameseDepthDecoderLayer"]
    _can_record_outputs = {"attentions": Olmo3SiameseDepthAttention}

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Olmo3SiameseDepthDecoderLayer) and hasattr(module, "siamese_hybrid_attn_scale"):
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
                f"checkpoint keys do not match {cls.__name__} (norm_topology={model.config.resolved_norm_topology()}, "
                f"use_siamese_norm={model.config.use_siamese_norm}, "
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
        if config.resolved_norm_topology() == "residual":
            self.residual_dual_norm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
        dual = None  # ResiDual's dual stream, 0 until the first sublayer adds to it
        for i, layer in enumerate(self.layers[: self.config.num_hidden_layers]):
            layer_type = self.config.layer_types[i]
            x, y, dual = layer(
                x,
                siamese_y=y,
                residual_dual=dual,
                attention_mask=causal_mask_mapping[layer_type],
                position_ids=position_ids,
                past_key_values=past_key_values,
                position_embeddings=position_embeddings[layer_type],
                depth_state=depth_state,
                **kwargs,
            )
        if self.config.use_siamese_norm:
            x = self.siamese_post_final_layernorm(x) + self.siamese_pre_final_layernorm(y)
        elif self.config.resolved_norm_topology() == "residual":  # ResiDual's end: x_a + LN(x_d)
            x = x + self.residual_dual_norm(dual if dual is not None else torch.zeros_like(x))
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
