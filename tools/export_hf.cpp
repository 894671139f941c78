// archspace export-hf: a checkpoint as a Hugging Face model directory (+ tokenizer, + remote code).
#include "archspace/export/export_hf.h"

#include <iostream>

#include "command.h"

namespace archspace::cli {
namespace {

struct ExportArgs {
  std::string source, out, dtype = "fp32";
  ExportOptions options;
};

int run(ExportArgs a) {
  a.options.dtype = scalar_type(parse_dtype(a.dtype, "--dtype"));
  export_hf(a.source, a.out, a.options);
  std::cerr << "exported " << a.source << " to " << a.out << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<ExportArgs>();
  auto* app = parent.add_subcommand(
      "export-hf", "Export a checkpoint as a Hugging Face model directory (+ tokenizer, + remote code)");
  app->add_option("CHECKPOINT", a->source, "a checkpoint, a finished run directory, or a model directory")->required();
  app->add_option("OUT_DIR", a->out, "new output directory")->required();
  app->add_option("--tokenizer", a->options.tokenizer,
                  "tokenizer to ship (default: the one the model carries, else dolma2)");
  add_dtype_option(app, a->dtype, "weights dtype");
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(70, add);
}  // namespace archspace::cli
