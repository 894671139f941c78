#include "archspace/data/python_random.h"

#include <bit>
#include <cmath>
#include <string>
#include <unordered_set>

#include "archspace/util/error.h"

namespace archspace {

// _randommodule.c random_seed: an int seed is abs()'d and cut into 32-bit words for init_by_array.
PythonRandom::PythonRandom(int64_t seed) {
  const uint64_t magnitude = seed < 0 ? uint64_t{0} - static_cast<uint64_t>(seed) : static_cast<uint64_t>(seed);
  std::vector<uint32_t> key{static_cast<uint32_t>(magnitude)};
  if (magnitude >> 32) key.push_back(static_cast<uint32_t>(magnitude >> 32));
  mt_.seed_by_array(key);
}

// _random_Random_getrandbits_impl.
uint64_t PythonRandom::getrandbits(int k) {
  if (k < 0 || k > 64) throw Error("getrandbits takes 0 to 64 bits here, got " + std::to_string(k));
  if (k == 0) return 0;
  if (k <= 32) return mt_.next_uint32() >> (32 - k);
  const uint64_t low = mt_.next_uint32();
  const uint64_t high = mt_.next_uint32() >> (64 - k);
  return low | (high << 32);
}

// random.py _randbelow_with_getrandbits.
uint64_t PythonRandom::randbelow(uint64_t n) {
  if (n == 0) throw Error("randbelow needs a positive bound");
  const int k = std::bit_width(n);
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

// random.py Random.sample of a sequence of length n.
std::vector<uint64_t> PythonRandom::sample(uint64_t n, uint64_t k) {
  if (k > n)
    throw Error("cannot sample " + std::to_string(k) + " of " + std::to_string(n) +
                " (Python: Sample larger than population or is negative)");
  std::vector<uint64_t> result(k);
  // The size of a small set minus that of an empty list; 4 ** ceil(log(3k, 4)) more for a big set, with
  // math.log(x, base)'s own arithmetic: log(x) / log(base) in doubles.
  double setsize = 21;
  if (k > 5) setsize += std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0)));
  if (static_cast<double>(n) <= setsize) {
    std::vector<uint64_t> pool(n);
    for (uint64_t i = 0; i < n; ++i) pool[i] = i;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t j = randbelow(n - i);
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];  // the last unchosen position moves into the vacancy
    }
  } else {
    std::unordered_set<uint64_t> selected;
    for (uint64_t i = 0; i < k; ++i) {
      uint64_t j = randbelow(n);
      while (selected.contains(j)) j = randbelow(n);
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace archspace
