#include "archspace/data/numpy_random.h"

#include <numeric>
#include <string>

#include "archspace/util/error.h"

namespace archspace {

namespace {

// ---- SeedSequence (numpy/random/bit_generator.pyx) ------------------------------------------------------------

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr size_t kPoolSize = 4;

// hashmix: the multiplier advances on every call, so the order of calls is part of the result.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> 16);
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  return result ^ (result >> 16);
}

// _int_to_uint32_array: 32-bit words, lowest first; 0 is one word [0], not an empty entropy.
std::vector<uint32_t> seed_words(uint64_t seed) {
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed != 0);
  return words;
}

// SeedSequence(entropy).pool: mix_entropy of the words (no spawn key).
std::array<uint32_t, kPoolSize> entropy_pool(const std::vector<uint32_t>& entropy) {
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  // Every word into every other, so the last words reach the first.
  for (size_t src = 0; src < kPoolSize; ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  // Entropy beyond the pool's size (not reachable from a 64-bit seed; kept for completeness).
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  }
  return pool;
}

// generate_state(n, uint64): 2n 32-bit words cycled out of the pool, paired little-endian (low word first).
std::vector<uint64_t> generate_state_uint64(const std::array<uint32_t, kPoolSize>& pool, size_t n) {
  std::vector<uint32_t> words(2 * n);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t value = pool[i % kPoolSize] ^ hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    words[i] = value ^ (value >> 16);
  }
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return out;
}

// ---- 128-bit arithmetic (numpy/random/src/pcg64/pcg64.h, its emulated path) -----------------------------------

struct U128 {
  uint64_t hi, lo;
};

U128 add(U128 a, U128 b) {
  const uint64_t lo = a.lo + b.lo;
  return {a.hi + b.hi + (lo < b.lo ? 1u : 0u), lo};
}

// The full 128-bit product of two 64-bit words, from 32-bit halves.
U128 mul_wide(uint64_t x, uint64_t y) {
  const uint64_t x0 = x & 0xffffffffu, x1 = x >> 32, y0 = y & 0xffffffffu, y1 = y >> 32;
  const uint64_t w0 = x0 * y0;
  const uint64_t t = x1 * y0 + (w0 >> 32);
  const uint64_t w1 = (t & 0xffffffffu) + x0 * y1;
  return {x1 * y1 + (t >> 32) + (w1 >> 32), x * y};
}

// a * b mod 2**128.
U128 mul(U128 a, U128 b) {
  U128 r = mul_wide(a.lo, b.lo);
  r.hi += a.hi * b.lo + a.lo * b.hi;
  return r;
}

// ---- PCG64 (numpy/random/src/pcg64/pcg64.h, pcg64.c) --------------------------------------------------------

constexpr U128 kPcgMultiplier{2549297995355413924ull, 4865540595714422341ull};

// The 128-bit LCG step: state = state * multiplier + inc.
U128 pcg_step(U128 state, U128 inc) { return add(mul(state, kPcgMultiplier), inc); }

// XSL-RR: the two halves xored, rotated right by the top 6 bits.
uint64_t pcg_output(U128 state) {
  const uint64_t value = state.hi ^ state.lo;
  const unsigned rot = static_cast<unsigned>(state.hi >> 58);
  return (value >> rot) | (value << ((-rot) & 63u));
}

// pcg_advance_lcg_128: the LCG applied delta times, by squaring (Brown's method).
U128 pcg_advance(U128 state, uint64_t delta, U128 cur_mult, U128 cur_plus) {
  U128 acc_mult{0, 1}, acc_plus{0, 0};
  while (delta > 0) {
    if (delta & 1) {
      acc_mult = mul(acc_mult, cur_mult);
      acc_plus = add(mul(acc_plus, cur_mult), cur_plus);
    }
    cur_plus = mul(add(cur_mult, U128{0, 1}), cur_plus);
    cur_mult = mul(cur_mult, cur_mult);
    delta >>= 1;
  }
  return add(mul(acc_mult, state), acc_plus);
}

// ---- random_interval (numpy/random/src/distributions/distributions.c) ---------------------------------------

// Masked rejection: draw under the smallest all-ones mask covering max until the value is <= max. The draw
// width follows max, not the generator: 32 bits (next_uint32) while max fits in them, else 64.
template <typename Rng>
uint64_t masked_interval(Rng& rng, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffu) {
    while ((value = (rng.next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (rng.next_uint64() & mask)) > max) {
    }
  }
  return value;
}

template <typename Rng>
std::vector<uint64_t> permutation_of(Rng& rng, uint64_t n) {
  std::vector<uint64_t> values(n);
  std::iota(values.begin(), values.end(), uint64_t(0));
  rng.shuffle(values);
  return values;
}

}  // namespace

// ---- NumpyGenerator: PCG64 seeded as numpy/random/_pcg64.pyx PCG64.__init__ does -----------------------------

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // generate_state(4, uint64) = [seed high, seed low, increment high, increment low]; pcg64_set_seed then runs
  // pcg_setseq_128_srandom_r: inc = 2 * initseq + 1, state = 0, step, state += initstate, step.
  const std::vector<uint64_t> words = generate_state_uint64(entropy_pool(seed_words(seed)), 4);
  const U128 initstate{words[0], words[1]}, initseq{words[2], words[3]};
  const U128 inc{(initseq.hi << 1) | (initseq.lo >> 63), (initseq.lo << 1) | 1u};
  U128 state = pcg_step(U128{0, 0}, inc);
  state = pcg_step(add(state, initstate), inc);
  state_hi_ = state.hi;
  state_lo_ = state.lo;
  inc_hi_ = inc.hi;
  inc_lo_ = inc.lo;
}

// pcg_setseq_128_xsl_rr_64_random_r: step first, then output from the new state.
uint64_t NumpyGenerator::next_uint64() {
  const U128 state = pcg_step(U128{state_hi_, state_lo_}, U128{inc_hi_, inc_lo_});
  state_hi_ = state.hi;
  state_lo_ = state.lo;
  return pcg_output(state);
}

// pcg64_next32.
uint32_t NumpyGenerator::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

// PCG64.advance: pcg64_advance, then _reset_state_variables.
void NumpyGenerator::advance(uint64_t delta) {
  const U128 state = pcg_advance(U128{state_hi_, state_lo_}, delta, kPcgMultiplier, U128{inc_hi_, inc_lo_});
  state_hi_ = state.hi;
  state_lo_ = state.lo;
  has_uint32_ = false;
  uinteger_ = 0;
}

uint64_t NumpyGenerator::random_interval(uint64_t max) { return masked_interval(*this, max); }

std::vector<uint64_t> NumpyGenerator::permutation(uint64_t n) { return permutation_of(*this, n); }

// ---- NumpyRandomState: MT19937 (numpy/random/src/mt19937/mt19937.c, mt19937.h) ------------------------------

// _mt19937.pyx _legacy_seeding: an integer seed goes to mt19937_seed (Knuth's linear recurrence, init_genrand's
// fill), not to init_by_array; only an array seed takes init_by_array.
NumpyRandomState::NumpyRandomState(uint64_t seed) {
  if (seed > 0xffffffffu) {
    throw Error("RandomState seed " + std::to_string(seed) + " is out of range: numpy takes 0 to 2**32 - 1");
  }
  mt_.seed_genrand(static_cast<uint32_t>(seed));
}

uint32_t NumpyRandomState::next_uint32() { return mt_.next_uint32(); }

// mt19937_next64 leaves the order of its two calls to the C compiler; numpy's wheels draw the high word first
// (checked against RandomState.randint(0, 2**64, dtype=uint64), which returns next_uint64 as it is).
uint64_t NumpyRandomState::next_uint64() {
  const uint64_t high = next_uint32();
  return (high << 32) | next_uint32();
}

// mtrand.pyx's shuffle calls the same random_interval as the Generator's; only the bits under it differ.
uint64_t NumpyRandomState::random_interval(uint64_t max) { return masked_interval(*this, max); }

std::vector<uint64_t> NumpyRandomState::permutation(uint64_t n) { return permutation_of(*this, n); }

}  // namespace archspace
