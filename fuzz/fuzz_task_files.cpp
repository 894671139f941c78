// libFuzzer target: an OLMES task variant's requests.jsonl.gz read by `eval downstream`: load_task (multiple
// choice: documents, choices, labels, TruthfulQA's several true labels, unconditional requests) or
// load_generation_task (generation settings, stop sequences, each task kind's gold, --chat's conversations).
// The first byte chooses: bit 0 the loader, bit 1 whether the rest is gzip-compressed here (to reach the JSON
// lines) or written as it is (to reach the gzip reader: util/gzip_lines), bit 2 a config with unconditional
// requests (multiple choice) or --chat (generation), bit 3 a document limit of 2, bits 4-6 the generation task
// (one per kind of gold), bit 4 the multiple-choice task (arc_easy or truthfulqa). config.json is fixed: it is read by
// read_json_file, which other targets reach.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/task_files.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

namespace {

void write_requests(const std::string& path, const uint8_t* data, size_t size, bool compress) {
  if (!compress) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return;
  }
  gzFile f = gzopen(path.c_str(), "wb1");
  if (!f || (size && gzwrite(f, data, static_cast<unsigned>(size)) != static_cast<int>(size)) || gzclose(f) != Z_OK)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const bool generation = mode & 1, compress = mode & 2, flag = mode & 4;
  const int64_t limit = (mode & 8) ? 2 : 0;
  static const char* const kGenerationTasks[] = {"gsm8k",           "drop",       "naturalqs_open", "ifeval",
                                                 "codex_humaneval", "codex_mbpp", "bbh_navigate",   "popqa"};
  // A multiple-choice file as arc_easy's (one gold label per document) or as truthfulqa's (the family reads each
  // document's own labels).
  const std::string task = generation ? kGenerationTasks[(mode >> 4) & 7] : (mode & 16) ? "truthfulqa" : "arc_easy";
  const std::string dir = fuzz::scratch_dir() + "/variant";
  std::filesystem::create_directories(dir);
  const std::string config =
      generation ? R"({"task_config": {"num_shots": 0, "generation_kwargs": {"max_gen_toks": 16, "do_sample": false}}})"
      : flag ? R"({"task_config": {"primary_metric": "acc_uncond", "metric_kwargs": {"uncond_docid_offset": 1000000}}})"
             : R"({"task_config": {"primary_metric": "acc_per_char"}})";
  fuzz::write_file("variant/config.json", reinterpret_cast<const uint8_t*>(config.data()), config.size());
  write_requests(dir + "/requests.jsonl.gz", data + 1, size - 1, compress);
  try {
    if (generation)
      (void)archspace::load_generation_task(dir, task, limit, /*chat=*/flag);
    else
      (void)archspace::load_task(dir, task, "rc", 0, limit);
  } catch (const archspace::Error&) {
  }
  return 0;
}
