// CPython's `random.Random`, draw for draw (Lib/random.py and Modules/_randommodule.c of CPython 3.11): OLMES
// chooses the few-shot examples of tasks without a fixed few-shot source with random.Random(seed).sample of the
// training documents, so rendering its prompts needs the very same draws. Standard C++ only.
#pragma once

#include <cstdint>
#include <vector>

#include "archspace/data/mt19937.h"

namespace archspace {

class PythonRandom {
 public:
  // random.Random(seed) for an integer seed: MT19937's init_by_array with |seed|'s 32-bit words, least
  // significant first (one word 0 for seed 0).
  explicit PythonRandom(int64_t seed);

  // getrandbits(k) for 0 <= k <= 64: k <= 32 takes one word's top k bits; more, 32-bit words least significant
  // first, the last one's top bits.
  uint64_t getrandbits(int k);
  // _randbelow(n) for n >= 1: getrandbits(n.bit_length()) until it falls below n.
  uint64_t randbelow(uint64_t n);
  // random.sample(range(n), k): the k chosen positions in order of choice. Like Python, a pool for small
  // populations (n <= the size a k-element set would take) and rejection against a set of chosen positions
  // otherwise; k > n throws, as Python raises ValueError.
  std::vector<uint64_t> sample(uint64_t n, uint64_t k);

 private:
  Mt19937 mt_;
};

}  // namespace archspace
