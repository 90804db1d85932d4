// The subcommands. Each takes the whole argv (argv[1] is the command name), parses
// its own options and returns the process exit code; errors are thrown (cli.hpp).
#pragma once

namespace facli {

int cmd_info(int argc, char** argv);
int cmd_check(int argc, char** argv);
int cmd_bench(int argc, char** argv);

}  // namespace facli
