// The memory plan of train.sharding = "full" (FSDP) and HSDP against what a rank of a real sharded step holds:
// the ranks run as threads of this process over Gloo, and a counting CPU allocator charges every allocation to
// the rank whose thread made it (the free goes back to the same rank, from whichever thread frees it).
//
// The transport's buffers are charged to no rank: those Gloo's worker threads allocate, and those made inside a
// c10d collective on a rank's thread (Gloo stages a reduce-scatter's input in a clone and an all-gather's output
// in a flat copy there), found through RecordFunction's callbacks on the dispatcher's "c10d::" ops. The plan
// counts the engine's buffers, not the transport's, as on a GPU NCCL works in buffers of its own outside
// PyTorch's caching allocator. Intra-op parallelism is off (one thread per rank), so every kernel's allocations
// are made on its rank's thread.
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <thread>

#include "archspace/dist/process_group.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/model/parameters.h"
#include "archspace/train/fully_sharded.h"
#include "archspace/train/optimizer.h"
#include "archspace/train/plan.h"

namespace archspace {
namespace {

constexpr int kMaxRanks = 4;
constexpr int kUnattributed = kMaxRanks;  // Gloo's threads, the test's main thread

// The CPU allocator, counting live and peak bytes per rank: a thread declares its rank with charge_to().
class PerRankAllocator final : public c10::Allocator {
 public:
  explicit PerRankAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner_->allocate(n);
    void* data = d.get();
    const c10::Device device = d.device();
    const int slot = slot_ref();
    const int64_t now = live_[slot] += static_cast<int64_t>(n);
    int64_t peak = peak_[slot].load();
    while (now > peak && !peak_[slot].compare_exchange_weak(peak, now)) {
    }
    return {data, new Context{std::move(d), static_cast<int64_t>(n), slot, this}, &release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  static void charge_to(int rank) { slot_ref() = rank; }
  static int charged() { return slot_ref(); }
  int64_t live(int rank) const { return live_[rank]; }
  int64_t peak(int rank) const { return peak_[rank]; }
  void reset_peak(int rank) { peak_[rank] = live_[rank].load(); }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    int slot;
    PerRankAllocator* owner;
  };
  static int& slot_ref() {
    thread_local int slot = kUnattributed;
    return slot;
  }
  static void release(void* p) {
    auto* c = static_cast<Context*>(p);
    c->owner->live_[c->slot] -= c->bytes;
    delete c;
  }
  c10::Allocator* inner_;
  std::array<std::atomic<int64_t>, kMaxRanks + 1> live_{}, peak_{};
};

// Inside a c10d collective (the dispatcher's "c10d::..." ops) this thread's allocations are the transport's:
// Gloo stages a copy of a reduce-scatter's input and an all-gather's output on the calling thread.
struct TransportScope : at::ObserverContext {
  int slot;
};
at::CallbackHandle charge_collectives_to_no_rank() {
  return at::addThreadLocalCallback(at::RecordFunctionCallback(
      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string_view(fn.name()).rfind("c10d::", 0) != 0) return nullptr;
        auto scope = std::make_unique<TransportScope>();
        scope->slot = PerRankAllocator::charged();
        PerRankAllocator::charge_to(kUnattributed);
        return scope;
      },
      [](const at::RecordFunction&, at::ObserverContext* scope) {
        if (scope) PerRankAllocator::charge_to(static_cast<TransportScope*>(scope)->slot);
      }));
}

PerRankAllocator& per_rank() {
  static PerRankAllocator counting(c10::GetCPUAllocator());
  return counting;
}

// A TCP port nobody listens on now (the kernel's pick), for the store rank 0 serves.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Shape {
  int world = 2, replicate_groups = 1;
  int64_t batch = 2, sequence = 12, loss_chunk = 0;
  bool checkpointing = false;
};

// What one rank held, in bytes, counted from just before its FullyShardedModel was built.
struct RankBytes {
  int64_t steady = 0;   // after a step's optimizer update, gradients kept: shards + their gradients + moments
  int64_t kept = 0;     // above `steady` after the next micro-batch's forward and loss (before its backward)
  int64_t peak = 0;     // above `steady` at the highest point of that micro-batch's forward and backward
  int64_t padding = 0;  // elements of this rank's shards that lie beyond the end of their flat groups
  std::string error;
};

// Each unit's elements as FullyShardedModel lays them out (fsdp_placement): (matmul weights, the rest).
std::vector<std::pair<int64_t, int64_t>> unit_elements(const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  std::vector<std::pair<int64_t, int64_t>> units(static_cast<size_t>(L + 2));
  for (const auto& spec : parameter_specs(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const FsdpPlacement at = fsdp_placement(spec, L);
    (at.autocasts ? units[at.unit].first : units[at.unit].second) += n;
  }
  return units;
}

// Waits until Gloo's worker threads have let go of this rank's tensors they held for a finished collective
// (they drop a work's tensors just after wait() returns): its live bytes unchanged for 20 ms (2 s at most).
int64_t settled_live(int rank) {
  int64_t last = per_rank().live(rank);
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t now = per_rank().live(rank);
    if (now == last) break;
    last = now;
  }
  return last;
}

// Two micro-batches of the trainer's step (Trainer::train_step with train.sharding = "full") on every rank:
// the first, clipping and the AdamW update (the moments now exist; the gradients are kept, as within a
// step's accumulation), then the second, measured. fp32, one process's model cut into shards on each rank.
std::vector<RankBytes> measure(const ModelConfig& c, const Shape& s) {
  const int world = s.world, shard_size = world / s.replicate_groups;
  std::vector<CausalLM> models;
  std::vector<at::Tensor> ids, labels;
  at::manual_seed(7);
  for (int r = 0; r < world; ++r) {
    models.push_back(CausalLM::random_init(c, 1));  // the same weights on every rank
    ids.push_back(at::randint(c.vocab_size, {s.batch, s.sequence}, at::kLong));
    labels.push_back(at::randint(c.vocab_size, {s.batch, s.sequence}, at::kLong));
  }
  const double labelled = static_cast<double>(world * s.batch * s.sequence);
  const int port = free_port();
  std::vector<RankBytes> out(static_cast<size_t>(world));
  c10::Allocator* previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&per_rank(), /*priority=*/255);
  auto rank_main = [&](int rank) {
    RankBytes& mine = out[static_cast<size_t>(rank)];
    PerRankAllocator::charge_to(rank);
    at::set_num_threads(1);
    const at::CallbackHandle transport = charge_collectives_to_no_rank();
    try {
      DistEnv env;
      env.rank = env.local_rank = rank;
      env.world_size = env.local_world_size = world;
      env.master_port = port;
      DistGroup group(env, at::kCPU, std::chrono::seconds(60));
      std::unique_ptr<DistGroup> shards, replicas;
      if (s.replicate_groups > 1) {
        const ShardLayout layout = ShardLayout::make(world, s.replicate_groups, "replicate_groups");
        shards = group.subgroup(layout.shard_group_of(rank), "shard group " + std::to_string(rank / shard_size));
        replicas =
            group.subgroup(layout.replicate_group_of(rank), "replicate group " + std::to_string(rank % shard_size));
      }
      CausalLM& model = models[static_cast<size_t>(rank)];
      const int64_t before = per_rank().live(rank);
      FullyShardedModel fsdp(model, shards ? *shards : group, replicas.get(), false, false);
      AdamW optimizer(fsdp.optimizer_groups(), AdamWOptions{});
      auto micro_batch = [&](bool measured) {
        SequenceOptions options;
        options.parameters = &fsdp;
        options.final_hidden_only = true;
        options.activation_checkpointing = s.checkpointing;
        const at::Tensor hidden = model.forward(ids[static_cast<size_t>(rank)], options);
        LossSums sums = head_loss(hidden, fsdp.head().lm_head, labels[static_cast<size_t>(rank)], 1e-4, s.loss_chunk);
        at::Tensor loss = (sums.ce_sum + sums.z_sum) / labelled;
        if (measured) mine.kept = per_rank().live(rank) - before - mine.steady;
        loss.backward();
        fsdp.finish_backward();
      };
      fsdp.begin_step(0);
      micro_batch(false);
      fsdp.clip_grad_norm(1.0);
      fsdp.attach_gradients();
      optimizer.step(1e-3, 0.1);
      mine.steady = settled_live(rank) - before;
      per_rank().reset_peak(rank);
      fsdp.begin_step(1);
      micro_batch(true);
      mine.peak = per_rank().peak(rank) - before - mine.steady;
      // This rank's elements [r n, (r + 1) n) of each group padded to S x n; those past the group's end are padding.
      const int64_t r = rank % shard_size;
      for (const auto& [matmul, rest] : unit_elements(c))
        for (int64_t numel : {matmul, rest}) {
          if (numel == 0) continue;
          const int64_t n = (numel + shard_size - 1) / shard_size, lo = r * n, hi = lo + n;
          mine.padding += std::max<int64_t>(0, hi - std::max(lo, numel));
        }
    } catch (const std::exception& e) {
      mine.error = e.what();
    }
    at::removeCallback(transport);
    PerRankAllocator::charge_to(kUnattributed);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  c10::SetCPUAllocator(previous, 255);
  return out;
}

PlanOptions plan_options(const Shape& s) {
  PlanOptions o;
  o.world = s.world;
  o.replicate_groups = s.replicate_groups;
  o.sharding = Sharding::kFull;
  o.sequence_length = s.sequence;
  o.micro_batch = s.batch;
  o.grad_accum = 2;  // the measured micro-batch is a step's second: the first's gradients are held
  o.dtype = DType::kFp32;
  o.loss_chunk_tokens = s.loss_chunk;
  o.activation_checkpointing = s.checkpointing;
  return o;
}

// The MHA model of test_plan.cpp (CPU SDPA expands GQA's keys, which the plan does not model), window 8.
ModelConfig small_mha(Variant v) {
  ModelConfig c = preset("tiny", v);
  c.num_key_value_heads = c.num_attention_heads;
  c.depth_attention_stride = 2;
  return c;
}

void expect_plan_matches(const ModelConfig& c, const Shape& s, const std::string& what) {
  const std::vector<RankBytes> ranks = measure(c, s);
  const MemoryPlan p = plan_memory(c, plan_options(s));
  const int64_t planned_state = p.parameters + p.gradients + p.optimizer_state;
  const int64_t planned_peak = p.sharding_buffers + p.activations;
  // What autograd keeps after the forward and the loss, as test_plan.cpp's activation tests count it (less the one
  // block checkpointing recomputes at a time and the loss's chunk working set: both exist only inside backward or
  // the loss), and the head's gathered fp32 buffer, which the loss still reads in backward.
  const int64_t S = s.world / s.replicate_groups, head = unit_elements(c).back().second;
  const int64_t planned_kept = p.activations - p.recompute - p.loss_chunk + 4 * ((head + S - 1) / S * S);
  // The figures the plan would give for one process: the check below must tell them apart.
  PlanOptions one = plan_options(s);
  one.world = 1;
  one.replicate_groups = 1;
  const MemoryPlan unsharded = plan_memory(c, one);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankBytes& m = ranks[r];
    ASSERT_TRUE(m.error.empty()) << what << " rank " << r << ": " << m.error;
    std::printf(
        "%s rank %zu: weights + gradients + AdamW planned %ld measured %ld (padding %ld elements); after the "
        "forward planned %ld measured %ld; peak above the weights planned %ld (sharding buffers %ld + activations "
        "%ld) measured %ld (plan %+.1f%%)\n",
        what.c_str(), r, long(planned_state), long(m.steady), long(m.padding), long(planned_kept), long(m.kept),
        long(planned_peak), long(p.sharding_buffers), long(p.activations), long(m.peak),
        100.0 * (planned_peak - m.peak) / m.peak);
    // The shards and their gradients are padded, the moments are not: AdamW keeps one per parameter piece of the
    // shard (FullyShardedModel::optimizer_groups), so a rank holding padding holds 8 bytes less per element.
    EXPECT_EQ(m.steady, planned_state - 8 * m.padding) << what << " rank " << r;
    // The 1% of test_plan.cpp (the three scalar losses are the only difference with torch 2.11).
    EXPECT_NEAR(static_cast<double>(m.kept) / planned_kept, 1.0, 0.01) << what << " rank " << r;
    // The plan's sharding buffers and activations are an upper bound of the peak (each counted at its largest,
    // all at once; in backward the activations shrink as the buffers come and go), and not a loose one.
    EXPECT_LE(m.peak, planned_peak) << what << " rank " << r;
    EXPECT_GE(m.peak, planned_peak * 0.7) << what << " rank " << r;
    // One process's plan is not this rank's: twice the state, no sharding buffers to bound the peak.
    EXPECT_GT(unsharded.parameters + unsharded.gradients + unsharded.optimizer_state, m.steady * 3 / 2) << what;
    EXPECT_GT(m.peak, unsharded.sharding_buffers + unsharded.activations) << what;
  }
}

TEST(PlanSharded, FullShardingPerRankMatchesTheCountingAllocator) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    for (bool checkpointing : {false, true}) {
      Shape s;
      s.checkpointing = checkpointing;
      expect_plan_matches(small_mha(v), s,
                          std::string(variant_name(v)) + (checkpointing ? " checkpointed" : "") + " full over 2");
    }
  }
  Shape chunked;  // the chunked loss: its working set lives inside the loss's forward and backward
  chunked.loss_chunk = 5;
  expect_plan_matches(small_mha(Variant::kBase), chunked, "base chunked loss full over 2");
  Shape three;  // 3 ranks: groups that do not divide by 3, so the last rank holds padding
  three.world = 3;
  expect_plan_matches(small_mha(Variant::kBase), three, "base full over 3");
}

// HSDP: 4 ranks as 2 shard groups of 2; each rank holds what one of 2 FSDP ranks does, and the all-reduce over the
// replicas adds nothing that stays.
TEST(PlanSharded, HsdpPerRankMatchesTheCountingAllocator) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    Shape s;
    s.world = 4;
    s.replicate_groups = 2;
    expect_plan_matches(small_mha(v), s, std::string(variant_name(v)) + " HSDP 2 x 2");
  }
}

}  // namespace
}  // namespace archspace
