// The request files of generation tasks (eval/generation_tasks.h: load_generation_task), apart from the decoding
// in generation_tasks.cpp, so that the file reader builds without a model (the fuzz target task_files).
#include <filesystem>
#include <set>

#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/task_files.h"
#include "archspace/util/error.h"
#include "archspace/util/gzip_lines.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"

namespace archspace {

namespace fs = std::filesystem;

bool is_generation_task(const std::string& task) { return find_generation_task(task) != nullptr; }

GenerationTaskFiles load_generation_task(const std::string& variant_dir, const std::string& task, int64_t limit,
                                         bool chat) {
  if (limit < 0) throw Error("the document limit must be at least 1 (0: all), got " + std::to_string(limit));
  const GenerationTaskSpec* spec = find_generation_task(task);
  if (!spec) throw Error("task \"" + task + "\" is not a generation task");
  GenerationTaskFiles t;
  t.task = task;
  t.dir = variant_dir;
  t.chat = chat;
  const std::string config_path = (fs::path(variant_dir) / "config.json").string();
  const nlohmann::json config = read_json_file(config_path);
  const nlohmann::json& task_config = json_field(config, "task_config", config_path);
  t.shots = json_int_field(task_config, "num_shots", config_path + " task_config");
  const RequestFile file{task, task_config, config_path, t.shots, chat};

  t.requests_path = (fs::path(variant_dir) / "requests.jsonl.gz").string();
  std::set<int64_t> seen;
  for_each_gzip_line(t.requests_path, kTaskRequestFileLimits, [&](const std::string& line, int64_t line_no) {
    const std::string where = t.requests_path + ":" + std::to_string(line_no) + " (task " + task + ")";
    const auto j = parse_json_line(line, where);
    if (!j) return true;
    GenerationRequest r;
    r.line = line_no;
    r.doc_id = json_int_field(*j, "doc_id", where);
    if (!seen.insert(r.doc_id).second) throw Error(where + ": document " + std::to_string(r.doc_id) + " appears twice");
    r.native_id = j->contains("native_id") ? (*j)["native_id"] : nlohmann::json();
    static_cast<GenerationPrompt&>(r) = spec->family->read_prompt(*j, file, where);
    try {
      r.gold = gold_from_request(*spec, *j);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    t.requests.push_back(std::move(r));
    return limit == 0 || static_cast<int64_t>(t.requests.size()) < limit;
  });
  if (t.requests.empty()) throw Error(t.requests_path + ": no requests (task " + task + ")");
  return t;
}

}  // namespace archspace
