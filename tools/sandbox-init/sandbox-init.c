/*
 * sap-sandbox-init: starts a sandbox's init with one exec instead of `sh` + `mount` + `mount`.
 *
 *   sap-sandbox-init [-c CGROUP_PROCS_FILE]... [-o SOURCE TARGET OPTIONS]... -- PROGRAM [ARG]...
 *
 * Moves itself into each cgroup (writes its pid into the `cgroup.procs` file; a file that cannot be
 * written is skipped), mounts each overlay (`mount -t overlay SOURCE TARGET -o OPTIONS`), then execs
 * PROGRAM (looked up in PATH) with the remaining arguments and the same open file descriptors.
 * The sandbox host (sandbox/bwrap.ts) runs it with bwrap as PROGRAM. Exits 1 with a message on stderr
 * when a mount or the exec fails, 2 on bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

static void join_cgroup(const char *file, const char *pid, size_t len) {
  int fd = open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, pid, len) < 0) { /* controller absent or not writable: skipped, as documented */ }
  close(fd);
}

int main(int argc, char **argv) {
  char pid[32];
  int pidlen = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  int i = 1;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) { i++; break; }
    if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
      join_cgroup(argv[i + 1], pid, (size_t)pidlen);
      i += 1;
    } else if (strcmp(argv[i], "-o") == 0 && i + 3 < argc) {
      if (mount(argv[i + 1], argv[i + 2], "overlay", 0, argv[i + 3]) != 0) {
        fprintf(stderr, "sap-sandbox-init: mount overlay on %s: %s\n", argv[i + 2], strerror(errno));
        return 1;
      }
      i += 3;
    } else {
      fprintf(stderr, "sap-sandbox-init: bad argument %s\nusage: sap-sandbox-init [-c FILE]... [-o SOURCE TARGET OPTIONS]... -- PROGRAM [ARG]...\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "sap-sandbox-init: no program to run\n");
    return 2;
  }
  execvp(argv[i], argv + i);
  fprintf(stderr, "sap-sandbox-init: exec %s: %s\n", argv[i], strerror(errno));
  return 1;
}
