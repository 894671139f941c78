#include "command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "archspace/dist/process_group.h"
#include "archspace/io/run_dir.h"
#include "archspace/util/error.h"
#include "archspace/util/python_scripts.h"
#include "archspace/util/strings.h"

namespace archspace::cli {

namespace {

std::vector<std::pair<int, AddCommand>>& registry() {
  static std::vector<std::pair<int, AddCommand>> commands;  // a function-local static: safe during static init
  return commands;
}

}  // namespace

bool register_command(int order, AddCommand add) {
  registry().emplace_back(order, add);
  return true;
}

std::vector<AddCommand> registered_commands() {
  auto sorted = registry();
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AddCommand> out;
  for (const auto& [order, add] : sorted) out.push_back(add);
  return out;
}

CLI::Validator choice_validator(std::function<void(const std::string&)> parse, const std::string& choices) {
  return CLI::Validator(
      [parse](std::string& s) {
        try {
          parse(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      choices);
}

CLI::Option* add_dtype_option(CLI::App* app, std::string& value, const std::string& what) {
  return app->add_option("--dtype", value, what)
      ->check(choice_validator([](const std::string& s) { parse_dtype(s, ""); }, "fp32|bf16"))
      ->capture_default_str();
}

CLI::Option* add_quantization_option(CLI::App* app, std::string& value) {
  return app
      ->add_option("--quantization", value,
                   "matmul weights as int8 with one scale per output row (CPU; decoding reads a quarter of fp32's "
                   "bytes), or none")
      ->check(choice_validator([](const std::string& s) { parse_quantization(s, ""); }, "none|int8"))
      ->capture_default_str();
}

CLI::Option* add_device_option(CLI::App* app, std::string& value) {
  return app->add_option("--device", value, "compute device")
      ->check(choice_validator([](const std::string& s) { parse_device(s, ""); }, "cpu|cuda[:N]"))
      ->capture_default_str();
}

CLI::Option* add_decode_steps_option(CLI::App* app, std::string& value) {
  return app
      ->add_option("--decode-steps", value,
                   "how decoding steps run: eager (the KV cache grows with the length), fixed-shapes (the cache "
                   "reserved once, each step on the same memory, over a bucket of 1, 2, 4, ... rows), cuda-graph "
                   "(fixed shapes, each bucket's step captured as a CUDA graph and replayed: fewer kernel launches; "
                   "--device cuda)")
      ->check(CLI::Validator(  // CLI11 names the flag; parse_decode_mode's message would name it again
          [](std::string& s) -> std::string {
            try {
              parse_decode_mode(s);
              return std::string();
            } catch (const Error&) {
              return "\"" + s + "\" is not one of eager, fixed-shapes, cuda-graph";
            }
          },
          "eager|fixed-shapes|cuda-graph"))
      ->capture_default_str();
}

DecodeMode decode_mode_for(const std::string& decode_steps, const std::string& device) {
  const DecodeMode mode = parse_decode_mode(decode_steps);
  if (mode == DecodeMode::kCudaGraph && !parse_device(device, "--device").device().is_cuda())
    throw Error("--decode-steps cuda-graph: CUDA graphs need --device cuda (got --device " + device + ")");
  return mode;
}

CLI::Option* add_profile_option(CLI::App* app, std::string& path) {
  return app
      ->add_option("--profile", path,
                   "write a Kineto trace of the work (after loading) to FILE (name it *.pt.trace.json for "
                   "TensorBoard; Perfetto and chrome://tracing open it too) and FILE.top-ops.txt, the ops "
                   "by self time")
      ->check(
          [](const std::string& path) {
            try {
              OpProfiler::check_trace_path(path);
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          "FILE");
}

CommandProfile::CommandProfile(const std::string& path) {
  if (!path.empty()) profiler_.emplace(path);
}

void CommandProfile::finish() {
  if (!profiler_) return;
  const ProfileSummary s = profiler_->finish();
  profiler_.reset();
  std::cerr << "profile: " << s.trace_path
            << " (open it in ui.perfetto.dev, chrome://tracing or TensorBoard), top ops in " << s.table_path << "\n"
            << s.table << std::flush;
}

namespace {

// RANK, WORLD_SIZE and LOCAL_RANK as torchrun sets them; a bad value counts as a single process here (the
// trainer reports it, naming the variable).
DistEnv launch_env() {
  try {
    return dist_env_from_environment();
  } catch (const Error&) {
    return DistEnv{};
  }
}

}  // namespace

bool speaks_for_run() { return launch_env().rank == 0; }

namespace {

// After the ranks joined, an error may be the same on every rank (a file each of them read) or one rank's own.
// The failing ranks of this machine compare their messages through files in a directory named after their
// torchrun agent (the parent process) and the run's port. The lowest rank holding a message prints it; it is
// labelled with its ranks unless every rank of the run failed with it; the other ranks stay silent. Waits are bounded:
// 0.5 s for peers to fail alike, 3 s for the printers (torchrun stops every worker once one exits, so nobody leaves
// before they have printed).
void print_agreed_error(const DistEnv& env, const std::string& label, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec) /
                       ("archspace-errors-" + std::to_string(::getppid()) + "-" + std::to_string(env.master_port));
  const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
  auto put = [&](const std::string& name, const std::string& content) {
    const fs::path tmp = dir / (name + ".tmp");
    std::ofstream(tmp, std::ios::binary) << content;
    fs::rename(tmp, dir / name, ec);
  };
  fs::create_directories(dir, ec);
  if (ec) {  // no shared place: every rank speaks for itself
    std::cerr << label << ": " << who << ": " << text << "\n";
    return;
  }
  put("rank-" + std::to_string(env.rank) + ".msg", text);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::map<int, std::string> messages;  // rank -> message, of the ranks that failed so far
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || !name.ends_with(".msg")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    messages[std::atoi(name.c_str() + 5)] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  messages[env.rank] = text;
  put("read-" + std::to_string(env.rank), "");
  std::vector<int> same;   // ranks with this message, ascending
  std::set<int> printers;  // the lowest rank of each message
  std::set<std::string> seen;
  for (const auto& [rank, message] : messages) {
    if (message == text) same.push_back(rank);
    if (seen.insert(message).second) printers.insert(rank);
  }
  auto wait_for = [&](const std::string& marker, const std::set<int>& ranks) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (int r : ranks) {
      while (!fs::exists(dir / (marker + std::to_string(r))) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  if (same.front() != env.rank) {
    wait_for("printed-", {same.front()});
    return;
  }
  std::string ranks;
  if (static_cast<int>(same.size()) < env.world_size) {
    ranks = same.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < same.size(); ++i) ranks += (i ? ", " : "") + std::to_string(same[i]);
    ranks += " of " + std::to_string(env.world_size) + ": ";
  }
  std::cerr << label << ": " << ranks << text << "\n" << std::flush;
  put("printed-" + std::to_string(env.rank), "");
  const bool first = env.rank == *printers.begin();
  printers.erase(env.rank);
  wait_for("printed-", printers);
  if (first) {  // once every rank seen has read the messages (a rank failing later speaks for itself)
    std::set<int> seen_ranks;
    for (const auto& entry : messages) seen_ranks.insert(entry.first);
    wait_for("read-", seen_ranks);
    fs::remove_all(dir, ec);
  }
}

}  // namespace

void report_error(const std::string& message, const std::string& label) {
  std::string text = message;
  for (const std::string prefix : {label + ": ", std::string("error: ")}) {
    while (text.rfind(prefix, 0) == 0) text.erase(0, prefix.size());
  }
  const DistEnv env = launch_env();
  if (env.world_size > 1) {
    const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
    const bool names_rank = text.rfind(who + ":", 0) == 0;
    if (!names_rank && !joined_process_group()) {
      if (env.rank != 0 && env.local_rank != 0) {
        // Rank 0 on this machine says the same. Leave it time to: torchrun stops every worker once one exits.
        std::this_thread::sleep_for(std::chrono::seconds(2));
        return;
      }
      if (env.rank != 0) text = who + ": " + text;
    } else if (!names_rank) {
      print_agreed_error(env, label, text);
      return;
    }
  }
  std::cerr << label << ": " << text << "\n";
}

void add_model_option(CLI::App* app, std::string& model, const std::string& what, bool required) {
  auto* flag = app->add_option("--model", model, what);
  auto* positional = app->add_option("MODEL", model, "the model, positionally: the same as --model");
  positional->excludes(flag);
  if (required) {
    app->parse_complete_callback([flag, positional] {
      if (flag->count() == 0 && positional->count() == 0) throw CLI::RequiredError("MODEL (or --model MODEL)");
    });
  }
}

void add_skip_checksums_option(CLI::App* app, bool& skip) {
  app->add_flag("--skip-checksums", skip,
                "load a checkpoint without verifying its files against checksums.json (verification reads them all "
                "once more: about 0.6 s a GB on one core)");
}

std::string model_dir_to_use(const std::string& model, bool skip_checksums) {
  const std::string dir = model_dir_for_use(model, !skip_checksums, "--skip-checksums loads it as it is");
  if (skip_checksums && !checkpoint_of_model_dir(dir).empty())
    std::fprintf(stderr, "note: --skip-checksums: %s is loaded without verifying its checksums\n",
                 checkpoint_of_model_dir(dir).c_str());
  return dir;
}

namespace {

// Other tools' names for our flags, with the same meaning (after underscores became dashes). A synonym applies
// only where the command has the target and lacks the synonym itself (eval ppl's own --max-tokens stays).
const std::vector<std::pair<std::string, std::string>>& synonyms() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"num-fewshot", "shots"},          // lm-eval
      {"output-path", "out"},            // lm-eval
      {"output", "out"},                 // lm-eval -o, and many tools
      {"output-dir", "out"},             // transformers' save/Trainer
      {"model-path", "model"},           // many scripts
      {"model-name-or-path", "model"},   // transformers' examples
      {"pretrained", "model"},           // lm-eval's model_args key
      {"max-tokens", "max-new-tokens"},  // vLLM / the OpenAI API
      {"apply-chat-template", "chat"},   // lm-eval
  };
  return table;
}

// Flags of other tools that mean something else here: the hint says what to type instead, where the command
// has the flag it names (`needs`).
struct Hint {
  const char *flag, *needs, *text;
};
const std::vector<Hint>& hints() {
  static const std::vector<Hint> table = {
      {"model-args", "model",
       "lm-eval's --model_args pretrained=PATH,...: give the model as --model PATH (or as MODEL)"},
      {"trust-remote-code", "", "not needed: archspace runs the variant itself"},
      {"bf16", "dtype", "use --dtype bf16"},
      {"fp16", "dtype", "archspace computes in fp32 or bf16: use --dtype bf16"},
      {"max-new-tokens", "max-tokens", "nothing is generated here: --max-tokens N evaluates the first N tokens"},
  };
  return table;
}

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// The long flags (no dashes) of `app` and of the apps above it.
std::vector<std::string> long_flags(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* a = app; a; a = a->get_parent()) {
    for (const CLI::Option* o : a->get_options()) {
      for (const std::string& n : o->get_lnames()) names.push_back(n);
    }
  }
  return names;
}

std::string command_path(const CLI::App* app) {
  std::string path;
  for (const CLI::App* a = app; a; a = a->get_parent()) {
    const std::string name = a->get_parent() ? a->get_name() : "archspace";
    path = path.empty() ? name : name + " " + path;
  }
  return path;
}

}  // namespace

NormalizedArgs normalize_flags(CLI::App& app, int argc, const char* const* argv) {
  NormalizedArgs out;
  CLI::App* current = &app;
  bool literal = false;  // after "--" every word is a value
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (literal || word == "--") {
      literal = true;
      out.args.push_back(word);
      continue;
    }
    if (word.rfind("--", 0) != 0) {
      // A subcommand's name moves on to that subcommand (a value equal to one is rare: eval's are ppl, downstream).
      for (CLI::App* sub : current->get_subcommands([](CLI::App*) { return true; })) {
        if (sub->get_name() == word) {
          current = sub;
          break;
        }
      }
      out.args.push_back(word);
      continue;
    }
    const size_t eq = word.find('=');
    const std::string name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string value = eq == std::string::npos ? "" : word.substr(eq);
    const std::vector<std::string> known = long_flags(current);
    auto has = [&](const std::string& n) { return std::find(known.begin(), known.end(), n) != known.end(); };
    std::string target;
    if (!name.empty() && !has(name)) {
      const std::string d = dashed(name);
      if (has(d)) {
        target = d;
      } else {
        for (const auto& [alias, ours] : synonyms()) {
          if (alias == d && has(ours)) target = ours;
        }
      }
      if (target.empty()) out.unknown.push_back({"--" + name, command_path(current), known});
    }
    out.args.push_back(target.empty() ? word : "--" + target + value);
  }
  return out;
}

std::string explain_unknown_flags(const NormalizedArgs& normalized) {
  std::string text;
  for (const auto& u : normalized.unknown) {
    const std::string name = dashed(u.flag.substr(2));
    std::string advice;
    for (const Hint& h : hints()) {
      if (h.flag == name && (!*h.needs || std::find(u.known.begin(), u.known.end(), h.needs) != u.known.end()))
        advice = h.text;
    }
    if (advice.empty()) {
      // The nearest of the command's flags and of the synonyms it accepts, within a third of the name's length.
      std::vector<std::pair<std::string, std::string>> candidates;  // spelling -> our flag
      for (const auto& k : u.known) candidates.emplace_back(k, k);
      for (const auto& [alias, ours] : synonyms()) {
        if (std::find(u.known.begin(), u.known.end(), ours) != u.known.end()) candidates.emplace_back(alias, ours);
      }
      size_t best = std::max<size_t>(2, name.size() / 3) + 1;
      for (const auto& [spelling, ours] : candidates) {
        const size_t d = edit_distance(name, spelling);
        if (d < best) {
          best = d;
          advice = "did you mean --" + ours + "?";
        }
      }
    }
    text += "unknown flag " + u.flag + " for `" + u.command + "`" + (advice.empty() ? "" : " (" + advice + ")") + "\n";
  }
  return text;
}

std::vector<int64_t> parse_token_ids(const std::string& text, int64_t vocab_size, const std::string& flag) {
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  std::istringstream in(normalized);
  std::vector<int64_t> ids;
  for (std::string word; in >> word;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) throw Error(flag + ": '" + word + "' is not an integer token id");
    if (id < 0 || id >= vocab_size)
      throw Error(flag + ": token id " + word + " is out of range [0, " + std::to_string(vocab_size) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) throw Error(flag + ": no token ids given");
  return ids;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1000000)
    std::snprintf(buf, sizeof(buf), "%.1fM", n / 1e6);
  else if (n >= 1000)
    std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  return buf;
}

void plot_or_warn(const std::string& script, const std::vector<std::string>& args, const std::string& what) {
  std::string why;
  try {
    const int status = run_python_script(script, args);
    if (status == 0) return;
    why = "exit status " + std::to_string(status);
  } catch (const Error& e) {
    why = e.what();
  }
  std::cerr << "warning: " << what << " was not drawn (" << scripts_python() << " " << script << ": " << why << ")\n";
}

}  // namespace archspace::cli
