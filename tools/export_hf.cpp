// archspace export-hf: a checkpoint as a Hugging Face model directory (+ tokenizer, + remote code).
#include "archspace/export/export_hf.h"

#include <iostream>

#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct ExportArgs {
  std::vector<std::string> paths;  // CHECKPOINT OUT_DIR, or what --model / --out leave out
  std::string model, out, dtype = "fp32";
  ExportOptions options;
};

int run(ExportArgs a) {
  // --model and --out (lm-eval's --output_path) take the place of a positional; the others fill in, in order.
  std::vector<std::string> rest = a.paths;
  for (std::string* slot : {&a.model, &a.out}) {
    if (slot->empty() && !rest.empty()) {
      *slot = rest.front();
      rest.erase(rest.begin());
    }
  }
  if (a.model.empty() || a.out.empty())
    throw Error("export-hf: give the checkpoint and the output directory: export-hf CHECKPOINT OUT_DIR");
  if (!rest.empty()) throw Error("export-hf: unexpected argument '" + rest.front() + "' (CHECKPOINT OUT_DIR)");
  a.options.dtype = scalar_type(parse_dtype(a.dtype, "--dtype"));
  export_hf(a.model, a.out, a.options);
  std::cerr << "exported " << a.model << " to " << a.out << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<ExportArgs>();
  auto* app = parent.add_subcommand(
      "export-hf", "Export a checkpoint as a Hugging Face model directory (+ tokenizer, + remote code)");
  app->add_option("PATHS", a->paths,
                  "CHECKPOINT OUT_DIR: a checkpoint, a finished run directory, or a model directory; then the "
                  "output directory")
      ->expected(0, 2);
  app->add_option("--model", a->model, "the checkpoint (instead of the first positional)");
  app->add_option("--out", a->out, "the output directory (instead of the second positional)");
  app->add_flag("--force", a->options.force,
                "replace an existing output directory (the new one is complete before the old one is removed)");
  app->add_option("--tokenizer", a->options.tokenizer,
                  "tokenizer to ship (default: the one the model carries, else dolma2)");
  add_dtype_option(app, a->dtype, "weights dtype");
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(70, add);
}  // namespace archspace::cli
