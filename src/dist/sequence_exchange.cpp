#include "archspace/dist/sequence_exchange.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "archspace/util/error.h"

namespace archspace {

HaloPlan halo_plan(int rank, int ranks, int64_t slice_length, int64_t count) {
  const int64_t S = slice_length;
  // Receiver r wants positions [max(0, r S - count), r S): the first of them lands at its halo's offset 0.
  auto wanted = [&](int r) { return std::pair<int64_t, int64_t>{std::max<int64_t>(0, r * S - count), r * S}; };
  HaloPlan plan;
  const auto [lo, hi] = wanted(rank);
  plan.halo = hi - lo;
  for (int q = 0; q < rank; ++q) {  // owners, ascending
    const int64_t a = std::max(lo, q * S), b = std::min(hi, (q + 1) * S);
    if (b > a) plan.receives.push_back({q, a - q * S, b - a, a - lo});
  }
  for (int r = rank + 1; r < ranks; ++r) {  // receivers, ascending
    const auto [rlo, rhi] = wanted(r);
    const int64_t a = std::max(rlo, rank * S), b = std::min(rhi, (rank + 1) * S);
    if (b > a) plan.sends.push_back({r, a - rank * S, b - a, a - rlo});
  }
  return plan;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GroupHolder : torch::CustomClassHolder {
  DistGroup* group = nullptr;
  int64_t dim = 0, count = 0;
  int64_t slice_length = 0;  // gather_preceding: positions per rank, for the backward's plan
};

c10::intrusive_ptr<GroupHolder> holder_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
}

// [len, rest of the slice's dims moved behind dim 0]: the buffer one piece travels in.
at::Tensor piece_buffer(const at::Tensor& moved, int64_t length) {
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] = length;
  return at::empty(shape, moved.options());
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<GroupHolder> holder, const at::Tensor& slice) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(holder);
    // Collectives concatenate along dim 0: the sequence dimension goes first for the trip and back after it
    // (a view: the gathered buffer keeps the [n x S, ...] layout).
    DistGroup& group = *holder->group;
    const at::Tensor moved = slice.movedim(holder->dim, 0).contiguous();
    std::vector<int64_t> shape = moved.sizes().vec();
    shape[0] *= group.world_size();
    at::Tensor gathered = at::empty(shape, moved.options());
    group.all_gather_into(gathered, moved, "the context-parallel all-gather of a sequence");
    return gathered.movedim(0, holder->dim);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = holder_of(ctx);
    const at::Tensor& grad = grads[0];
    at::Tensor mine = holder->group->reduce_scatter_dim0(
        grad.movedim(holder->dim, 0), "the context-parallel reduce-scatter of a sequence's gradient");
    return {at::Tensor(), mine.to(grad.device()).movedim(0, holder->dim)};
  }
};

struct GatherPreceding : torch::autograd::Function<GatherPreceding> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<GroupHolder> holder, const at::Tensor& slice) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(holder);
    DistGroup& group = *holder->group;
    const int64_t dim = holder->dim;
    holder->slice_length = slice.size(dim);
    const HaloPlan plan = halo_plan(group.rank(), group.world_size(), holder->slice_length, holder->count);
    const at::Tensor moved = slice.movedim(dim, 0);
    std::vector<DistGroup::Transfer> receives, sends;
    for (const HaloPiece& p : plan.receives) receives.push_back({p.peer, piece_buffer(moved, p.length)});
    for (const HaloPiece& p : plan.sends) sends.push_back({p.peer, moved.narrow(0, p.start, p.length).contiguous()});
    group.exchange(sends, receives, "the context-parallel exchange of a sliding window's halo");
    // The pieces arrive in owner order, which is position order.
    std::vector<at::Tensor> parts;
    for (const auto& r : receives) parts.push_back(r.tensor.movedim(0, dim));
    parts.push_back(slice);
    return at::cat(parts, dim);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = holder_of(ctx);
    DistGroup& group = *holder->group;
    const int64_t dim = holder->dim;
    const HaloPlan plan = halo_plan(group.rank(), group.world_size(), holder->slice_length, holder->count);
    const at::Tensor moved = grads[0].movedim(dim, 0);  // [halo + S, ...]
    at::Tensor mine = moved.narrow(0, plan.halo, holder->slice_length).clone();
    // The reverse trip: each halo piece's gradient goes back to its owner, each owner adds what its readers send.
    // Posted in descending rank order (the forward's order mirrored), so that NCCL's in-order queues cannot
    // wait on each other.
    std::vector<DistGroup::Transfer> sends, receives;
    for (auto p = plan.sends.rbegin(); p != plan.sends.rend(); ++p)
      receives.push_back({p->peer, piece_buffer(moved, p->length)});
    for (auto p = plan.receives.rbegin(); p != plan.receives.rend(); ++p)
      sends.push_back({p->peer, moved.narrow(0, p->offset, p->length).contiguous()});
    group.exchange(sends, receives, "the context-parallel return of a sliding window's halo gradient");
    for (size_t i = 0; i < receives.size(); ++i) {
      const HaloPiece& p = plan.sends[plan.sends.size() - 1 - i];
      mine.narrow(0, p.start, p.length).add_(receives[i].tensor);
    }
    return {at::Tensor(), mine.movedim(0, dim)};
  }
};

}  // namespace

at::Tensor gather_sequence(DistGroup& group, const at::Tensor& slice, int64_t dim) {
  auto holder = c10::make_intrusive<GroupHolder>();
  holder->group = &group;
  holder->dim = dim < 0 ? dim + slice.dim() : dim;
  return GatherSequence::apply(holder, slice);
}

at::Tensor gather_preceding(DistGroup& group, const at::Tensor& slice, int64_t dim, int64_t count) {
  auto holder = c10::make_intrusive<GroupHolder>();
  holder->group = &group;
  holder->dim = dim < 0 ? dim + slice.dim() : dim;
  holder->count = count;
  return GatherPreceding::apply(holder, slice);
}

}  // namespace archspace
