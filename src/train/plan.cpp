#include "archspace/train/plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "archspace/model/attention.h"
#include "archspace/model/depth_attention.h"
#include "archspace/model/loss.h"
#include "archspace/model/parameters.h"
#include "archspace/train/fully_sharded.h"
#include "archspace/util/error.h"

namespace archspace {

// How the account below reads the engine's forward (one micro-batch, N = B * T tokens):
//
// - An op saves what its backward needs: a linear its input and weight; rms_norm (model/rms_norm.cpp) its fp32
//   input, the normalised product and the [N, 1] rsqrt; pow its input; softmax its result; a mul of two
//   tensors that need gradients both, a mul by a constant (cos, sin, a mask, a double) only the constant;
//   add, cat, stack, mean, narrow, neg and casts nothing. A tensor nothing saves is freed when its last
//   use ends; a tensor saved by several ops is one storage and counted once.
// - fp32: the residual stream is kept by the linears that read it; a linear's output is 4 bytes/element.
// - bf16 autocast: a linear casts its input to bf16, and each cast of a non-leaf tensor is a fresh copy
//   (autocast caches casts of weights only), so q/k/v keep three bf16 copies of their input and gate/up
//   two; the fp32 residual itself is freed. Linear outputs are bf16; rms_norm makes an fp32 copy of a
//   bf16 input; Depth-Attention's sums run in fp32 (autocast's sum policy); SDPA gets bf16 q, k, v.
// - Attention through SDPA (flash on CUDA, the flash CPU kernel) keeps q, k, v, the output and a
//   [B, H, T] fp32 logsumexp: O(T), no scores; on CUDA in bf16 the flash kernel keeps the same and takes
//   the window itself (PlanOptions::cuda), so no masks. Elsewhere a sliding layer with window < T builds a boolean mask
//   that SDPA turns into an additive mask in the query's dtype and keeps: [T, T] when T <= 2 window, else one [window,
//   <= 2 window] mask per query block (model/attention.cpp). The reference attention path (tests only) keeps [B, H, T,
//   T] scores and is not planned for.
// - Document masking (PlanOptions::document_masking). Off the flash kernel each document of each row runs alone
//   through the paths above, by its own length: a sliding layer's masks are then per row and per document,
//   L^2 for a document of W < L <= 2 window tokens, per block beyond, none up to the window. Over any split of
//   a row into documents that is at most T^2 (T <= 2 window) or 2 window x T (documents of exactly 2 window
//   tokens reach it), times the rows: the plan counts that worst case. The documents' outputs are
//   concatenated into the [B, T, H, h] tensor o_proj reads and keeps, beside the pieces SDPA keeps: one more
//   [N, H h] activation per layer (the blocked path's own copy is that copy). The flash kernel takes every
//   document in one call: no masks, no copy, the int32 offsets (at most N + 1) kept once.
// - Context parallelism (N slices of S = T / N positions): everything above is per position and counted for
//   the S positions of one slice, the last (the largest: it reads every earlier position). Its attention keeps
//   the keys and values it attends to, gathered from the other ranks, in place of its own: T positions at full
//   layers (the whole gathered buffer, of which it reads all), halo + S at sliding ones (the window - 1
//   positions before the slice); its own are freed (the exchanges keep nothing). Its queries sit at an offset
//   into those keys, so SDPA takes a [S, keys] mask (the flash kernel only serves whole sequences).
// - FP8 (PlanOptions::fp8, with bf16 autocast; kernels/fp8_linear.cpp): the block's linears are autograd functions
//   outside autocast that keep, for backward, the e4m3 copy of their input (1 byte an entry, made once for all
//   the linears that read it: q/k/v one, gate/up one) and the e4m3 copy of their weight (1 byte an entry, made
//   each micro-batch, so an activation), each with an fp32 scalar inverse scale; not the input itself. So the
//   three bf16 copies q/k/v keep become one e4m3 copy, gate/up's two one; o_proj and down_proj keep an e4m3
//   copy of their input where autocast kept the tensor itself: the SwiGLU product is then freed, and so is the
//   blocked path's (or the documents') concatenated output; autocast caches no bf16 block weight (the LM head
//   still runs under autocast). Outputs are bf16, as under autocast. What is saved does not depend on the
//   matmul's path: the GPU's _scaled_mm and the CPU's (oneDNN's _scaled_mm, or the widened fp32 fallback where
//   bf16 matmuls are widened or oneDNN refused) keep the same four tensors, so the CPU measurement
//   (tests/unit/test_plan.cpp) checks the GPU's account. On CUDA _scaled_mm needs the rows and both feature
//   counts multiples of 16 (fp8_linear_applies); the plan counts FP8 only where every block linear qualifies,
//   else the bf16 account (exact when the rows do not qualify, as then no linear does).
// - Fused training kernels (PlanOptions::fused_kernels; kernels/fused_training.cpp): rms_norm, add_rms_norm and
//   rms_norm_rope are autograd functions that keep their input x itself, in its own dtype (no fp32 copy, no
//   normalised product), and an fp32 rstd a row (4 bytes a token); add_rms_norm not its residual, rms_norm_rope
//   the shared cos/sin tables (rope_tables) besides, its rotated output (fresh, SDPA keeps it) as before. So a
//   Q/K norm keeps the projection output in the activation dtype where the composite kept an fp32 one and the
//   normalised product; a post-sublayer norm the bf16 linear output (under autocast) where it kept an fp32 copy;
//   a norm of an fp32 stream the stream itself, counted once where another op keeps it too (the siamese
//   rms_norm(Y) beside scale * X). The SwiGLU keeps gate and up; silu's output is not kept, the product still is
//   (down_proj's input; under FP8 its e4m3 copy). Linears, SDPA, Depth-Attention, masks and the loss are as
//   above. With checkpointing only the recomputed block and the final norms change.
namespace {

struct Widths {
  int64_t d, qw, kw, inter, vocab, heads, kv_heads, head_dim;
};

Widths widths(const ModelConfig& c) {
  return {c.hidden_size,
          c.num_attention_heads * c.head_dim,
          c.num_key_value_heads * c.head_dim,
          c.intermediate_size,
          c.vocab_size,
          c.num_attention_heads,
          c.num_key_value_heads,
          c.head_dim};
}

// The activation model below is exact for the reordered and siamese_hybrid_pre blocks; the other
// topologies of SPEC.md section 7 are counted as the one with the same number of streams (an estimate).
bool siamese(const ModelConfig& c) { return is_siamese(c.topology()); }
bool depth(const ModelConfig& c) { return c.variant == Variant::kSiameseDepth && c.use_depth_attention; }

// Per-token bytes of what the op sequences keep, by mode.
struct Bytes {
  bool bf16;
  bool flash = false;                           // CUDA bf16: the flash kernel keeps what SDPA's does, without masks
  bool documents = false;                       // document masking (see above)
  bool fp8 = false;                             // the block's linears through FP8 (see above)
  bool fused = false;                           // the fused training kernels (see above)
  int64_t act() const { return bf16 ? 2 : 4; }  // a linear's output, SDPA's tensors
  // An fp32 tensor read by `readers` linears: itself in fp32, a bf16 copy per reader under autocast.
  int64_t linear_input(int64_t readers) const { return bf16 ? 2 * readers : 4; }
  // The same for the block's linears: under FP8 one e4m3 copy for all the readers.
  int64_t block_input(int64_t readers) const { return fp8 ? 1 : linear_input(readers); }
  // rms_norm (or add_rms_norm's norm) of a [N, w] input of `in` bytes an entry, per token, its input included.
  // Composite: its fp32 input (the input itself, or an fp32 copy of a bf16 one), the normalised product, the
  // [N, 1] rsqrt. Fused: the input itself and the fp32 rstd.
  int64_t norm_saved(int64_t w, int64_t in) const { return fused ? in * w + 4 : 4 * w + 4 * w + 4; }
};

// Attention from its (separately counted) input to o_proj's input: q/k norms, RoPE outputs, v, SDPA's
// output and logsumexp, the reshaped output o_proj reads. Per token; masks and Depth-Attention apart.
int64_t attention_core(const Widths& w, const Bytes& b) {
  // q and k: the linear output (fp32: rms_norm keeps it; bf16: rms_norm keeps an fp32 copy), the
  // normalised product, the RoPE output in the activation dtype (the norm's output is freed: RoPE's muls
  // keep only cos/sin). Fused: the linear output itself and the rstd, then the RoPE output.
  const int64_t q = b.norm_saved(w.qw, b.act()) + b.act() * w.qw;
  const int64_t k = b.norm_saved(w.kw, b.act()) + b.act() * w.kw;
  const int64_t v = b.act() * w.kw;
  // SDPA's output is laid out [B, T, H, h], so o_proj reads it through a view (the blocked path's cat
  // is the exception: see blocked_copy_bytes).
  const int64_t sdpa = b.act() * w.qw /*output*/ + 4 * w.heads /*logsumexp*/;
  const int64_t o_input = b.fp8 ? w.qw : 0;  // FP8: o_proj's e4m3 copy of that output
  return q + k + v + sdpa + o_input;
}

// SwiGLU from its input (counted apart): gate output (silu keeps it), silu output (fused: none), up output,
// product (FP8: down_proj keeps the product's e4m3 copy instead).
int64_t mlp_core(const Widths& w, const Bytes& b) {
  return (b.fused ? 2 : 3) * b.act() * w.inter + (b.fp8 ? 1 : b.act()) * w.inter;
}

// FP8: whether every block linear takes _scaled_mm (fp8_linear_applies) for N rows.
bool fp8_applies(const Widths& w, const PlanOptions& o, int64_t N) {
  if (!o.fp8) return false;
  if (!o.cuda) return true;
  for (int64_t n : {N, w.d, w.qw, w.kw, w.inter})
    if (n % 16 != 0) return false;
  return true;
}

// FP8: what one layer's linears keep besides the per-token inputs: each weight's e4m3 copy, and the fp32 inverse
// scales of the seven weights and the four inputs (q/k/v's, o's, gate/up's, down's).
int64_t fp8_layer_bytes(const Widths& w) {
  const int64_t weights = w.d * (2 * w.qw + 2 * w.kw) + 3 * w.d * w.inter;
  return weights + 4 * (7 + 4);
}

Bytes bytes_of(const ModelConfig& c, const PlanOptions& o) {
  const bool bf16 = o.dtype == DType::kBf16;
  const int64_t N = o.micro_batch * (o.sequence_length / o.context_parallel);
  return {bf16, o.cuda && bf16, o.document_masking, fp8_applies(widths(c), o, N), o.fused_kernels};
}

// Depth-Attention at a layer with `sources` earlier sources: the mean query, the stacked keys and values
// [.., S + 1, h], the fp32 softmax (and its bf16 copy under autocast). Per token.
int64_t depth_saved(const Widths& w, const Bytes& b, int64_t sources) {
  const int64_t n = sources + 1;
  return b.act() * w.kw * (1 + 2 * n) + 4 * n * w.kv_heads + (b.bf16 ? 2 * n * w.kv_heads : 0);
}

// What one layer's attention works on in the last context-parallel slice (the whole sequence without):
// its queries, the keys they read, where the first query sits among them.
struct AttentionShape {
  int64_t tq, tk, q_offset;
};

AttentionShape attention_shape(const PlanOptions& o, int64_t window) {
  const int64_t S = o.sequence_length / o.context_parallel, start = (o.context_parallel - 1) * S;
  if (window <= 0) return {S, start + S, start};     // every earlier position
  const int64_t halo = std::min(window - 1, start);  // the window's reach before the slice
  return {S, halo + S, halo};
}

// The kernel causal_attention takes for this shape (model/attention.cpp's own rule).
AttentionPath path_of(const ModelConfig& c, const PlanOptions& o, const AttentionShape& a, int64_t window) {
  return attention_path(AttentionImpl::kSdpa, o.cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU),
                        o.dtype == DType::kBf16 ? at::kBFloat16 : at::kFloat, a.tq, a.tk, c.head_dim, window,
                        a.q_offset, /*padded=*/false);
}

// The additive masks a layer keeps (bytes, not per token): see causal_attention in model/attention.cpp. SDPA turns
// the boolean mask into an additive one in the query's dtype and keeps it: [Tq, Tk] in one call, or one
// [window, <= 2 window] mask per query block on the blocked path.
// With documents (no context parallelism), the worst case over the documents of `rows` rows (see above).
int64_t mask_bytes(const AttentionShape& a, int64_t window, AttentionPath path, const Bytes& b, int64_t rows) {
  if (b.documents) {
    if (b.flash || window <= 0 || window >= a.tq) return 0;  // flash, or each document plain causal
    return rows * b.act() * a.tq * std::min(a.tq, 2 * window);
  }
  if (path == AttentionPath::kSdpaMasked) return b.act() * a.tq * a.tk;
  if (path != AttentionPath::kSdpaBlocked) return 0;
  int64_t bytes = 0;
  for (int64_t s = 0; s < a.tq; s += window) {
    const int64_t e = std::min(a.tq, s + window);
    const int64_t k0 = std::max<int64_t>(0, s + a.q_offset - (window - 1)), k1 = std::min(a.tk, e + a.q_offset);
    bytes += b.act() * (e - s) * (k1 - k0);
  }
  return bytes;
}

// Sliding layers attended block by block concatenate the blocks' outputs in [B, H, T, h] order, so o_proj's
// input is a copy of its own; so do the documents of document masking on any layer (off the flash kernel).
// Under FP8 o_proj keeps its e4m3 copy (attention_core), and the concatenation is freed.
int64_t blocked_copy_bytes(AttentionPath path, int64_t N, const Widths& w, const Bytes& b) {
  if (b.fp8) return 0;
  if (b.documents) return b.flash ? 0 : b.act() * w.qw * N;
  return path == AttentionPath::kSdpaBlocked ? b.act() * w.qw * N : 0;
}

// Context parallelism: the keys and values beyond the slice's own positions that SDPA keeps (attention_core
// counts S positions of each). Rope outputs and v in the activation dtype (under autocast SDPA's bf16 copies).
int64_t context_key_bytes(const Widths& w, const Bytes& b, const PlanOptions& o, const AttentionShape& a) {
  return 2 * b.act() * w.kw * o.micro_batch * (a.tk - a.tq);
}

int64_t sources_of(const ModelConfig& c, int64_t layer) {
  return static_cast<int64_t>(depth_sources(layer, c.depth_attention_stride, c.depth_attention_recent_window).size());
}

// Per-token bytes of layer `layer` without masks (and Depth-Attention separately).
int64_t layer_per_token(const ModelConfig& c, const Bytes& b, int64_t layer) {
  const Widths w = widths(c);
  int64_t bytes = attention_core(w, b) + mlp_core(w, b);
  if (siamese(c)) {
    // Inputs X and Y (one tensor at layer 0: the embedding), kept by scale * X and rms_norm(Y) (Y counted
    // once); the attention input read by q/k/v; rms_norm of X after attention, of Y, of X + RMS(Y), all fp32
    // streams; the MLP input.
    bytes += (layer == 0 ? 4 : 8) * w.d + (b.norm_saved(w.d, 4) - 4 * w.d) + b.block_input(3) * w.d;
    bytes += 3 * b.norm_saved(w.d, 4) + b.block_input(2) * w.d;
  } else {
    // The input read by q/k/v; post-attention norm of the attention output; h read by gate/up;
    // post-feedforward norm of the MLP output (those outputs in the activation dtype; fused keeps them).
    bytes += b.block_input(3) * w.d + b.norm_saved(w.d, b.act()) + b.block_input(2) * w.d + b.norm_saved(w.d, b.act());
  }
  return bytes;
}

}  // namespace

void PlanOptions::validate() const {
  auto positive = [](int64_t v, const char* flag) {
    if (v <= 0) throw Error(std::string(flag) + " must be a positive integer, got " + std::to_string(v));
  };
  positive(world, "--world");
  positive(sequence_length, "--sequence-length");
  positive(micro_batch, "--micro-batch");
  positive(grad_accum, "--grad-accum");
  positive(replicate_groups, "--replicate-groups");
  if (replicate_groups > 1 && sharding != Sharding::kFull)
    throw Error("--replicate-groups " + std::to_string(replicate_groups) +
                ": HSDP replicates the shard groups of --sharding full");
  if (world % replicate_groups != 0)
    throw Error("--replicate-groups " + std::to_string(replicate_groups) + " does not divide --world " +
                std::to_string(world) + " into equal shard groups");
  positive(context_parallel, "--context-parallel");
  if (world % context_parallel != 0)
    throw Error("--context-parallel " + std::to_string(context_parallel) + " must divide --world " +
                std::to_string(world) + " (the ranks are data-parallel x context-parallel)");
  if (sequence_length % context_parallel != 0)
    throw Error("--context-parallel " + std::to_string(context_parallel) + " must divide --sequence-length " +
                std::to_string(sequence_length) + " (each rank takes an equal contiguous slice)");
  if (context_parallel > 1 && document_masking)
    throw Error("--context-parallel " + std::to_string(context_parallel) +
                " with --document-masking: not supported together (train.context_parallel refuses it too)");
  if (!reduce_each_micro_batch && sharding != Sharding::kFull)
    throw Error("--reduce-once-per-step: applies to --sharding full only (the other modes reduce once per step)");
  if (fp8 && dtype != DType::kBf16)
    throw Error("--fp8 needs --dtype bf16 (train.fp8 needs train.dtype = \"bf16\": autocast around the FP8 matmuls)");
  if (loss_chunk_tokens < 0)
    throw Error("--loss-chunk-tokens must be >= 0 (0: unchunked), got " + std::to_string(loss_chunk_tokens));
}

int64_t layer_activation_bytes(const ModelConfig& c, const PlanOptions& o, int64_t layer) {
  const Bytes b = bytes_of(c, o);
  const int64_t N = o.micro_batch * (o.sequence_length / o.context_parallel);  // this rank's positions
  int64_t bytes = layer_per_token(c, b, layer) * N + (b.fp8 ? fp8_layer_bytes(widths(c)) : 0);
  if (depth(c)) bytes += depth_saved(widths(c), b, sources_of(c, layer)) * N;
  const int64_t window = c.layer_types[layer] == LayerType::kSliding ? c.sliding_window : 0;
  const AttentionShape a = attention_shape(o, window);
  const AttentionPath path = path_of(c, o, a, window);
  return bytes + mask_bytes(a, window, path, b, o.micro_batch) + blocked_copy_bytes(path, N, widths(c), b) +
         context_key_bytes(widths(c), b, o, a);
}

MemoryPlan plan_memory(const ModelConfig& c, const PlanOptions& o) {
  o.validate();
  c.validate("plan");
  const Bytes b = bytes_of(c, o);
  const Widths w = widths(c);
  // T: this rank's positions (a context-parallel slice, or the whole sequence).
  const int64_t T = o.sequence_length / o.context_parallel, N = o.micro_batch * T, L = c.num_hidden_layers;

  MemoryPlan p;
  p.parameter_count = parameter_count(c);
  p.tokens_per_step = o.micro_batch * o.grad_accum * o.data_parallel() * o.sequence_length;
  p.parameters = 4 * p.parameter_count;
  p.gradients = 4 * p.parameter_count;
  const int64_t adam = 2 * 4 * p.parameter_count;
  p.optimizer_state = o.sharding == Sharding::kOptimizer ? (adam + o.world - 1) / o.world : adam;
  if (o.sharding == Sharding::kFull && o.world > 1) {
    // FSDP (train/fully_sharded.h): per unit, a flat group of the blocks' matmul weights and one of the rest,
    // each padded to a multiple of the shard group's size S; a rank holds 1/S of each, in fp32, with its
    // gradient and moments. The matmul weights arrive in the autocast dtype per unit and are freed after, so
    // no autocast copies are kept; one unit is gathered at a time (the next block's all-gather in backward
    // starts after the previous block's gradients are packed: the autograd engine runs the later node first).
    // When a unit's backward completes, autograd holds its whole (unsharded) gradients, one per gathered view
    // in the view's dtype, while they are packed into the fp32 flat buffers; each buffer being reduce-scattered
    // has its 1/S output beside it. tests/unit/test_plan_sharded.cpp measures these with the counting allocator.
    const int64_t S = o.shard_group(), L = c.num_hidden_layers;
    std::vector<std::pair<int64_t, int64_t>> units(static_cast<size_t>(L + 2));  // (autocast, fp32) elements
    for (const auto& spec : parameter_specs(c)) {
      int64_t numel = 1;
      for (int64_t dim : spec.shape) numel *= dim;
      const FsdpPlacement at = fsdp_placement(spec, L);
      (at.autocasts ? units[at.unit].first : units[at.unit].second) += numel;
    }
    auto padded = [S](int64_t n) { return (n + S - 1) / S * S; };
    const int64_t matmul = b.bf16 ? 2 : 4;
    int64_t shard = 0, gathered = 0;
    std::vector<int64_t> groups;
    for (const auto& [autocast, fp32] : units) {
      for (int64_t n : {autocast, fp32})
        if (n > 0) {
          shard += padded(n) / S;
          groups.push_back(padded(n));
        }
      // The gathered buffers and autograd's gradients of their views.
      gathered = std::max(gathered, padded(autocast) * matmul + padded(fp32) * 4 + autocast * matmul + fp32 * 4);
    }
    std::sort(groups.rbegin(), groups.rend());
    int64_t reducing = 0;  // the packed fp32 gradients and their reduced shards
    for (size_t i = 0; i < std::min(groups.size(), kFsdpReductionsInFlight); ++i)
      reducing += 4 * (groups[i] + groups[i] / S);
    p.parameters = p.gradients = 4 * shard;
    if (!o.reduce_each_micro_batch && o.grad_accum > 1)  // every unit's own sums, held over the micro-batches
      for (int64_t n : groups) p.gradients += 4 * n;
    p.optimizer_state = 8 * shard;
    p.sharding_buffers = gathered + reducing;
  } else if (b.bf16) {
    for (const auto& spec : parameter_specs(c)) {
      if (spec.kind != ParamKind::kLinear) continue;                  // the embedding lookup and norms stay fp32
      if (b.fp8 && spec.name.starts_with("model.layers.")) continue;  // FP8 casts the block's to e4m3 instead
      int64_t numel = 1;
      for (int64_t dim : spec.shape) numel *= dim;
      p.autocast_weights += 2 * numel;
    }
  }

  for (int64_t l = 0; l < L; ++l) {
    const int64_t window = c.layer_types[l] == LayerType::kSliding ? c.sliding_window : 0;
    const AttentionShape a = attention_shape(o, window);
    p.attention_masks += mask_bytes(a, window, path_of(c, o, a, window), b, o.micro_batch);
    p.context_keys += context_key_bytes(w, b, o, a);
    if (depth(c)) p.depth_attention += depth_saved(w, b, sources_of(c, l)) * N;
    // The documents' concatenated output (the blocked path's copy is already part of the per-layer account).
    if (b.documents && !b.flash && !b.fp8 && !(window > 0 && T > 2 * window)) p.document_masking += b.act() * w.qw * N;
  }
  const int64_t offsets = b.documents && b.flash ? 4 * (N + 1) : 0;  // the flash kernels' cu_seqlens, one tensor
  p.document_masking += offsets;
  if (o.activation_checkpointing) {
    // Each block's fp32 input(s) are kept (the checkpoint node saves them; the last block's output is
    // the final norm's input, in head_and_loss); one block's internals exist at a time (its
    // recomputation in backward). Depth-Attention's source keys and mixed values cross blocks and stay:
    // the key in the activation dtype, the mix in fp32 under autocast (its sums run in fp32).
    int64_t largest = 0;
    for (int64_t l = 0; l < L; ++l) largest = std::max(largest, layer_activation_bytes(c, o, l));
    int64_t inputs = 0;
    for (int64_t l = 0; l < L; ++l) inputs += (siamese(c) && l > 0 ? 8 : 4) * w.d * N;
    int64_t crossing = 0;
    if (depth(c)) {
      std::vector<bool> is_source(L);
      for (int64_t l = 1; l < L; ++l)
        for (int64_t j : depth_sources(l, c.depth_attention_stride, c.depth_attention_recent_window))
          is_source[j] = true;
      for (int64_t l = 0; l < L; ++l)
        if (is_source[l]) crossing += (b.act() + 4) * w.kw * N;  // its key and mixed value
    }
    p.recompute = largest;
    p.layer_activations = inputs + largest + crossing + offsets;
    p.attention_masks = 0;  // inside the one block's internals
    p.context_keys = 0;
    p.depth_attention = crossing;
    p.document_masking = offsets;
  } else {
    for (int64_t l = 0; l < L; ++l) p.layer_activations += layer_activation_bytes(c, o, l);
    p.layer_activations += offsets;
  }

  // Final norm(s), the LM head's input, the logits, the loss (model/loss.cpp). Unchunked (loss_chunk_tokens
  // 0): logits in fp32 (the bf16 logits stay alive in the trainer too), logsumexp [N], the gather index
  // (int64) and the label mask. Chunked (N > loss_chunk_tokens): the head's input in the matmul dtype (as the
  // linear keeps it) and one fp32 log-sum-exp per row, plus one chunk's working set, the larger of the
  // forward's (its logits and, on the ATen form a GPU runs, their fp32 copy and exp(logits - max) of the same
  // size: an upper bound for the CPU's one-pass kernel) and, under autocast, the backward's (the chunk's bf16
  // logit gradient and its bf16 [V, d] weight-gradient product; fp32 forms that in place). One chunk (N <=
  // loss_chunk_tokens): as chunked, and the chunk's logits in the matmul dtype kept from forward to backward
  // (where they become their gradient in place); the working set is the bf16 weight-gradient product under
  // autocast (on a CPU with AMX, where MKL's fp32-output bf16 GEMM sums the products into the fp32 gradient,
  // kernels/bf16_gemm.h, that product is never formed: the row is then 2 V d bytes over). Counting every token as
  // labelled: the copies of the labelled rows' labels and indices that SFT masks (and a window's last position) make
  // are at most 16 bytes a token more.
  // On CUDA the chunked form runs its matmuls on the head padded with zero rows to a multiple of
  // kCudaHeadRowMultiple (model/loss.h): its logits and gradients are that wide, and the padded copy of the
  // weight in the matmul dtype lives from the loss's forward to its backward.
  int64_t head = (siamese(c) ? 3 : 1) * b.norm_saved(w.d, 4) + b.linear_input(1) * w.d;  // norms of fp32 streams
  const int64_t chunk = o.loss_chunk_tokens;
  const int64_t vocab = o.cuda && chunk > 0 ? padded_head_rows(w.vocab, kCudaHeadRowMultiple) : w.vocab;
  const int64_t padded_head = vocab != w.vocab ? (b.bf16 ? 2 : 4) * vocab * w.d : 0;
  if (chunk > 0 && N > chunk) {
    p.loss_chunk = std::max(2 * 4 * chunk * vocab, b.bf16 ? 2 * chunk * vocab + 2 * vocab * w.d : 0);
    p.head_and_loss = (head + 4) * N + padded_head + p.loss_chunk;
  } else if (chunk > 0) {
    p.loss_chunk = b.bf16 ? 2 * vocab * w.d : 0;
    p.head_and_loss = (head + 4 + (b.bf16 ? 2 : 4) * vocab) * N + padded_head + p.loss_chunk;
  } else {
    head += (b.bf16 ? 2 + 4 : 4) * w.vocab + 4 + 8 + 4;
    p.head_and_loss = head * N;
  }
  p.rope_tables = 4 * 4 * T * w.head_dim;  // cos and sin, sliding and full, [T, head_dim] fp32

  p.activations = p.layer_activations + p.head_and_loss + p.rope_tables;
  return p;
}

nlohmann::json MemoryPlan::to_json() const {
  return {{"parameter_count", parameter_count},
          {"tokens_per_step", tokens_per_step},
          {"bytes",
           {{"parameters", parameters},
            {"gradients", gradients},
            {"optimizer_state", optimizer_state},
            {"autocast_weights", autocast_weights},
            {"sharding_buffers", sharding_buffers},
            {"activations", activations},
            {"total", total()}}},
          {"activation_bytes",
           {{"layers", layer_activations},
            {"attention_masks", attention_masks},
            {"document_masking", document_masking},
            {"depth_attention", depth_attention},
            {"recompute", recompute},
            {"head_and_loss", head_and_loss},
            {"loss_chunk", loss_chunk},
            {"context_keys", context_keys},
            {"rope_tables", rope_tables}}}};
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const std::string forms =
      " (a size with its unit: 80GiB, 80GB, 80G, 81920MiB or 85899345920B; all binary, 2^30 a GiB)";
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  // A bare number is refused rather than read as bytes: "--gpu-memory 80" almost always means 80 GiB, and reading
  // it as 80 bytes answered a question nobody asked. Bytes must say so ("B").
  if (used > 0 && unit.empty()) throw Error(flag + ": '" + text + "' has no unit" + forms);
  static const std::vector<std::pair<std::vector<std::string>, double>> units = {
      {{"B"}, 1.0},
      {{"K", "KB", "KIB"}, 1024.0},
      {{"M", "MB", "MIB"}, 1024.0 * 1024},
      {{"G", "GB", "GIB"}, 1024.0 * 1024 * 1024},
      {{"T", "TB", "TIB"}, 1024.0 * 1024 * 1024 * 1024}};
  for (const auto& [names, scale] : units) {
    for (const auto& n : names) {
      if (used > 0 && unit == n && value > 0 && value * scale < 9e18) return static_cast<int64_t>(value * scale);
    }
  }
  throw Error(flag + ": '" + text + "' is not a memory size" + forms);
}

FitAdvice advise_fit(const ModelConfig& c, const PlanOptions& o, int64_t capacity) {
  FitAdvice a;
  a.capacity = capacity;
  a.margin = capacity - plan_memory(c, o).total();
  if (a.fits()) return a;
  // Candidates in the order of the header's comment; each keeps the global batch where it can.
  std::vector<std::pair<PlanOptions, std::string>> candidates;
  auto with = [&](PlanOptions p, const std::string& flags) { candidates.emplace_back(std::move(p), flags); };
  // Each change below is tried with ZeRO-1 and then with FSDP over the ranks there are.
  const bool can_fully_shard = o.world > 1 && o.sharding != Sharding::kFull;
  auto with_sharding = [&](const PlanOptions& p, const std::string& plain, const std::string& zero1_flags) {
    with(p, zero1_flags);
    if (!can_fully_shard) return;
    PlanOptions q = p;
    q.sharding = Sharding::kFull;
    with(q, "--sharding full " + plain);
  };
  const bool can_shard = o.world > 1 && o.sharding == Sharding::kNone;
  auto sharded = [&](PlanOptions p, std::string& flags) {
    if (can_shard) {
      p.sharding = Sharding::kOptimizer;
      flags = "--shard-optimizer " + flags;
    }
    return p;
  };
  if (can_shard) {
    PlanOptions p = o;
    p.sharding = Sharding::kOptimizer;
    with(p, "--shard-optimizer");
  }
  if (can_fully_shard) {
    PlanOptions p = o;
    p.sharding = Sharding::kFull;
    with(p, "--sharding full");
  }
  if (!o.activation_checkpointing) {
    std::string flags = "--activation-checkpointing";
    PlanOptions p = o;
    p.activation_checkpointing = true;
    const std::string plain = flags;
    with_sharding(sharded(p, flags), plain, flags);
  }
  for (const bool checkpointing : {false, true}) {
    if (checkpointing && o.activation_checkpointing) continue;  // already covered by the first pass
    for (int64_t mb = o.micro_batch / 2; mb >= 1; mb /= 2) {
      PlanOptions p = o;
      p.micro_batch = mb;
      p.grad_accum = o.grad_accum * (o.micro_batch / mb);
      if (o.micro_batch % mb != 0) continue;
      p.activation_checkpointing = checkpointing || o.activation_checkpointing;
      std::string flags = std::string(checkpointing ? "--activation-checkpointing " : "") + "--micro-batch " +
                          std::to_string(mb) + " --grad-accum " + std::to_string(p.grad_accum);
      const std::string plain = flags;
      with_sharding(sharded(p, flags), plain, flags);
    }
  }
  for (int64_t world = o.world * 2; world <= o.world * 64; world *= 2) {
    const int64_t factor = world / o.world;
    PlanOptions p = o;
    p.world = world;
    if (p.sharding == Sharding::kNone) p.sharding = Sharding::kOptimizer;
    p.grad_accum = o.grad_accum % factor == 0 ? o.grad_accum / factor : o.grad_accum;
    std::string flags =
        "--world " + std::to_string(world) + (o.sharding != Sharding::kNone ? "" : " --shard-optimizer");
    if (p.grad_accum != o.grad_accum)
      flags += " --grad-accum " + std::to_string(p.grad_accum);
    else
      flags += " (the global batch grows " + std::to_string(factor) + "x)";
    with(p, flags);
    if (!o.activation_checkpointing) {
      PlanOptions q = p;
      q.activation_checkpointing = true;
      with(q, "--activation-checkpointing " + flags);
    }
  }
  for (const auto& [p, flags] : candidates) {
    const int64_t total = plan_memory(c, p).total();
    if (total <= capacity) {
      a.found = true;
      a.change = flags;
      a.changed = p;
      a.changed_total = total;
      return a;
    }
  }
  return a;
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace archspace
