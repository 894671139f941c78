#include "archspace/export/export_hf.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archspace/chat/chat.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/remote_code.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/file_writer.h"
#include "archspace/util/json_file.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTransformersVersion = "5.17.0";

// SPEC.md section 6 as a Jinja chat template: what encode_chat produces (a finished conversation ends in
// <|endoftext|>), or with a generation prompt what encode_chat_prompt produces (every turn ends in <|im_end|>).
std::string chat_template() {
  return std::string("{%- if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n") + kDefaultSystemPrompt +
         "<|im_end|>\\n' }}{%- endif %}"
         "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
         "{%- if loop.last and message['role'] == 'assistant' and not add_generation_prompt %}{{ '<|endoftext|>' }}{%- "
         "else %}{{ '<|im_end|>\\n' "
         "}}{%- endif %}"
         "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace

void export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options) {
  const std::string model_dir = resolve_model_dir(checkpoint);
  if (const std::string ckpt = checkpoint_of_model_dir(model_dir); !ckpt.empty()) verify_checkpoint(ckpt);
  CausalLM model = load_model(model_dir);
  const ModelConfig& c = model.config();
  // The one tokenizer rule; an HF directory needs a tokenizer, so export ships dolma2 when nothing says otherwise.
  auto tokenizer = model_tokenizer(model_dir, options.tokenizer, c.vocab_size, "dolma2");
  const fs::path final_dir = fs::path(out_dir).lexically_normal();
  const bool replace = fs::exists(final_dir) && !(fs::is_directory(final_dir) && fs::is_empty(final_dir));
  if (replace) {
    if (!fs::is_directory(final_dir)) throw Error(out_dir + ": exists and is not a directory");
    if (!options.force) throw Error(out_dir + ": exists and is not empty (pass --force to replace it)");
    const std::string target = fs::weakly_canonical(final_dir).string() + "/";
    const std::string source = fs::weakly_canonical(model_dir).string() + "/";
    if (source.rfind(target, 0) == 0)
      throw Error(out_dir + ": holds the checkpoint being exported (" + model_dir + "); --force will not replace it");
  }
  const fs::path parent = final_dir.has_parent_path() ? final_dir.parent_path() : fs::path(".");
  fs::create_directories(parent);
  std::string tmpl = (parent / (final_dir.filename().string() + ".export-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw Error(out_dir + ": cannot create a directory beside it: " + std::strerror(errno));
  const fs::path out(tmpl);
  struct Cleanup {  // the temporary directory, unless it was renamed into place
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } cleanup{out};
  ::chmod(out.c_str(), 0755);  // mkdtemp's 0700 is for scratch, not for a model directory others read

  save_model(model, out.string(), options.dtype);
  // transformers_version, as save_pretrained writes it. Without it transformers 5.x's tokenizer loader
  // (TokenizersBackend._patch_mistral_regex) takes any local directory for a pre-5.0 Mistral checkpoint and warns
  // "incorrect regex pattern ... fix_mistral_regex=True", whatever the regex; the version we write is the release
  // the export's format is tested against (requirements.txt; tests/python/test_export.py checks they agree).
  {
    const fs::path config_path = out / "config.json";
    json config = read_json_file(config_path.string());
    config["transformers_version"] = kTransformersVersion;
    write_file(config_path.string(), config.dump(2) + "\n");
  }
  copy_file_contents(tokenizer->path(), (out / "tokenizer.json").string());
  auto token_or_null = [&](const char* t) { return tokenizer->token_to_id(t) ? json(t) : json(nullptr); };
  json tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},  {"eos_token", token_or_null("<|endoftext|>")},
                     {"pad_token", token_or_null("<|pad|>")},         {"bos_token", nullptr},
                     {"model_max_length", c.max_position_embeddings}, {"clean_up_tokenization_spaces", false}};
  if (tokenizer->token_to_id("<|im_start|>")) tok_config["chat_template"] = chat_template();
  write_file((out / "tokenizer_config.json").string(), tok_config.dump(2) + "\n");
  json gen = {{"eos_token_id", c.eos_token_id ? json(*c.eos_token_id) : json(nullptr)},
              {"pad_token_id", c.pad_token_id ? json(*c.pad_token_id) : json(nullptr)}};
  write_file((out / "generation_config.json").string(), gen.dump(2) + "\n");
  if (c.variant == Variant::kSiameseDepth) {
    write_file((out / "configuration_olmo3_siamese_depth.py").string(), kRemoteConfigurationPy);
    write_file((out / "modeling_olmo3_siamese_depth.py").string(), kRemoteModelingPy);
  }
  // Into place: an old directory is moved aside first and removed only once the new one is there.
  if (replace) {
    const fs::path old = out.string() + ".old";
    fs::rename(final_dir, old);
    fs::rename(out, final_dir);
    cleanup.dir = old;
  } else {
    if (fs::exists(final_dir)) fs::remove(final_dir);  // an empty directory
    fs::rename(out, final_dir);
    cleanup.dir.clear();
  }
}

}  // namespace archspace
