// The one progress line of long work (training, tokenizing, evaluation): "[label] what | elapsed | ETA".
// On a terminal it redraws one line in place at most every 0.3 s; into a log (not a terminal) it writes
// a new line at most every 5 s, so logs stay readable. Lines that must stay (validation results,
// warnings) go through note(), which does not break the redrawn line.
#pragma once

#include <chrono>
#include <string>

namespace archspace {

// Seconds as H:MM:SS.
std::string format_duration(double seconds);

class ProgressLine {
 public:
  explicit ProgressLine(std::string label, bool enabled = true);
  ~ProgressLine();

  // `what`: the state ("step 12/100 | loss 3.21 | 5400 tok/s"); `fraction_done` in [0, 1] gives the ETA
  // (from the time since construction). Printed when due, or always with `force` (first and last updates).
  void update(const std::string& what, double fraction_done, bool force = false);
  // A line of its own, "[label] text".
  void note(const std::string& text);
  // Ends a redrawn line (on a terminal); called by the destructor too.
  void finish();

  double elapsed_seconds() const;

 private:
  std::string label_;
  bool enabled_, tty_, line_open_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

}  // namespace archspace
