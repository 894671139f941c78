// A completion's text as its tokens arrive, cut at stop strings: shared by `generate`, the scheduler and
// serve's request schema (which builds a request's StopStrings once), apart from the model code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace archspace {

// Stop strings and each one's KMP failure table, built once and shared by the sequences of a request, so
// that matching costs O(new bytes x stop strings) per token, whatever the text's length or the stops'.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> strings);  // empty strings never match (callers refuse them)
  const std::vector<std::string>& strings() const { return strings_; }

 private:
  friend class CompletionText;
  std::vector<std::string> strings_;
  // failure_[s][i]: the longest proper prefix of strings_[s][0..i] that is also its suffix.
  std::vector<std::vector<uint32_t>> failure_;
};

// A completion's text as its tokens arrive: stop strings cut it (before the stop), and only whole UTF-8
// characters that cannot be the start of a stop string are released for streaming, so the pieces
// streamed always add up to the final text. Each stop is matched incrementally (its KMP state: how much of
// it the text ends with), so a token costs O(its bytes x stop strings).
class CompletionText {
 public:
  explicit CompletionText(std::vector<std::string> stop_strings = {})
      : CompletionText(std::make_shared<const StopStrings>(std::move(stop_strings))) {}
  // Shares the list (a request's n x prompts sequences hold one copy); null: no stop strings.
  explicit CompletionText(std::shared_ptr<const StopStrings> stop_strings);
  // Adds one token's bytes; returns the text that became safe to stream (may be empty).
  std::string add(const std::string& token_bytes);
  // Releases whatever is held back (at the end of the completion).
  std::string flush();
  bool stopped() const { return stopped_; }  // a stop string appeared
  std::string text() const;                  // the whole text so far (invalid UTF-8 replaced)

 private:
  std::shared_ptr<const StopStrings> stops_;
  std::vector<uint32_t> matched_;  // per stop: the length of its longest prefix the text ends with
  std::string bytes_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace archspace
