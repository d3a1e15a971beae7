// The workers' command lines: torchrun's rules for -m, *.py and --no-python, the
// interpreter, and --local-rank-arg.
#include "run/program.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace chorus::run {
namespace {

using Args = std::vector<std::string>;

LaunchOptions given(const std::string& program, const Args& args = {}) {
  LaunchOptions o;
  o.program = program;
  o.program_args = args;
  o.python = "/opt/py/bin/python3";
  return o;
}

TEST(WorkerCommand, ScriptEndingInDotPyRunsWithTheInterpreter) {
  EXPECT_EQ(worker_command(given("train.py", {"--lr", "1"}), 0),
            (Args{"/opt/py/bin/python3", "-u", "train.py", "--lr", "1"}));
}

TEST(WorkerCommand, ModuleRunsAsPythonDashM) {
  LaunchOptions o = given("pkg.train", {"x"});
  o.module = true;
  EXPECT_EQ(worker_command(o, 0), (Args{"/opt/py/bin/python3", "-u", "-m", "pkg.train", "x"}));
}

TEST(WorkerCommand, OtherProgramsAndNoPythonRunThemselves) {
  EXPECT_EQ(worker_command(given("/usr/bin/python3", {"train.py"}), 0),
            (Args{"/usr/bin/python3", "train.py"}));
  EXPECT_EQ(worker_command(given("./prog", {"a"}), 0), (Args{"./prog", "a"}));
  EXPECT_EQ(worker_command(given("train.pyc"), 0), (Args{"train.pyc"}));
  LaunchOptions o = given("tool.py", {"a"});
  o.no_python = true;
  EXPECT_EQ(worker_command(o, 0), (Args{"tool.py", "a"}));
}

TEST(WorkerCommand, LocalRankArgumentComesLast) {
  LaunchOptions o = given("train.py", {"--lr", "1"});
  o.local_rank_arg = true;
  EXPECT_EQ(worker_command(o, 3),
            (Args{"/opt/py/bin/python3", "-u", "train.py", "--lr", "1", "--local_rank=3"}));
  o.local_rank_arg = false;
  EXPECT_EQ(worker_command(o, 3).back(), "1");
}

TEST(WorkerCommand, DefaultInterpreterIsTheSystemPythonWhenItExists) {
  LaunchOptions o = given("train.py");
  o.python.clear();
  std::string expected = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  EXPECT_EQ(python_interpreter(o), expected);
  EXPECT_EQ(worker_command(o, 0).front(), expected);
}

}  // namespace
}  // namespace chorus::run
