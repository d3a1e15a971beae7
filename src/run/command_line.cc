// chorusrun's command line, parsed with CLI11 into given values (option_table.h).
#include <CLI/CLI.hpp>
#include <algorithm>

#include "chorus/version.h"
#include "run/option_table.h"
#include "run/options.h"

namespace chorus::run {
namespace {

// In "--opt VALUE", a VALUE like "--nnodes", "-h" or "-m" is far more likely a forgotten
// value than a real one (argparse refuses it too); "--opt=--odd" still gives such a value.
bool looks_like_option(const std::string& arg) {
  return arg.rfind("--", 0) == 0 || arg == "-h" || (arg.size() == 2 && find_spec(arg) != nullptr);
}

void check_value_follows(const std::vector<std::string>& args, size_t i, const OptionSpec& spec) {
  std::string needs = args[i] + ": needs a value (" + std::string(spec.value_name) + ")";
  if (i + 1 == args.size()) throw UsageError(needs);
  if (looks_like_option(args[i + 1])) {
    throw UsageError(needs + " before " + args[i + 1] + "; to give that as the value, write " +
                     args[i] + "=VALUE");
  }
}

// CLI11 reads "--opt=" (nothing after '=') as "value not here" and takes the next
// argument, which would swallow the program; so that form becomes "--opt ''". A missing
// value gets a message that names the option, instead of CLI11's.
std::vector<std::string> with_explicit_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.rfind("-", 0) != 0) break;  // the program
    size_t equals = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
    const OptionSpec* spec = find_spec(std::string_view(arg).substr(0, equals));
    if (spec == nullptr || spec->value_name.empty()) {
      out.push_back(arg);  // a flag, or unknown: CLI11 handles both
    } else if (equals == std::string::npos) {
      check_value_follows(args, i, *spec);
      out.insert(out.end(), {arg, args[++i]});
    } else if (equals + 1 == arg.size()) {
      out.insert(out.end(), {arg.substr(0, equals), ""});
    } else {
      out.push_back(arg);
    }
  }
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

void run_parser(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested();
  } catch (const CLI::CallForVersion&) {
    throw VersionRequested();
  } catch (const CLI::ExtrasError&) {
    throw UsageError("unknown option " + app.remaining().front() +
                     " (chorusrun --help lists the options)");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CLI::App app{"chorusrun"};
  // The first positional is the program: everything after it is the program's own,
  // even when it looks like one of our options.
  app.positionals_at_end();
  std::map<std::string, CLI::Option*> options;
  for (const OptionSpec& spec : kOptions) {
    std::string names = dashed_flag(spec) + ",--" + member_name(spec);
    if (!spec.short_flag.empty()) names = std::string(spec.short_flag) + "," + names;
    options[member_name(spec)] =
        spec.value_name.empty()
            ? app.add_flag(names)
            : app.add_option(names)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  app.set_version_flag("--version", CHORUS_VERSION);
  CommandLine line;
  app.add_option("program", line.program);
  app.add_option("args", line.program_args);
  run_parser(app, with_explicit_values(args));
  for (const OptionSpec& spec : kOptions) {
    const CLI::Option* option = options.at(member_name(spec));
    // The last one wins, as in torchrun; a bare flag's result is "true".
    if (option->count() > 0)
      line.given[member_name(spec)] = {option->results().back(), dashed_flag(spec)};
  }
  return line;
}

}  // namespace chorus::run
