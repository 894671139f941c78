#include "archspace/util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace archspace {

std::string format_duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

ProgressLine::ProgressLine(std::string label, bool enabled)
    : label_(std::move(label)),
      enabled_(enabled),
      tty_(::isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()) {}

ProgressLine::~ProgressLine() { finish(); }

double ProgressLine::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressLine::update(const std::string& what, double fraction_done, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  const bool printed_before = last_print_.time_since_epoch().count() != 0;
  if (!force && printed_before && since_print < (tty_ ? 0.3 : 5.0)) return;
  const double elapsed = elapsed_seconds();
  const std::string eta =
      fraction_done > 0 ? format_duration(elapsed / fraction_done * (1.0 - fraction_done)) : std::string("?");
  std::fprintf(stderr, "%s[%s] %s | elapsed %s | ETA %s%s", tty_ ? "\r\033[K" : "", label_.c_str(), what.c_str(),
               format_duration(elapsed).c_str(), eta.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
  line_open_ = tty_;
  last_print_ = now;
}

void ProgressLine::note(const std::string& text) {
  if (!enabled_) return;
  finish();
  std::fprintf(stderr, "[%s] %s\n", label_.c_str(), text.c_str());
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (line_open_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    line_open_ = false;
  }
}

}  // namespace archspace
