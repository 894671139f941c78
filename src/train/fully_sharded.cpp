#include "archspace/train/fully_sharded.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <map>

#include "archspace/dist/test_fault.h"
#include "archspace/kernels/gradient_norm.h"
#include "archspace/train/stability.h"
#include "archspace/util/error.h"

namespace archspace {

// ---- the layout ------------------------------------------------------------------------------------

ShardLayout ShardLayout::make(int world, int replicate_groups, const std::string& where) {
  if (replicate_groups < 1 || world % replicate_groups != 0) {
    throw Error(where + " is " + std::to_string(replicate_groups) + ", which does not divide the " +
                std::to_string(world) + " ranks into equal shard groups");
  }
  return {world, replicate_groups};
}

std::vector<int> ShardLayout::shard_group_of(int rank) const {
  const int size = shard_size(), first = rank / size * size;
  std::vector<int> ranks;
  for (int r = first; r < first + size; ++r) ranks.push_back(r);
  return ranks;
}

std::vector<int> ShardLayout::replicate_group_of(int rank) const {
  std::vector<int> ranks;
  for (int r = rank % shard_size(); r < world; r += shard_size()) ranks.push_back(r);
  return ranks;
}

// One flat group of a unit: its parameters end to end, padded to S x shard_numel.
FsdpPlacement fsdp_placement(const ParamSpec& spec, int64_t num_layers) {
  static const std::string layers = "model.layers.";
  if (spec.kind == ParamKind::kEmbedding) return {0, false};
  if (spec.name.rfind(layers, 0) == 0) {
    const int64_t l = std::stoll(spec.name.substr(layers.size()));
    if (l >= 0 && l < num_layers) return {static_cast<size_t>(1 + l), spec.kind == ParamKind::kLinear};
  }
  return {static_cast<size_t>(num_layers + 1), false};  // the final norms, the final norm, the LM head
}

struct FullyShardedModel::FlatGroup {
  std::vector<size_t> params;    // indices into specs_
  std::vector<int64_t> offsets;  // where each starts in the group
  int64_t numel = 0;             // the parameters' elements; the rest up to S x shard_numel is padding
  int64_t shard_numel = 0;
  bool autocasts = false;  // a block's matmul weights: gathered in autocast's dtype when it is on
  at::Tensor shard;        // fp32 [shard_numel]: this rank's elements, the leaf the optimizer updates
  at::Tensor grad;         // fp32 [shard_numel], summed over ranks and micro-batches; undefined: none yet
  // fp32 [S x shard_numel]: this rank's own gradients of the step's micro-batches so far, not yet reduced
  // (set_gradient_sync(false)); undefined when there are none.
  at::Tensor unreduced;
  at::Tensor gathered;  // [S x shard_numel]; its storage holds no bytes while the unit is not gathered
  at::ScalarType gathered_dtype = at::kFloat;
};

struct FullyShardedModel::Unit {
  std::string name;  // "the embedding", "block 3", "the head"
  std::vector<FlatGroup> groups;
  std::map<std::string, size_t> view_index;  // parameter name -> position among gather_views' outputs
  bool materialized = false;
};

struct FullyShardedModel::Piece {
  size_t unit, group, param;  // param: index into specs_
  int64_t shard_offset;       // where it starts in this rank's shard
  int64_t param_offset;       // where it starts in the (flattened) parameter
  int64_t numel;
};

struct FullyShardedModel::Pending {
  Unit* unit;
  size_t group;
  at::Tensor out;  // this rank's part of the sum, valid after work.wait()
  PendingCollective work;
};

namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Gives a tensor's storage `bytes` bytes (fresh, uninitialised) or none: the unsharded buffers live only
// while a unit runs, and the views autograd saved of them read the new bytes once a unit is gathered again.
void resize_storage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(bytes ? s->allocator()->allocate(bytes) : at::DataPtr(nullptr, s->device()));
  s->set_nbytes(bytes);
}

}  // namespace

// What the autograd nodes below hold of the unit they gather (the model outlives every backward).
struct UnitHolder : torch::CustomClassHolder {
  FullyShardedModel* owner = nullptr;
  FullyShardedModel::Unit* unit = nullptr;
  size_t groups = 0;
};

// Forward: the unit's shards all-gathered; its parameters are returned as views of the gathered buffers.
// Backward: the parameters' gradients reduce-scattered (started, not waited for); the shards get theirs in
// finish_backward(), so no gradient flows to them through autograd.
struct GatherUnit : torch::autograd::Function<GatherUnit> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<UnitHolder> holder, at::TensorList shards) {
    (void)shards;
    holder->owner->gather(*holder->unit);
    torch::autograd::variable_list views;
    for (const auto& g : holder->unit->groups) {
      for (size_t j = 0; j < g.params.size(); ++j) {
        const ParamSpec& spec = holder->owner->specs_[g.params[j]];
        views.push_back(g.gathered.narrow(0, g.offsets[j], numel_of(spec.shape)).view(spec.shape));
      }
    }
    ctx->saved_data["unit"] = c10::IValue::make_capsule(holder);
    return views;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<UnitHolder>(ctx->saved_data["unit"].toCapsule());
    holder->owner->reduce(*holder->unit, grads);
    return torch::autograd::variable_list(1 + holder->groups);
  }
};

// An identity on a block's outputs whose backward gathers the block again: without activation
// checkpointing the block's backward reads the weights its forward saved (views of the gathered buffers),
// whose storage was freed after the forward. Every node of the block that reads a weight lies behind the
// block's outputs, so this runs first.
struct GatherBeforeBackward : torch::autograd::Function<GatherBeforeBackward> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<UnitHolder> holder, at::TensorList outputs) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(holder);
    return torch::autograd::variable_list(outputs.begin(), outputs.end());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<UnitHolder>(ctx->saved_data["unit"].toCapsule());
    holder->owner->gather(*holder->unit);  // in the dtypes of the forward's gather
    torch::autograd::variable_list out{at::Tensor()};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

// ---- setup -----------------------------------------------------------------------------------------

FullyShardedModel::FullyShardedModel(CausalLM& model, DistGroup& shard_group, DistGroup* replicate_group,
                                     bool decay_embeddings, bool decay_norms)
    : config_(model.config()),
      shard_group_(shard_group),
      replicate_group_(replicate_group),
      specs_(parameter_specs(model.config())) {
  const int64_t L = config_.num_hidden_layers, S = shard_group_.world_size(), r = shard_group_.rank();
  // Units in forward order; each parameter to the unit its name places it in.
  units_.push_back(std::make_unique<Unit>());
  units_.back()->name = "the embedding";
  for (int64_t l = 0; l < L; ++l) {
    units_.push_back(std::make_unique<Unit>());
    units_.back()->name = "block " + std::to_string(l);
  }
  units_.push_back(std::make_unique<Unit>());
  units_.back()->name = "the head";
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& spec = specs_[i];
    const auto [u, autocasts] = fsdp_placement(spec, L);
    Unit& unit = *units_[u];
    FlatGroup* group = nullptr;
    for (auto& g : unit.groups)
      if (g.autocasts == autocasts) group = &g;
    if (!group) {
      unit.groups.emplace_back();
      group = &unit.groups.back();
      group->autocasts = autocasts;
    }
    group->params.push_back(i);
    group->offsets.push_back(group->numel);
    group->numel += numel_of(spec.shape);
  }
  const at::TensorOptions fp32 = at::TensorOptions(at::kFloat).device(model.device());
  for (auto& unit : units_) {
    // Gather order within a unit: the groups as built; views in the same order.
    size_t view = 0;
    for (auto& g : unit->groups) {
      g.shard_numel = (g.numel + S - 1) / S;
      g.shard = at::zeros({g.shard_numel}, fp32);
      g.gathered = at::empty({0}, fp32);
      for (size_t j = 0; j < g.params.size(); ++j) unit->view_index[specs_[g.params[j]].name] = view++;
    }
  }
  load_full_parameters(model.parameters());
  for (auto& unit : units_)
    for (auto& g : unit->groups) g.shard.requires_grad_(true);

  // The optimizer's groups: each parameter's part of this rank's shard, named as the parameter.
  c10::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t gi = 0; gi < units_[u]->groups.size(); ++gi) {
      const FlatGroup& g = units_[u]->groups[gi];
      const int64_t lo = r * g.shard_numel, hi = lo + g.shard_numel;
      for (size_t j = 0; j < g.params.size(); ++j) {
        const ParamSpec& spec = specs_[g.params[j]];
        const int64_t begin = std::max(lo, g.offsets[j]), end = std::min(hi, g.offsets[j] + numel_of(spec.shape));
        if (begin >= end) continue;
        pieces_.push_back({u, gi, g.params[j], begin - lo, begin - g.offsets[j], end - begin});
        const bool decay = spec.kind == ParamKind::kLinear ||
                           (spec.kind == ParamKind::kEmbedding && decay_embeddings) ||
                           (spec.kind == ParamKind::kNorm && decay_norms);
        groups_.push_back({spec.name, g.shard.narrow(0, begin - lo, end - begin), decay});
      }
    }
  }
  // The model's own tensors go: the shards are the weights now. Emptied, not left stale: a forward
  // without this source fails on their shapes instead of computing with old values.
  for (const auto& [name, p] : model.parameters()) p.set_(at::empty({0}, p.options()));
}

FullyShardedModel::~FullyShardedModel() = default;

int64_t FullyShardedModel::shard_elements() const {
  int64_t n = 0;
  for (const auto& unit : units_)
    for (const auto& g : unit->groups) n += g.shard_numel;
  return n;
}

int64_t FullyShardedModel::gathered_bytes_peak() const {
  int64_t peak = 0;
  for (const auto& unit : units_) {
    int64_t bytes = 0;
    for (const auto& g : unit->groups)
      bytes += g.shard_numel * shard_group_.world_size() * static_cast<int64_t>(c10::elementSize(g.gathered_dtype));
    peak = std::max(peak, bytes);
  }
  return peak;
}

std::string FullyShardedModel::unit_what(const std::string& op, const Unit& unit) const {
  return op + " of " + unit.name + " (step " + std::to_string(step_ + 1) + ")";
}

// ---- gathering -------------------------------------------------------------------------------------

void FullyShardedModel::gather(Unit& unit) {
  if (unit.materialized) return;
  if (test_fault_is(TestFault::kDieInAllGather) && step_ + 1 == test_fault().step && &unit == units_[0].get())
    die_for_test_fault();  // the fault test's rank dies where the others wait in this all-gather
  const int64_t S = shard_group_.world_size();
  for (auto& g : unit.groups) {
    const int64_t total = S * g.shard_numel;
    if (g.gathered.scalar_type() != g.gathered_dtype || g.gathered.numel() != total) {
      g.gathered = at::empty({total}, g.shard.options().dtype(g.gathered_dtype));
    } else {
      resize_storage(g.gathered, static_cast<size_t>(total) * c10::elementSize(g.gathered_dtype));
    }
    const at::Tensor local = g.shard.detach().to(g.gathered_dtype);  // fp32: the shard itself, no copy
    // Written by the collective, not by an autograd-visible op: the views autograd saved of the buffer
    // keep their version, so the backward of a gathered-again block may read them.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    shard_group_.all_gather_into(g.gathered, local, unit_what("the all-gather", unit));
  }
  unit.materialized = true;
}

void FullyShardedModel::free(Unit& unit) {
  for (auto& g : unit.groups) resize_storage(g.gathered, 0);
  unit.materialized = false;
}

std::vector<at::Tensor> FullyShardedModel::gather_views(Unit& unit) {
  // The matmul weights in autocast's dtype when autocast is on for the device (bf16 gathers move half the
  // bytes); everything else in fp32, as autocast would read it.
  const c10::DeviceType device = units_.front()->groups.front().shard.device().type();
  const bool autocast = at::autocast::is_autocast_enabled(device);
  bool changed = false;
  for (auto& g : unit.groups) {
    const at::ScalarType dtype = g.autocasts && autocast ? at::autocast::get_autocast_dtype(device) : at::kFloat;
    changed = changed || dtype != g.gathered_dtype;
    g.gathered_dtype = dtype;
  }
  if (changed) free(unit);
  auto holder = c10::make_intrusive<UnitHolder>();
  holder->owner = this;
  holder->unit = &unit;
  holder->groups = unit.groups.size();
  std::vector<at::Tensor> shards;
  for (const auto& g : unit.groups) shards.push_back(g.shard);
  return GatherUnit::apply(holder, at::TensorList(shards));
}

at::Tensor FullyShardedModel::embedding() {
  return gather_views(*units_.front()).at(units_.front()->view_index.at("model.embed_tokens.weight"));
}

// The lookup's backward needs only the indices and the table's size: nothing to gather again.
void FullyShardedModel::embedding_done() { free(*units_.front()); }

BlockWeights FullyShardedModel::block(int64_t l) {
  Unit& unit = *units_.at(static_cast<size_t>(1 + l));
  const std::vector<at::Tensor> views = gather_views(unit);
  auto lookup = [&](const std::string& name) { return views.at(unit.view_index.at(name)); };
  BlockWeights w;
  bind_parameters(w, param_tables::kAttentionMlpRows, layer_prefix(l), lookup);
  bind_parameters(w, block_norm_rows(config_), layer_prefix(l), lookup);
  return w;
}

void FullyShardedModel::block_done(int64_t l, std::vector<at::Tensor>& outputs, bool recomputed) {
  Unit& unit = *units_.at(static_cast<size_t>(1 + l));
  free(unit);
  if (recomputed || !c10::GradMode::is_enabled()) return;
  std::vector<size_t> slots;
  std::vector<at::Tensor> wrapped;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad()) {
      slots.push_back(i);
      wrapped.push_back(outputs[i]);
    }
  }
  if (wrapped.empty()) return;
  auto holder = c10::make_intrusive<UnitHolder>();
  holder->owner = this;
  holder->unit = &unit;
  holder->groups = unit.groups.size();
  const auto out = GatherBeforeBackward::apply(holder, at::TensorList(wrapped));
  for (size_t k = 0; k < slots.size(); ++k) outputs[slots[k]] = out[k];
}

std::vector<at::Tensor> FullyShardedModel::block_leaves(int64_t l) {
  std::vector<at::Tensor> shards;
  for (const auto& g : units_.at(static_cast<size_t>(1 + l))->groups) shards.push_back(g.shard);
  return shards;
}

HeadWeights FullyShardedModel::head() {
  if (head_.lm_head.defined()) return head_;
  Unit& unit = *units_.back();
  const std::vector<at::Tensor> views = gather_views(unit);
  auto lookup = [&](const std::string& name) { return views.at(unit.view_index.at(name)); };
  ModelWeights mw;
  bind_parameters(mw, param_tables::kHeadRows, "", lookup);
  bind_parameters(head_.final_norms, final_norm_rows(config_), "", lookup);
  head_.norm = mw.norm;
  head_.lm_head = mw.lm_head;
  return head_;
}

void FullyShardedModel::release() {
  for (auto& unit : units_) free(*unit);
  head_ = {};
}

// ---- gradients -------------------------------------------------------------------------------------

void FullyShardedModel::reduce(Unit& unit, const std::vector<at::Tensor>& grads) {
  const int64_t S = shard_group_.world_size(), r = shard_group_.rank();
  size_t k = 0;
  for (size_t gi = 0; gi < unit.groups.size(); ++gi) {
    FlatGroup& g = unit.groups[gi];
    // At most kFsdpReductionsInFlight packed buffers exist at a time (the memory plan counts them).
    while (pending_.size() >= kFsdpReductionsInFlight) wait_oldest();
    // One fp32 buffer per group (whatever dtype the views had): one collective, fp32 sums. Filled by the
    // copies; only the padding and the parameters without a gradient are zeroed (no unit-size zero fill).
    at::Tensor flat = at::empty({S * g.shard_numel}, g.shard.options().requires_grad(false));
    for (size_t j = 0; j < g.params.size(); ++j, ++k) {
      at::Tensor piece = flat.narrow(0, g.offsets[j], numel_of(specs_[g.params[j]].shape));
      if (k < grads.size() && grads[k].defined())
        piece.copy_(grads[k].reshape({-1}));
      else
        piece.zero_();
    }
    flat.narrow(0, g.numel, flat.numel() - g.numel).zero_();
    // Without sync the micro-batch's gradients add to this rank's own sum (in micro-batch order, as autograd
    // accumulates an unsharded parameter's), which the step's last micro-batch reduces once.
    if (g.unreduced.defined()) flat = g.unreduced.add_(flat);
    g.unreduced = gradient_sync_ ? at::Tensor() : flat;
    if (!gradient_sync_) continue;
    Pending p{&unit, gi, at::Tensor(), PendingCollective()};
    if (test_fault_is(TestFault::kDropReduceScatter)) {
      p.out = flat.narrow(0, r * g.shard_numel, g.shard_numel).clone();  // this rank's own gradient only
    } else {
      // The fault test's rank dies where the others wait in this reduce-scatter (the embedding's is the last).
      if (test_fault_is(TestFault::kDieInReduceScatter) && step_ + 1 == test_fault().step && &unit == units_[0].get()) {
        while (!pending_.empty()) wait_oldest();  // the earlier ones complete: the others wait in this one alone
        die_for_test_fault();
      }
      p.out = at::empty({g.shard_numel}, flat.options());
      p.work = shard_group_.reduce_scatter_sum(p.out, flat, unit_what("the reduce-scatter of the gradients", unit));
    }
    pending_.push_back(std::move(p));
  }
  free(unit);  // every node that reads the unit's weights has run: they produced the gradients above
}

void FullyShardedModel::wait_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  p.work.wait();
  if (replicate_group_)
    replicate_group_->all_reduce_sum(p.out,
                                     "the all-reduce over the replicas of " + unit_what("the gradients", *p.unit));
  FlatGroup& g = p.unit->groups[p.group];
  if (g.grad.defined()) {
    g.grad.add_(p.out);
  } else {
    g.grad = p.out;
  }
}

void FullyShardedModel::finish_backward() {
  while (!pending_.empty()) wait_oldest();
  release();
}

void FullyShardedModel::attach_gradients() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    const at::Tensor& grad = units_[piece.unit]->groups[piece.group].grad;
    groups_[i].param.mutable_grad() = grad.defined() ? grad.narrow(0, piece.shard_offset, piece.numel) : at::Tensor();
  }
}

void FullyShardedModel::zero_gradients() {
  for (auto& unit : units_)
    for (auto& g : unit->groups) g.grad = g.unreduced = at::Tensor();
  for (auto& group : groups_) group.param.mutable_grad() = at::Tensor();
}

double FullyShardedModel::clip_grad_norm(double max_norm) {
  c10::NoGradGuard no_grad;
  const at::TensorOptions f64 = at::TensorOptions(at::kDouble).device(units_.front()->groups.front().shard.device());
  at::Tensor squares = at::zeros({1}, f64);
  for (const auto& unit : units_)
    for (const auto& g : unit->groups)
      if (g.grad.defined()) squares += sum_of_squares(g.grad);
  shard_group_.all_reduce_sum(squares, "summing the squared gradient norms of step " + std::to_string(step_ + 1));
  // The norm as the unsharded clip_grad_norm holds it (fp64 squares rounded once to fp32), and its coefficient.
  const float total = squares.sqrt().item<float>();
  if (max_norm > 0) {
    const float coef = clip_coefficient(total, max_norm);
    for (auto& unit : units_)
      for (auto& g : unit->groups)
        if (g.grad.defined()) scale_gradient(g.grad, coef);
  }
  return total;
}

nlohmann::json FullyShardedModel::layer_grad_norms(int64_t num_layers) {
  attach_gradients();
  std::vector<std::string> names;
  std::vector<at::Tensor> parts;
  for (const auto& g : groups_) {
    names.push_back(g.name);
    parts.push_back(g.param);
  }
  const std::vector<double> mine = layer_grad_squares(names, parts, num_layers);
  at::Tensor squares = at::tensor(mine, at::kDouble);
  shard_group_.all_reduce_sum(squares, "summing the per-layer gradient norms of step " + std::to_string(step_ + 1));
  return layer_grad_norms_of_squares(
      std::vector<double>(squares.data_ptr<double>(), squares.data_ptr<double>() + squares.numel()));
}

// ---- whole tensors (checkpoints) -------------------------------------------------------------------

at::Tensor FullyShardedModel::full_of_group(const FlatGroup& g, const at::Tensor& shard_values, at::Device device) {
  at::Tensor full = at::empty({shard_group_.world_size() * g.shard_numel}, shard_values.options());
  shard_group_.all_gather_into(full, shard_values.contiguous(),
                               "gathering the shards for a checkpoint (step " + std::to_string(step_ + 1) + ")");
  return full.to(device);
}

NamedTensors FullyShardedModel::full_tensors(at::Device device,
                                             const std::function<at::Tensor(const FlatGroup&)>& shard_values) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> out(specs_.size());
  for (const auto& unit : units_) {
    for (const auto& g : unit->groups) {
      const at::Tensor full = full_of_group(g, shard_values(g), device);
      for (size_t j = 0; j < g.params.size(); ++j) {
        const ParamSpec& spec = specs_[g.params[j]];
        out[g.params[j]] = full.narrow(0, g.offsets[j], numel_of(spec.shape)).view(spec.shape).clone();
      }
    }
  }
  NamedTensors named;
  for (size_t i = 0; i < specs_.size(); ++i) named.emplace_back(specs_[i].name, out[i]);
  return named;
}

NamedTensors FullyShardedModel::full_parameters(at::Device device) {
  return full_tensors(device, [](const FlatGroup& g) { return g.shard.detach(); });
}

NamedTensors FullyShardedModel::full_gradients(at::Device device) {
  return full_tensors(device, [](const FlatGroup& g) {
    return g.grad.defined() ? g.grad : at::zeros({g.shard_numel}, g.shard.options());
  });
}

NamedTensors FullyShardedModel::full_optimizer_state(const AdamW& optimizer, at::Device device) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> exp_avg(specs_.size()), exp_avg_sq(specs_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t gi = 0; gi < units_[u]->groups.size(); ++gi) {
      const FlatGroup& g = units_[u]->groups[gi];
      at::Tensor m = at::zeros({g.shard_numel}, g.shard.options().requires_grad(false)), v = at::zeros_like(m);
      for (size_t i = 0; i < pieces_.size(); ++i) {
        if (pieces_[i].unit != u || pieces_[i].group != gi) continue;
        auto [pm, pv] = optimizer.moments(i);
        m.narrow(0, pieces_[i].shard_offset, pieces_[i].numel).copy_(pm);
        v.narrow(0, pieces_[i].shard_offset, pieces_[i].numel).copy_(pv);
      }
      const at::Tensor full_m = full_of_group(g, m, device), full_v = full_of_group(g, v, device);
      for (size_t j = 0; j < g.params.size(); ++j) {
        const ParamSpec& spec = specs_[g.params[j]];
        exp_avg[g.params[j]] = full_m.narrow(0, g.offsets[j], numel_of(spec.shape)).view(spec.shape).clone();
        exp_avg_sq[g.params[j]] = full_v.narrow(0, g.offsets[j], numel_of(spec.shape)).view(spec.shape).clone();
      }
    }
  }
  NamedTensors state;
  for (size_t i = 0; i < specs_.size(); ++i) {
    state.emplace_back("exp_avg." + specs_[i].name, exp_avg[i]);
    state.emplace_back("exp_avg_sq." + specs_[i].name, exp_avg_sq[i]);
  }
  return state;
}

void FullyShardedModel::load_full_parameters(const NamedTensors& params) {
  c10::NoGradGuard no_grad;
  const int64_t S = shard_group_.world_size(), r = shard_group_.rank();
  // The mutation test's wrong offset: every rank cuts its shard one element further on.
  const int64_t shift = test_fault_is(TestFault::kShardOffset) ? 1 : 0;
  for (auto& unit : units_) {
    for (auto& g : unit->groups) {
      at::Tensor flat = at::zeros({S * g.shard_numel + shift}, g.shard.options().requires_grad(false));
      for (size_t j = 0; j < g.params.size(); ++j) {
        const at::Tensor& p = params.at(g.params[j]).second;
        flat.narrow(0, g.offsets[j], p.numel()).copy_(p.reshape({-1}));
      }
      g.shard.detach().copy_(flat.narrow(0, r * g.shard_numel + shift, g.shard_numel));
    }
  }
}

void FullyShardedModel::load_full_optimizer_state(AdamW& optimizer, const NamedTensors& state, int64_t steps_taken,
                                                  const std::string& source) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  for (const auto& spec : specs_) {
    for (const std::string prefix : {"exp_avg.", "exp_avg_sq."}) {
      auto it = by_name.find(prefix + spec.name);
      if (it == by_name.end()) throw Error(source + ": optimizer state lacks '" + prefix + spec.name + "'");
      if (it->second.sizes().vec() != spec.shape)
        throw Error(source + ": optimizer state '" + prefix + spec.name + "' has the wrong shape");
    }
  }
  if (by_name.size() != 2 * specs_.size())
    throw Error(source + ": optimizer state has tensors for parameters the model lacks");
  NamedTensors mine;
  for (const Piece& piece : pieces_) {
    const std::string& name = specs_[piece.param].name;
    for (const std::string prefix : {"exp_avg.", "exp_avg_sq."})
      mine.emplace_back(prefix + name,
                        by_name.at(prefix + name).reshape({-1}).narrow(0, piece.param_offset, piece.numel));
  }
  optimizer.load_state(mine, steps_taken, source);
}

}  // namespace archspace
