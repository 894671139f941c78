// Prints the engine's step-skipping verdicts (train/skip_step.h) for tests/python/test_recipes.py to hold against
// OLMo-core's own SkipStepAdamW. stdin: a first line "WINDOW SIGMA USE_GRAD_NORMS", then one line per step,
// "LOSS GRAD_NORM", or "checkpoint": the rule's state through its JSON text into a new rule, as a resumed run reads
// it. stdout: one line per step, 1 when the step is skipped, else 0.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "archspace/train/skip_step.h"

int main() {
  int64_t window = 0;
  double sigma = 0;
  int use_grad_norms = 0;
  std::string line;
  if (!std::getline(std::cin, line) || !(std::istringstream(line) >> window >> sigma >> use_grad_norms)) {
    std::cerr << "skip_step_dump: the first line must be WINDOW SIGMA USE_GRAD_NORMS\n";
    return 1;
  }
  auto rule = std::make_unique<archspace::SkipStepRule>(window, sigma, use_grad_norms != 0);
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (line == "checkpoint") {
      const std::string saved = rule->state().dump();
      rule = std::make_unique<archspace::SkipStepRule>(window, sigma, use_grad_norms != 0);
      rule->restore(nlohmann::json::parse(saved));
      continue;
    }
    std::istringstream in(line);
    std::string loss, grad_norm;  // strtod reads "nan" and "inf"
    if (!(in >> loss >> grad_norm)) {
      std::cerr << "skip_step_dump: bad line '" << line << "'\n";
      return 1;
    }
    std::cout << (rule->observe(std::stod(loss), std::stod(grad_norm)).skip ? 1 : 0) << "\n";
  }
  return 0;
}
