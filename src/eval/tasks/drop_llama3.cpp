// drop::llama3 from a local copy of EleutherAI/drop (include/archspace/eval/tasks/drop_llama3.h says what OLMES
// does, with its files).
#include "archspace/eval/tasks/drop_llama3.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "archspace/data/python_random.h"
#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/task_files.h"
#include "archspace/text/python_str.h"
#include "archspace/util/error.h"
#include "archspace/util/gzip_lines.h"
#include "archspace/util/json_lines.h"
#include "archspace/util/python_scripts.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace {

constexpr int64_t kShots = 3, kFewshotSeed = 1234;  // drop::llama3's num_shots; OLMES' default fewshot_seed
const std::vector<std::string> kShotColumns = {"passage", "question", "answer"};
const std::vector<std::string> kDocumentColumns = {"passage", "question", "query_id", "answer", "validated_answers"};

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error(where + ": no field \"" + key + "\"");
  return j[key];
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_string()) throw Error(where + ": field \"" + key + "\" must be a string");
  return v.get<std::string>();
}

// drop.py _process_doc: make_cloze_prompt(question, question_prefix=passage_prefix + passage + "\nQuestion: ").
std::string drop_query(const std::string& passage, const std::string& question) {
  return "Passage: " + passage + "\nQuestion: " + question + "\nAnswer:";
}

// drop.py get_answers: the answer, then each validated answer (a dict of lists, as datasets stores a Sequence of
// dicts), parsed; a parse seen before is skipped.
nlohmann::json drop_answers(const nlohmann::json& row, const std::string& where) {
  std::vector<std::vector<std::string>> answers{drop_parse_answer(field(row, "answer", where), where + " answer")};
  const nlohmann::json& validated = field(row, "validated_answers", where);
  const std::string vwhere = where + " validated_answers";
  const nlohmann::json &numbers = field(validated, "number", vwhere), &dates = field(validated, "date", vwhere),
                       &spans = field(validated, "spans", vwhere);
  if (!numbers.is_array() || !dates.is_array() || !spans.is_array() || dates.size() < numbers.size() ||
      spans.size() < numbers.size())
    throw Error(vwhere + ": must be a dict of lists (number, date, spans) of equal lengths");
  for (size_t i = 0; i < numbers.size(); ++i) {
    const nlohmann::json one = {{"number", numbers[i]}, {"date", dates[i]}, {"spans", spans[i]}};
    std::vector<std::string> parsed = drop_parse_answer(one, vwhere + "[" + std::to_string(i) + "]");
    if (std::find(answers.begin(), answers.end(), parsed) == answers.end()) answers.push_back(std::move(parsed));
  }
  return answers;
}

// One request line in the form the family's read_prompt reads (the prompt settings of drop::llama3: DROP's
// TASK_CONFIG_DEFAULTS generation_kwargs, with chat_overrides' stop sequences under --chat).
nlohmann::json request_line(const std::string& context, bool chat) {
  const nlohmann::json stops =
      chat ? nlohmann::json{"Passage:", "Question:", "<|eot_id|>"} : nlohmann::json{"Passage:", "Question:", "\n\n"};
  return {{"request",
           {{"context", context},
            {"stop_sequences", stops},
            {"generation_kwargs", {{"max_gen_toks", 50}, {"temperature", 0.0}, {"do_sample", false}}}}}};
}

struct Document {
  nlohmann::json native_id, gold;
  std::string query;
};

// The installed file's documents (their doc: passage, question, answers, query_id), the first `limit`.
std::vector<Document> installed_documents(const std::string& variant_dir, int64_t limit) {
  const std::string path = (std::filesystem::path(variant_dir) / "requests.jsonl.gz").string();
  std::vector<Document> docs;
  for_each_gzip_line(path, kTaskRequestFileLimits, [&](const std::string& line, int64_t line_no) {
    const std::string where = path + ":" + std::to_string(line_no);
    const auto j = parse_json_line(line, where);
    if (!j) return true;
    const nlohmann::json& doc = field(*j, "doc", where);
    docs.push_back(
        {field(doc, "query_id", where + " doc"), field(doc, "answers", where + " doc"),
         drop_query(string_field(doc, "passage", where + " doc"), string_field(doc, "question", where + " doc"))});
    return limit == 0 || static_cast<int64_t>(docs.size()) < limit;
  });
  return docs;
}

}  // namespace

DatasetRows read_dataset_rows(const std::string& path, const std::string& split,
                              const std::vector<std::string>& columns,
                              const std::optional<std::vector<int64_t>>& indices, bool optional) {
  const nlohmann::json request = {{"path", path},
                                  {"split", split},
                                  {"columns", columns},
                                  {"indices", indices ? nlohmann::json(*indices) : nlohmann::json("all")},
                                  {"optional", optional}};
  const nlohmann::json answer =
      run_python_json(ARCHSPACE_DATASET_ROWS_SCRIPT, request.dump(), "cannot read the " + split + " split of " + path);
  DatasetRows rows;
  try {
    rows.files = answer.at("files").get<std::vector<std::string>>();
    rows.rows = answer.at("rows").get<int64_t>();
    rows.missing = answer.value("missing", "");
    if (answer.contains("selected")) rows.selected = answer["selected"].get<std::vector<nlohmann::json>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string(ARCHSPACE_DATASET_ROWS_SCRIPT) + ": not the reader's answer (" + e.what() + ")");
  }
  return rows;
}

std::vector<int64_t> drop_llama3_shot_positions(int64_t rows) {
  if (rows < kShots)
    throw Error("DROP's training split has " + std::to_string(rows) + " documents: drop::llama3 samples " +
                std::to_string(kShots));
  std::vector<int64_t> positions;
  for (uint64_t p : PythonRandom(kFewshotSeed).sample(static_cast<uint64_t>(rows), kShots))
    positions.push_back(static_cast<int64_t>(p));
  return positions;
}

std::vector<std::string> drop_parse_answer(const nlohmann::json& answer, const std::string& where) {
  const std::string number = string_field(answer, "number", where);
  if (!number.empty()) return {number};
  const nlohmann::json& spans = field(answer, "spans", where);
  if (!spans.is_array()) throw Error(where + ": field \"spans\" must be a list of strings");
  if (!spans.empty()) {
    std::vector<std::string> out;
    for (const auto& s : spans) {
      if (!s.is_string()) throw Error(where + ": field \"spans\" must be a list of strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  const nlohmann::json& date = field(answer, "date", where);
  const std::string day = string_field(date, "day", where + " date"), month = string_field(date, "month", where),
                    year = string_field(date, "year", where + " date");
  return {text::py_strip(day + " " + month + " " + year)};
}

GenerationTaskFiles load_drop_llama3(const std::string& path, const std::string& installed, int64_t limit, bool chat,
                                     const std::function<void(const std::string&)>& note, const DatasetReader& reader) {
  if (limit < 0) throw Error("the document limit must be at least 1 (0: all), got " + std::to_string(limit));
  const DatasetRows train = reader(path, "train", kShotColumns, std::vector<int64_t>{}, false);
  const std::vector<int64_t> positions = drop_llama3_shot_positions(train.rows);
  const DatasetRows shots = reader(path, "train", kShotColumns, positions, false);
  if (shots.selected.size() != positions.size())
    throw Error(path + ": the reader answered " + std::to_string(shots.selected.size()) + " of " +
                std::to_string(positions.size()) + " training rows");
  std::vector<std::string> examples;
  for (size_t k = 0; k < positions.size(); ++k) {
    const nlohmann::json& row = shots.selected[k];
    const std::string where = join(train.files, ", ") + " (training row " + std::to_string(positions[k]) + ")";
    examples.push_back(drop_query(string_field(row, "passage", where), string_field(row, "question", where)) + " " +
                       join(drop_parse_answer(field(row, "answer", where), where + " answer"), ", "));
  }
  const std::string prefix = join(examples, "\n\n") + "\n\n";

  std::optional<std::vector<int64_t>> first;  // the validation rows wanted: all, or the first `limit`
  if (limit > 0) {
    first.emplace();
    for (int64_t i = 0; i < limit; ++i) first->push_back(i);
  }
  DatasetRows validation = reader(path, "validation", kDocumentColumns, std::vector<int64_t>{}, true);
  std::vector<Document> docs;
  if (validation.missing.empty()) {
    if (first && static_cast<int64_t>(first->size()) > validation.rows)
      first->resize(static_cast<size_t>(validation.rows));
    validation = reader(path, "validation", kDocumentColumns, first, false);
    for (size_t i = 0; i < validation.selected.size(); ++i) {
      const nlohmann::json& row = validation.selected[i];
      const std::string where = join(validation.files, ", ") + " (validation row " + std::to_string(i) + ")";
      docs.push_back({field(row, "query_id", where), drop_answers(row, where),
                      drop_query(string_field(row, "passage", where), string_field(row, "question", where))});
    }
  } else if (installed.empty()) {
    throw Error(path + " has no validation split (" + validation.missing +
                ") and there are no installed drop files to take the documents from: give a directory with both "
                "splits");
  } else {
    docs = installed_documents(installed, limit);
  }
  if (note)
    note("drop: drop::llama3's prompts, shots " + std::to_string(positions[0]) + ", " + std::to_string(positions[1]) +
         ", " + std::to_string(positions[2]) + " (random.Random(1234).sample) of the " + std::to_string(train.rows) +
         " training documents in " + join(train.files, ", ") + "; documents: " +
         (validation.missing.empty()
              ? "the " + std::to_string(docs.size()) + " of its validation split in " + join(validation.files, ", ")
              : std::to_string(docs.size()) + " of the installed file " + installed +
                    " (no validation split in the copy: " + validation.missing + ")"));

  GenerationTaskFiles t;
  t.task = "drop";
  t.dir = path;
  t.requests_path = join(train.files, ", ");
  t.shots = kShots;
  t.chat = chat;
  const nlohmann::json task_config = {{"num_shots", kShots}};
  const RequestFile file{"drop", task_config, path, kShots, chat};
  const GenerationTaskSpec* spec = find_generation_task("drop");
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string where = path + " (drop::llama3, document " + std::to_string(i) + ")";
    GenerationRequest r;
    static_cast<GenerationPrompt&>(r) =
        spec->family->read_prompt(request_line(prefix + docs[i].query, chat), file, where);
    r.doc_id = static_cast<int64_t>(i);
    r.line = static_cast<int64_t>(i) + 1;
    r.native_id = docs[i].native_id;
    spec->family->check_gold(*spec, docs[i].gold);
    r.gold = docs[i].gold;
    t.requests.push_back(std::move(r));
  }
  if (t.requests.empty()) throw Error(path + ": no DROP documents to evaluate");
  return t;
}

}  // namespace archspace
