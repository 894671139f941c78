// CompletionText: the streamed pieces always add up to the final text, stop strings cut it (also when a
// stop spans tokens), and neither a partial UTF-8 character nor the start of a possible stop is streamed.
#include <gtest/gtest.h>

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
