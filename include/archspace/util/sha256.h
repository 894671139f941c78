// SHA-256 (OpenSSL) for manifests and checksums: hex digests of files and byte ranges.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace archspace {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finishes the hash

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_file(const std::string& path);
std::string sha256_bytes(const void* data, size_t n);

}  // namespace archspace
