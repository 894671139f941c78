// numpy's random generators, draw for draw: numpy.random.default_rng(seed) (SeedSequence seeding PCG64, behind
// a Generator) and the legacy numpy.random.RandomState(seed) (MT19937). OLMo-core orders its instances with the
// first (rng.shuffle of the index array), Megatron-Core its documents and samples with the second
// (RandomState.shuffle); reading instances in their order needs the very same draws, not merely the same
// distribution. Standard C++ only: no LibTorch here, so the test tool builds in seconds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "archspace/data/mt19937.h"

namespace archspace {

namespace numpy_random_detail {
// Generator.shuffle and RandomState.shuffle of a 1-D array alike (numpy/random/_generator.pyx _shuffle_raw,
// numpy/random/mtrand.pyx RandomState._shuffle_raw): Fisher-Yates from the last element down to the second,
// each partner drawn with the generator's random_interval.
template <typename Rng, typename T>
void shuffle(Rng& rng, std::vector<T>& values) {
  for (size_t i = values.size(); i > 1;) {
    --i;
    const auto j = static_cast<size_t>(rng.random_interval(i));
    if (j != i) std::swap(values[i], values[j]);  // numpy copies an element onto itself; a self-swap may not
  }
}
}  // namespace numpy_random_detail

// numpy.random.default_rng(seed) for an integer seed >= 0.
class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_uint64();
  // numpy splits a 64-bit draw in two: the low half now, the high half kept for the next 32-bit request (a
  // 64-bit draw in between leaves it waiting).
  uint32_t next_uint32();
  // PCG64.advance(delta) for delta < 2**64: jumps the stream, and drops a waiting high half as numpy does.
  void advance(uint64_t delta);
  // Uniform in [0, max] by masked rejection: 32-bit draws while max fits in 32 bits, else 64-bit ones.
  uint64_t random_interval(uint64_t max);

  // Generator.shuffle(x) of a 1-D array (any dtype: numpy moves raw bytes, so only the length matters).
  template <typename T>
  void shuffle(std::vector<T>& values) {
    numpy_random_detail::shuffle(*this, values);
  }
  // Generator.permutation(n): shuffle of arange(n).
  std::vector<uint64_t> permutation(uint64_t n);

 private:
  // PCG64's 128-bit state and increment, high word first.
  uint64_t state_hi_ = 0, state_lo_ = 0, inc_hi_ = 0, inc_lo_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.RandomState(seed) for an integer seed in [0, 2**32); a larger one throws, as numpy raises.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint64_t seed);

  uint32_t next_uint32();
  // Two 32-bit draws, the first one the high word (MT19937's next64 as numpy's build evaluates it).
  uint64_t next_uint64();
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle(x) of a 1-D array.
  template <typename T>
  void shuffle(std::vector<T>& values) {
    numpy_random_detail::shuffle(*this, values);
  }
  // RandomState.permutation(n).
  std::vector<uint64_t> permutation(uint64_t n);

 private:
  Mt19937 mt_;
};

}  // namespace archspace
