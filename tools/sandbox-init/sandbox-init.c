/*
 * sap-sandbox-init: starts a sandbox's init with one exec instead of `sh` + `mount` + `mount`.
 *
 *   sap-sandbox-init [-c CGROUP_PROCS]... [-d DIR]... [-l LOG] [-n] [-o SOURCE TARGET OPTIONS]... -- PROGRAM [ARG]...
 *   sap-sandbox-init -w [-s SOCKET ID] [-c CGROUP_PROCS]...   (the rest of the arguments come later)
 *
 * In order: moves itself into each cgroup (writes its pid into the `cgroup.procs` file), creates each
 * directory (an existing one is fine), sends stdout and stderr to LOG (appended), with -n moves into a
 * mount namespace of its own whose mounts are all private (nothing it mounts afterwards propagates
 * back to the host's namespace), mounts each overlay (`mount -t overlay SOURCE TARGET -o OPTIONS`),
 * then execs PROGRAM (looked up in PATH) with the remaining arguments. The sandbox host
 * (sandbox/bwrap.ts) runs it with -n and bwrap as PROGRAM: bwrap builds the sandbox from that
 * namespace, so the overlays never appear in the host's mount table and vanish with the sandbox's
 * last process.
 *
 * With -w it prepares ahead of a request: it joins the cgroups, writes "ready\n" to stdout, then reads
 * the remaining arguments from stdin, each ended by a NUL byte, until end of file, and goes on as above.
 * Joining a cgroup waits for an RCU grace period in the kernel (5-15 ms); done ahead, it is off the
 * path of a create. An empty stdin (the host went away) makes it exit 0 without doing anything.
 *
 * With -s (and -w) it talks over a unix stream socket instead of stdin and stdout, so that it can be
 * started by a process other than the host (the host's spawner) and still reach the host: once in its
 * cgroups it connects to SOCKET, writes "ready ID\n", reads the remaining arguments from the socket
 * until the host shuts down its side, and leaves the socket as descriptor 3 for what it execs (bwrap
 * writes its --info-fd 3 there, so the host learns the sandbox's pid over the same connection).
 *
 * Exits 1 with a message on stderr when a step fails, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what, const char *arg) {
  fprintf(stderr, "sap-sandbox-init: %s %s: %s\n", what, arg, strerror(errno));
  return 1;
}

static int usage(const char *arg) {
  fprintf(stderr,
          "sap-sandbox-init: bad argument %s\n"
          "usage: sap-sandbox-init [-w] [-c FILE]... [-d DIR]... [-l LOG] [-n] [-o SOURCE TARGET OPTIONS]... -- PROGRAM [ARG]...\n",
          arg);
  return 2;
}

static int join_cgroup(const char *file) {
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  int fd = open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fail("join cgroup", file);
  if (write(fd, pid, (size_t)len) != len) {
    int e = errno;
    close(fd);
    errno = e;
    return fail("join cgroup", file);
  }
  close(fd);
  return 0;
}

/* Runs the options in args[0..n) in order; on "--" execs the program that follows. Returns an exit code. */
static int run(char **args, int n, int allow_exec) {
  for (int i = 0; i < n; i++) {
    const char *a = args[i];
    if (strcmp(a, "--") == 0) {
      if (!allow_exec) return usage(a);
      if (i + 1 >= n) return usage("(no program)");
      args[n] = NULL;
      execvp(args[i + 1], args + i + 1);
      return fail("exec", args[i + 1]);
    } else if (strcmp(a, "-c") == 0 && i + 1 < n) {
      if (join_cgroup(args[++i])) return 1;
    } else if (strcmp(a, "-d") == 0 && i + 1 < n) {
      if (mkdir(args[++i], 0755) != 0 && errno != EEXIST) return fail("mkdir", args[i]);
    } else if (strcmp(a, "-l") == 0 && i + 1 < n) {
      int fd = open(args[++i], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) return fail("open", args[i]);
      if (dup2(fd, 1) < 0 || dup2(fd, 2) < 0) return fail("redirect to", args[i]);
      close(fd);
    } else if (strcmp(a, "-n") == 0) {
      if (unshare(CLONE_NEWNS) != 0) return fail("unshare", "mount namespace");
      if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("make private", "/");
    } else if (strcmp(a, "-o") == 0 && i + 3 < n) {
      if (mount(args[i + 1], args[i + 2], "overlay", 0, args[i + 3]) != 0) return fail("mount overlay on", args[i + 2]);
      i += 3;
    } else {
      return usage(a);
    }
  }
  return allow_exec ? usage("(no program)") : 0;
}

/* Reads `fd` to its end and splits it at NUL bytes; returns the number of arguments (-1 on error). */
static int read_args(int fd, char ***out) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  if (!buf) return -1;
  for (;;) {
    if (len == cap) {
      char *bigger = realloc(buf, cap *= 2);
      if (!bigger) return -1;
      buf = bigger;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    len += (size_t)r;
  }
  if (len > 0 && buf[len - 1] != '\0') {
    errno = EINVAL;
    return -1;
  }
  int n = 0;
  for (size_t i = 0; i < len; i++) n += buf[i] == '\0';
  char **args = calloc((size_t)n + 1, sizeof *args);
  if (!args) return -1;
  size_t start = 0;
  for (int k = 0; k < n; k++) {
    args[k] = buf + start;
    start += strlen(buf + start) + 1;
  }
  *out = args;
  return n;
}

/* Connects to the unix socket at `path`; returns the descriptor (not close-on-exec), -1 on error. */
static int connect_to(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int write_all(int fd, const char *text) {
  size_t len = strlen(text);
  while (len > 0) {
    ssize_t w = write(fd, text, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    text += w;
    len -= (size_t)w;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-w") == 0) {
    const char *sock_path = NULL, *id = "";
    int first = 2;
    if (argc > 4 && strcmp(argv[2], "-s") == 0) {
      sock_path = argv[3];
      id = argv[4];
      first = 5;
    }
    int code = run(argv + first, argc - first, 0);
    if (code) return code;
    int in = 0;
    if (sock_path) {
      int sock = connect_to(sock_path);
      if (sock < 0) return fail("connect to", sock_path);
      char line[256];
      snprintf(line, sizeof line, "ready %s\n", id);
      if (write_all(sock, line) != 0) return fail("write", "ready");
      /* Descriptor 3 for bwrap's --info-fd; read from it until the host shuts down its side. */
      if (sock != 3) {
        if (dup2(sock, 3) < 0) return fail("dup", "socket");
        close(sock);
      }
      in = 3;
    } else if (write(1, "ready\n", 6) != 6) {
      return fail("write", "ready");
    }
    char **args = NULL;
    int n = read_args(in, &args);
    if (n < 0) return fail("read", "arguments");
    if (n == 0) return 0;
    if (!sock_path) {
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull < 0 || dup2(devnull, 0) < 0) return fail("open", "/dev/null");
      close(devnull);
    }
    return run(args, n, 1);
  }
  return run(argv + 1, argc - 1, 1);
}
