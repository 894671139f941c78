// CompletionText: the streamed pieces always add up to the final text, stop strings cut it (also when a
// stop spans tokens), and neither a partial UTF-8 character nor the start of a possible stop is streamed.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "archspace/infer/generator.h"

using namespace archspace;

namespace {
std::string feed(CompletionText& t, const std::vector<std::string>& tokens, std::vector<std::string>* pieces) {
  std::string streamed;
  for (const auto& tok : tokens) {
    std::string piece = t.add(tok);
    if (pieces) pieces->push_back(piece);
    streamed += piece;
  }
  return streamed + t.flush();
}
}  // namespace

TEST(CompletionText, StopSpanningTokensIsNeverStreamed) {
  CompletionText t({"\n\nQ"});
  std::vector<std::string> pieces;
  const std::string streamed = feed(t, {"The", " answer", "\n", "\n", "Q", "uestion"}, &pieces);
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.text(), "The answer");
  EXPECT_EQ(streamed, "The answer");
  EXPECT_EQ(pieces[2], "");  // "\n" may start the stop: held back
  EXPECT_EQ(pieces[3], "");
}

TEST(CompletionText, HeldBackTextIsReleasedWhenItIsNotAStop) {
  CompletionText t({"ab", "xyz"});
  std::vector<std::string> pieces;
  const std::string streamed = feed(t, {"1a", "c", "x", "y", "q"}, &pieces);
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(streamed, "1acxyq");
  EXPECT_EQ(pieces, (std::vector<std::string>{"1", "ac", "", "", "xyq"}));
}

TEST(CompletionText, EarliestStopWinsAndPartialCharactersWait) {
  CompletionText t({"cd", "bcde"});
  EXPECT_EQ(feed(t, {"abcdef"}, nullptr), "a");  // "bcde" starts before "cd"
  EXPECT_EQ(t.text(), "a");
  CompletionText u;
  EXPECT_EQ(u.add("caf\xC3"), "caf");  // the first byte of "é"
  EXPECT_EQ(u.add("\xA9!"), "\xC3\xA9!");
}

namespace {
// The definition, rescanning the whole text at every token: the cut is the earliest start of any stop in the
// text; what streams is the text up to the longest tail that is a proper prefix of some stop, and not inside a
// UTF-8 character (pieces equal under utf8_lossy, which both sides apply the same way: compared as bytes here,
// on ASCII-and-two-byte texts whose splits the checks below know).
struct Naive {
  std::vector<std::string> stops;
  std::string bytes;
  size_t emitted = 0;
  bool stopped = false;

  static size_t incomplete_tail(const std::string& s) {
    for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
      const unsigned char c = s[s.size() - back];
      if ((c & 0xC0) == 0x80) continue;
      const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
      return need > back ? back : 0;
    }
    return 0;
  }
  std::string add(const std::string& tok) {
    if (stopped) return "";
    bytes += tok;
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, bytes.find(s));
    if (cut != std::string::npos) {
      bytes.resize(cut);
      stopped = true;
      std::string rest = bytes.substr(std::min(emitted, bytes.size()));
      emitted = bytes.size();
      return rest;
    }
    size_t release = bytes.size() - incomplete_tail(bytes);
    for (const auto& s : stops) {
      for (size_t n = std::min(s.size() - 1, bytes.size()); n > 0; --n) {
        if (bytes.compare(bytes.size() - n, n, s, 0, n) == 0) {
          release = std::min(release, bytes.size() - n);
          break;
        }
      }
    }
    if (release <= emitted) return "";
    std::string piece = bytes.substr(emitted, release - emitted);
    emitted = release;
    return piece;
  }
};
}  // namespace

TEST(CompletionText, IncrementalMatchingEqualsRescanningTheWholeText) {
  // Small alphabets make stops overlap, repeat and span tokens (KMP's failure paths); 2,000 random cases.
  std::mt19937 rng(7);
  const std::string alphabet = "aab\n";
  auto random_string = [&](size_t lo, size_t hi) {
    std::string s(std::uniform_int_distribution<size_t>(lo, hi)(rng), 'a');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    return s;
  };
  int64_t stopped = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    const size_t count = rng() % 5;
    for (size_t i = 0; i < count; ++i) stops.push_back(random_string(1, 7));
    CompletionText fast(stops);
    Naive naive{stops};
    for (int t = 0; t < 30; ++t) {
      const std::string tok = random_string(0, 4);
      ASSERT_EQ(fast.add(tok), naive.add(tok)) << "trial " << trial << " token " << t;
      ASSERT_EQ(fast.stopped(), naive.stopped);
    }
    stopped += naive.stopped;
    ASSERT_EQ(fast.text(), naive.bytes);
  }
  EXPECT_GT(stopped, 500);  // both branches exercised
  EXPECT_LT(stopped, 1900);
}

TEST(CompletionText, CostPerTokenDoesNotGrowWithTheText) {
  // 64 stops of 256 bytes that a stream of a's keeps almost matching (a^128 b^128, one odd byte each): the
  // rescanning definition's cost per token grows with the text; the state walk's is O(stops) per byte. Timed
  // side by side (a ratio, not seconds, so that the machine's load cancels out): the 200 tokens after the
  // first 200, as the text grows to 1,600 bytes.
  std::vector<std::string> stops(64, std::string(128, 'a') + std::string(128, 'b'));
  for (size_t i = 0; i < stops.size(); ++i) stops[i][200] = static_cast<char>('c' + i % 20);
  auto timed = [](auto& matcher) {
    for (int i = 0; i < 200; ++i) matcher.add("aaaa");
    const auto start = std::chrono::steady_clock::now();
    std::string streamed;
    for (int i = 0; i < 200; ++i) streamed += matcher.add("aaaa");
    EXPECT_EQ(streamed.size(), 800u);  // the text's last 128 a's may begin a stop: held back, before and after
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  CompletionText fast(stops);
  Naive naive{stops};
  const double fast_s = timed(fast), naive_s = timed(naive);
  EXPECT_FALSE(fast.stopped());
  EXPECT_LT(fast_s * 20, naive_s) << fast_s << " s against " << naive_s << " s";
}
