// Prints archspace's copy of CPython's random.Random for tests/python/test_python_random.py to hold against Python
// itself. One request a line on stdin, one line of space-separated integers out for each:
//   sample SEED N K          Random(SEED).sample(range(N), K)
//   chain SEED N K M         Random(SEED): sample(range(N), K) M times over, the answers one after the other
//   bits SEED K COUNT        COUNT getrandbits(K) of Random(SEED)
//   below SEED N COUNT       COUNT _randbelow(N) of Random(SEED)
// Standard C++ only, linked with src/data/python_random.cpp and src/data/mt19937.cpp alone.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "archspace/data/python_random.h"
#include "archspace/util/error.h"

namespace {

std::vector<uint64_t> answer(const std::string& request) {
  std::istringstream in(request);
  std::string kind;
  int64_t seed = 0;
  uint64_t a = 0, b = 0, c = 1;
  in >> kind >> seed >> a >> b;
  if (kind == "chain") in >> c;
  if (!in) throw archspace::Error("bad request: " + request);
  archspace::PythonRandom rng(seed);
  std::vector<uint64_t> out;
  if (kind == "sample" || kind == "chain") {
    for (uint64_t round = 0; round < c; ++round) {
      for (uint64_t v : rng.sample(a, b)) out.push_back(v);
    }
  } else if (kind == "bits") {
    for (uint64_t i = 0; i < b; ++i) out.push_back(rng.getrandbits(static_cast<int>(a)));
  } else if (kind == "below") {
    for (uint64_t i = 0; i < b; ++i) out.push_back(rng.randbelow(a));
  } else {
    throw archspace::Error("unknown request: " + request);
  }
  return out;
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    try {
      const std::vector<uint64_t> values = answer(line);
      std::string text;
      for (size_t i = 0; i < values.size(); ++i) text += (i ? " " : "") + std::to_string(values[i]);
      std::cout << text << '\n';
    } catch (const std::exception& e) {
      std::cout << "error: " << e.what() << '\n';
    }
  }
  return 0;
}
