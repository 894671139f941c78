// FSDP (ZeRO-3, train.sharding = "full") and HSDP (train.replicate_groups): the model's parameters,
// gradients and AdamW state divided over the ranks of a shard group, applied around a model written for
// one device as a ParameterSource (model/parameter_source.h), as PyTorch's FSDP and torchtitan do.
//
// Units: the embedding, each block, the head (the topology's final norms, the final norm and the LM
// head). Each unit's parameters are laid end to end in flat groups, padded to a multiple of the shard
// group's size S; rank r holds elements [r n, (r + 1) n) of each group in fp32 (the shard, the leaf the
// optimizer updates). One group per unit holds the blocks' matmul weights, gathered in autocast's dtype
// under bf16 autocast (what autocast would cast them to); the other holds everything else in fp32 (norms,
// the embedding that autocast leaves in fp32, and the LM head, whose gradient the chunked loss sums in
// fp32), so that a sharded step computes what an unsharded one does.
//
// A unit's shards are all-gathered into one flat buffer just before it runs and the buffer's storage is
// freed after; backward gathers a block again (activation checkpointing's recomputation asks for it, or,
// without checkpointing, a node on the block's outputs does before the block's backward). When a unit's
// backward is complete, its gradients are packed into one fp32 buffer and reduce-scattered (SUM) while
// the rest of backward runs; finish_backward() waits for them and adds them to the shards' gradients,
// after an all-reduce across the replicate groups under HSDP. The loss is normalised by the global
// batch's labelled tokens, so the sum over ranks is the whole batch's gradient.
//
// Checkpoints stay those of one process: full fp32 parameters and full AdamW moments, gathered here
// and cut again on resume, whatever the number of ranks or the sharding mode.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/dist/process_group.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/parameter_source.h"
#include "archspace/train/optimizer.h"
#include "archspace/util/tensors.h"

namespace archspace {

// The HSDP layout of `world` ranks in `replicate_groups` groups: shard groups of consecutive ranks (one
// machine's GPUs under torchrun's node-major numbering), replicate groups of the ranks at the same place in
// each shard group. Throws naming train.replicate_groups when it does not divide the world.
struct ShardLayout {
  int world = 1, replicate_groups = 1;
  int shard_size() const { return world / replicate_groups; }
  std::vector<int> shard_group_of(int rank) const;
  std::vector<int> replicate_group_of(int rank) const;
  static ShardLayout make(int world, int replicate_groups, const std::string& where);
};

// Which unit a parameter belongs to (0: the embedding, 1 + l: block l, num_layers + 1: the head) and whether it
// is gathered in autocast's dtype (a block's matmul weight). The strategy and the memory plan both read this.
struct FsdpPlacement {
  size_t unit;
  bool autocasts;
};
FsdpPlacement fsdp_placement(const ParamSpec& spec, int64_t num_layers);

// How many gradient reduce-scatters may be in flight (one per flat group) before the oldest is waited for.
inline constexpr size_t kFsdpReductionsInFlight = 2;

class FullyShardedModel : public ParameterSource {
 public:
  // Cuts the shards of this rank from `model`'s parameters (the same on every rank) and releases the
  // model's own tensors (they become empty: reading them is an error, not a silent use of stale weights).
  // `shard_group` divides the parameters; `replicate_group` (HSDP; null otherwise) holds this shard's replicas.
  // The groups must outlive this object.
  FullyShardedModel(CausalLM& model, DistGroup& shard_group, DistGroup* replicate_group, bool decay_embeddings,
                    bool decay_norms);
  ~FullyShardedModel() override;

  // ---- ParameterSource (CausalLM::forward's view of the weights) ----
  at::Tensor embedding() override;
  void embedding_done() override;
  BlockWeights block(int64_t l) override;
  void block_done(int64_t l, std::vector<at::Tensor>& outputs, bool recomputed) override;
  std::vector<at::Tensor> block_leaves(int64_t l) override;
  HeadWeights head() override;

  // ---- the training step ----
  // The 0-based step the next collectives belong to (named in their errors).
  void begin_step(int64_t step) { step_ = step; }
  // Whether the next backward reduce-scatters its gradients (true, the default) or adds them to this rank's
  // unreduced, unsharded sums for a later backward to reduce with its own (train.reduce_each_micro_batch =
  // false: the step's last micro-batch syncs), as FSDP2's set_requires_gradient_sync. Deferring holds a full
  // fp32 gradient per unit between micro-batches and reduces once per step; at 2 ranks it sums exactly as
  // "none" does, (a1 + a2) + (b1 + b2), where reducing each micro-batch forms (a1 + b1) + (a2 + b2).
  void set_gradient_sync(bool sync) { gradient_sync_ = sync; }
  // After a micro-batch's backward: waits for its reduce-scatters (and the HSDP all-reduces) and adds
  // the reduced shards to the gradients accumulated over the step's micro-batches; frees what is still gathered.
  void finish_backward();
  // Frees every gathered unit (after a forward without grad, e.g. validation, once the loss read the head).
  void release();
  // The AdamW parameter groups of this rank: each parameter's part of the shards (a view), named as the
  // parameter, decayed as its kind. Their gradients are attached by attach_gradients().
  const std::vector<AdamW::Group>& optimizer_groups() const { return groups_; }
  // Points each optimizer group's gradient at its part of the accumulated shard gradients.
  void attach_gradients();
  void zero_gradients();
  // The global L2 norm of the whole batch's gradient, and clipping as clip_grad_norm (train/optimizer.h)
  // does it: sums of squares in fp64 over the shards, summed over the shard group.
  double clip_grad_norm(double max_norm);
  // layer_grad_norms (train/stability.h) of the whole gradient, on every rank.
  nlohmann::json layer_grad_norms(int64_t num_layers);

  // ---- checkpoints (collectives: every rank calls them; `device` is where the full tensors go) ----
  NamedTensors full_parameters(at::Device device);  // in parameter_specs order
  NamedTensors full_gradients(at::Device device);   // the accumulated (reduced) gradients
  // "exp_avg.NAME", "exp_avg_sq.NAME" of every parameter, as AdamW::state() of one process.
  NamedTensors full_optimizer_state(const AdamW& optimizer, at::Device device);
  // Cut this rank's shards from full tensors (a checkpoint's): parameters in parameter_specs order.
  void load_full_parameters(const NamedTensors& params);
  void load_full_optimizer_state(AdamW& optimizer, const NamedTensors& state, int64_t steps_taken,
                                 const std::string& source);

  // Elements of each kind on this rank (for the start-up note).
  int64_t shard_elements() const;
  int64_t gathered_bytes_peak() const;  // the largest unit's gathered buffers (bytes, under the last dtypes)

  struct Unit;

 private:
  struct FlatGroup;
  void gather(Unit& unit);
  void free(Unit& unit);
  std::vector<at::Tensor> gather_views(Unit& unit);
  void reduce(Unit& unit, const std::vector<at::Tensor>& grads);
  void wait_oldest();
  at::Tensor full_of_group(const FlatGroup& g, const at::Tensor& shard_values, at::Device device);
  // Every parameter's whole tensor, gathered from each group's `shard_values` (its shards or their gradients).
  NamedTensors full_tensors(at::Device device, const std::function<at::Tensor(const FlatGroup&)>& shard_values);
  std::string unit_what(const std::string& op, const Unit& unit) const;
  friend struct GatherUnit;
  friend struct GatherBeforeBackward;

  const ModelConfig config_;
  DistGroup& shard_group_;
  DistGroup* replicate_group_;
  std::vector<ParamSpec> specs_;
  std::vector<std::unique_ptr<Unit>> units_;  // embedding, blocks 0..L-1, head
  std::vector<AdamW::Group> groups_;
  struct Piece;  // where each optimizer group lies in its flat group and in its parameter
  std::vector<Piece> pieces_;
  struct Pending;
  std::deque<Pending> pending_;
  HeadWeights head_;  // the head's gathered views while they are in use
  int64_t step_ = 0;
  bool gradient_sync_ = true;
  bool fault_step_done_ = false;
};

}  // namespace archspace
