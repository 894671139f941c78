// The memory plan (archspace plan): exact weight/gradient/optimizer arithmetic, and the activation
// estimate against what autograd really keeps on CPU, measured with a counting CPU allocator.
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/model/parameters.h"
#include "archspace/train/autocast.h"
#include "archspace/train/plan.h"
#include "test_support.h"

namespace archspace {
namespace {

PlanOptions options(int64_t world, int64_t T, int64_t B, DType dtype = DType::kBf16) {
  PlanOptions o;
  o.world = world;
  o.sequence_length = T;
  o.micro_batch = B;
  o.dtype = dtype;
  return o;
}

TEST(Plan, WeightsGradientsOptimizerFromParameterCount) {
  for (const char* name : {"tiny", "1B", "7B"}) {
    for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
      const ModelConfig c = preset(name, v);
      const int64_t P = parameter_count(c);
      PlanOptions o = options(64, 8192, 1);
      o.grad_accum = 2;
      MemoryPlan p = plan_memory(c, o);
      EXPECT_EQ(p.parameter_count, P);
      EXPECT_EQ(p.parameters, 4 * P);
      EXPECT_EQ(p.gradients, 4 * P);
      EXPECT_EQ(p.optimizer_state, 8 * P);
      EXPECT_EQ(p.tokens_per_step, 1 * 2 * 64 * 8192);
      // bf16 copies of every matmul weight: all but the embedding and the norm/scale vectors.
      int64_t vectors = 0;
      for (const auto& s : parameter_specs(c))
        if (s.shape.size() == 1) vectors += s.shape[0];
      EXPECT_EQ(p.autocast_weights, 2 * (P - c.vocab_size * c.hidden_size - vectors)) << name;
      EXPECT_EQ(p.total(), p.parameters + p.gradients + p.optimizer_state + p.autocast_weights + p.activations);

      o.sharding = Sharding::kOptimizer;
      MemoryPlan sharded = plan_memory(c, o);
      EXPECT_EQ(sharded.optimizer_state, (8 * P + 63) / 64);
      EXPECT_EQ(sharded.parameters, p.parameters);
      EXPECT_EQ(sharded.activations, p.activations);

      o.dtype = DType::kFp32;
      EXPECT_EQ(plan_memory(c, o).autocast_weights, 0);
    }
  }
}

TEST(Plan, ValuesOutOfRangeNameTheFlag) {
  const ModelConfig c = preset("tiny");
  using testing::expect_error;
  expect_error([&] { plan_memory(c, options(0, 16, 1)); }, {"--world", "0"});
  expect_error([&] { plan_memory(c, options(1, 0, 1)); }, {"--sequence-length"});
  expect_error([&] { plan_memory(c, options(1, 16, -1)); }, {"--micro-batch"});
  PlanOptions o = options(1, 16, 1);
  o.grad_accum = 0;
  expect_error([&] { plan_memory(c, o); }, {"--grad-accum"});
}

TEST(Plan, CheckpointingKeepsLessThanTheFullForward) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    PlanOptions o = options(8, 8192, 1);
    const MemoryPlan full = plan_memory(preset("1B", v), o);
    o.activation_checkpointing = true;
    const MemoryPlan ckpt = plan_memory(preset("1B", v), o);
    EXPECT_LT(ckpt.layer_activations, full.layer_activations / 4);
    EXPECT_EQ(ckpt.head_and_loss, full.head_and_loss);
  }
}

// On CUDA in bf16 sliding layers go through the flash kernel with its window: no masks, no blocked copy.
TEST(Plan, FlashOnCudaKeepsNoMasks) {
  PlanOptions o = options(1, 8192, 1);
  const MemoryPlan cpu = plan_memory(preset("1B"), o);
  o.cuda = true;
  const MemoryPlan cuda = plan_memory(preset("1B"), o);
  EXPECT_GT(cpu.attention_masks, 0);
  EXPECT_EQ(cuda.attention_masks, 0);
  // And the chunked loss's matmuls on the head padded to 100,352 rows (model/loss.h): the bf16 copy of the
  // padded weight, and each chunk's working set that wide (8 x 1,024 x V bytes here).
  const int64_t V = 100278, Vp = 100352, d = 2048;
  EXPECT_EQ(cpu.loss_chunk, 8 * 1024 * V);
  EXPECT_EQ(cuda.loss_chunk, 8 * 1024 * Vp);
  EXPECT_EQ(cuda.head_and_loss - cpu.head_and_loss, 2 * Vp * d + 8 * 1024 * (Vp - V));
  EXPECT_EQ(cpu.activations - cuda.activations, cpu.attention_masks - (cuda.head_and_loss - cpu.head_and_loss));
  o.dtype = DType::kFp32;  // fp32 on CUDA: SDPA with masks, as on the CPU
  EXPECT_GT(plan_memory(preset("1B"), o).attention_masks, 0);
}

// Wraps the CPU allocator and counts the bytes of live allocations made while it is installed. The context is
// the data pointer itself (a table keeps the inner allocation), as c10::Allocator::raw_allocate requires: oneDNN's
// bf16 matmuls allocate through it.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner_->allocate(n);
    void* data = d.get();
    const c10::Device device = d.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_allocations_[data] = {std::move(d), static_cast<int64_t>(n)};
    }
    peak_ = std::max(peak_.load(), live_ += static_cast<int64_t>(n));
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_.load(); }

 private:
  static void release(void* p);
  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>> live_allocations_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

CountingAllocator& counter() {
  static CountingAllocator counting(c10::GetCPUAllocator());
  return counting;
}

void CountingAllocator::release(void* p) {
  if (p == nullptr) return;
  CountingAllocator& c = counter();
  c10::DataPtr inner;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    auto it = c.live_allocations_.find(p);
    c.live_ -= it->second.second;
    inner = std::move(it->second.first);
    c.live_allocations_.erase(it);
  }
}

// Bytes alive after one training forward and the loss (what the trainer holds until backward), minus
// what was alive before: the activations autograd keeps, plus the logits (unless the loss is chunked).
// `batch` (optional) replaces the random ids; `document_eos` >= 0 switches document masking on; with `cp`, T is
// one context-parallel slice's positions. `bf16`: under CPU bf16 autocast, as training runs it; `fp8`: the block's
// matmuls in FP8 (SequenceOptions::fp8), under bf16 autocast as train.fp8 requires.
int64_t measured_activations(const ModelConfig& c, int64_t B, int64_t T, bool checkpointing = false,
                             int64_t loss_chunk = 0, const at::Tensor& batch = {}, int64_t document_eos = -1,
                             ContextParallel* cp = nullptr, bool bf16 = false, bool fp8 = false,
                             bool fused_kernels = false) {
  CausalLM model = CausalLM::random_init(c, 1);
  for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
  at::Tensor ids = batch.defined() ? batch : at::randint(c.vocab_size, {B, T}, at::kLong);
  at::Tensor labels = at::randint(c.vocab_size, {B, T}, at::kLong);
  c10::Allocator* previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counter(), /*priority=*/255);
  const int64_t before = counter().live();
  int64_t kept = 0;
  {
    // As the Trainer runs it: the final hidden states into the loss, which applies the head.
    SequenceOptions options;
    options.activation_checkpointing = checkpointing;
    options.final_hidden_only = true;
    options.document_eos_id = document_eos;
    options.context_parallel = cp;
    options.fp8 = fp8;
    options.fused_kernels = fused_kernels;
    LossSums sums;
    {
      AutocastGuard autocast(bf16 || fp8, at::kCPU);  // the forward and loss only, as the Trainer scopes it
      sums = head_loss(model.forward(ids, options), model.head_weight(), labels, c.vocab_z_loss_coeff, loss_chunk);
    }
    at::Tensor loss = sums.ce_sum + sums.z_sum;
    kept = counter().live() - before;
    loss.backward();  // the graph is whole: backward runs
  }
  c10::SetCPUAllocator(previous, 255);
  return kept;
}

// What the final RMSNorm keeps per token (plan.cpp's rms_norm_saved): its input, the normalised product, the rsqrt.
int64_t rms_norm_bytes_per_token(int64_t d) { return 4 * d + 4 * d + 4; }

// A small MHA model (the OLMo-core presets are MHA; CPU SDPA's flash kernel handles GQA by expanding
// k/v, which the plan does not model) with window 8, so T = 6, 12 and 40 take the three attention paths
// of causal_attention: plain causal, one [T, T] mask, masks per query block.
ModelConfig small_mha(Variant v) {
  ModelConfig c = preset("tiny", v);
  c.num_key_value_heads = c.num_attention_heads;
  c.depth_attention_stride = 2;
  return c;
}

// The plan counts every tensor the fp32 forward keeps, so it should agree to the byte apart from the
// three scalar losses the measurement also holds (12 bytes; with torch 2.11 it does). The 1% band leaves
// room for a LibTorch version that saves an extra small tensor, and still fails on any missed or
// double-counted [N, d] tensor (>= 2% of these totals). bf16 autocast and the CUDA kernels are not
// measured here (no GPU in the unit tests): their figures rest on the same account (plan.cpp).
// The chunked loss (chunk 5 < N) keeps the head's input and a log-sum-exp per row instead of the logits;
// its one chunk's working set (MemoryPlan::loss_chunk) is gone again after the forward. One chunk (1000 >= N)
// keeps its logits for backward besides.
TEST(Plan, ActivationEstimateMatchesWhatAutogradKeeps) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (int64_t T : {6, 12, 40}) {
      for (int64_t chunk : {0, 5, 1000}) {
        const ModelConfig c = small_mha(v);
        const int64_t B = 2;
        const int64_t measured = measured_activations(c, B, T, false, chunk);
        PlanOptions o = options(1, T, B, DType::kFp32);
        o.loss_chunk_tokens = chunk;
        const MemoryPlan p = plan_memory(c, o);
        EXPECT_EQ(p.loss_chunk > 0, chunk > 0 && chunk < B * T);  // one chunk in fp32: no working set
        const int64_t kept = p.activations - p.loss_chunk;
        std::printf("%s T=%ld loss chunk %ld: estimated %ld measured %ld (%+.2f%%)\n", variant_name(v), long(T),
                    long(chunk), long(kept), long(measured), 100.0 * (kept - measured) / measured);
        EXPECT_NEAR(static_cast<double>(kept) / measured, 1.0, 0.01) << variant_name(v) << " T=" << T << " " << chunk;
      }
    }
  }
}

// Peak bytes while the head and the loss run forward and backward, from the final hidden states [N, d]
// (a leaf, so the model's blocks are not in the figure) to their gradient and the head's. The unchunked form
// holds the fp32 logits [N, V] at least (and their gradient); the chunked form one chunk's: its peak must
// be lower by at least the fp32 logits of the N - chunk other rows, (N - chunk) x V x 4 bytes, and it must
// stay within the plan's account: what the loss keeps (head_and_loss - loss_chunk, less the final norm the
// leaf stands for), its chunk's working set (loss_chunk) and the two gradients it returns (h's, W's: fp32).
TEST(Plan, ChunkedLossPeakIsOneChunk) {
  const int64_t N = 384, d = 16, V = 3000, chunk = 32;
  at::manual_seed(1);
  const at::Tensor w = (at::randn({V, d}) * 0.1).requires_grad_(true);
  const at::Tensor labels = at::randint(V, {N}, at::kLong);
  auto peak = [&](int64_t loss_chunk) {
    at::Tensor h = at::randn({N, d}).requires_grad_(true);
    c10::Allocator* previous = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&counter(), /*priority=*/255);
    counter().reset_peak();
    const int64_t before = counter().live();
    {
      LossSums s = head_loss(h, w, labels, 1e-4, loss_chunk);
      (s.ce_sum + s.z_sum).backward();
    }
    const int64_t bytes = counter().peak() - before;
    c10::SetCPUAllocator(previous, 255);
    w.mutable_grad().reset();
    return bytes;
  };
  const int64_t unchunked = peak(0), chunked = peak(chunk), one = peak(N);
  const int64_t saving = (N - chunk) * V * 4;
  std::printf("head + loss peak: unchunked %ld, chunked %ld (chunk %ld), one chunk %ld, difference %ld >= %ld\n",
              long(unchunked), long(chunked), long(chunk), long(one), long(unchunked - chunked), long(saving));
  EXPECT_GE(unchunked - chunked, saving);
  // One chunk holds its logits once, turned into their gradient in place; the unchunked form holds the logits
  // and their gradient (and the gather's zero-filled [N, V]) at once.
  EXPECT_GE(unchunked - one, N * V * 4);
  ModelConfig c = preset("tiny");
  c.hidden_size = d;
  c.vocab_size = V;
  c.padded_vocab_size = 3072;
  for (const auto& [loss_chunk, measured] : {std::pair{chunk, chunked}, std::pair{N, one}}) {
    PlanOptions o = options(1, N, 1, DType::kFp32);
    o.loss_chunk_tokens = loss_chunk;
    const MemoryPlan p = plan_memory(c, o);
    const int64_t account = p.head_and_loss - rms_norm_bytes_per_token(d) * N + 4 * (N * d + V * d);
    EXPECT_LE(measured, account) << "loss chunk " << loss_chunk;
  }
}

// With activation checkpointing autograd keeps the blocks' inputs, Depth-Attention's crossing keys and
// mixed values, the head and the loss: the plan's figure less the one block backward recomputes at a
// time (MemoryPlan::recompute; that block's internals are the per-layer account checked above).
TEST(Plan, CheckpointedActivationsMatchWhatAutogradKeeps) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (int64_t T : {12, 40}) {
      const ModelConfig c = small_mha(v);
      const int64_t B = 2;
      const int64_t measured = measured_activations(c, B, T, /*checkpointing=*/true);
      PlanOptions o = options(1, T, B, DType::kFp32);
      o.activation_checkpointing = true;
      const MemoryPlan p = plan_memory(c, o);
      const int64_t kept = p.activations - p.recompute;
      std::printf("%s T=%ld checkpointed: estimated %ld measured %ld (%+.2f%%); without checkpointing %ld\n",
                  variant_name(v), long(T), long(kept), long(measured), 100.0 * (kept - measured) / measured,
                  long(measured_activations(c, B, T)));
      EXPECT_NEAR(static_cast<double>(kept) / measured, 1.0, 0.01) << variant_name(v) << " T=" << T;
    }
  }
}

// The last of N context-parallel slices (the one the plan counts) without the other ranks: the keys and values it
// attends to laid out as ContextParallelism (train/context_parallelism.cpp) hands them to attention, the other
// slices' positions zeros: at full layers one [T, 2, B, G, h] buffer of every position (the all-gather of k and v
// stacked) viewed as [B, G, T, h] each; at sliding ones halo + slice positions concatenated, [2, B, G, halo + S, h].
// What autograd keeps of them depends on their sizes and layout alone, not on their values or their origin.
class LastSliceStandIn final : public ContextParallel {
 public:
  LastSliceStandIn(int64_t slices, int64_t slice_length) : start_((slices - 1) * slice_length) {}
  int64_t slice_start() const override { return start_; }
  Keys attention_keys(const at::Tensor& k, const at::Tensor& v, int64_t window) override {
    const at::Tensor kv = at::stack({k, v});  // [2, B, G, S, h]
    const int64_t S = k.size(2);
    if (window > 0) {
      const int64_t halo = std::min(window - 1, start_);
      std::vector<int64_t> shape = kv.sizes().vec();
      shape[3] = halo;
      std::vector<at::Tensor> both = at::cat({at::zeros(shape, kv.options()), kv}, 3).unbind(0);
      return {both[0], both[1], halo};
    }
    const at::Tensor moved = kv.movedim(3, 0);  // [S, 2, B, G, h]
    std::vector<int64_t> shape = moved.sizes().vec();
    shape[0] = start_;
    std::vector<at::Tensor> both = at::cat({at::zeros(shape, kv.options()), moved}, 0).movedim(0, 3).unbind(0);
    return {both[0].narrow(2, 0, start_ + S), both[1].narrow(2, 0, start_ + S), start_};
  }

 private:
  int64_t start_;
};

// Context parallelism: the last slice's activations (its S positions, the gathered keys and values of the full
// layers, the halo of the sliding ones, the masks of its offset queries, RoPE tables of S rows) as the plan counts
// them, within the 1% of the tests above: windows shorter and longer than a slice, with and without blocks
// (T = 48 over 2 slices: 24 > 2 x window 8 takes the blocked path), checkpointed too.
TEST(Plan, ContextParallelSliceMatchesWhatAutogradKeeps) {
  struct Case {
    int64_t T, slices, window;
    bool checkpointing;
  };
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (const Case& k : {Case{24, 2, 8, false}, Case{48, 2, 8, false}, Case{24, 4, 8, false}, Case{24, 3, 20, false},
                          Case{48, 2, 8, true}, Case{24, 4, 8, true}}) {
      ModelConfig c = small_mha(v);
      c.sliding_window = k.window;
      const int64_t B = 2, S = k.T / k.slices;
      LastSliceStandIn last(k.slices, S);
      const int64_t measured = measured_activations(c, B, S, k.checkpointing, 0, {}, -1, &last);
      PlanOptions o = options(k.slices, k.T, B, DType::kFp32);
      o.context_parallel = k.slices;
      o.loss_chunk_tokens = 0;
      o.activation_checkpointing = k.checkpointing;
      const MemoryPlan p = plan_memory(c, o);
      const int64_t kept = p.activations - (k.checkpointing ? p.recompute : 0);
      std::printf(
          "%s T=%ld over %ld slices, window %ld%s: estimated %ld measured %ld (%+.2f%%), other slices' keys %ld\n",
          variant_name(v), long(k.T), long(k.slices), long(k.window), k.checkpointing ? " checkpointed" : "",
          long(kept), long(measured), 100.0 * (kept - measured) / measured, long(p.context_keys));
      EXPECT_NEAR(static_cast<double>(kept) / measured, 1.0, 0.01)
          << variant_name(v) << " T=" << k.T << " slices " << k.slices << " window " << k.window;
      if (!k.checkpointing) EXPECT_GT(p.context_keys, 0);
    }
  }
}

// The per-rank figures shrink with the slice, the gathered keys and values of the full layers aside; tokens per
// step count data-parallel ranks only (a context-parallel group shares its instances).
TEST(Plan, ContextParallelDividesTheActivations) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    PlanOptions o = options(8, 65536, 1);
    o.cuda = true;
    o.activation_checkpointing = true;
    const MemoryPlan whole = plan_memory(preset("1B", v), o);
    o.context_parallel = 8;
    const MemoryPlan sliced = plan_memory(preset("1B", v), o);
    EXPECT_EQ(sliced.tokens_per_step, 65536);
    EXPECT_EQ(whole.tokens_per_step, 8 * 65536);
    EXPECT_LT(sliced.activations, whole.activations / 4);
    EXPECT_EQ(sliced.parameters, whole.parameters);
    EXPECT_EQ(sliced.rope_tables * 8, whole.rope_tables);
  }
  using testing::expect_error;
  PlanOptions o = options(8, 65536, 1);
  o.context_parallel = 3;
  expect_error([&] { plan_memory(preset("tiny"), o); }, {"--context-parallel 3", "--world 8"});
  o.world = 6;
  o.sequence_length = 1000;
  expect_error([&] { plan_memory(preset("tiny"), o); }, {"--context-parallel 3", "--sequence-length 1000"});
  o.context_parallel = 0;
  expect_error([&] { plan_memory(preset("tiny"), o); }, {"--context-parallel"});
}

}  // namespace
}  // namespace archspace

namespace archspace {
namespace {

// Rows of documents of the given lengths (EOS = 0 ends each but the row's last; other ids from 2 up).
at::Tensor document_rows(const std::vector<std::vector<int64_t>>& rows, int64_t vocab) {
  std::vector<at::Tensor> out;
  for (const auto& lengths : rows) {
    at::Tensor row = at::randint(2, vocab, {std::accumulate(lengths.begin(), lengths.end(), int64_t{0})}, at::kLong);
    int64_t end = 0;
    for (size_t i = 0; i + 1 < lengths.size(); ++i) row[(end += lengths[i]) - 1] = 0;
    out.push_back(row);
  }
  return at::stack(out);
}

}  // namespace

// Document masking off the flash kernel (the CPU): each document's own masks, per row, and the documents'
// concatenated output o_proj keeps. Documents of exactly 2 window tokens reach the plan's worst case, so the
// plan agrees with what autograd keeps there (the 1% band of ActivationEstimateMatchesWhatAutogradKeeps);
// any other split keeps less. Also with activation checkpointing (its one recomputed block apart).
TEST(Plan, DocumentMaskingCountsItsWorstCase) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    ModelConfig c = small_mha(v);  // window 8
    c.eos_token_id = 0;
    const int64_t B = 2, T = 32;
    for (bool checkpointing : {false, true}) {
      PlanOptions o = options(1, T, B, DType::kFp32);
      o.loss_chunk_tokens = 0;
      o.activation_checkpointing = checkpointing;
      const MemoryPlan plain = plan_memory(c, o);
      o.document_masking = true;
      const MemoryPlan p = plan_memory(c, o);
      const int64_t kept = p.activations - p.recompute;
      at::manual_seed(3);
      const int64_t worst =
          measured_activations(c, B, T, checkpointing, 0, document_rows({{16, 16}, {16, 16}}, 512), 0);
      std::printf("%s%s document masking: estimated %ld measured %ld (%+.2f%%); without masking %ld\n", variant_name(v),
                  checkpointing ? " checkpointed" : "", long(kept), long(worst), 100.0 * (kept - worst) / worst,
                  long(plain.activations - plain.recompute));
      EXPECT_NEAR(static_cast<double>(kept) / worst, 1.0, 0.01) << variant_name(v) << " " << checkpointing;
      for (const auto& split : std::vector<std::vector<std::vector<int64_t>>>{
               {{5, 17, 10}, {32}}, {{1, 1, 30}, {12, 20}}, {{8, 8, 8, 8}, {31, 1}}}) {
        const int64_t measured = measured_activations(c, B, T, checkpointing, 0, document_rows(split, 512), 0);
        EXPECT_LE(measured, kept * 1.01) << variant_name(v) << " " << checkpointing;
      }
      if (!checkpointing) {
        EXPECT_GT(p.attention_masks, plain.attention_masks);  // per row and per document
        // The full layer's copy; the sliding layers (T > 2 window) had the blocked path's copy already.
        EXPECT_EQ(p.document_masking, 4 * c.num_attention_heads * c.head_dim * B * T);
      }
    }
  }
  // CUDA bf16: the variable-length flash kernel, no masks and no copy, the offsets once.
  PlanOptions o = options(1, 8192, 2);
  o.cuda = true;
  const MemoryPlan plain = plan_memory(preset("1B"), o);
  o.document_masking = true;
  const MemoryPlan flash = plan_memory(preset("1B"), o);
  EXPECT_EQ(flash.attention_masks, 0);
  EXPECT_EQ(flash.document_masking, 4 * (2 * 8192 + 1));
  EXPECT_EQ(flash.activations - plain.activations, flash.document_masking);
}

}  // namespace archspace

namespace archspace {
namespace {

// FP8 (SequenceOptions::fp8, under CPU bf16 autocast as train.fp8 runs): what autograd keeps after the forward
// (autocast's cache cleared: the LM head's bf16 copy, autocast_weights, is kept by the loss) against the plan, within
// the 1% band of ActivationEstimateMatchesWhatAutogradKeeps (it agrees but for the 3 scalar losses); and the
// difference from the plain bf16 forward to the byte: the block linears' e4m3 inputs, weights and scales in place of
// autocast's bf16 input copies and bf16 block weights, the SwiGLU product and the blocked path's (T = 40)
// concatenated output freed. (The plain bf16 CPU figure itself is not the plan's to 1%: not checked here.)
// Checkpointed, a block's internals exist only in its recomputation (MemoryPlan::recompute, FP8's there), so FP8
// changes nothing autograd keeps after the forward.
TEST(Plan, Fp8ActivationsMatchWhatAutogradKeeps) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (int64_t T : {6, 12, 40}) {
      for (bool checkpointing : {false, true}) {
        const ModelConfig c = small_mha(v);
        const int64_t B = 2, chunk = 5;
        PlanOptions o = options(1, T, B, DType::kBf16);
        o.cuda = false;
        o.loss_chunk_tokens = chunk;
        o.activation_checkpointing = checkpointing;
        const MemoryPlan bf16 = plan_memory(c, o);
        o.fp8 = true;
        const MemoryPlan fp8 = plan_memory(c, o);
        const int64_t measured_bf16 = measured_activations(c, B, T, checkpointing, chunk, {}, -1, nullptr, true);
        const int64_t measured_fp8 = measured_activations(c, B, T, checkpointing, chunk, {}, -1, nullptr, true, true);
        EXPECT_LT(fp8.autocast_weights, bf16.autocast_weights);  // the LM head's copy only
        if (checkpointing) {
          EXPECT_EQ(measured_fp8, measured_bf16) << variant_name(v) << " T=" << T;
          EXPECT_EQ(fp8.activations - fp8.recompute, bf16.activations - bf16.recompute);
          EXPECT_NE(fp8.recompute, bf16.recompute);
          continue;
        }
        auto kept = [](const MemoryPlan& p) { return p.autocast_weights + p.activations - p.loss_chunk; };
        std::printf("%s T=%ld FP8: estimated %ld measured %ld (%+.2f%%); bf16 keeps %ld more, plan %ld\n",
                    variant_name(v), long(T), long(kept(fp8)), long(measured_fp8),
                    100.0 * (kept(fp8) - measured_fp8) / measured_fp8, long(measured_bf16 - measured_fp8),
                    long(kept(bf16) - kept(fp8)));
        // The plan counts what the GPU (and a CPU with native bf16 matmuls) keeps. Where this CPU widens every bf16
        // matmul to fp32 (kernels/bf16_matmuls.h: the avx2 and baseline kernel paths), autograd keeps those fp32
        // copies too, which no GPU does: there the measurement is not the plan's, only printed.
        if (bf16_matmuls_widened()) continue;
        EXPECT_NEAR(static_cast<double>(kept(fp8)) / measured_fp8, 1.0, 0.01) << variant_name(v) << " T=" << T;
        EXPECT_EQ(kept(bf16) - kept(fp8), measured_bf16 - measured_fp8) << variant_name(v) << " T=" << T;
      }
    }
  }
  PlanOptions o = options(1, 16, 1, DType::kFp32);
  o.fp8 = true;
  testing::expect_error([&] { plan_memory(preset("tiny"), o); }, {"--fp8", "--dtype bf16"});
}

// The fused training kernels (train.fused_kernels, kernels/fused_training.h): each norm keeps its input and an fp32
// rstd a row, the SwiGLU its gate and up. What autograd keeps after the forward against the plan within the 1% band of
// ActivationEstimateMatchesWhatAutogradKeeps (it agrees but for the 3 scalar losses), in fp32, under CPU bf16 autocast
// and with FP8 over it (as Fp8ActivationsMatchWhatAutogradKeeps: autocast's cache is the LM head's copy, and where
// this CPU widens its bf16 matmuls the bf16 measurements are only printed); and the saving against the composite
// forward to the byte. Checkpointed, only the final norm(s) differ after the forward (a block's internals exist in its
// recomputation, MemoryPlan::recompute); under autocast the figure after the forward is not the plan's (the plan
// counts the block weights' bf16 copies a step holds, which the no-grad forward does not cache): only the saving, and
// FP8 changes nothing there.
TEST(Plan, FusedKernelsActivationsMatchWhatAutogradKeeps) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (int64_t T : {6, 12, 40}) {
      for (bool checkpointing : {false, true}) {
        const ModelConfig c = small_mha(v);
        const int64_t B = 2, chunk = 5;
        auto kept = [](const MemoryPlan& p) { return p.autocast_weights + p.activations - p.loss_chunk - p.recompute; };
        auto measured = [&](bool fused, bool bf16, bool fp8) {
          return measured_activations(c, B, T, checkpointing, chunk, {}, -1, nullptr, bf16, fp8, fused);
        };
        for (const DType dtype : {DType::kFp32, DType::kBf16}) {
          const bool bf16 = dtype == DType::kBf16;
          PlanOptions o = options(1, T, B, dtype);
          o.cuda = false;
          o.loss_chunk_tokens = chunk;
          o.activation_checkpointing = checkpointing;
          const MemoryPlan composite = plan_memory(c, o);
          o.fused_kernels = true;
          const MemoryPlan fused = plan_memory(c, o);
          const int64_t measured_composite = measured(false, bf16, false), measured_fused = measured(true, bf16, false);
          std::printf(
              "%s T=%ld %s%s fused kernels: estimated %ld measured %ld (%+.2f%%%s); composite keeps %ld more, "
              "plan %ld\n",
              variant_name(v), long(T), dtype_name(dtype), checkpointing ? " checkpointed" : "", long(kept(fused)),
              long(measured_fused), 100.0 * (kept(fused) - measured_fused) / measured_fused,
              bf16 && checkpointing ? ", not the plan's: see above" : "", long(measured_composite - measured_fused),
              long(kept(composite) - kept(fused)));
          EXPECT_LT(kept(fused), kept(composite));
          if (checkpointing) EXPECT_LT(fused.recompute, composite.recompute);
          if (bf16 && bf16_matmuls_widened()) continue;
          EXPECT_EQ(kept(composite) - kept(fused), measured_composite - measured_fused)
              << variant_name(v) << " T=" << T << " " << dtype_name(dtype) << " " << checkpointing;
          if (!bf16 || !checkpointing)
            EXPECT_NEAR(static_cast<double>(kept(fused)) / measured_fused, 1.0, 0.01)
                << variant_name(v) << " T=" << T << " " << dtype_name(dtype) << " " << checkpointing;
          if (!bf16) continue;
          o.fp8 = true;
          const MemoryPlan fp8 = plan_memory(c, o);
          const int64_t measured_fp8 = measured(true, true, true);
          if (checkpointing) {
            EXPECT_EQ(measured_fp8, measured_fused) << variant_name(v) << " T=" << T;
            EXPECT_EQ(fp8.activations - fp8.recompute, fused.activations - fused.recompute);
            continue;
          }
          std::printf("%s T=%ld FP8 fused kernels: estimated %ld measured %ld (%+.2f%%)\n", variant_name(v), long(T),
                      long(kept(fp8)), long(measured_fp8), 100.0 * (kept(fp8) - measured_fp8) / measured_fp8);
          EXPECT_NEAR(static_cast<double>(kept(fp8)) / measured_fp8, 1.0, 0.01) << variant_name(v) << " T=" << T;
        }
      }
    }
  }
  // fp32 with context parallelism (the last of 2 slices; T = 48 takes the blocked path) and with document masking
  // (documents of 2 windows, the plan's worst case): within the same 1% band.
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    ModelConfig c = small_mha(v);
    const int64_t B = 2;
    const bool fused = true;
    for (int64_t T : {24, 48}) {
      LastSliceStandIn last(2, T / 2);
      const int64_t measured = measured_activations(c, B, T / 2, false, 0, {}, -1, &last, false, false, fused);
      PlanOptions o = options(2, T, B, DType::kFp32);
      o.context_parallel = 2;
      o.loss_chunk_tokens = 0;
      o.fused_kernels = true;
      const int64_t kept = plan_memory(c, o).activations;
      std::printf("%s T=%ld over 2 slices fused kernels: estimated %ld measured %ld (%+.2f%%)\n", variant_name(v),
                  long(T), long(kept), long(measured), 100.0 * (kept - measured) / measured);
      EXPECT_NEAR(static_cast<double>(kept) / measured, 1.0, 0.01) << variant_name(v) << " T=" << T;
    }
    c.eos_token_id = 0;
    at::manual_seed(3);
    const int64_t measured = measured_activations(c, B, 32, false, 0, document_rows({{16, 16}, {16, 16}}, 512),
                                                  /*document_eos=*/0, nullptr, false, false, fused);
    PlanOptions o = options(1, 32, B, DType::kFp32);
    o.loss_chunk_tokens = 0;
    o.document_masking = true;
    o.fused_kernels = true;
    const int64_t kept = plan_memory(c, o).activations;
    std::printf("%s document masking fused kernels: estimated %ld measured %ld (%+.2f%%)\n", variant_name(v),
                long(kept), long(measured), 100.0 * (kept - measured) / measured);
    EXPECT_NEAR(static_cast<double>(kept) / measured, 1.0, 0.01) << variant_name(v);
  }
  // The 1B model at bf16 4 x 4096 on CUDA: the fused plan keeps less, with FP8 too and checkpointed.
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (bool fp8 : {false, true}) {
      PlanOptions o = options(1, 4096, 4);
      o.cuda = true;
      o.fp8 = fp8;
      const MemoryPlan composite = plan_memory(preset("1B", v), o);
      o.fused_kernels = true;
      const MemoryPlan fused = plan_memory(preset("1B", v), o);
      EXPECT_LT(fused.total(), composite.total()) << variant_name(v) << " " << fp8;
      EXPECT_EQ(fused.total() - fused.activations, composite.total() - composite.activations);
      o.activation_checkpointing = true;
      const MemoryPlan checkpointed = plan_memory(preset("1B", v), o);
      o.fused_kernels = false;
      EXPECT_LT(checkpointed.total(), plan_memory(preset("1B", v), o).total()) << variant_name(v) << " " << fp8;
    }
  }
}

}  // namespace
}  // namespace archspace
