// libFuzzer target: a rescore file (`eval downstream --rescore`): read_rescore_file, then every metric of its
// generation rows (score_generations, with stand-ins for Minerva's is_equiv and the code sandbox: every pair
// unequal, every program failing) and the per-task and group results. The generations and golds go through the
// regexes (PCRE2), the UTF-8 and Python-string helpers and DROP's number parsing.
#include <cstddef>
#include <cstdint>

#include "archspace/eval/generation_metrics.h"
#include "archspace/util/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("rescore.jsonl", data, size);
  try {
    const archspace::RescoreFile file = archspace::read_rescore_file(path);
    const auto metrics = archspace::score_generations(
        file.instances,
        [](const std::vector<std::pair<std::string, std::string>>& pairs) { return std::vector<bool>(pairs.size()); },
        [](const std::vector<std::pair<nlohmann::json, std::string>>& pairs) {
          std::vector<archspace::InstructionResult> results(pairs.size());
          for (size_t i = 0; i < pairs.size(); ++i) {
            const size_t n = pairs[i].first["instruction_id_list"].size();  // checked by check_gold
            results[i].inst_strict.assign(n, false);
            results[i].inst_loose.assign(n, i % 2 == 0);
          }
          return results;
        },
        [](const std::vector<std::string>& programs) { return std::vector<bool>(programs.size()); });
    std::vector<std::pair<std::string, std::vector<std::string>>> macro_over;
    (void)archspace::generation_results(file.instances, metrics, file.shots, &macro_over);
  } catch (const archspace::Error&) {
  }
  return 0;
}
