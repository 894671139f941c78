// drop::llama3 from a local copy (eval/tasks/drop_llama3.h) with a stand-in for the dataset reader: what a copy of
// the wrong shape gets (an error that names the file, the row and the field), and the rendering's edges (a split
// smaller than three, a limit beyond the split). tests/python/test_olmes_prompts.py holds the prompts to OLMES' rules
// on copies `datasets` writes.
#include <gtest/gtest.h>

#include "archspace/eval/tasks/drop_llama3.h"
#include "archspace/util/error.h"

namespace archspace {
namespace {

nlohmann::json answer(const std::string& number, const std::vector<std::string>& spans,
                      const std::vector<std::string>& date = {"", "", ""}) {
  return {{"number", number}, {"spans", spans}, {"date", {{"day", date[0]}, {"month", date[1]}, {"year", date[2]}}}};
}

nlohmann::json row(int i, nlohmann::json a) {
  return {{"passage", "P" + std::to_string(i)},
          {"question", "Q" + std::to_string(i)},
          {"query_id", "q" + std::to_string(i)},
          {"answer", std::move(a)},
          {"validated_answers",
           {{"number", {"7"}}, {"spans", {nlohmann::json::array()}}, {"date", {answer("", {})["date"]}}}}};
}

// A copy of `train` training rows and the given validation rows ("missing" when empty).
DatasetReader fake(int64_t train, std::vector<nlohmann::json> validation) {
  return [=](const std::string&, const std::string& split, const std::vector<std::string>&,
             const std::optional<std::vector<int64_t>>& indices, bool) {
    DatasetRows r;
    r.files = {"/copy/" + split + ".arrow"};
    if (split == "validation" && validation.empty()) {
      r.files.clear();
      r.missing = "no validation split";
      return r;
    }
    r.rows = split == "train" ? train : static_cast<int64_t>(validation.size());
    std::vector<int64_t> wanted;
    if (indices) {
      wanted = *indices;
    } else {
      for (int64_t i = 0; i < r.rows; ++i) wanted.push_back(i);
    }
    for (int64_t i : wanted)
      r.selected.push_back(split == "train" ? row(static_cast<int>(i), answer(std::to_string(i), {}))
                                            : validation.at(i));
    return r;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DropLlama3, ParseAnswerTakesTheNumberThenTheSpansThenTheDate) {
  EXPECT_EQ(drop_parse_answer(answer("12", {"a"}), "x"), std::vector<std::string>{"12"});
  EXPECT_EQ(drop_parse_answer(answer("", {"a", "b"}), "x"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(drop_parse_answer(answer("", {}, {"", "May", "1990"}), "x"), std::vector<std::string>{"May 1990"});
  EXPECT_EQ(drop_parse_answer(answer("", {}), "x"), std::vector<std::string>{""});
}

TEST(DropLlama3, RendersTheShotsBeforeEveryDocumentAndDropsRepeatedAnswers) {
  const std::vector<nlohmann::json> validation = {row(100, answer("7", {})), row(101, answer("", {"x"}))};
  const GenerationTaskFiles t = load_drop_llama3("/copy", "", 0, false, nullptr, fake(50, validation));
  ASSERT_EQ(t.requests.size(), 2u);
  const std::vector<int64_t> shots = drop_llama3_shot_positions(50);
  std::string prefix;
  for (int64_t p : shots)
    prefix += "Passage: P" + std::to_string(p) + "\nQuestion: Q" + std::to_string(p) +
              "\nAnswer: " + std::to_string(p) + "\n\n";
  EXPECT_EQ(t.requests[0].context, prefix + "Passage: P100\nQuestion: Q100\nAnswer:");
  // Each row's one validated answer is the number 7: a repeat of the first document's answer, kept once.
  EXPECT_EQ(t.requests[0].gold, nlohmann::json::parse(R"([["7"]])"));
  EXPECT_EQ(t.requests[1].gold, nlohmann::json::parse(R"([["x"], ["7"]])"));
  EXPECT_EQ(t.requests[1].native_id, "q101");
  EXPECT_EQ(t.shots, 3);
}

TEST(DropLlama3, ACopyOfAnotherShapeNamesTheFileRowAndField) {
  nlohmann::json no_number = row(0, answer("1", {}));
  no_number["answer"].erase("number");
  EXPECT_NE(error_of([&] {
              load_drop_llama3("/copy", "", 0, false, nullptr, fake(10, {no_number}));
            }).find("/copy/validation.arrow (validation row 0) answer: no field \"number\""),
            std::string::npos);
  nlohmann::json lists = row(0, answer("1", {}));
  lists["validated_answers"] = nlohmann::json::array({answer("1", {})});  // a list of dicts, not a dict of lists
  EXPECT_NE(error_of([&] {
              load_drop_llama3("/copy", "", 0, false, nullptr, fake(10, {lists}));
            }).find("validated_answers: no field \"number\""),
            std::string::npos);
  nlohmann::json spans = row(0, answer("", {}));
  spans["answer"]["spans"] = "a";
  EXPECT_NE(error_of([&] {
              load_drop_llama3("/copy", "", 0, false, nullptr, fake(10, {spans}));
            }).find("field \"spans\" must be a list of strings"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_drop_llama3("/copy", "", 0, false, nullptr, fake(2, {row(0, answer("1", {}))}));
            }).find("training split has 2 documents: drop::llama3 samples 3"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { load_drop_llama3("/copy", "", 0, false, nullptr, fake(10, {})); }).find("no installed drop files"),
      std::string::npos);
  EXPECT_NE(error_of([&] { load_drop_llama3("/copy", "", -1, false, nullptr, fake(10, {})); }).find("at least 1"),
            std::string::npos);
}

TEST(DropLlama3, ALimitBeyondTheSplitTakesTheWholeSplit) {
  const std::vector<nlohmann::json> validation = {row(100, answer("7", {})), row(101, answer("8", {}))};
  EXPECT_EQ(load_drop_llama3("/copy", "", 5, false, nullptr, fake(50, validation)).requests.size(), 2u);
  EXPECT_EQ(load_drop_llama3("/copy", "", 1, false, nullptr, fake(50, validation)).requests.size(), 1u);
}

}  // namespace
}  // namespace archspace
