// drop::llama3, the DROP prompt of the seed's table (olmes oe_eval/configs/tasks.py "drop::llama3": validation
// split, 3 shots, f1, no few-shot source and no description), rendered from a local copy of EleutherAI/drop (the
// dataset OLMES' DROP task loads) that the user points at: the Hugging Face datasets cache directory, a
// save_to_disk directory, the hub's Parquet files, or one file of the training split. No package ships DROP's
// training split, from which this spec draws its shots.
//
// As OLMES builds each request (olmes oe_eval/tasks/base_task.py build_all_requests, fewshot_context,
// fewshot_examples; oe_eval/tasks/oe_eval_tasks/drop.py):
//   - per document a fresh random.Random(fewshot_seed = 1234) (build_all_requests), whose sample(training docs, 3)
//     picks the shots (fewshot_examples: no fixed source, the task has training docs, exactly k drawn and no
//     document left out): the same three for every document, in the order sample returns them;
//   - a document's text (_process_doc, make_cloze_prompt): "Passage: " + passage + "\nQuestion: " + question +
//     "\nAnswer:"; a shot's target " " + ", ".join(answers[0]), answers[0] being parse_answer(doc["answer"]) (the
//     number, else the spans, else "day month year" stripped);
//   - the context: the shots' text + target joined by blank lines, a blank line, the document's text; under --chat
//     one user turn of it (no fewshot_as_multiturn, no prefix), and DROP's chat_overrides' stop sequences;
//   - the documents: the copy's validation split in its order (doc_id its position, native_id query_id, gold
//     get_answers: the answer and the validated answers parsed, duplicates dropped), else the installed file's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "archspace/eval/generation_tasks.h"

namespace archspace {

// The DROP rows of a local copy: `split` of `path` read by scripts/hf_dataset_rows.py (pyarrow), `columns` of the
// rows at `indices` (all of them for nullopt; none, only the count, for an empty list).
struct DatasetRows {
  std::vector<std::string> files;  // the files read, in order
  int64_t rows = 0;                // in the split
  std::string missing;             // non-empty: the split has no files here (an optional split), and why
  std::vector<nlohmann::json> selected;
};
using DatasetReader = std::function<DatasetRows(const std::string& path, const std::string& split,
                                                const std::vector<std::string>& columns,
                                                const std::optional<std::vector<int64_t>>& indices, bool optional)>;
// The project's reader (scripts/hf_dataset_rows.py with the scripts' python).
DatasetRows read_dataset_rows(const std::string& path, const std::string& split,
                              const std::vector<std::string>& columns,
                              const std::optional<std::vector<int64_t>>& indices, bool optional);

// The positions of drop::llama3's shots in a training split of `rows` documents: random.Random(1234).sample.
std::vector<int64_t> drop_llama3_shot_positions(int64_t rows);

// drop.py parse_answer of one answer object {"number", "date": {"day", "month", "year"}, "spans"}.
std::vector<std::string> drop_parse_answer(const nlohmann::json& answer, const std::string& where);

// The drop task's requests as drop::llama3 renders them from the copy at `path` (the first `limit` documents, 0:
// all). installed: the installed drop files' variant directory, whose documents are used when the copy has no
// validation split. `note` says where shots and documents came from.
GenerationTaskFiles load_drop_llama3(const std::string& path, const std::string& installed, int64_t limit, bool chat,
                                     const std::function<void(const std::string&)>& note,
                                     const DatasetReader& reader = read_dataset_rows);

}  // namespace archspace
