#include "archspace/data/mt19937.h"

namespace archspace {

namespace {
constexpr size_t kN = 624, kM = 397;
}

void Mt19937::seed_genrand(uint32_t s) {
  for (size_t pos = 0; pos < kN; ++pos) {
    key_[pos] = s;
    s = 1812433253u * (s ^ (s >> 30)) + static_cast<uint32_t>(pos + 1);
  }
  pos_ = kN;  // the first draw regenerates the whole block
}

void Mt19937::seed_by_array(const std::vector<uint32_t>& key) {
  const std::vector<uint32_t> words = key.empty() ? std::vector<uint32_t>{0} : key;
  seed_genrand(19650218u);
  size_t i = 1, j = 0;
  for (size_t k = kN > words.size() ? kN : words.size(); k; --k) {
    key_[i] = (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1664525u)) + words[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      key_[0] = key_[kN - 1];
      i = 1;
    }
    if (j >= words.size()) j = 0;
  }
  for (size_t k = kN - 1; k; --k) {
    key_[i] = (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      key_[0] = key_[kN - 1];
      i = 1;
    }
  }
  key_[0] = 0x80000000u;  // the most significant bit set: the state is never all zeros
  pos_ = kN;
}

// The twist of all 624 words at once.
void Mt19937::regenerate() {
  constexpr uint32_t matrix_a = 0x9908b0dfu, upper = 0x80000000u, lower = 0x7fffffffu;
  for (size_t i = 0; i < kN; ++i) {
    const uint32_t y = (key_[i] & upper) | (key_[(i + 1) % kN] & lower);
    key_[i] = key_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? matrix_a : 0u);
  }
  pos_ = 0;
}

uint32_t Mt19937::next_uint32() {
  if (pos_ == kN) regenerate();
  uint32_t y = key_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

}  // namespace archspace
