// Prints the prompts `eval downstream` would give the generation tasks named, without a model, for the tests that
// hold them to OLMES' rules on every document (tests/python/test_olmes_prompts.py). Runs the downstream pipeline's
// own planning and loading (eval/downstream_pipeline.h), so the files, --chat and --drop-dataset are treated as
// `eval downstream` treats them.
//   task_prompts_dump [--chat] [--limit N] [--tasks-dir DIR]... [--drop-dataset PATH] TASK...
// One JSON line per request: {"task", "doc_id", "native_id", "messages", "assistant_prefix", "context",
// "stop_sequences", "max_gen_toks", "gold"} ("messages" and "assistant_prefix" under --chat), then one line
// {"prompts_differ": {task: how}}.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/eval/downstream_pipeline.h"
#include "archspace/util/error.h"

int main(int argc, char** argv) {
  using namespace archspace;
  try {
    DownstreamSelection selection;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--chat") {
        selection.chat = true;
      } else if (arg == "--limit") {
        selection.limit = std::stoll(value());
      } else if (arg == "--tasks-dir") {
        selection.tasks_dirs.push_back(value());
      } else if (arg == "--drop-dataset") {
        selection.drop_dataset = value();
      } else {
        selection.tasks.push_back(arg);
      }
    }
    const DownstreamPipeline pipeline(selection, plan_downstream(selection), nullptr);
    for (const auto& files : pipeline.generation_files()) {
      for (const auto& r : files.requests) {
        nlohmann::json row = {{"task", files.task},
                              {"doc_id", r.doc_id},
                              {"native_id", r.native_id},
                              {"context", r.context},
                              {"stop_sequences", r.stop_sequences},
                              {"max_gen_toks", r.max_gen_toks},
                              {"gold", r.gold}};
        if (r.chat) {
          row["messages"] = r.chat->messages;
          row["assistant_prefix"] = r.chat->assistant_prefix;
        }
        std::cout << row.dump() << "\n";
      }
    }
    std::cout << nlohmann::json{{"prompts_differ", pipeline.prompts_differ()}}.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
