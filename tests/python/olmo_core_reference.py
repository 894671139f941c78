"""The same run in OLMo-core: a small OLMo 3 model built, and trained, by OLMo-core itself (fp32, CPU, one
process, no torch.distributed), for side-by-side tests with the engine. A helper module; no tests in it.
`python tests/python/olmo_core_reference.py` runs `_self_check()`.

What is OLMo-core's own code (ai2-olmo-core, `olmo_core`):
- the model: `TransformerConfig.llama_like(...)` with the settings of its `olmo3_*` presets (the OLMo 2/3
  "reordered norm" block, qk_norm over the whole projection width, RMSNorm, RoPE, the sliding-window
  pattern [W, W, W, -1] with force_full_attention_on_last_layer=True and not on the first) and its
  CPU attention backend "torch" (SDPA with an explicit sliding-window mask); `Transformer.init_weights`.
- the weight names: `olmo_core.nn.hf.convert_state_from_hf` / `convert_state_to_hf` (its HF converter,
  strict: every key must map).
- training: `TransformerTrainModule` (labels from `get_labels`, micro-batch split, its cross-entropy with
  z-loss, loss normalisation, `_clip_grad_norm`, scheduler call, optimizer step, metric recording),
  `SkipStepAdamWConfig` (or `AdamWConfig` = torch.optim.AdamW) with `OptimGroupOverride` taking
  weight decay off `embeddings.weight` (as OLMo-core's cookbook `configure_train_module` does),
  `CosWithWarmup(warmup, alpha_f)`; the metric store is `Trainer.record_metric` / `record_ce_loss`.

What is a stand-in:
- `_TrainerStandIn` replaces OLMo-core's `Trainer` (which needs a data loader, save folder, checkpointer
  and callbacks). It has exactly what the train module and the scheduler read: `global_step` (1 during
  the first step), `max_steps`, `global_batch_size` (tokens) and `dp_process_group` (for `pre_train`),
  and OLMo-core's own `Trainer.record_metric` / `record_ce_loss` functions bound to it.
- `train_in_olmo_core`'s loop repeats `Trainer.fit` / `_fit_epoch`'s calls: `pre_train()`, `zero_grads()`,
  then per batch `global_step += 1`, `train_batch(batch)`, `optim_step()`, `zero_grads()`.

What is not matched exactly:
- no `Trainer._dry_run_batch` (a forward/backward on a mock batch before step 1; its gradients are
  zeroed by `_fit_epoch` before the first step, so it changes nothing here), no callbacks (logging,
  checkpointing, GC, speed monitor), no metric reduction across ranks (one rank: the identity).
- the model is not compiled and runs fp32 on CPU (OLMo 3 trained bf16 under FSDP on GPUs).
- rounding: SkipStepAdamW (float32 bias corrections, foreach arithmetic) and a different micro-batch split
  (gradient summation order) differ from torch.optim.AdamW / one micro-batch by an ulp per step; Adam
  amplifies that in the few coordinates whose clipped gradient is near eps (1e-8), where the update depends
  on the gradient's exact value. Measured by `_self_check` (4 layers, 16 x 32 tokens, 20 steps): vs a plain
  PyTorch loop on transformers' model, logits 0 (sdpa; 4.4e-6 vs eager), CE loss <= 4.8e-7, final weights
  8.3e-7 (SkipStepAdamW), 0 (AdamW: bit-identical), 2.9e-5 with 4 micro-batches (2 of 177k weights
  above 1e-5).

OLMo-core behaviours worth knowing (checked against the installed code):
- labels = input_ids shifted left by one, the last position -100 (`olmo_core.data.utils.get_labels`);
  the loss is divided by the number of labelled tokens in the whole (global) batch
  (`loss_div_factor=batch_num_tokens_for_loss`, sum reduction per micro-batch), so micro-batching does not
  change the loss or the gradient; `ce_loss`/`z_loss` are the batch sums of those per-micro-batch parts.
- z-loss = multiplier * mean over labelled tokens of logsumexp(logits)^2; the backward loss is CE + z-loss,
  but the recorded "train/CE loss", which is what `SkipStepAdamW` sees (`optim.latest_loss`), excludes it.
- `SkipStepAdamW` sees the grad norm only when `max_grad_norm` is set (it is fed from the clipping, before
  clipping); it can skip only once it holds >= max(2, rolling_interval_length // 2) losses including the
  current one (so from step 64 with 128); it skips when the current loss OR grad norm exceeds mean +
  sigma_factor * std (unbiased) of up to rolling_interval_length previous ones (spikes, once seen, stay in
  the window); a skipped step changes neither weights, moments nor Adam's step count (weight decay is
  skipped too), while the LR schedule still advances. With rolling_interval_length < 6 the first check has
  one previous value, whose std is NaN, so that step (step 2) is always skipped.
- the LR for step s (1-based) is CosWithWarmup.get_lr(lr, s, max_steps): lr * s / warmup while s < warmup.
- z_loss_multiplier=0.0 would silently become 1e-4 in the LM head (`z_loss_multiplier or 1e-4`), so a
  zero/None `z_loss` is passed as None (no z-loss at all).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoConfig

from olmo_core.nn.attention import SlidingWindowAttentionConfig
from olmo_core.nn.attention.backend import AttentionBackendName
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.hf import convert_state_from_hf, convert_state_to_hf
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
from olmo_core.train.common import TRAIN_CE_LOSS_METRIC
from olmo_core.train.train_module import TransformerTrainModule
from olmo_core.train.trainer import Trainer

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------------------------- model


def _read_hf_dir(model_dir):
    """(HF config, HF state dict) of a save_pretrained directory (one safetensors file or an index)."""
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type != "olmo3" or config.tie_word_embeddings:
        raise NotImplementedError(f"an untied Olmo3 model is expected, got {config.model_type}")
    index = model_dir / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.exists():  # sharded save
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state = {}
    for name in files:
        state.update(load_file(model_dir / name))
    return config, {k: v.float() for k, v in state.items()}


def _rope_theta(config):
    """The one RoPE theta of all layer types; OLMo 3's YaRN-scaled full layers are not handled."""
    params = getattr(config, "rope_parameters", None) or {}
    thetas = set()
    for kind in set(config.layer_types):
        p = params.get(kind, params)  # transformers 5: one entry per layer type; older: flat
        if p.get("rope_type", "default") != "default":
            raise NotImplementedError("RoPE scaling")
        thetas.add(float(p.get("rope_theta", getattr(config, "rope_theta", 500_000))))
    if len(thetas) != 1:  # e.g. Olmo3Config(rope_theta=X) sets X for full layers only (transformers 5)
        raise NotImplementedError(f"different RoPE thetas per layer type: {thetas}")
    theta = thetas.pop()
    return int(theta) if theta.is_integer() else theta


def _sliding_window(config):
    """OLMo-core's olmo3 preset pattern when it reproduces config.layer_types, else one entry per layer.

    HF's sliding_window W = OLMo-core's window W (both: W keys including the query's own position;
    OLMo-core hands (W - 1, 0) to the kernel)."""
    kinds = list(config.layer_types)
    if "sliding_attention" not in kinds:
        return None
    w, n = config.sliding_window, len(kinds)
    preset = SlidingWindowAttentionConfig(
        pattern=[w, w, w, -1], force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=True
    )
    if all(preset.should_use_swa(i, n) == (k == "sliding_attention") for i, k in enumerate(kinds)):
        return preset
    return SlidingWindowAttentionConfig(  # e.g. 6 layers: HF's default [S,S,S,F,S,S] keeps the last sliding
        pattern=[w if k == "sliding_attention" else -1 for k in kinds],
        force_full_attention_on_first_layer=False,
        force_full_attention_on_last_layer=False,
    )


def olmo_core_config_from_hf(config) -> TransformerConfig:
    """The OLMo-core TransformerConfig of an HF Olmo3Config (the olmo2_*/olmo3_* presets' settings)."""
    assert config.hidden_act == "silu" and not config.attention_bias
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return TransformerConfig.llama_like(
        d_model=config.hidden_size,
        vocab_size=config.vocab_size,  # HF rows, no padding
        n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        block_name=TransformerBlockType.reordered_norm,  # norm on the attention / MLP outputs
        qk_norm=True,  # RMSNorm over the whole q / k projection (use_head_qk_norm False)
        layer_norm_eps=config.rms_norm_eps,
        rope_theta=_rope_theta(config),
        sliding_window=_sliding_window(config),
        attn_backend=AttentionBackendName.torch,  # SDPA; runs on CPU
        feed_forward=FeedForwardConfig(hidden_size=config.intermediate_size, bias=False),
    )  # dtype: float32 (llama_like's default)


def olmo_core_model_from_hf(model_dir, *, max_seq_len=None):
    """OLMo-core Transformer (fp32, CPU, train mode) holding the weights of an HF Olmo3 directory."""
    config, hf_state = _read_hf_dir(model_dir)
    model = olmo_core_config_from_hf(config).build(init_device="cpu")
    model.init_weights(max_seq_len=max_seq_len, device=CPU)  # what parallelize_model does; then overwrite
    model.load_state_dict(convert_state_from_hf(config, hf_state, model_type="olmo3"), strict=True)
    return model


def hf_state_from_olmo_core(model, config):
    """The model's parameters under HF names (OLMo-core's converter), as fp32 CPU tensors."""
    state = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    return convert_state_to_hf(config, state)


# ------------------------------------------------------------------------------------------- training


class _TrainerStandIn:
    """Stand-in for olmo_core.train.Trainer: only what TransformerTrainModule and the scheduler read.
    record_metric / record_ce_loss are OLMo-core's own Trainer functions (same per-step store)."""

    record_metric = Trainer.record_metric
    record_ce_loss = Trainer.record_ce_loss

    def __init__(self, max_steps, global_batch_size):
        self.global_step = 0  # the loop increments it before each step, as Trainer._fit_epoch does
        self.max_steps = max_steps
        self.global_batch_size = global_batch_size  # tokens; checked by TransformerTrainModule.pre_train
        self.dp_process_group = None  # no torch.distributed: world size 1
        self._metrics, self._metrics_reduce_type = {}, {}


def _optim_config(skip_steps, lr, betas, eps, weight_decay, rolling_interval_length, sigma_factor):
    """OLMo 3's optimizer: (SkipStep)AdamW, no weight decay on the embeddings via OptimGroupOverride."""
    no_decay = [OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))]
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, group_overrides=no_decay)
    if skip_steps:
        return SkipStepAdamWConfig(
            **common, foreach=True, rolling_interval_length=rolling_interval_length, sigma_factor=sigma_factor
        )
    return AdamWConfig(**common)  # builds torch.optim.AdamW


def _step_record(metrics, has_z):
    """One step's recorded metrics -> the returned per-step values."""
    get = lambda name: float(metrics[name]) if name in metrics else math.nan  # noqa: E731
    return dict(
        ce_loss=get(TRAIN_CE_LOSS_METRIC),
        z_loss=get("train/Z loss") if has_z else 0.0,
        grad_norm=get("optim/total grad norm"),  # before clipping; recorded only when clip is set
        lr=get("optim/LR (group 0)"),
        skipped=get("optim/step skipped") if "optim/step skipped" in metrics else 0.0,
    )


def train_in_olmo_core(model_dir, batches, *, lr, warmup, max_steps, final_lr_factor, weight_decay, clip,
                       z_loss, betas=(0.9, 0.95), eps=1e-8, skip_steps=True, rolling_interval_length=128,
                       sigma_factor=6, micro_batch_size=None):
    """Train the HF Olmo3 model in `model_dir` on `batches` (one int64 [B, T] tensor of input ids per step)
    with OLMo-core's TransformerTrainModule. micro_batch_size: instances per micro-batch (None: all B).

    Returns {"ce_loss", "z_loss", "grad_norm", "lr", "skipped": one float per step, "metrics": every
    recorded metric per step, "weights": final parameters under HF names (fp32 torch tensors)}:
    ce_loss = "train/CE loss" (mean over labelled tokens), z_loss = "train/Z loss" (multiplier included),
    grad_norm = "optim/total grad norm" (before clipping; NaN when clip is None), lr = "optim/LR (group 0)"
    (the LR of that step; both groups share it), skipped = "optim/step skipped" (0.0 with AdamW)."""
    config, hf_state = _read_hf_dir(model_dir)
    B, T = batches[0].shape
    train_module = TransformerTrainModule(
        model=olmo_core_config_from_hf(config).build(init_device="cpu"),
        optim=_optim_config(skip_steps, lr, betas, eps, weight_decay, rolling_interval_length, sigma_factor),
        rank_microbatch_size=(micro_batch_size or B) * T,  # tokens
        max_sequence_length=T,
        z_loss_multiplier=z_loss or None,  # 0.0 would become 1e-4 inside the LM head
        max_grad_norm=clip,
        scheduler=CosWithWarmup(warmup=warmup, alpha_f=final_lr_factor),
        device=CPU,
    )
    # The train module initialised random weights (parallelize_model -> init_weights); load the HF ones in
    # place (the optimizer holds the same Parameter objects), as a checkpoint load would.
    train_module.model.load_state_dict(convert_state_from_hf(config, hf_state, model_type="olmo3"), strict=True)
    trainer = _TrainerStandIn(max_steps=max_steps, global_batch_size=B * T)
    train_module._attach_trainer(trainer)

    train_module.pre_train()  # Trainer.fit
    train_module.zero_grads()  # Trainer._fit_epoch, before the first batch
    steps = []
    for input_ids in batches:
        trainer.global_step += 1
        train_module.train_batch({"input_ids": input_ids.clone()})  # labels: get_labels (shift, -100 last)
        train_module.optim_step()  # clip (records the norm), set LR, step, record "step skipped"
        train_module.zero_grads()
        metrics = {k: float(v) for k, v in trainer._metrics.pop(trainer.global_step).items()}
        steps.append(dict(_step_record(metrics, z_loss), metrics=metrics))

    out = {key: [s[key] for s in steps] for key in ("ce_loss", "z_loss", "grad_norm", "lr", "skipped", "metrics")}
    out["weights"] = hf_state_from_olmo_core(train_module.model, config)
    return out


# ------------------------------------------------------------------------------------------ self-check


def random_hf_model(model_dir, seed=0, std=0.15, layers=4, hidden=64, heads=4, vocab=96, window=8):
    """A random transformers Olmo3ForCausalLM saved to model_dir; every weight perturbed (norms included,
    so a swapped norm mapping would show)."""
    from transformers import Olmo3Config, Olmo3ForCausalLM

    torch.manual_seed(seed)
    config = Olmo3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, rms_norm_eps=1e-6, sliding_window=window,
        max_position_embeddings=128, rope_theta=500_000.0, tie_word_embeddings=False,
        pad_token_id=None, eos_token_id=None, bos_token_id=None,
    )
    model = Olmo3ForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.ndim == 1 else std * torch.randn_like(p))
    model.save_pretrained(model_dir)
    return model


def _hf_logits(model_dir, input_ids, attn_implementation="sdpa"):
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn_implementation
    ).eval()
    with torch.no_grad():
        return model(input_ids).logits


def _plain_pytorch_run(model_dir, batches, *, lr, warmup, max_steps, final_lr_factor, weight_decay, clip,
                       z_loss, betas=(0.9, 0.95), eps=1e-8):
    """The same run written directly in PyTorch on transformers' model (the check's independent side):
    torch AdamW with the same two groups, CosWithWarmup.get_lr(lr, step + 1, max_steps), clip_grad_norm_,
    CE + z_loss * logsumexp^2, both averaged over the labelled tokens (labels shifted, last one -100)."""
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    embed = model.model.embed_tokens.weight
    rest = [p for p in model.parameters() if p is not embed]
    opt = torch.optim.AdamW([{"params": [embed], "weight_decay": 0.0}, {"params": rest}], lr=lr, betas=betas,
                            eps=eps, weight_decay=weight_decay, foreach=False)
    sched = CosWithWarmup(warmup=warmup, alpha_f=final_lr_factor)
    out = {"ce_loss": [], "z_loss": [], "grad_norm": [], "lr": []}
    for step, ids in enumerate(batches):
        labels = F.pad(ids[:, 1:], (0, 1), value=-100).reshape(-1)
        logits = model(ids).logits.float().reshape(labels.numel(), -1)
        mask = labels != -100
        n = mask.sum()
        ce = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / n
        z = z_loss * (logits.logsumexp(-1).pow(2) * mask).sum() / n
        (ce + z).backward()
        out["grad_norm"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        out["lr"].append(sched.get_lr(lr, step + 1, max_steps))
        for group in opt.param_groups:
            group["lr"] = out["lr"][-1]
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["ce_loss"].append(ce.item())
        out["z_loss"].append(z.item())
    out["weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


def _max_diff(a, b):
    """Max abs difference of two per-step lists or two {HF name: tensor} dicts."""
    if isinstance(a, dict):
        assert set(a) == set(b), set(a) ^ set(b)
        return max(float((a[k] - b[k]).abs().max()) for k in a)
    return max(abs(x - y) for x, y in zip(a, b))


def check_logits_against_transformers(model_dir):
    """OLMo-core logits vs transformers' on the same weights; sliding layers must matter at T=32."""
    ids = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(1))
    model = olmo_core_model_from_hf(model_dir, max_seq_len=32).eval()
    windows = [b.attention.backend.window_size for b in model.blocks.values()]
    assert windows == [(7, 0), (7, 0), (7, 0), (-1, -1)], windows  # HF sliding_window 8, [S, S, S, F]
    with torch.no_grad():
        ours = model(ids)
        diffs = {impl: float((ours - _hf_logits(model_dir, ids, impl)).abs().max()) for impl in ("sdpa", "eager")}
        for b in model.blocks.values():  # the same model with every layer full: must differ clearly
            b.attention.backend.window_size = (-1, -1)
        full_diff = float((model(ids) - _hf_logits(model_dir, ids)).abs().max())
    print(f"logits: max|OLMo-core - transformers| = {diffs['sdpa']:.3g} (sdpa), {diffs['eager']:.3g} (eager); "
          f"|logits| up to {float(ours.abs().max()):.3g}; with all layers full attention: {full_diff:.3g}")
    assert max(diffs.values()) < 2e-5 and full_diff > 1e-2, (diffs, full_diff)
    return diffs


def _zipf_batches(steps, batch, seq_len, vocab=96, seed=2):
    """Random batches from a skewed (Zipf 1.2, shuffled ids) unigram distribution: learnable, so the loss
    falls; 16 x 32 keeps the gradient noise low enough that clip 0.5 is active on some steps only."""
    g = torch.Generator().manual_seed(seed)
    probs, ids = 1.0 / torch.arange(1, vocab + 1).float() ** 1.2, torch.randperm(vocab, generator=g)
    return [ids[torch.multinomial(probs, batch * seq_len, True, generator=g)].view(batch, seq_len)
            for _ in range(steps)]


def _check_training(model_dir):
    """20 OLMo-core steps vs the plain PyTorch loop, with SkipStepAdamW, torch AdamW and micro-batches."""
    batches = _zipf_batches(20, 16, 32)
    hp = dict(lr=1e-2, warmup=3, max_steps=20, final_lr_factor=0.1, weight_decay=0.1, clip=0.5, z_loss=1e-4)
    ref = _plain_pytorch_run(model_dir, batches, **hp)
    results = {}
    for label, kw in [("SkipStepAdamW", {}), ("AdamW", dict(skip_steps=False)),
                      ("SkipStepAdamW, 4 micro-batches", dict(micro_batch_size=4))]:
        run = train_in_olmo_core(model_dir, batches, **hp, **kw)
        d = {k: _max_diff(run[k], ref[k]) for k in ("ce_loss", "z_loss", "grad_norm", "lr", "weights")}
        w = torch.cat([(run["weights"][k] - ref["weights"][k]).abs().flatten() for k in ref["weights"]])
        clipped = sum(gn > hp["clip"] for gn in run["grad_norm"])
        print(f"{label}: CE {run['ce_loss'][0]:.4f} -> {run['ce_loss'][-1]:.4f}, clipped on {clipped}/20 steps, "
              f"skipped {sum(run['skipped']):.0f}; max diff vs plain PyTorch: "
              + ", ".join(f"{k} {v:.3g}" for k, v in d.items())
              + f" ({int((w > 1e-6).sum())} of {w.numel()} weights differ by > 1e-6)")
        assert run["ce_loss"][-1] < run["ce_loss"][0] - 1.0 and 0 < clipped < 20
        assert d["ce_loss"] < 1e-5 and d["z_loss"] < 1e-8 and d["lr"] < 1e-12 and d["weights"] < 1e-4, d
        results[label] = d
    return results


def _check_skipping(model_dir):
    """SkipStepAdamW does skip: window 8 (checks from the 4th loss on), sigma 1, the 8th batch uniform tokens
    (a loss spike after 7 batches of the skewed distribution)."""
    batches = _zipf_batches(7, 4, 32) + [torch.randint(0, 96, (4, 32), generator=torch.Generator().manual_seed(3))]
    hp = dict(lr=1e-2, warmup=3, max_steps=8, final_lr_factor=0.1, weight_decay=0.1, clip=0.5, z_loss=1e-4,
              rolling_interval_length=8, sigma_factor=1)
    run, before = train_in_olmo_core(model_dir, batches, **hp), train_in_olmo_core(model_dir, batches[:7], **hp)
    print("CE per step:", " ".join(f"{x:.3f}" for x in run["ce_loss"]),
          "| skipped:", [int(x) for x in run["skipped"]])
    assert set(run["skipped"]) <= {0.0, 1.0} and run["skipped"][:3] == [0.0] * 3 and run["skipped"][-1] == 1.0
    assert _max_diff(run["weights"], before["weights"]) == 0.0  # the skipped step left the weights alone


def _self_check():
    torch.set_num_threads(max(1, min(8, torch.get_num_threads())))
    with tempfile.TemporaryDirectory() as tmp:
        random_hf_model(tmp)
        check_logits_against_transformers(tmp)
        _check_training(tmp)
        _check_skipping(tmp)
    print("ok")


if __name__ == "__main__":
    sys.exit(_self_check())
