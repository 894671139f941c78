// archspace plan: per-rank training memory (weights, gradients, AdamW state, activations) of a preset or
// a config.json at a given run shape. The arithmetic lives in the library (archspace/train/plan.h).
#include "archspace/train/plan.h"

#include <iomanip>
#include <iostream>
#include <optional>

#include "archspace/model/parameters.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct PlanArgs {
  std::string preset, config, variant = "base", dtype = "bf16";
  int64_t world = 1, sequence_length = 0, micro_batch = 1, grad_accum = 1, context_parallel = 1;
  int64_t loss_chunk_tokens = kDefaultLossChunkTokens;
  bool shard_optimizer = false, activation_checkpointing = false, document_masking = false, json = false;
  bool reduce_once_per_step = false, fp8 = false, fused_kernels = false;
  std::string sharding;  // --sharding; empty: "optimizer" with --shard-optimizer, else "none"
  int64_t replicate_groups = 1;
  std::string device = "cuda";
  std::string gpu_memory;  // "80GiB": say whether the plan fits
};

void print_fit(const FitAdvice& f) {
  const std::string cap = human_bytes(f.capacity);
  if (f.fits()) {
    std::cout << "fits in " << cap << " per rank, margin " << human_bytes(f.margin) << "\n";
  } else {
    std::cout << "does not fit in " << cap << " per rank: " << human_bytes(-f.margin) << " over\n";
    if (f.found)
      std::cout << "cheapest change that fits: " << f.change << " (total " << human_bytes(f.changed_total)
                << ", margin " << human_bytes(f.capacity - f.changed_total) << ")\n";
    else
      std::cout << "no change the plan models fits (ZeRO-1, FSDP, activation checkpointing, micro-batch 1, up to 64x "
                   "the ranks): a shorter --sequence-length or a smaller model\n";
  }
  std::cout << "(tensors only: leave a few GiB for the CUDA context and the allocator's fragmentation)\n";
}

void print_plan(const ModelConfig& c, const PlanOptions& o, const MemoryPlan& p) {
  auto row = [](const std::string& name, int64_t bytes, const std::string& note = "") {
    std::cout << "  " << std::left << std::setw(22) << name << std::right << std::setw(12) << human_bytes(bytes)
              << std::setw(18) << bytes << " B" << (note.empty() ? "" : "  " + note) << "\n";
  };
  std::cout << "model:              " << variant_name(c.variant) << ", " << c.num_hidden_layers << " layers, d "
            << c.hidden_size << ", vocabulary " << c.vocab_size << "\n"
            << "parameters:         " << p.parameter_count << " (" << human_count(p.parameter_count) << ")\n"
            << "run:                world " << o.world
            << (o.context_parallel > 1 ? " (" + std::to_string(o.data_parallel()) + " data-parallel x " +
                                             std::to_string(o.context_parallel) + " context-parallel)"
                                       : std::string())
            << ", sequence " << o.sequence_length << ", micro-batch " << o.micro_batch << ", grad-accum "
            << o.grad_accum << ", " << dtype_name(o.dtype) << (o.dtype == DType::kBf16 ? " autocast" : "")
            << (o.cuda ? ", CUDA" : ", CPU") << (o.sharding == Sharding::kOptimizer ? ", ZeRO-1" : "")
            << (o.sharding == Sharding::kFull
                    ? ", FSDP over " + std::to_string(o.shard_group()) + " ranks" +
                          (o.replicate_groups > 1 ? " x " + std::to_string(o.replicate_groups) + " replicas (HSDP)"
                                                  : "")
                    : "")
            << (o.activation_checkpointing ? ", activation checkpointing" : "")
            << (o.document_masking ? ", document masking" : "") << (o.fp8 ? ", FP8 block matmuls" : "")
            << (o.fused_kernels ? ", fused training kernels" : "") << "\n"
            << "tokens per step:    " << p.tokens_per_step << " (" << human_count(p.tokens_per_step) << ")\n"
            << "memory per rank:\n";
  const bool full = p.sharding_buffers > 0;
  const std::string per = " / " + std::to_string(full ? o.shard_group() : o.world) + " ranks";
  row("parameters", p.parameters, full ? "fp32 master weights" + per : "fp32 master weights");
  const bool unsharded_sums = full && !o.reduce_each_micro_batch && o.grad_accum > 1;
  row("gradients", p.gradients,
      full ? "fp32" + per + (unsharded_sums ? " + this rank's unsharded sums (reduced once per step)" : "") : "fp32");
  row("optimizer state", p.optimizer_state,
      o.sharding != Sharding::kNone && o.world > 1 ? "AdamW, 2 fp32 moments" + per : "AdamW, 2 fp32 moments");
  if (full) {
    row("sharding buffers", p.sharding_buffers,
        "one unit gathered with its gradients, gradients being reduce-scattered");
  } else {
    row("autocast weights", p.autocast_weights, "bf16 copies of the matmul weights");
  }
  row("activations", p.activations, "one micro-batch, kept for backward");
  row("  layers", p.layer_activations,
      o.activation_checkpointing
          ? "block inputs, Depth-Attention " + human_bytes(p.depth_attention) + ", one block recomputed in backward " +
                human_bytes(p.recompute)
          : "of which masks " + human_bytes(p.attention_masks) + ", Depth-Attention " + human_bytes(p.depth_attention) +
                (o.document_masking ? ", document masking " + human_bytes(p.document_masking) : "") +
                (o.context_parallel > 1 ? ", other slices' keys/values " + human_bytes(p.context_keys) : ""));
  row("  head and loss", p.head_and_loss,
      p.loss_chunk > 0 ? "final norm, head input, one chunk of " + std::to_string(o.loss_chunk_tokens) +
                             " tokens' logits " + human_bytes(p.loss_chunk)
                       : "final norm, logits [B, T, V], loss");
  row("  rope tables", p.rope_tables);
  row("total", p.total());
}

int run(const PlanArgs& a) {
  if (a.preset.empty() == a.config.empty()) throw Error("plan: give --preset NAME or --config FILE");
  const ModelConfig config =
      !a.config.empty() ? ModelConfig::load(a.config) : preset(a.preset, parse_variant(a.variant, "--variant"));
  PlanOptions o;
  o.world = a.world;
  o.sequence_length = a.sequence_length;
  o.micro_batch = a.micro_batch;
  o.grad_accum = a.grad_accum;
  o.dtype = parse_dtype(a.dtype, "--dtype");
  if (!a.sharding.empty() && a.shard_optimizer && a.sharding != "optimizer")
    throw Error("--shard-optimizer (ZeRO-1, --sharding optimizer) conflicts with --sharding " + a.sharding);
  o.sharding = a.sharding.empty() ? (a.shard_optimizer ? Sharding::kOptimizer : Sharding::kNone)
                                  : parse_sharding(a.sharding, "--sharding");
  o.replicate_groups = a.replicate_groups;
  o.reduce_each_micro_batch = !a.reduce_once_per_step;
  o.activation_checkpointing = a.activation_checkpointing;
  o.loss_chunk_tokens = a.loss_chunk_tokens;
  o.document_masking = a.document_masking;
  o.context_parallel = a.context_parallel;
  o.fp8 = a.fp8;
  o.fused_kernels = a.fused_kernels;
  if (a.device != "cuda" && a.device != "cpu")
    throw Error("--device: unknown device '" + a.device + "' (valid: cuda, cpu)");
  o.cuda = a.device == "cuda";
  const MemoryPlan p = plan_memory(config, o);
  std::optional<FitAdvice> fit;
  if (!a.gpu_memory.empty()) fit = advise_fit(config, o, parse_memory_size(a.gpu_memory, "--gpu-memory"));
  if (a.json) {
    nlohmann::json j = p.to_json();
    j["variant"] = variant_name(config.variant);
    j["options"] = {{"world", o.world},
                    {"sequence_length", o.sequence_length},
                    {"micro_batch", o.micro_batch},
                    {"grad_accum", o.grad_accum},
                    {"dtype", dtype_name(o.dtype)},
                    {"shard_optimizer", o.sharding == Sharding::kOptimizer},
                    {"sharding", sharding_name(o.sharding)},
                    {"replicate_groups", o.replicate_groups},
                    {"activation_checkpointing", o.activation_checkpointing},
                    {"loss_chunk_tokens", o.loss_chunk_tokens},
                    {"document_masking", o.document_masking},
                    {"context_parallel", o.context_parallel},
                    {"fp8", o.fp8},
                    {"fused_kernels", o.fused_kernels},
                    {"device", a.device}};
    if (fit) {
      j["fit"] = {{"gpu_memory", fit->capacity}, {"fits", fit->fits()}, {"margin", fit->margin}};
      if (!fit->fits()) {
        j["fit"]["change"] = fit->found ? nlohmann::json(fit->change) : nlohmann::json(nullptr);
        if (fit->found) j["fit"]["changed_total"] = fit->changed_total;
      }
    }
    std::cout << j.dump(2) << "\n";
  } else {
    print_plan(config, o, p);
    if (fit) print_fit(*fit);
  }
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<PlanArgs>();
  auto* app = parent.add_subcommand(
      "plan", "Per-rank training memory of a preset or config: weights, gradients, AdamW state, activations");
  auto* preset_opt = app->add_option("--preset", a->preset, "preset name")->check(CLI::IsMember(preset_names()));
  app->add_option("--config", a->config, "or a config.json")->excludes(preset_opt);
  app->add_option("--variant", a->variant, "model variant (with --preset)")
      ->check(CLI::IsMember(variant_choices()))
      ->capture_default_str();
  // Ranges are checked by the library (PlanOptions::validate), whose errors name the flag.
  app->add_option("--world", a->world, "ranks (data-parallel x context-parallel)")->capture_default_str();
  app->add_option("--sequence-length", a->sequence_length, "tokens per instance")->required();
  app->add_option("--micro-batch", a->micro_batch, "instances per micro-batch")->capture_default_str();
  app->add_option("--grad-accum", a->grad_accum, "micro-batches per optimizer step")->capture_default_str();
  add_dtype_option(app, a->dtype, "training precision: fp32, or bf16 autocast over fp32 master weights");
  app->add_flag("--shard-optimizer", a->shard_optimizer,
                "ZeRO-1: AdamW state divided over the ranks (--sharding optimizer)");
  app->add_option("--sharding", a->sharding,
                  "train.sharding: none, optimizer (ZeRO-1), full (FSDP: weights, gradients and AdamW state divided)")
      ->check(CLI::IsMember(sharding_choices()));
  app->add_option("--replicate-groups", a->replicate_groups,
                  "train.replicate_groups: HSDP with --sharding full, shard within world / N ranks, replicate N times")
      ->capture_default_str();
  app->add_flag("--reduce-once-per-step", a->reduce_once_per_step,
                "train.reduce_each_micro_batch = false: with --sharding full, unsharded gradients kept over the "
                "micro-batches, reduced once per step");
  app->add_flag("--activation-checkpointing", a->activation_checkpointing,
                "train.activation_checkpointing: keep block inputs, recompute one block at a time in backward");
  app->add_option("--loss-chunk-tokens", a->loss_chunk_tokens,
                  "train.loss_chunk_tokens: the head and loss this many tokens at a time (0: all logits at once)")
      ->capture_default_str();
  app->add_flag("--document-masking", a->document_masking,
                "train.document_masking: attention within each document (masks at their worst case over document "
                "lengths)");
  app->add_flag("--fp8", a->fp8,
                "train.fp8: the block's matmuls in FP8 (needs --dtype bf16): e4m3 copies of their inputs and weights "
                "kept for backward instead of autocast's bf16 ones");
  app->add_flag("--fused-kernels", a->fused_kernels,
                "train.fused_kernels: RMSNorm, add + RMSNorm, Q/K norm + RoPE and SwiGLU through the fused training "
                "kernels, which keep their inputs and an fp32 rstd a row instead of the composite's fp32 tensors");
  app->add_option("--device", a->device,
                  "cuda (bf16 attention through the flash kernel: sliding layers keep no masks) or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app->add_option("--context-parallel", a->context_parallel,
                  "train.context_parallel: each sequence split over this many of the ranks (the last slice is planned)")
      ->capture_default_str();
  app->add_flag("--json", a->json, "print the figures as JSON");
  app->add_option("--gpu-memory", a->gpu_memory,
                  "a GPU's memory with its unit, e.g. 80GiB, 80GB, 81920MiB (binary units; a bare number is refused): "
                  "says whether the plan fits, the margin, and else the cheapest change that fits (ZeRO-1, activation "
                  "checkpointing, smaller micro-batch, more ranks)")
      ->check(choice_validator([](const std::string& text) { parse_memory_size(text, "--gpu-memory"); }, "SIZE"));
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(65, add);
}  // namespace archspace::cli
