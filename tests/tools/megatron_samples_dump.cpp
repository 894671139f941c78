// Prints archspace's Megatron GPTDataset indices (data/megatron_samples.h) for tests/python/test_megatron_order.py to
// hold against megatron-core's own functions. One request a line on stdin:
//   SEQUENCE_LENGTH NUM_SAMPLES SEED LENGTH...
// and four lines out for each: "EPOCHS SEPARATE_FINAL_EPOCH", the document index, the sample index flattened
// (position, offset, position, offset, ...), the shuffle index. Standard C++ only.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "archspace/data/megatron_samples.h"
#include "archspace/util/error.h"

namespace {

template <typename T>
void print(const std::vector<T>& values) {
  std::string line;
  for (size_t i = 0; i < values.size(); ++i) (line += i ? " " : "") += std::to_string(values[i]);
  std::cout << line << '\n';
}

}  // namespace

int main() {
  try {
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      int64_t sequence_length = 0;
      uint64_t samples = 0, seed = 0;
      in >> sequence_length >> samples >> seed;
      if (!in) throw archspace::Error("bad request: " + line);
      std::vector<int32_t> lengths;
      for (int32_t n; in >> n;) lengths.push_back(n);
      const archspace::MegatronSampleIndex index =
          archspace::build_megatron_sample_index(lengths, static_cast<int32_t>(sequence_length), samples, seed);
      std::cout << index.epochs << ' ' << (index.separate_final_epoch ? 1 : 0) << '\n';
      print(index.document_index);
      std::vector<int64_t> pairs;
      for (size_t i = 0; i < index.sample_document.size(); ++i) {
        pairs.push_back(index.sample_document[i]);
        pairs.push_back(index.sample_offset[i]);
      }
      print(pairs);
      print(index.shuffle_index);
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
