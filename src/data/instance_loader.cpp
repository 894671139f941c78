#include "archspace/data/instance_loader.h"

#include <algorithm>
#include <mutex>

#include "archspace/data/numpy_random.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {
// SplitMix64: a well-mixed 64-bit hash, the Feistel round function.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n), key_(mix64(key)) {
  int bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) bits += 2;
  half_bits_ = bits / 2;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  if (i >= n_) throw Error("permutation index " + std::to_string(i) + " out of range " + std::to_string(n_));
  const uint64_t mask = (uint64_t(1) << half_bits_) - 1;
  uint64_t x = i;
  do {  // cycle-walk: re-encrypt until the value lands inside [0, n); at most ~4 rounds on average
    uint64_t left = x >> half_bits_, right = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const uint64_t f = mix64(key_ ^ (round << 56) ^ right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

InstanceLoader::InstanceLoader(std::shared_ptr<const TokenShards> shards, int64_t sequence_length, uint64_t seed,
                               bool shuffle, DataOrder order, int64_t global_batch)
    : shards_(std::move(shards)),
      sequence_length_(sequence_length),
      seed_(seed),
      shuffle_(shuffle),
      order_(order),
      permutation_(std::make_shared<PermutationCache>()) {
  if (sequence_length_ <= 0) throw Error("sequence length must be positive");
  if (order_ == DataOrder::kMegatron)
    throw Error("InstanceLoader: the megatron order's samples cross documents (data/megatron_order.h), not windows");
  for (size_t s = 0; s < shards_->num_shards(); ++s) {
    window_starts_.push_back(total_windows_);
    total_windows_ += shards_->shard_tokens(s) / sequence_length_;
  }
  if (total_windows_ == 0) {
    throw Error(shards_->dir() + ": " + std::to_string(shards_->manifest().total_tokens()) +
                " tokens hold no complete instance of length " + std::to_string(sequence_length_));
  }
  epoch_instances_ = total_windows_;
  if (order_ == DataOrder::kOlmoCore) {
    // NumpyFSLDataLoader.total_size: the instances of whole global batches; its indices are uint32.
    if (global_batch < 1) throw Error("InstanceLoader: the global batch must be >= 1");
    epoch_instances_ = total_windows_ / static_cast<uint64_t>(global_batch) * static_cast<uint64_t>(global_batch);
    if (epoch_instances_ == 0)
      throw Error(shards_->dir() + ": " + std::to_string(total_windows_) + " instances of length " +
                  std::to_string(sequence_length_) + " are fewer than one global batch (" +
                  std::to_string(global_batch) + "), which the olmo-core data order reads whole");
    if (total_windows_ >= UINT32_MAX)
      throw Error(shards_->dir() + ": " + std::to_string(total_windows_) +
                  " instances: OLMo-core's data order indexes them with uint32, below 4,294,967,295");
  }
}

struct InstanceLoader::PermutationCache {
  std::mutex mutex;
  uint64_t epoch = UINT64_MAX;
  std::vector<uint32_t> indices;
};

uint64_t InstanceLoader::olmo_core_window(uint64_t epoch, uint64_t position) const {
  std::lock_guard<std::mutex> lock(permutation_->mutex);
  if (permutation_->epoch != epoch) {
    std::vector<uint32_t> indices(total_windows_);
    for (uint64_t i = 0; i < total_windows_; ++i) indices[i] = static_cast<uint32_t>(i);
    NumpyGenerator(seed_ + epoch + 1).shuffle(indices);  // get_rng(seed + epoch), epochs counted from 1
    permutation_->indices = std::move(indices);
    permutation_->epoch = epoch;
  }
  return permutation_->indices[position];
}

uint64_t InstanceLoader::window_of(uint64_t index) const {
  const uint64_t epoch = index / epoch_instances_, position = index % epoch_instances_;
  if (!shuffle_) return position;
  if (order_ == DataOrder::kOlmoCore) return olmo_core_window(epoch, position);
  return IndexPermutation(total_windows_, mix64(seed_) ^ mix64(epoch + 0x5EED))(position);
}

std::vector<uint32_t> InstanceLoader::instance(uint64_t index) const {
  const uint64_t window = window_of(index);
  const size_t shard =
      std::upper_bound(window_starts_.begin(), window_starts_.end(), window) - window_starts_.begin() - 1;
  std::vector<uint32_t> ids(sequence_length_);
  shards_->read(shard, (window - window_starts_[shard]) * sequence_length_, sequence_length_, ids.data());
  return ids;
}

at::Tensor Instances::batch(uint64_t first, int64_t count) const {
  const int64_t length = sequence_length() + label_tokens();
  at::Tensor out = at::empty({count, length}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < count; ++b) {
    const std::vector<uint32_t> ids = instance(first + b);
    std::copy(ids.begin(), ids.end(), dst + b * length);
  }
  return out;
}

at::Tensor Instances::rank_batch(uint64_t step, int64_t global_batch, int rank, int world) const {
  if (world <= 0 || rank < 0 || rank >= world || global_batch % world != 0) {
    throw Error("rank_batch: global batch " + std::to_string(global_batch) + " must split evenly over " +
                std::to_string(world) + " ranks");
  }
  const int64_t local = global_batch / world;
  return batch(step * global_batch + rank * local, local);
}

}  // namespace archspace
