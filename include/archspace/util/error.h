// One exception type for every user-facing failure. Messages name the file and the field or tensor
// that is wrong, so the CLI can print them as they are.
#pragma once

#include <stdexcept>
#include <string>

namespace archspace {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace archspace
