#include "archspace/serve/request_log.h"

#include <cstdio>

namespace archspace::serve {

namespace {
thread_local AccessRecord t_notes;

// A request's bytes as a log shows them: printable ASCII, the rest escaped, cut at 200 (no forged lines).
std::string printable(const std::string& s) {
  std::string out;
  size_t i = 0;
  for (; i < s.size() && out.size() < 200; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return i < s.size() ? out + "..." : out;
}

std::string count(int64_t n) { return n < 0 ? "-" : std::to_string(n); }

std::string fixed1(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f", x);
  return buf;
}
}  // namespace

std::string access_line(const AccessRecord& r) {
  return "archspace serve: " + r.client + " \"" + printable(r.method) + " " + printable(r.path) + " " +
         printable(r.version) + "\" " + std::to_string(r.status) + " prompt_tokens=" + count(r.prompt_tokens) +
         " completion_tokens=" + count(r.completion_tokens) +
         " latency_ms=" + std::to_string(static_cast<int64_t>(r.latency_ms + 0.5)) +
         (r.client_gone ? " (client gone)" : "");
}

void note_tokens(int64_t prompt, int64_t completion) {
  t_notes.prompt_tokens = prompt;
  t_notes.completion_tokens = completion;
}

void note_client_gone() { t_notes.client_gone = true; }

AccessRecord take_notes() {
  AccessRecord r = std::move(t_notes);
  t_notes = AccessRecord{};
  return r;
}

void log_line(const std::string& line) {
  static std::mutex mutex;
  const std::string text = line + "\n";
  std::lock_guard lock(mutex);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

std::string ThroughputLog::line(const SchedulerStats& before, const SchedulerStats& now, double seconds) {
  const int64_t prompt = now.prompt_tokens - before.prompt_tokens, sampled = now.sampled_tokens - before.sampled_tokens;
  if (prompt == 0 && sampled == 0 && now.running == 0 && now.waiting == 0) return "";
  return "archspace serve: last " + fixed1(seconds) + " s: prompt " + fixed1(static_cast<double>(prompt) / seconds) +
         " tokens/s, generation " + fixed1(static_cast<double>(sampled) / seconds) + " tokens/s; sequences running " +
         std::to_string(now.running) + ", waiting " + std::to_string(now.waiting);
}

ThroughputLog::ThroughputLog(std::function<SchedulerStats()> stats, int64_t interval_s) {
  if (interval_s <= 0) return;
  thread_ = std::thread([this, stats = std::move(stats), interval_s] {
    using clock = std::chrono::steady_clock;
    SchedulerStats before = stats();
    auto since = clock::now();
    std::unique_lock lock(mutex_);
    while (!stop_.wait_for(lock, std::chrono::seconds(interval_s), [&] { return stopping_; })) {
      const SchedulerStats now = stats();
      const auto at = clock::now();
      const std::string text = line(before, now, std::chrono::duration<double>(at - since).count());
      if (!text.empty()) log_line(text);
      before = now;
      since = at;
    }
  });
}

ThroughputLog::~ThroughputLog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace archspace::serve
