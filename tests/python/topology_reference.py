"""An independent reference for the normalization topologies (SPEC.md section 7), in plain PyTorch.

Written from the papers' definitions and SPEC.md, not from the engine (src/model/block.cpp) or the
remote code (archs/): it imports neither transformers nor the archs/ files, and it is laid out differently
(one function per topology over explicit tensors; attention with an explicit mask and einsum). The tests
compare both implementations against it (tests/python/test_topology.py).

The equation used for each topology (x: the residual stream; F: attention, then the MLP):
- reordered  OLMo 2 (arXiv 2501.00656) "reordered norm", SPEC.md section 2: x <- x + N(F(x)).
- pre        Pre-LN, Xiong et al. 2020 (arXiv 2002.04745), Table 1 (Pre-LN Transformer): x <- x + F(N(x)).
- peri       Peri-LN, Kim et al. 2025 (arXiv 2502.02732): x <- x + N_out(F(N_in(x))).
- post       Post-LN, Vaswani et al. 2017; Xiong et al. 2020, Table 1 (Post-LN Transformer): x <- N(x + F(x)).
- deepnorm   DeepNet, Wang et al. 2022 (arXiv 2203.00555), DeepNorm x <- LN(alpha x + G(x)) with the
             decoder-only constants of its Figure 2: alpha = (2N)^(1/4), beta = (8N)^(-1/4), N = layers
             (beta only scales the init, so it does not appear in a forward).
- hybrid     HybridNorm, Zhuo et al. 2025 (arXiv 2503.04598): attention with QKV-Norm (q, k and v
             normalised), y = x + Attn(x); then Post-Norm around the FFN: h = N(y), x <- h + FFN(h).
- residual   ResiDual, Xie et al. 2023 (arXiv 2304.14802), Pre-Post-LN: per sublayer o = F(x_a),
             x_a <- LN(x_a + o), x_d <- x_d + o (x_d = 0 at the start); the output is x_a + LN(x_d).
- siamese_hybrid_pre / siamese_post_pre  SiameseNorm (arXiv 2602.08064): a post-norm-like stream X and a
             pre-norm-like stream Y share each sublayer; X gets c_l * O, Y gets O, c_l = 1/sqrt(2(l+1))
             (depth-wise scaling; 1 when ablated). The fused sublayer inputs are those of SPEC.md 3.1 / 7;
             the normalized-input ablation feeds the fused sum without its norm.
Every topology ends with lm_head(N_final(h)). Depth-Attention (SPEC.md 3.2) is implemented here too.
"""
import math

import torch


def rms(x, weight, eps):
    """RMSNorm in fp32: weight * x / sqrt(mean(x^2) + eps)."""
    x32 = x.float()
    return weight * (x32 / torch.sqrt((x32 * x32).mean(-1, keepdim=True) + eps))


def rope_tables(length, head_dim, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, h/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    """Rotate-half RoPE: x * cos + rotate_half(x) * sin, x [B, heads, T, h]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def depth_sources(layer, stride, recent):
    return [j for j in range(layer) if j % stride == 0 or j >= layer - recent]


class Reference:
    """A forward of the variant's model from its state dict (names as in SPEC.md) and config dict."""

    def __init__(self, weights, config):
        self.w = weights
        self.c = config
        self.topology = config.get("norm_topology") or ("siamese_hybrid_pre" if config.get("use_siamese_norm", True)
                                                        else "reordered")
        self.depth_scaling = config.get("siamese_depth_scaling", True)
        self.normalized_input = config.get("siamese_normalized_input", True)
        self.eps = config["rms_norm_eps"]

    def n(self, name, x):
        return rms(x, self.w[name], self.eps)

    def rope_theta(self):
        """Plain RoPE only (transformers 4.x rope_theta/rope_scaling or 5.x rope_parameters)."""
        params = self.c.get("rope_parameters") or {}
        params = params.get("full_attention", params)
        if (params.get("rope_type") or params.get("type") or "default") != "default" or self.c.get("rope_scaling"):
            raise ValueError("the reference implements plain RoPE only")
        return params.get("rope_theta", self.c.get("rope_theta"))

    def layer_types(self):
        if self.c.get("layer_types"):
            return self.c["layer_types"]
        return ["full_attention" if (l + 1) % 4 == 0 else "sliding_attention" for l in range(self.c["num_hidden_layers"])]

    # ---- sublayers ---------------------------------------------------------------------------------

    def attention(self, l, x, depth):
        c, p = self.c, f"model.layers.{l}."
        B, T, _ = x.shape
        H, G = c["num_attention_heads"], c["num_key_value_heads"]
        h = c.get("head_dim") or c["hidden_size"] // H
        q = self.n(p + "self_attn.q_norm.weight", x @ self.w[p + "self_attn.q_proj.weight"].T)
        k = self.n(p + "self_attn.k_norm.weight", x @ self.w[p + "self_attn.k_proj.weight"].T)
        v = x @ self.w[p + "self_attn.v_proj.weight"].T
        if self.topology == "hybrid":  # QKV-Norm: V normalised over its full width like K
            v = self.n(p + "self_attn.v_norm.weight", v)
        q = q.view(B, T, H, h).transpose(1, 2)
        k = k.view(B, T, G, h).transpose(1, 2)
        v = v.view(B, T, G, h).transpose(1, 2)
        cos, sin = rope_tables(T, h, self.rope_theta())
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if depth is not None:
            v = self.depth_mix(l, q, k, v, depth)
        # Token attention: query i sees key j when j <= i (and i - j < window on sliding layers).
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if self.layer_types()[l] == "sliding_attention":
            allowed = allowed & (i - j < c["sliding_window"])
        k_rep = k.repeat_interleave(H // G, dim=1)
        v_rep = v.repeat_interleave(H // G, dim=1)
        scores = torch.einsum("bhid,bhjd->bhij", q, k_rep) / math.sqrt(h)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("bhij,bhjd->bhid", scores.softmax(-1), v_rep)
        return out.transpose(1, 2).reshape(B, T, H * h) @ self.w[p + "self_attn.o_proj.weight"].T

    def depth_mix(self, l, q, k, v, depth):
        """SPEC.md 3.2: the mean query of each kv group scores the sources' keys and the layer's own key."""
        B, H, T, h = q.shape
        G = k.shape[1]
        qbar = q.reshape(B, G, H // G, T, h).mean(2)
        sources = depth_sources(l, self.c["depth_attention_stride"], self.c.get("depth_attention_recent_window", 0))
        keys = [depth[j][0] for j in sources] + [k]
        values = [depth[j][1] for j in sources] + [v]
        scores = torch.stack([(qbar * key).sum(-1) for key in keys], dim=-1) / math.sqrt(h)  # [B, G, T, S+1]
        alpha = scores.softmax(-1)
        mixed = sum(alpha[..., s, None] * values[s] for s in range(len(values)))
        depth[l] = (k, mixed)
        return mixed

    def mlp(self, l, x):
        p = f"model.layers.{l}.mlp."
        gate = x @ self.w[p + "gate_proj.weight"].T
        up = x @ self.w[p + "up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    # ---- the model ---------------------------------------------------------------------------------

    def logits(self, ids):
        """ids [B, T] -> logits [B, T, V] (fp32)."""
        c = self.c
        L = c["num_hidden_layers"]
        x = self.w["model.embed_tokens.weight"][ids]
        depth = {} if c.get("use_depth_attention", True) else None
        t = self.topology
        y = x if t.startswith("siamese_") else None
        d = torch.zeros_like(x)  # ResiDual's dual stream
        alpha = (2 * L) ** 0.25
        for l in range(L):
            p = f"model.layers.{l}."
            n = lambda name, u, p=p: self.n(p + name, u)
            attn = lambda u, l=l: self.attention(l, u, depth)
            mlp = lambda u, l=l: self.mlp(l, u)
            c_l = 1.0 / math.sqrt(2 * (l + 1)) if self.depth_scaling else 1.0
            fused = (lambda name, u: n(name, u)) if self.normalized_input else (lambda name, u: u)
            if t == "reordered":
                x = x + n("post_attention_layernorm.weight", attn(x))
                x = x + n("post_feedforward_layernorm.weight", mlp(x))
            elif t == "pre":
                x = x + attn(n("input_layernorm.weight", x))
                x = x + mlp(n("pre_feedforward_layernorm.weight", x))
            elif t == "peri":
                x = x + n("post_attention_layernorm.weight", attn(n("input_layernorm.weight", x)))
                x = x + n("post_feedforward_layernorm.weight", mlp(n("pre_feedforward_layernorm.weight", x)))
            elif t == "post":
                x = n("post_attention_layernorm.weight", x + attn(x))
                x = n("post_feedforward_layernorm.weight", x + mlp(x))
            elif t == "deepnorm":
                x = n("post_attention_layernorm.weight", alpha * x + attn(x))
                x = n("post_feedforward_layernorm.weight", alpha * x + mlp(x))
            elif t == "hybrid":
                h = n("pre_feedforward_layernorm.weight", x + attn(x))
                x = h + mlp(h)
            elif t == "residual":
                for sublayer, name in ((attn, "post_attention_layernorm.weight"), (mlp, "post_feedforward_layernorm.weight")):
                    o = sublayer(x)
                    x = n(name, x + o)
                    d = d + o
            elif t == "siamese_hybrid_pre":
                o = attn(n("siamese_attn_pre_norm.weight", y) + self.w[p + "siamese_hybrid_attn_scale"] * x)
                x, y = n("pre_mlp_layernorm.weight", x + c_l * o), y + o
                o = mlp(fused("siamese_mlp_input_norm.weight", x + n("siamese_mlp_pre_norm.weight", y)))
                x, y = x + c_l * o, y + o
            elif t == "siamese_post_pre":
                o = attn(fused("siamese_attn_input_norm.weight", x + n("siamese_attn_pre_norm.weight", y)))
                x, y = n("post_attention_layernorm.weight", x + c_l * o), y + o
                o = mlp(fused("siamese_mlp_input_norm.weight", x + n("siamese_mlp_pre_norm.weight", y)))
                x, y = n("post_feedforward_layernorm.weight", x + c_l * o), y + o
            else:
                raise ValueError(t)
        if y is not None:
            x = self.n("model.siamese_post_final_layernorm.weight", x) + self.n("model.siamese_pre_final_layernorm.weight", y)
        elif t == "residual":
            x = x + self.n("model.residual_dual_norm.weight", d)
        return self.n("model.norm.weight", x) @ self.w["lm_head.weight"].T


def reference_loss(logits, ids, z_loss):
    """The engine's training loss on one batch: next-token cross-entropy plus z-loss, mean over labels."""
    logits = logits[:, :-1].float()
    target = ids[:, 1:]
    lse = torch.logsumexp(logits, -1)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
    return (ce + z_loss * (lse ** 2).sum()) / target.numel()
