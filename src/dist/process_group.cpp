#include "archspace/dist/process_group.h"

#include <torch/csrc/autograd/variable.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef ARCHSPACE_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <numeric>

#include "archspace/util/error.h"

namespace archspace {

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int env_int(const char* name, int fallback) {
  const std::string v = env_or(name, "");
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size()) return n;
  } catch (const std::exception&) {
  }
  throw Error(std::string("environment variable ") + name + "='" + v + "' is not an integer");
}

// c10::Error's what() carries a C++ backtrace: users need the message alone.
std::string cause_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& c) {
    return c.what_without_backtrace();
  } catch (const std::exception& s) {
    return s.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv e;
  e.world_size = env_int("WORLD_SIZE", 1);
  e.rank = env_int("RANK", 0);
  e.local_rank = env_int("LOCAL_RANK", e.rank);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
  e.master_addr = env_or("MASTER_ADDR", e.master_addr);
  e.master_port = env_int("MASTER_PORT", e.master_port);
  e.agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  e.restart_count = env_or("TORCHELASTIC_RESTART_COUNT", "0");
  if (e.world_size < 1) throw Error("environment variable WORLD_SIZE must be >= 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw Error("environment variable RANK=" + std::to_string(e.rank) +
                " is outside [0, WORLD_SIZE=" + std::to_string(e.world_size) + ")");
  if (e.master_port <= 0 || e.master_port > 65535) throw Error("environment variable MASTER_PORT is not a port");
  return e;
}

namespace {
std::atomic<bool> joined{false};
}  // namespace

bool joined_process_group() { return joined.load(); }

struct DistGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // the run's keys ("/worker/attempt_N"); subgroups nest under it
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  at::Device device = at::kCPU;  // where collectives' tensors live
};

namespace {

// A process group of `size` ranks over `store` (Gloo for CPU tensors, NCCL for CUDA ones).
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, at::Device device,
                                                          std::chrono::milliseconds timeout) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  if (device.is_cuda()) {
#ifdef ARCHSPACE_WITH_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank,
                                                            size, opts);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
#else
    throw Error("data-parallel training on CUDA needs NCCL, and this build has none (NCCL headers not found)");
#endif
  } else {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // GLOO_SOCKET_IFNAME picks the network interface on multi-homed hosts, as in PyTorch.
    const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
    opts->devices.push_back(ifname.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                           : c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank,
                                                            size, opts);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    // Gloo's full-mesh connect can return on one rank while a peer still completes its side of their pair:
    // a rank that then fails at once (an error every rank meets, such as a vocabulary mismatch) would close
    // the pair under that peer, which reports "cannot join" instead of the real error (seen once in CI).
    // No rank leaves here before every rank has its group (PyTorch's TORCH_DIST_INIT_BARRIER=1 does the same).
    // Gloo's own barrier, not ProcessGroup::barrier: that one keeps its 1-byte tensor in a function-local static
    // every call replaces, a race when ranks run as threads of one process (test_plan_sharded.cpp saw one rank's
    // byte freed by another's barrier).
    c10d::BarrierOptions joined_everywhere;
    joined_everywhere.timeout = timeout;
    gloo->barrier(joined_everywhere)->wait();
  }
  return pg;
}

std::string world_who(const DistEnv& env) {
  return "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
}

[[noreturn]] void throw_failed(const std::string& who, const std::string& what, std::chrono::milliseconds timeout,
                               const std::exception_ptr& e) {
  throw Error(who + ": " + what + " failed (a peer rank died, or did not answer within " +
              std::to_string(timeout.count() / 1000) + " s): " + cause_of(e));
}

}  // namespace

DistGroup::DistGroup(const DistEnv& env, at::Device device, std::chrono::milliseconds timeout)
    : rank_(env.rank), size_(env.world_size), who_(world_who(env)), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  const std::string store_at = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = !env.agent_store && env.rank == 0;  // by hand, rank 0 serves the store
    so.numWorkers = env.world_size;
    so.waitWorkers = false;
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    // The prefix Python's init_process_group uses under torchrun: a restarted attempt gets fresh keys.
    impl_->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + env.restart_count, tcp);
    impl_->pg = make_process_group(impl_->store, env.rank, env.world_size, device, timeout);
    impl_->device = device;
    joined = true;
  } catch (const Error&) {
    throw;
  } catch (...) {
    throw Error(who() + ": cannot join the process group (store " + store_at + ", " +
                std::to_string(timeout.count() / 1000) + " s timeout): " + cause_of(std::current_exception()));
  }
}

DistGroup::DistGroup(std::unique_ptr<Impl> impl, int rank, int size, std::string who, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), who_(std::move(who)), timeout_(timeout), impl_(std::move(impl)) {}

DistGroup::~DistGroup() = default;

std::string DistGroup::who() const { return who_; }

void DistGroup::rethrow(const std::string& what) const {
  throw_failed(who(), what, timeout_, std::current_exception());
}

std::unique_ptr<DistGroup> DistGroup::subgroup(const std::vector<int>& ranks, const std::string& name) {
  // Every member computes the same list; this rank's place in it is its rank in the subgroup.
  const int me = impl_->pg->getRank();
  const auto it = std::find(ranks.begin(), ranks.end(), me);
  if (it == ranks.end()) throw Error(who() + ": is not a member of " + name);
  auto impl = std::make_unique<Impl>();
  impl->device = impl_->device;
  const int rank = static_cast<int>(it - ranks.begin()), size = static_cast<int>(ranks.size());
  std::string label = who() + " in " + name;
  guard("building " + name, [&] {
    impl->store = c10::make_intrusive<c10d::PrefixStore>(name, impl_->store);
    impl->pg = make_process_group(impl->store, rank, size, impl->device, timeout_);
  });
  return std::unique_ptr<DistGroup>(new DistGroup(std::move(impl), rank, size, std::move(label), timeout_));
}

struct PendingCollective::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep;  // the tensors the collective reads and writes
  std::string who, what;
  std::chrono::milliseconds timeout;
};

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

void PendingCollective::wait() {
  if (!impl_) return;
  try {
    impl_->work->wait();
  } catch (...) {
    const std::unique_ptr<Impl> done = std::move(impl_);
    throw_failed(done->who, done->what, done->timeout, std::current_exception());
  }
  impl_.reset();
}

void DistGroup::all_gather_into(at::Tensor& out, const at::Tensor& in, const std::string& what) {
  guard(what, [&] {
    if (out.numel() != in.numel() * size_ || !out.is_contiguous())
      throw Error("all_gather_into: the output must be contiguous and hold " + std::to_string(size_) + " x " +
                  std::to_string(in.numel()) + " elements");
    at::Tensor flat_in = in.contiguous().view({-1}), flat_out = out.view({-1});
    impl_->pg->_allgather_base(flat_out, flat_in)->wait();
  });
}

at::Tensor DistGroup::reduce_scatter_dim0(const at::Tensor& t, const std::string& what) {
  at::Tensor out;
  guard(what, [&] {
    at::Tensor in = t.to(impl_->device).contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    if (shape.empty() || shape[0] % size_ != 0)
      throw Error("reduce_scatter_dim0: dim 0 of " + std::to_string(shape.empty() ? 0 : shape[0]) +
                  " rows does not split over " + std::to_string(size_) + " ranks");
    shape[0] /= size_;
    out = at::empty(shape, in.options());
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    impl_->pg->_reduce_scatter_base(out, in, o)->wait();  // Gloo: valid only after wait()
  });
  return out;
}

void DistGroup::exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives,
                         const std::string& what) {
  guard(what, [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<std::vector<at::Tensor>> buffers;  // alive until every work is done
    buffers.reserve(sends.size() + receives.size());
    for (const Transfer& r : receives) {
      buffers.push_back({r.tensor});
      works.push_back(impl_->pg->recv(buffers.back(), r.peer, /*tag=*/0));
    }
    for (const Transfer& s : sends) {
      buffers.push_back({s.tensor.contiguous()});
      works.push_back(impl_->pg->send(buffers.back(), s.peer, /*tag=*/0));
    }
    for (auto& w : works) w->wait();
  });
}

PendingCollective DistGroup::reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string& what) {
  PendingCollective pending;
  guard(what, [&] {
    auto impl = std::make_unique<PendingCollective::Impl>();
    impl->keep = {out, in};
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    impl->work = impl_->pg->_reduce_scatter_base(impl->keep[0], impl->keep[1], o);
    impl->who = who();
    impl->what = what;
    impl->timeout = timeout_;
    pending.impl_ = std::move(impl);
  });
  return pending;
}

void DistGroup::all_reduce_sum(at::Tensor& t, const std::string& what) {
  guard(what, [&] {
    std::vector<at::Tensor> v{t.to(impl_->device)};
    impl_->pg->allreduce(v)->wait();
    t.copy_(v[0]);
  });
}

void DistGroup::broadcast(at::Tensor& t, int root, const std::string& what) {
  guard(what, [&] {
    std::vector<at::Tensor> v{t.to(impl_->device).contiguous()};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    impl_->pg->broadcast(v, o)->wait();
    t.copy_(v[0]);
  });
}

at::Tensor DistGroup::all_gather(const at::Tensor& t, const std::string& what) {
  at::Tensor out;
  guard(what, [&] {
    std::vector<at::Tensor> in{t.to(impl_->device).contiguous()};
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < size_; ++r) gathered[0].push_back(at::empty_like(in[0]));
    impl_->pg->allgather(gathered, in)->wait();
    out = at::cat(gathered[0]).to(t.device());
  });
  return out;
}

void DistGroup::barrier(const std::string& what, std::chrono::milliseconds timeout) {
  guard(what, [&] {
    c10d::BarrierOptions o;
    o.timeout = timeout;
    if (impl_->device.is_cuda()) o.device_ids = {impl_->device.index()};
    // The backend's barrier, as c10d's barrier op calls it: ProcessGroup::barrier's static tensor is shared by
    // every group of the process (see make_process_group).
    impl_->pg->getBackend(impl_->device.type())->barrier(o)->wait();
  });
}

struct GradientReducer::Impl {
  std::unique_ptr<c10d::Reducer> reducer;
};

GradientReducer::GradientReducer(DistGroup& group, const std::vector<at::Tensor>& params, int64_t bucket_bytes)
    : impl_(std::make_unique<Impl>()) {
  // Buckets in reverse parameter order, as DDP: backward produces the last layers' gradients first, so
  // their bucket can be all-reduced while earlier layers are still differentiated.
  std::vector<int64_t> order(params.size());
  std::iota(order.rbegin(), order.rend(), int64_t{0});
  const std::vector<bool> dense(params.size(), false);
  auto [buckets, caps] = c10d::compute_bucket_assignment_by_size(
      params, {static_cast<size_t>(1 << 20), static_cast<size_t>(bucket_bytes)}, dense, order);
  std::vector<int64_t> cap_list(caps.begin(), caps.end());
  group.guard("setting up the gradient reducer", [&] {
    impl_->reducer = std::make_unique<c10d::Reducer>(params, std::move(buckets), group.impl_->pg, dense, bucket_bytes,
                                                     /*find_unused_parameters=*/false,
                                                     /*gradient_as_bucket_view=*/false, /*param_names=*/
                                                     std::unordered_map<size_t, std::string>{},
                                                     /*first_bucket_bytes_cap=*/1 << 20,
                                                     /*skip_all_reduce_unused_params=*/false,
                                                     /*use_python_reducer=*/false, cap_list);
  });
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::arm() { impl_->reducer->prepare_for_backward({}); }

}  // namespace archspace
