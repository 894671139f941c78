// Prints archspace's numpy generators' output for tests/python/test_numpy_random.py to hold against numpy itself.
// One request a line on stdin, one line of space-separated integers out for each:
//   generator SEED N          default_rng(SEED).permutation(N)
//   randomstate SEED N        RandomState(SEED).permutation(N)
//   draws SEED K              the first K next_uint64 of default_rng(SEED)
//   draws32 SEED K            the first K next_uint32 of default_rng(SEED)
//   interval SEED MAX K       K random_interval(MAX) of default_rng(SEED)
//   rsinterval SEED MAX K     K random_interval(MAX) of RandomState(SEED)
//   advance SEED DELTA K      default_rng(SEED): one next_uint32, advance(DELTA), then K next_uint32
//   chain SEED N K            default_rng(SEED): the permutation of N, then K next_uint32 of the same generator
//   rschain SEED N M          RandomState(SEED): shuffle of arange(N), then shuffle of arange(M), both printed
// Standard C++ only, linked with src/data/numpy_random.cpp alone.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "archspace/data/numpy_random.h"
#include "archspace/util/error.h"

namespace {

void print(std::ostream& out, const std::vector<uint64_t>& values) {
  std::string line;
  line.reserve(values.size() * 8);
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(values[i]);
  }
  line += '\n';
  out << line;
}

template <typename Draw>
std::vector<uint64_t> draw(uint64_t count, Draw&& next) {
  std::vector<uint64_t> values(count);
  for (auto& v : values) v = next();
  return values;
}

std::vector<uint64_t> answer(const std::string& request) {
  std::istringstream in(request);
  std::string kind;
  uint64_t seed = 0, a = 0, b = 0;
  in >> kind >> seed >> a;
  const bool three =
      kind == "interval" || kind == "rsinterval" || kind == "advance" || kind == "chain" || kind == "rschain";
  if (three) in >> b;
  if (!in) throw archspace::Error("bad request: " + request);
  using archspace::NumpyGenerator;
  using archspace::NumpyRandomState;
  if (kind == "generator") return NumpyGenerator(seed).permutation(a);
  if (kind == "randomstate") return NumpyRandomState(seed).permutation(a);
  if (kind == "draws") {
    NumpyGenerator g(seed);
    return draw(a, [&] { return g.next_uint64(); });
  }
  if (kind == "draws32") {
    NumpyGenerator g(seed);
    return draw(a, [&] { return g.next_uint32(); });
  }
  if (kind == "interval") {
    NumpyGenerator g(seed);
    return draw(b, [&] { return g.random_interval(a); });
  }
  if (kind == "rsinterval") {
    NumpyRandomState r(seed);
    return draw(b, [&] { return r.random_interval(a); });
  }
  if (kind == "advance") {
    NumpyGenerator g(seed);
    g.next_uint32();
    g.advance(a);
    return draw(b, [&] { return g.next_uint32(); });
  }
  if (kind == "chain") {
    NumpyGenerator g(seed);
    std::vector<uint32_t> values(a);
    for (uint64_t i = 0; i < a; ++i) values[i] = static_cast<uint32_t>(i);
    g.shuffle(values);  // the uint32 index array OLMo-core shuffles
    std::vector<uint64_t> out(values.begin(), values.end());
    for (uint64_t k = 0; k < b; ++k) out.push_back(g.next_uint32());
    return out;
  }
  if (kind == "rschain") {
    NumpyRandomState r(seed);
    std::vector<uint64_t> out = r.permutation(a);
    std::vector<int32_t> second(b);
    for (uint64_t i = 0; i < b; ++i) second[i] = static_cast<int32_t>(i);
    r.shuffle(second);  // Megatron's int32 document index, shuffled by the same RandomState
    out.insert(out.end(), second.begin(), second.end());
    return out;
  }
  throw archspace::Error("unknown request: " + request);
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string request;
  try {
    while (std::getline(std::cin, request)) {
      if (request.find_first_not_of(" \t\r") == std::string::npos) continue;
      print(std::cout, answer(request));
    }
  } catch (const std::exception& e) {
    std::cerr << "numpy_random_dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
