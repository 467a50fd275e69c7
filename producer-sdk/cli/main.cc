// ferry: the producer-side command-line tool (see `ferry --help`).
#include "commands.h"

int main(int argc, char** argv) { return ferry::cli::RunCli(argc, argv); }
