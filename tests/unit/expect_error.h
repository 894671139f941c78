// Shared by the unit tests: "this call fails with an archspace::Error whose message names these things".
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "archspace/util/error.h"

namespace archspace::testing {

inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' not in: " << e.what();
  }
}

}  // namespace archspace::testing
