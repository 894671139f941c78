// The message of any exception as a user may see it.
#pragma once

#include <exception>
#include <string>

namespace archspace {

// e.what(), except LibTorch's c10::Error without the C++ backtrace its what() carries (never shown to an
// HTTP client).
std::string error_message(const std::exception& e);

}  // namespace archspace
