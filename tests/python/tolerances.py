"""Comparison bounds for fp32 results, derived from the arithmetic (docs/reference.md); the
same rules and names as tests/unit/tolerance.h, which explains them in full.

Each fp32 operation rounds with relative error at most u = 2^-24; a sum of n terms in any order (another
GEMM kernel, blocking, vector width, thread split) is within gamma(n) = n u / (1 - n u) of the sum of the
terms' magnitudes (Higham, section 3.1; gamma takes the smaller of that worst case and Higham and Mary's
probabilistic bound); two fp32 computations of one value differ by at most the sum of their bounds. A
whole forward: forward_bound (the links of its deepest chain of reductions, forward_links, acting on the
largest magnitude the head's dot products can reach, head_scale). Bounds against fp64 references and
checks of bitwise equality are not these helpers' business: their tests say what they compare.
"""
import math

import numpy as np

U = 2.0 ** -24


LAMBDA = 10.0


def gamma_worst(n):
    """n roundings in series (a sum of n terms in any order), the worst case: Higham's gamma_n."""
    nu = n * U
    return nu / (1.0 - nu)


def gamma(n):
    """The bound the tests use: the smaller of the worst case and Higham and Mary's probabilistic bound (2019,
    theorem 3.1: errors independent and of mean zero; about 10 sqrt(n) u, failing with probability below
    2n exp(-50), under 1e-16 for a vocabulary's 10^5 terms)."""
    probabilistic = math.expm1(LAMBDA * math.sqrt(n) * U + n * U * U / (1 - U))
    return min(gamma_worst(n), probabilistic)


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def forward_links(config, T):
    """The links of the deepest chain of reductions in one forward over T positions, each a sum's length
    (tests/unit/tolerance.h's forward_links): per block the input norm, q/k/v projections, q/k norms, scores,
    softmax's sum and the weighted sum (keys each: the window on sliding layers), the output projection, the
    MLP's norm, gate/up and down, and 16 single elementwise roundings; Depth-Attention and SiameseNorm their
    extra reductions; the final norm and the head. `config` is a transformers config or a config.json dict."""
    d = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads")
    h = _get(config, "head_dim") or d // heads
    layers = _get(config, "num_hidden_layers")
    window = _get(config, "sliding_window") or T
    types = _get(config, "layer_types") or ["full_attention"] * layers
    siamese = _get(config, "model_type") == "olmo3_siamese_depth"
    links = [d, d]
    for layer in range(layers):
        keys = min(T, window) if types[layer] == "sliding_attention" else T
        links += [d, d, heads * h, h, keys, keys, heads * h, d, d, _get(config, "intermediate_size")] + [1] * 16
        if siamese:
            links += [h, layers + 1, layers + 1, d]
    return links


def chain_gamma(links):
    """A chain's relative error: its links' bounds add (first order; normalisation keeps each relative)."""
    return sum(gamma(n) for n in links)


def head_scale(model):
    """The largest sum_k |h_k W_vk| the head can compute: the final RMSNorm leaves ||h||_2 <= sqrt(d) max|g|,
    and Cauchy-Schwarz gives ||h||_2 ||W_v||_2. `model` is a transformers causal LM."""
    g = model.model.norm.weight.detach().double()
    w = model.get_output_embeddings().weight.detach().double()
    return math.sqrt(g.numel()) * float(g.abs().max()) * float(w.norm(dim=1).max())


def forward_bound(model, T):
    """Two fp32 forwards of `model` over T positions that differ only in summation order (the engine and
    transformers, a batch and its rows, another kernel): each logit within twice chain_gamma(forward_links)
    times head_scale."""
    return 2 * chain_gamma(forward_links(model.config, T)) * head_scale(model)


def logprob_bound(logit_bound, vocab, max_abs_logprob):
    """log_softmax of two computations whose logits are within logit_bound: each log-probability within twice
    that, plus each side's log-sum-exp roundings (gamma(V + 2), and 2 u |log p| from the subtractions)."""
    return 2 * logit_bound + 2 * (gamma(vocab + 2) + 2 * U * max_abs_logprob)


def gradient_bound(config, T, positions, grad_scale):
    """Parameter gradients of a loss over `positions` predictions, by two fp32 computations: the backward runs
    the transposes of the forward's chain (twice its roundings) and sums each weight's gradient over the
    positions; relative to the largest gradient entry, grad_scale."""
    return 2 * (2 * chain_gamma(forward_links(config, T)) + gamma(positions)) * grad_scale


def loglikelihood_bounds(model_dir):
    """A function (context, continuation, log-likelihood, continuation tokens n) -> the bound on two fp32
    computations of that continuation's log-likelihood: n log-probabilities, each within logprob_bound at the
    sequence's length (one token's |log p| <= |the sum|, every log p being <= 0), summed. n None: the
    sequence's length, which n cannot exceed."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def bound(context, continuation, loglikelihood, n=None):
        T = len(tokenizer.encode(context + continuation).ids) + 1
        n = T if n is None else n
        return n * logprob_bound(forward_bound(model, T), model.config.vocab_size, abs(loglikelihood))

    return bound


def activation_bound(model, T):
    """For named activations (trace): each tensor relative to its own largest magnitude, with the whole
    forward's chain, as the logits are; a callable (name, reference array) -> bound for first_difference."""
    relative = 2 * chain_gamma(forward_links(model.config, T))
    logits = forward_bound(model, T)
    return lambda name, want: logits if name == "logits" else relative * float(np.abs(want).max())
