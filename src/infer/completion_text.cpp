#include "archspace/infer/completion_text.h"

#include <algorithm>

#include "archspace/text/utf8.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

StopStrings::StopStrings(std::vector<std::string> strings) : strings_(std::move(strings)) {
  failure_.reserve(strings_.size());
  for (const std::string& stop : strings_) {
    std::vector<uint32_t> f(stop.size(), 0);
    for (size_t i = 1, k = 0; i < stop.size(); ++i) {
      while (k > 0 && stop[i] != stop[k]) k = f[k - 1];
      if (stop[i] == stop[k]) ++k;
      f[i] = static_cast<uint32_t>(k);
    }
    failure_.push_back(std::move(f));
  }
}

CompletionText::CompletionText(std::shared_ptr<const StopStrings> stop_strings) : stops_(std::move(stop_strings)) {
  if (stops_) matched_.assign(stops_->strings_.size(), 0);
}

std::string CompletionText::add(const std::string& token_bytes) {
  if (stopped_) return "";
  const size_t added_from = bytes_.size();
  bytes_ += token_bytes;
  // Each stop's state walks the new bytes; its first full match ends its earliest occurrence, and the
  // occurrence starting first among all stops cuts the text.
  size_t cut = std::string::npos;
  size_t held = 0;  // the longest stop prefix the text ends with: it may become a stop, so it waits
  for (size_t s = 0; s < matched_.size(); ++s) {
    const std::string& stop = stops_->strings_[s];
    const std::vector<uint32_t>& f = stops_->failure_[s];
    if (stop.empty()) continue;
    size_t k = matched_[s];
    for (size_t i = added_from; i < bytes_.size(); ++i) {
      while (k > 0 && bytes_[i] != stop[k]) k = f[k - 1];
      if (bytes_[i] == stop[k]) ++k;
      if (k == stop.size()) {
        cut = std::min(cut, i + 1 - stop.size());
        k = f[k - 1];
        break;  // later occurrences of this stop start later
      }
    }
    matched_[s] = static_cast<uint32_t>(k);
    held = std::max(held, k);
  }
  if (cut != std::string::npos) {
    bytes_.resize(cut);
    stopped_ = true;
    return flush();
  }
  const size_t release = std::min(bytes_.size() - text::incomplete_utf8_tail(bytes_), bytes_.size() - held);
  if (release <= emitted_) return "";
  std::string piece = utf8_lossy(std::string_view(bytes_).substr(emitted_, release - emitted_));
  emitted_ = release;
  return piece;
}

std::string CompletionText::flush() {
  if (emitted_ >= bytes_.size()) return "";
  std::string piece = utf8_lossy(std::string_view(bytes_).substr(emitted_));
  emitted_ = bytes_.size();
  return piece;
}

std::string CompletionText::text() const { return utf8_lossy(bytes_); }

}  // namespace archspace
