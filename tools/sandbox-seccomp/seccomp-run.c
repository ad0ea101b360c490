/*
 * sap-seccomp-run: runs a program under a seccomp filter written by sap-seccomp-gen, the way the
 * sandbox helpers load it (seccomp-load.h). For tests, and for operators trying the filter:
 *
 *   sap-seccomp-run .tools/lib/sap-seccomp.bpf -- PROGRAM [ARG]...
 *
 * Sets no_new_privs, installs the filter, and execs PROGRAM (looked up in PATH). Nothing else changes:
 * same user, capabilities, namespaces and environment.
 *
 * Exit status: PROGRAM's; 125 when the filter cannot be loaded or the usage is wrong, 126 when PROGRAM
 * cannot be executed, 127 when it is not found (as env and the sandbox helpers do).
 */
#define _GNU_SOURCE
#include "seccomp-load.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 4 || strcmp(argv[2], "--") != 0) {
    fprintf(stderr, "usage: sap-seccomp-run FILTER.bpf -- PROGRAM [ARG]...\n");
    return 125;
  }
  char err[512];
  if (sap_load_seccomp(argv[1], err, sizeof err) < 0) {
    fprintf(stderr, "sap-seccomp-run: %s\n", err);
    return 125;
  }
  execvp(argv[3], argv + 3);
  int e = errno;
  fprintf(stderr, "sap-seccomp-run: %s: %s\n", argv[3], strerror(e));
  return e == ENOENT ? 127 : 126;
}
