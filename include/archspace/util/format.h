// Small formatting helpers for progress lines.
#pragma once

#include <cstdio>
#include <string>

namespace archspace {

// Seconds as H:MM:SS.
inline std::string format_duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

}  // namespace archspace
