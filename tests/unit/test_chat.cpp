// SFT formatting and masking (SPEC.md section 6): which tokens carry loss.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "archspace/chat/chat.h"
#include "archspace/util/error.h"

using namespace archspace;

namespace {
std::string trained_text(const Tokenizer& tok, const ChatExample& ex) {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < ex.ids.size(); ++i)
    if (ex.trained[i]) ids.push_back(ex.ids[i]);
  return tok.decode(ids);
}
}  // namespace

TEST(Chat, FormatAndLossMask) {
  auto tok = Tokenizer::load("dolma2");
  nlohmann::json messages = {{{"role", "user"}, {"content", "Hi?"}},
                             {{"role", "assistant"}, {"content", "Hello."}},
                             {{"role", "user"}, {"content", "2+2?"}},
                             {{"role", "assistant"}, {"content", "4"}}};
  ChatExample ex = encode_chat(*tok, messages, "test");
  ASSERT_EQ(ex.ids.size(), ex.trained.size());
  const std::string expected_text =
      std::string("<|im_start|>system\n") + kDefaultSystemPrompt +
      "<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|endoftext|>";
  EXPECT_EQ(tok->decode(ex.ids), expected_text);
  // Only assistant content and each assistant turn's end token carry loss.
  EXPECT_EQ(trained_text(*tok, ex), "Hello.<|im_end|>4<|endoftext|>");
  EXPECT_EQ(ex.ids.back(), 100257u);
}

TEST(Chat, GivenSystemPromptReplacesTheDefault) {
  auto tok = Tokenizer::load("dolma2");
  nlohmann::json messages = {{{"role", "system"}, {"content", "Be brief."}},
                             {{"role", "user"}, {"content", "x"}},
                             {{"role", "environment"}, {"content", "tool says 3"}},
                             {{"role", "assistant"}, {"content", "3"}}};
  ChatExample ex = encode_chat(*tok, messages, "test");
  EXPECT_EQ(tok->decode(ex.ids).find(kDefaultSystemPrompt), std::string::npos);
  EXPECT_EQ(trained_text(*tok, ex), "3<|endoftext|>");
}

TEST(Chat, ContentStartingWithANewlineIsEncodedAsTheWholeText) {
  // The chat template renders one text; "assistant\n" + "\n\nx" tokenizes with the newlines merged, so
  // the SFT ids must equal encode() of the rendered text, and the merged token (it carries content) trains.
  auto tok = Tokenizer::load("dolma2");
  nlohmann::json messages = {{{"role", "user"}, {"content", "\nWhat?"}},
                             {{"role", "assistant"}, {"content", "\n\n4."}}};
  ChatExample ex = encode_chat(*tok, messages, "test");
  const std::string rendered =
      std::string("<|im_start|>system\n") + kDefaultSystemPrompt +
      "<|im_end|>\n<|im_start|>user\n\nWhat?<|im_end|>\n<|im_start|>assistant\n\n\n4.<|endoftext|>";
  EXPECT_EQ(ex.ids, tok->encode(rendered));
  EXPECT_EQ(trained_text(*tok, ex), "\n\n\n4.<|endoftext|>");
}

TEST(Chat, BadMessagesAreClearErrors) {
  auto tok = Tokenizer::load("dolma2");
  EXPECT_THROW(encode_chat(*tok, nlohmann::json::array(), "f:1"), Error);
  EXPECT_THROW(encode_chat(*tok, {{{"role", "user"}, {"content", "no answer"}}}, "f:1"), Error);
  EXPECT_THROW(
      encode_chat(*tok, {{{"role", "robot"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "y"}}}, "f:1"),
      Error);  // Content of another type (null, a number) is an error naming the message, not a JSON type exception.
  for (const nlohmann::json& content : {nlohmann::json(nullptr), nlohmann::json(3), nlohmann::json::array()}) {
    try {
      encode_chat(*tok, {{{"role", "user"}, {"content", content}}, {{"role", "assistant"}, {"content", "y"}}}, "f:1");
      ADD_FAILURE() << "no error for content " << content.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f:1: message 0 needs string 'role' and 'content'"), std::string::npos)
          << e.what();
    }
  }
}

// Chat data files: every bad line is an error naming the file and the line.
TEST(Chat, BadChatDataFilesNameFileAndLine) {
  auto tok = Tokenizer::load("dolma2");
  const std::string path = ::testing::TempDir() + "/chat-bad.jsonl";
  auto expect_error = [&](const std::string& content, const std::vector<std::string>& fragments) {
    std::ofstream(path) << content;
    try {
      load_chat_jsonl(path, *tok);
      ADD_FAILURE() << "no error for:\n" << content;
    } catch (const Error& e) {
      for (const auto& f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what() << " lacks " << f;
    }
  };
  const std::string good = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  expect_error(good + "\n\n{\"messages\": [\n", {path + ":3", "malformed JSON line"});
  expect_error(good + "\n{\"text\": \"x\"}\n", {path + ":2", "no 'messages' field"});
  expect_error("\n \n", {path, "no chat examples"});
  std::ofstream(path) << good << "\n\n" << good << "\n";  // blank lines are skipped
  EXPECT_EQ(load_chat_jsonl(path, *tok).size(), 2u);
  std::filesystem::remove(path);
  try {
    load_chat_jsonl(path, *tok);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": cannot open"), std::string::npos) << e.what();
  }
}
