// The Mersenne Twister MT19937 (Matsumoto and Nishimura's mt19937ar.c) as numpy's RandomState and CPython's
// `random` run it: the same twist and tempering; they differ only in seeding, which is why both ways are here.
// Standard C++ only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace archspace {

class Mt19937 {
 public:
  // init_genrand(s): Knuth's linear recurrence from one 32-bit word (numpy's legacy integer seeding).
  void seed_genrand(uint32_t s);
  // init_by_array(key): init_genrand(19650218) mixed with the key words (CPython's random.seed of an integer, and
  // numpy's array seeds). An empty key is taken as {0}.
  void seed_by_array(const std::vector<uint32_t>& key);

  // genrand_uint32: one word of the block, tempered; the block is twisted when used up.
  uint32_t next_uint32();

 private:
  void regenerate();

  std::array<uint32_t, 624> key_{};
  size_t pos_ = 624;
};

}  // namespace archspace
