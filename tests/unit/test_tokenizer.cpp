// UTF-8 handling of the tokenizer module (parity with `tokenizers` itself is tested in pytest).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"

using namespace archspace;

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii, café, 🤗").has_value());
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("\xe2\x82"), 0u);          // truncated 3-byte sequence
  EXPECT_EQ(find_invalid_utf8("x\xc0\x80"), 1u);         // overlong encoding of NUL
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);      // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
}

TEST(Utf8, LossyReplacesMaximalInvalidSubparts) {
  size_t n = 0;
  // As Python's bytes.decode("utf-8", "replace"): one U+FFFD per maximal invalid subpart.
  EXPECT_EQ(utf8_lossy("a\xff\xfe"
                       "b",
                       &n),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(utf8_lossy("\xe2\x82x", &n), "\xEF\xBF\xBDx");  // a truncated sequence is one replacement
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(utf8_lossy("ok 🤗", &n), "ok 🤗");
  EXPECT_EQ(n, 0u);
}

TEST(Tokenizer, MissingFileIsAClearError) {
  try {
    Tokenizer::load("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

TEST(Tokenizer, Dolma2RoundTripsAndRejectsInvalidUtf8) {
  auto tok = Tokenizer::load("dolma2");
  EXPECT_EQ(tok->vocab_size(), 100278);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 100257u);
  const std::string text = "Hello, world! <|im_start|>user\nnaïve 🤗\t\t 12345<|im_end|>";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_EQ(tok->decode(tok->encode(text), /*skip_special_tokens=*/true).find("<|im_start|>"), std::string::npos);
  EXPECT_THROW(tok->encode("bad \xff byte"), Error);
}

// Found by fuzz/fuzz_tokenizer: a JSON value of an unexpected type escaped as nlohmann::json::type_error
// (std::terminate in the CLI) instead of an archspace::Error naming the file.
TEST(Tokenizer, UnexpectedJsonTypesAreErrorsNotCrashes) {
  const std::string dir = ::testing::TempDir();
  const std::string base =
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "decoder": {"type": "ByteLevel"}, "pre_tokenizer": )";
  const std::vector<std::string> cases = {
      base + R"({"type": "Sequence"}})",                      // no pretokenizers list
      base + R"({"type": "Sequence", "pretokenizers": 3}})",  // not a list
      base + R"({"type": "Sequence", "pretokenizers": [7]}})",
      base + R"({"type": 5}})",
      R"({"model": {"type": ["BPE"]}})",
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir + "/fuzz_tokenizer_" + std::to_string(i) + ".json";
    { std::ofstream(path) << cases[i]; }
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "case " << i << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}
