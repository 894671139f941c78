// Data-parallel communication for training: a c10d process group built from torchrun's environment
// (Gloo on CPU; NCCL on CUDA when the build found it), subgroups of it (HSDP's shard and replicate groups),
// collectives that fail with an error naming this rank instead of hanging (the sharded ones of FSDP
// included: all-gather into one buffer, a reduce-scatter started now and waited for later), and the
// gradient reducer (c10d::Reducer, the engine under PyTorch's DDP).
// One process (WORLD_SIZE unset or 1) builds none of this. The c10d headers stay inside the .cpp.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace archspace {

// What torchrun (or a hand launch) puts in the environment of each worker.
struct DistEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // ranks on this machine
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  // torchrun's agent serves the TCPStore: every rank connects as a client
  std::string restart_count = "0";
};

// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
// TORCHELASTIC_RESTART_COUNT; world_size 1 when WORLD_SIZE is unset. Throws naming the variable on bad values.
DistEnv dist_env_from_environment();

// Whether this process has joined a process group. Until then every rank runs the same code on the same
// inputs (config, files), so their errors are the same; afterwards ranks can fail differently. The CLI
// prints an error of the first kind from rank 0 alone and labels one of the second kind with its rank.
bool joined_process_group();

// A collective started and not yet finished (c10d::Work). Its output is valid only after wait() (Gloo's
// reduce-scatter copies it out inside wait()); it keeps its tensors alive until then.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();
  // Blocks until done. Throws archspace::Error "rank R of W: WHAT failed (...)" as the blocking collectives do.
  void wait();
  bool started() const { return impl_ != nullptr; }

 private:
  friend class DistGroup;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class DistGroup {
 public:
  // Connects to the other ranks (Gloo for CPU tensors, NCCL for CUDA ones); every collective, and the
  // connection itself, gives up after `timeout`. Throws archspace::Error naming this rank and the store.
  DistGroup(const DistEnv& env, at::Device device, std::chrono::milliseconds timeout);
  ~DistGroup();

  // This rank and the group's size (within the group, for a subgroup).
  int rank() const { return rank_; }
  int world_size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // "rank R of W" (the world's numbers; a subgroup adds " in NAME"), for messages.
  std::string who() const;

  // The group of `ranks` (world ranks, ascending, this rank among them) over the same store, for HSDP's shard
  // and replicate groups. Only the members build it; `name` keys its store entries (the same string on every
  // member, distinct per group) and names it in messages.
  std::unique_ptr<DistGroup> subgroup(const std::vector<int>& ranks, const std::string& name);

  // Collectives (blocking). Each throws archspace::Error "rank R of W: WHAT failed: CAUSE" (a dead peer, a
  // timeout). Tensors may live on any device; they travel on the group's device.
  void all_reduce_sum(at::Tensor& t, const std::string& what);
  void broadcast(at::Tensor& t, int root, const std::string& what);
  at::Tensor all_gather(const at::Tensor& t, const std::string& what);  // concatenated along dim 0, rank order
  void barrier(const std::string& what, std::chrono::milliseconds timeout);
  // FSDP's collectives, on contiguous tensors on the group's device (the sizes as c10d wants them: out of
  // all_gather_into and in of reduce_scatter_sum hold world_size() x the other's elements).
  // out <- every rank's `in`, concatenated in rank order (for [n, ...] inputs: along dim 0). Blocking.
  void all_gather_into(at::Tensor& out, const at::Tensor& in, const std::string& what);
  // out <- the sum over ranks of their in[rank() * n, (rank() + 1) * n), n = out.numel(): started here,
  // finished (and `out` valid) by the returned collective's wait(). Neither tensor may change until then.
  PendingCollective reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string& what);
  // Context parallelism's collectives. reduce_scatter_tensor, blocking: `t` [world x n, ...] summed over the
  // ranks, this rank's rows [rank x n, (rank + 1) x n).
  at::Tensor reduce_scatter_dim0(const at::Tensor& t, const std::string& what);
  // Point-to-point (batch_isend_irecv): receives each `receives[i].tensor` (preallocated, contiguous) from its
  // peer and sends each `sends[i].tensor` to its peer, then waits for all. Peers are ranks of this group; a pair of
  // ranks exchanges at most one tensor each way per call. Receives are posted in the given order, then sends:
  // callers order them so that no rank waits on one that waits on it (NCCL runs them in order).
  struct Transfer {
    int peer;
    at::Tensor tensor;
  };
  void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives, const std::string& what);

  // Runs `fn` (e.g. a backward whose hooks all-reduce), turning a communication failure into the error above.
  template <typename Fn>
  void guard(const std::string& what, Fn&& fn) {
    try {
      fn();
    } catch (...) {
      rethrow(what);
    }
  }

 private:
  friend class GradientReducer;
  struct Impl;
  DistGroup(std::unique_ptr<Impl> impl, int rank, int size, std::string who, std::chrono::milliseconds timeout);
  [[noreturn]] void rethrow(const std::string& what) const;

  int rank_ = 0, size_ = 1;
  std::string who_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
};

// Averages the gradients of `params` over the ranks, bucket by bucket while backward still runs. Only a
// backward preceded by arm() is reduced: earlier micro-batches of a step accumulate locally (as DDP's
// no_sync), and the last one reduces the accumulated sums.
class GradientReducer {
 public:
  GradientReducer(DistGroup& group, const std::vector<at::Tensor>& params, int64_t bucket_bytes = 25 << 20);
  ~GradientReducer();
  void arm();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace archspace
