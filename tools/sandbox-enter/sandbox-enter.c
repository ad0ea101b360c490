/*
 * sap-sandbox-enter: runs one command inside a live sandbox with one exec, instead of
 * `sh` + `nsenter` + `setpriv` + `env` + `timeout`.
 *
 *   sap-sandbox-enter [-c CGROUP_PROCS]... -n PID -S SECCOMP_FILE [-w DIR] [-e NAME=VALUE]... [-E COUNT] [-g]
 *                     [-t SECONDS [-k SECONDS]] [-x EXIT_FILE] [-L INDEX_FILE | -T ROWSxCOLS] [-P CALLER_PID]
 *                     [-R RUN_FILE] [-u UID] -- PROGRAM [ARG]...
 *
 *   -c FILE   join this cgroup: writes the helper's pid into FILE (a `cgroup.procs`); a controller
 *             that is missing or refuses is skipped, as the shell's `2>/dev/null` did.
 *   -n PID    enter the namespaces (user first, then cgroup, ipc, uts, net, pid, mnt) and the root
 *             directory of PID (a sandbox's pid 1, see tools/sandbox-init), as root of its user namespace.
 *   -S FILE   the seccomp filter every process of the sandbox gets (required with -n).
 *   -w DIR    working directory of the command (inside the root); the command is not started when
 *             it does not exist (exit 125, like `env -C`). Default: the root directory.
 *   -e N=V    the command's environment is exactly these pairs (nothing of the caller's is kept).
 *   -E COUNT  and, after the -e pairs, COUNT pairs taken from the helper's own environment: the
 *             variables SAP_ENV_0 .. SAP_ENV_<COUNT-1>, each "NAME=VALUE". Unlike -e, values do not
 *             show in the host's process list (/proc/PID/cmdline is world-readable, /proc/PID/environ
 *             only to its owner); the helper wipes its environment at start (a later read of its
 *             /proc/PID/environ gets zeros) and its copy once the command is forked. Numbered names,
 *             not the pairs' own: the helper's loader never sees a sandbox's LD_* or GLIBC_TUNABLES.
 *   -g        the command leads a process group of its own (what GNU timeout does); the signals the
 *             helper forwards, and those of the timeout, go to that whole group. Without -g the
 *             command stays in the helper's process group, and the caller signals that group
 *             (`kill -- -PID`): the helper then forwards nothing (the command would get each signal
 *             twice) and keeps waiting for the command's own status.
 *   -t SECS   timeout (decimals allowed; 0: none): then SIGTERM, and SIGKILL -k SECS later (0: never).
 *   -x FILE   when the command has ended, write its status ("<code>\n", one write) into FILE. FILE
 *             is created (emptied) at start, before entering, since it is a path of the caller's.
 *   -L FILE   relay the command's stdout and stderr: they are pipes to the helper, which appends what
 *             it reads to its own stdout and stderr (the caller's files) and records each chunk in
 *             FILE, in the order read: 24 bytes each, little-endian: stream (1 stdout, 2 stderr),
 *             3 zero bytes, length (u32), offset of the chunk in its stream's file (u64), wall
 *             clock in ms (u64). So the two streams can be put back in order from the tails of the
 *             files. When the command ends, what is still in the pipes is relayed (at most 16 MiB);
 *             processes it left behind then write to closed pipes. FILE is created (emptied) at start.
 *   -P PID    the caller's pid (the helper's parent): when the caller dies, the command is hung up,
 *             as a terminal's would be: SIGHUP (and SIGCONT) to its process group (with or without
 *             -g). A command that ignores SIGHUP (nohup) runs on; its status is still waited for.
 *             Nothing starts when the caller is already gone. Exec sessions live in the sandbox
 *             host's memory: this ends them with the host instead of leaving them unattended.
 *   -R FILE   claim the start of this run before anything else (entrypoints: a run starts at most
 *             once). The caller has written FILE.pending; the helper writes its pid into it
 *             ("<pid>\n"), fsyncs it, renames it to FILE (atomic, never over an existing FILE) and
 *             fsyncs the directory: FILE on disk is the durable mark that this run started. When
 *             FILE.pending is gone (a restarted caller cancelled the run by renaming it away, or the
 *             sandbox is gone), nothing is started and nothing is written (exit 125, no message:
 *             stderr may be the log of another run). So the caller and the helper decide who wins
 *             with one rename each, and a cancelled run can never start later.
 *   -u UID    run the command as this user of the sandbox (uid and gid UID, supplementary group UID),
 *             with no capabilities, and without no_new_privs: the seccomp filter is installed while
 *             still root of the sandbox's user namespace (which may install one without no_new_privs),
 *             then the ids change. So a setuid-root program of the sandbox (sudo) can make it sandbox
 *             root again, with the capabilities and the filter a root command has: nothing more. The
 *             working directory (-w) is entered as the user. Default: sandbox root.
 *   -T ROWSxCOLS  run the command on a pseudo-terminal of the sandbox's own devpts (its /dev/pts/ptmx,
 *             opened after entering its namespaces, so the terminal is one of the sandbox's): the
 *             command gets a new session with the terminal's slave as controlling terminal and as
 *             stdin, stdout and stderr; the helper relays its own stdin to the terminal and the
 *             terminal's output to its own stdout, and reads window sizes ("ROWS COLS\n") from fd 3
 *             (TIOCSWINSZ: the command's foreground group gets SIGWINCH). Not with -L.
 *
 * Steps: join the cgroups; raise its oom_score_adj to 500 (inherited by the command: the OOM killer's
 * first choice); read the seccomp filter; open the exit file, /proc/PID/ns/... and
 * /proc/PID/root; enter the namespaces, the user namespace first (the others belong to it); fork
 * (entering a pid namespace takes effect for children only). The child becomes root of the user
 * namespace (host ids BASE, see sandbox-init), moves to the root (fchdir + chroot) and to DIR, makes
 * keeps the capability set of a container's root (tools/sandbox-common), sets
 * no_new_privs and the seccomp filter, resets signal dispositions and mask, sets the environment and
 * execs PROGRAM (PATH lookup with the given PATH, like `env`). It is killed (SIGKILL) if the helper
 * dies before it.
 *
 * The helper waits for the command (with -g forwarding SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and
 * SIGUSR2 to it), and ends the way the command did: its exit code, or, when a signal killed it, the same
 * signal (as nsenter does; the exit file then says 128 + signal, what a shell's `$?` says). After a
 * timeout the status is GNU timeout's: 124, or 137 when SIGKILL was needed.
 *
 * Statuses of its own: 125 when the helper or the setup of the command fails (message on stderr),
 * 126 when PROGRAM cannot be executed, 127 when it is not found.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include "../sandbox-common/isolation.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define EXIT_SETUP 125
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND 127
#define EXIT_TIMEDOUT 124

static const char *const NS_NAMES[] = {"user", "cgroup", "ipc", "uts", "net", "pid", "mnt"};
static const int NS_TYPES[] = {CLONE_NEWUSER, CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS};
#define NS_COUNT (sizeof NS_TYPES / sizeof NS_TYPES[0])

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define FORWARDED_COUNT (sizeof FORWARDED / sizeof FORWARDED[0])

struct options {
  char **cgroups;
  int ncgroups;
  char **envs;
  int nenvs;
  int env_owned; /* -E: envs[env_owned..nenvs) are the helper's copies, wiped once forked */
  long ns_pid; /* 0: do not enter */
  const char *cwd;
  const char *exit_file;
  const char *log_index;
  const char *seccomp_file;
  const char *run_file;
  struct sock_fprog seccomp;
  double timeout, kill_after;
  int own_group;
  long caller; /* -P: 0 when not given */
  long run_uid; /* -u: 0 (root) when not given */
  unsigned short rows, cols; /* -T: 0 when not given */
  char **argv;
};

static void warn_errno(const char *what, const char *arg) {
  fprintf(stderr, "sap-sandbox-enter: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(errno));
}

static int usage(const char *arg) {
  fprintf(stderr,
          "sap-sandbox-enter: bad argument %s\n"
          "usage: sap-sandbox-enter [-c CGROUP_PROCS]... -n PID -S SECCOMP_FILE [-w DIR] [-e NAME=VALUE]... [-E COUNT] [-g]\n"
          "                         [-t SECONDS [-k SECONDS]] [-x EXIT_FILE] [-L INDEX_FILE | -T ROWSxCOLS] [-P CALLER_PID]\n"
          "                         [-R RUN_FILE] [-u UID] -- PROGRAM [ARG]...\n",
          arg);
  return EXIT_SETUP;
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= 0) || v > 1e9) return -1;
  *out = v;
  return 0;
}

static int parse_pid(const char *s, long *out) {
  char *end;
  errno = 0;
  long pid = strtol(s, &end, 10);
  if (errno || end == s || *end || pid <= 0 || pid > INT_MAX) return -1;
  *out = pid;
  return 0;
}

/* -E: COUNT pairs from SAP_ENV_<n> appended to the command's environment; then the whole environment is wiped. */
static int take_env(struct options *o, long count) {
  extern char **environ;
  char **envs = realloc(o->envs, ((size_t)o->nenvs + (size_t)count + 1) * sizeof *envs);
  if (!envs) return usage("(out of memory)");
  o->envs = envs;
  o->env_owned = o->nenvs;
  for (long k = 0; k < count; k++) {
    char name[32];
    snprintf(name, sizeof name, "SAP_ENV_%ld", k);
    const char *v = getenv(name);
    if (!v || !strchr(v, '=') || v[0] == '=') return usage(name);
    if (!(o->envs[o->nenvs++] = strdup(v))) return usage("(out of memory)");
  }
  o->envs[o->nenvs] = NULL;
  for (char **e = environ; e && *e; e++) explicit_bzero(*e, strlen(*e));
  static char *empty[] = {NULL};
  environ = empty;
  return 0;
}

/* -E: the helper's copies of the pairs, once the command has its own. */
static void wipe_env(struct options *o) {
  for (int k = o->env_owned; k < o->nenvs; k++) explicit_bzero(o->envs[k], strlen(o->envs[k]));
}

static int parse_args(int argc, char **argv, struct options *o) {
  long env_count = 0;
  memset(o, 0, sizeof *o);
  o->cgroups = calloc((size_t)argc, sizeof *o->cgroups);
  o->envs = calloc((size_t)argc + 1, sizeof *o->envs);
  if (!o->cgroups || !o->envs) return usage("(out of memory)");
  o->env_owned = argc + 1;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0' || a[2] != '\0') return usage(a);
    if (a[1] == 'g') {
      o->own_group = 1;
      continue;
    }
    if (!v) return usage(a);
    i++;
    switch (a[1]) {
      case 'c': o->cgroups[o->ncgroups++] = argv[i]; break;
      case 'e':
        if (!strchr(v, '=') || v[0] == '=') return usage(v);
        o->envs[o->nenvs++] = argv[i];
        break;
      case 'E': if (parse_pid(v, &env_count) || env_count > 65536) return usage(v); break;
      case 'n': if (parse_pid(v, &o->ns_pid)) return usage(v); break;
      case 'w': o->cwd = v; break;
      case 'x': o->exit_file = v; break;
      case 'L': o->log_index = v; break;
      case 'S': o->seccomp_file = v; break;
      case 'R': o->run_file = v; break;
      case 't': if (parse_seconds(v, &o->timeout)) return usage(v); break;
      case 'k': if (parse_seconds(v, &o->kill_after)) return usage(v); break;
      case 'P': if (parse_pid(v, &o->caller)) return usage(v); break;
      case 'u': if (parse_pid(v, &o->run_uid) || o->run_uid >= SAP_ID_COUNT) return usage(v); break;
      case 'T': {
        unsigned r, c;
        char x;
        if (sscanf(v, "%ux%u%c", &r, &c, &x) != 2 || r < 1 || c < 1 || r > 1000 || c > 1000) return usage(v);
        o->rows = (unsigned short)r;
        o->cols = (unsigned short)c;
        break;
      }
      default: return usage(a);
    }
  }
  if (i >= argc) return usage("(no program)");
  if (o->ns_pid && !o->seccomp_file) return usage("(-n without -S)");
  if (o->rows && o->log_index) return usage("(-T with -L)");
  o->argv = argv + i;
  return env_count ? take_env(o, env_count) : 0;
}

static void join_cgroups(const struct options *o) {
  char pid[24];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  for (int k = 0; k < o->ncgroups; k++) {
    int fd;
    do fd = open(o->cgroups[k], O_WRONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) continue; /* controller missing: skipped */
    (void)sap_write_all(fd, pid, (size_t)len);
    close(fd);
  }
}

static int open_at_pid(long pid, const char *name, int flags) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%ld/%s", pid, name);
  int fd;
  do fd = open(p, flags | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) warn_errno("open", p);
  return fd;
}

/*
 * -R: claims the run (see the usage above). Returns 0 when claimed, -1 when the run was cancelled
 * or cannot be claimed (then the helper exits without a trace).
 */
static int claim_run(const char *run_file) {
  size_t len = strlen(run_file);
  char pending[PATH_MAX];
  if (len + sizeof ".pending" > sizeof pending) return -1;
  memcpy(pending, run_file, len);
  memcpy(pending + len, ".pending", sizeof ".pending");
  int fd;
  do fd = open(pending, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  char line[24];
  int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
  int ok = ftruncate(fd, 0) == 0 && sap_write_all(fd, line, (size_t)n) == 0 && fsync(fd) == 0;
  close(fd);
  if (!ok) return -1;
  /* The one step that decides: the caller's cancel renames FILE.pending away just the same. */
  if (syscall(SYS_renameat2, AT_FDCWD, pending, AT_FDCWD, run_file, 1 /* RENAME_NOREPLACE */) != 0) return -1;
  char dir[PATH_MAX];
  memcpy(dir, run_file, len + 1);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  else strcpy(dir, ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return 0;
}

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * -u: the command's last steps as a user of the sandbox. The filter first, while root of the user
 * namespace (CAP_SYS_ADMIN there lets a task install one without no_new_privs); then the root's
 * capability set (the bounding set is what a setuid-root program gets back); then the ids, which
 * empty the permitted and effective sets; then the inheritable set emptied too. The ids change
 * clears the parent-death signal: it is set again, and the command does not start if the helper
 * (its parent, outside the sandbox's pid namespace) has gone meanwhile.
 */
static int lock_down_as_user(const struct sock_fprog *seccomp, const char *seccomp_file, uid_t uid, char *err, size_t errlen) {
  pid_t parent = getppid();
#ifdef SYS_seccomp
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, seccomp) != 0) {
#else
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, seccomp, 0, 0) != 0) {
#endif
    snprintf(err, errlen, "install the seccomp filter %s for user %u: %s", seccomp_file, (unsigned)uid, strerror(errno));
    return -1;
  }
  if (sap_drop_capabilities(err, errlen) != 0) return -1;
  gid_t groups[1] = {(gid_t)uid};
  if (setgroups(1, groups) != 0 || setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0 || setresuid(uid, uid, uid) != 0) {
    snprintf(err, errlen, "become user %u of the sandbox: %s", (unsigned)uid, strerror(errno));
    return -1;
  }
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct none[2];
  memset(none, 0, sizeof none);
  if (syscall(SYS_capset, &hdr, none) != 0) {
    snprintf(err, errlen, "clear the capabilities of user %u: %s", (unsigned)uid, strerror(errno));
    return -1;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) _exit(EXIT_SETUP);
  return 0;
}

/* The command's side of the fork: never returns. */
static void run_child(const struct options *o, int root_fd, int alive_fd, int tty_fd) {
  if (tty_fd >= 0) {
    /* A session of its own, with the terminal as its controlling terminal and stdio. */
    if (setsid() < 0 || dup2(tty_fd, 0) < 0 || dup2(tty_fd, 1) < 0 || dup2(tty_fd, 2) < 0 || ioctl(0, TIOCSCTTY, 0) != 0) {
      warn_errno("take the terminal", NULL);
      _exit(EXIT_SETUP);
    }
    if (tty_fd > 2) close(tty_fd);
  } else if (o->own_group) {
    setpgid(0, 0);
  }
  /* Killed if the helper dies; the pipe tells whether it died before this was set. */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  struct pollfd p = {.fd = alive_fd, .events = POLLIN};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLIN))) _exit(EXIT_SETUP);
  close(alive_fd);
  char err[256];
  if (sap_become_root(err, sizeof err) != 0) {
    fprintf(stderr, "sap-sandbox-enter: %s\n", err);
    _exit(EXIT_SETUP);
  }
  if (fchdir(root_fd) != 0 || chroot(".") != 0) {
    warn_errno("enter the sandbox's root", NULL);
    _exit(EXIT_SETUP);
  }
  close(root_fd);
  if (!o->cwd && chdir("/") != 0) _exit(EXIT_SETUP);
  /* As root, the working directory first; as a user (-u), after the ids change, with the user's rights. */
  if (o->cwd && !o->run_uid && chdir(o->cwd) != 0) {
    warn_errno("cannot change directory to", o->cwd);
    _exit(EXIT_SETUP);
  }
  if (o->run_uid ? lock_down_as_user(&o->seccomp, o->seccomp_file, (uid_t)o->run_uid, err, sizeof err) != 0
                 : sap_lock_down(&o->seccomp, o->seccomp_file, err, sizeof err) != 0) {
    fprintf(stderr, "sap-sandbox-enter: %s\n", err);
    _exit(EXIT_SETUP);
  }
  if (o->cwd && o->run_uid && chdir(o->cwd) != 0) {
    warn_errno("cannot change directory to", o->cwd);
    _exit(EXIT_SETUP);
  }
  /* Nothing of the helper's signal handling reaches the command. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; s++) {
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  extern char **environ;
  environ = o->envs;
  execvp(o->argv[0], o->argv);
  int e = errno;
  warn_errno(o->argv[0], NULL);
  _exit(e == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN);
}

/* -L: one of the command's output pipes, the file it goes to, and its stream number in the index. */
struct relay {
  int in;
  int out;
  unsigned char stream;
};

static void put_le(unsigned char *p, unsigned long long v, int n) {
  for (int k = 0; k < n; k++) p[k] = (unsigned char)(v >> (8 * k));
}

/* Moves one chunk from the pipe to its file and records it; returns the bytes moved (0: nothing). */
static ssize_t relay_once(struct relay *r, int index_fd) {
  static char buf[65536];
  if (r->in < 0) return 0;
  ssize_t n;
  do n = read(r->in, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return 0;
  if (n <= 0) {
    close(r->in);
    r->in = -1;
    return 0;
  }
  if (sap_write_all(r->out, buf, (size_t)n) != 0) return n; /* the file is gone or full: dropped */
  off_t end = lseek(r->out, 0, SEEK_CUR);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned char rec[24] = {0};
  rec[0] = r->stream;
  put_le(rec + 4, (unsigned long long)n, 4);
  put_le(rec + 8, end >= n ? (unsigned long long)(end - n) : 0ULL, 8);
  put_le(rec + 16, (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)(ts.tv_nsec / 1000000), 8);
  (void)sap_write_all(index_fd, (const char *)rec, sizeof rec);
  return n;
}

/* Sends sig to the command (its process group with -g). */
static void signal_child(const struct options *o, pid_t child, int sig) {
  if (o->own_group && kill(-child, sig) == 0) return;
  kill(child, sig);
}

/* Ends this process the way the command ended. */
static int finish(int status, int timed_out, int exit_fd) {
  int code;
  if (WIFEXITED(status)) code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) code = 128 + WTERMSIG(status);
  else code = 1;
  if (timed_out) code = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 128 + SIGKILL : EXIT_TIMEDOUT;
  if (exit_fd >= 0) {
    char line[24];
    int len = snprintf(line, sizeof line, "%d\n", code);
    if (sap_write_all(exit_fd, line, (size_t)len) != 0) warn_errno("write the exit file", NULL);
    close(exit_fd);
  }
  if (!timed_out && WIFSIGNALED(status)) {
    /* Die of the same signal, without a core dump of the helper. */
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
  }
  return code;
}

/*
 * -T: moves what is ready between the caller and the terminal: keystrokes from fd 0 to the master,
 * output from the master to fd 1, window sizes ("ROWS COLS\n" lines) from the control fd. A side that
 * ends (EOF, EIO once the terminal has no slave holder left) is set to -1 and no longer polled.
 */
static void pump_terminal(const struct pollfd *pf, int *in, int master, int *master_poll, int *ctl) {
  static char buf[65536];
  ssize_t n;
  if (*in >= 0 && pf[3].revents) {
    do n = read(*in, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n > 0) (void)sap_write_all(master, buf, (size_t)n);
    else if (n == 0 || errno != EAGAIN) *in = -1;
  }
  if (*master_poll >= 0 && pf[4].revents) {
    do n = read(master, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n > 0) (void)sap_write_all(1, buf, (size_t)n);
    else if (n == 0 || errno != EAGAIN) *master_poll = -1; /* EIO: no process holds the terminal any more */
  }
  if (*ctl >= 0 && pf[5].revents) {
    static char line[128];
    static size_t used;
    do n = read(*ctl, line + used, sizeof line - 1 - used);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
      if (n == 0 || errno != EAGAIN) *ctl = -1;
      return;
    }
    used += (size_t)n;
    line[used] = '\0';
    char *nl;
    while ((nl = strchr(line, '\n')) != NULL) {
      unsigned r, c;
      if (sscanf(line, "%u %u", &r, &c) == 2 && r >= 1 && c >= 1 && r <= 1000 && c <= 1000) {
        struct winsize ws = {.ws_row = (unsigned short)r, .ws_col = (unsigned short)c};
        ioctl(master, TIOCSWINSZ, &ws);
      }
      size_t rest = used - (size_t)(nl + 1 - line);
      memmove(line, nl + 1, rest);
      used = rest;
      line[used] = '\0';
    }
    if (used == sizeof line - 1) used = 0; /* a line too long: dropped */
  }
}

int main(int argc, char **argv) {
  struct options o;
  int bad = parse_args(argc, argv, &o);
  if (bad) return bad;
  /* Whatever the caller let through is not passed on. */
  syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  /* Before anything with a side effect (the exit and index files are the run's, cgroups, ...). */
  if (o.run_file && claim_run(o.run_file) != 0) return EXIT_SETUP;

  /*
   * -P: SIGHUP when the caller dies. Until the signals are waited for below, it ends the helper (and
   * the command with it, by the command's own PR_SET_PDEATHSIG). Set before checking the parent, so a
   * death between the two cannot be missed.
   */
  if (o.caller) {
    prctl(PR_SET_PDEATHSIG, SIGHUP, 0, 0, 0);
    if (getppid() != (pid_t)o.caller) {
      fprintf(stderr, "sap-sandbox-enter: the caller (pid %ld) is gone\n", o.caller);
      return EXIT_SETUP;
    }
  }
  join_cgroups(&o);
  if (!o.ns_pid) return usage("(no -n)");
  /*
   * The command inherits this: the OOM killer's first choice, before the host's processes and the
   * sandbox's pid 1 (raising it needs no privilege; the helper itself is tiny and never the biggest).
   */
  int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (adj >= 0) {
    (void)write(adj, "500", 3);
    close(adj);
  }
  char err[256];
  if (sap_read_seccomp(o.seccomp_file, &o.seccomp, err, sizeof err) != 0) {
    fprintf(stderr, "sap-sandbox-enter: %s\n", err);
    return EXIT_SETUP;
  }

  int exit_fd = -1;
  if (o.exit_file) {
    do exit_fd = open(o.exit_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    while (exit_fd < 0 && errno == EINTR);
    if (exit_fd < 0) {
      warn_errno("open", o.exit_file);
      return EXIT_SETUP;
    }
  }

  int index_fd = -1;
  int log_pipes[2][2] = {{-1, -1}, {-1, -1}};
  if (o.log_index) {
    do index_fd = open(o.log_index, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    while (index_fd < 0 && errno == EINTR);
    if (index_fd < 0 || pipe2(log_pipes[0], O_CLOEXEC) != 0 || pipe2(log_pipes[1], O_CLOEXEC) != 0) {
      warn_errno("open the output index", o.log_index);
      return EXIT_SETUP;
    }
  }

  /* Opened here, where /dev/null is the caller's (the sandbox's mount namespace may lack one). */
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);

  int root_fd = -1;
  {
    int ns_fds[NS_COUNT];
    for (size_t k = 0; k < NS_COUNT; k++) {
      char name[16];
      snprintf(name, sizeof name, "ns/%s", NS_NAMES[k]);
      ns_fds[k] = open_at_pid(o.ns_pid, name, O_RDONLY);
      if (ns_fds[k] < 0) return EXIT_SETUP;
    }
    root_fd = open_at_pid(o.ns_pid, "root", O_RDONLY | O_DIRECTORY);
    if (root_fd < 0) return EXIT_SETUP;
    for (size_t k = 0; k < NS_COUNT; k++) {
      if (setns(ns_fds[k], NS_TYPES[k]) != 0) {
        warn_errno("enter namespace", NS_NAMES[k]);
        return EXIT_SETUP;
      }
      close(ns_fds[k]);
    }
  }

  /*
   * -T: the terminal, from the sandbox's own devpts. `dev` and `dev/pts` are mount points of the
   * sandbox (a sandbox cannot swap them), and the opened file must be the ptmx device (5:2).
   */
  int master_fd = -1, tty_fd = -1;
  if (o.rows) {
    master_fd = openat(root_fd, "dev/pts/ptmx", O_RDWR | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    int unlock = 0;
    struct winsize ws = {.ws_row = o.rows, .ws_col = o.cols};
    if (master_fd < 0 || fstat(master_fd, &st) != 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 5 || minor(st.st_rdev) != 2 ||
        ioctl(master_fd, TIOCSPTLCK, &unlock) != 0 || ioctl(master_fd, TIOCSWINSZ, &ws) != 0 ||
        (tty_fd = ioctl(master_fd, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
      warn_errno("open a terminal in the sandbox", NULL);
      return EXIT_SETUP;
    }
  }

  /* SIGCHLD must not be ignored, or the child's status would be lost. */
  signal(SIGCHLD, SIG_DFL);

  int alive[2];
  if (pipe2(alive, O_CLOEXEC) != 0) {
    warn_errno("pipe", NULL);
    return EXIT_SETUP;
  }
  pid_t child = fork();
  if (child < 0) {
    warn_errno("fork", NULL);
    return EXIT_SETUP;
  }
  if (child == 0) {
    close(alive[1]);
    if (exit_fd >= 0) close(exit_fd);
    if (devnull >= 0) close(devnull);
    if (index_fd >= 0) {
      /* The command writes into the pipes; the pipes' other fds close at exec (O_CLOEXEC). */
      if (dup2(log_pipes[0][1], 1) < 0 || dup2(log_pipes[1][1], 2) < 0) _exit(EXIT_SETUP);
      close(index_fd);
    }
    if (master_fd >= 0) close(master_fd);
    run_child(&o, root_fd, alive[0], tty_fd);
  }
  wipe_env(&o);
  struct relay relays[2] = {{-1, -1, 1}, {-1, -1, 2}};
  if (index_fd >= 0) {
    close(log_pipes[0][1]);
    close(log_pipes[1][1]);
    relays[0].in = log_pipes[0][0];
    relays[1].in = log_pipes[1][0];
    relays[0].out = fcntl(1, F_DUPFD_CLOEXEC, 3); /* fd 1 goes to /dev/null below */
    relays[1].out = 2;
    for (int k = 0; k < 2; k++) fcntl(relays[k].in, F_SETFL, O_NONBLOCK);
  }
  close(alive[0]);
  if (root_fd >= 0) close(root_fd);
  if (tty_fd >= 0) close(tty_fd);
  if (master_fd >= 0) fcntl(master_fd, F_SETFL, O_NONBLOCK);
  /* The command alone holds its stdin and stdout: the helper keeps stderr for its own messages. */
  if (master_fd >= 0) {
    if (devnull >= 0) close(devnull);
  } else if (devnull > 2) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    close(devnull);
  }
  /* also here: no window where signals miss the group (with -T the child makes a session of its own) */
  if (o.own_group && master_fd < 0) setpgid(child, child);
  /*
   * From here the helper takes its signals synchronously (sigtimedwait). Not before the fork: a
   * signal pending on the helper then would not reach the child (pending signals are not inherited);
   * until here a signal ends the helper as it would have nsenter (and the child with it, by the
   * group signal or PR_SET_PDEATHSIG). A SIGCHLD that came before is caught by the first waitpid.
   */
  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGCHLD);
  for (size_t k = 0; k < FORWARDED_COUNT; k++) sigaddset(&waited, FORWARDED[k]);
  sigprocmask(SIG_BLOCK, &waited, NULL);

  int sig_fd = -1;
  if (index_fd >= 0 || master_fd >= 0) {
    sig_fd = signalfd(-1, &waited, SFD_CLOEXEC);
    if (sig_fd < 0) {
      warn_errno("signalfd", NULL);
      return EXIT_SETUP;
    }
  }

  /* -T: the caller's keystrokes (fd 0) and window sizes (fd 3); -1 once they end. */
  int term_in = master_fd >= 0 ? 0 : -1;
  int term_ctl = master_fd >= 0 && fcntl(3, F_GETFD) >= 0 ? 3 : -1;
  int master_poll = master_fd;
  long long term_at = o.timeout > 0 ? now_ns() + (long long)(o.timeout * 1e9) : -1;
  long long kill_at = -1;
  int timed_out = 0;
  int hung_up = 0;
  for (;;) {
    int status;
    pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) {
      /* What the command (or what it left behind) wrote before it ended, up to a bound. */
      long long drained = 0;
      for (int k = 0; k < 2; k++) {
        ssize_t n;
        while (drained < (16LL << 20) && (n = relay_once(&relays[k], index_fd)) > 0) drained += n;
      }
      if (master_fd >= 0) {
        static char buf[65536];
        ssize_t n;
        while (drained < (16LL << 20) && (n = read(master_fd, buf, sizeof buf)) > 0) {
          if (sap_write_all(1, buf, (size_t)n) != 0) break;
          drained += n;
        }
      }
      return finish(status, timed_out, exit_fd);
    }
    if (r < 0 && errno != EINTR) {
      warn_errno("wait", NULL);
      return EXIT_SETUP;
    }
    if (o.caller && !hung_up && getppid() != (pid_t)o.caller) {
      /* The caller died: hang the command up, once (without -g the group is the helper's own, and the
       * helper gets this SIGHUP back: it is ignored below). */
      hung_up = 1;
      if (o.own_group) {
        signal_child(&o, child, SIGHUP);
        signal_child(&o, child, SIGCONT);
      } else {
        kill(0, SIGHUP);
        kill(0, SIGCONT);
      }
    }
    long long next = term_at >= 0 ? term_at : kill_at;
    /*
     * With -P, also look at the parent once a second: the parent-death signal alone let one fresh-clone
     * run in six keep a command after its host died. (A multi-threaded caller's death sends it once per
     * reparenting, the first while getppid() still names the caller; later ones can merge with it.)
     */
    if (o.caller && !hung_up) {
      long long look_at = now_ns() + 1000000000LL;
      if (next < 0 || look_at < next) next = look_at;
    }
    siginfo_t info;
    int sig;
    if (sig_fd >= 0) {
      /* -L: wait for a signal, output or the next deadline at once. */
      int wait_ms = -1;
      if (next >= 0) {
        long long left = next - now_ns();
        wait_ms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
      }
      struct pollfd pf[6] = {{.fd = sig_fd, .events = POLLIN}, {.fd = relays[0].in, .events = POLLIN}, {.fd = relays[1].in, .events = POLLIN},
                             {.fd = term_in, .events = POLLIN}, {.fd = master_poll, .events = POLLIN}, {.fd = term_ctl, .events = POLLIN}};
      int pr = poll(pf, 6, wait_ms);
      if (pr > 0 && master_fd >= 0) pump_terminal(pf, &term_in, master_fd, &master_poll, &term_ctl);
      if (pr < 0 && errno != EINTR) {
        warn_errno("poll", NULL);
        return EXIT_SETUP;
      }
      for (int k = 0; k < 2; k++) {
        if (pr > 0 && pf[k + 1].revents) relay_once(&relays[k], index_fd);
      }
      struct signalfd_siginfo si;
      if (pr > 0 && (pf[0].revents & POLLIN) && read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        sig = (int)si.ssi_signo;
      } else {
        /* No signal: check the deadlines below (they act only once reached). */
        sig = -1;
        errno = EAGAIN;
      }
    } else if (next >= 0) {
      long long left = next - now_ns();
      if (left < 0) left = 0;
      struct timespec ts = {.tv_sec = left / 1000000000LL, .tv_nsec = left % 1000000000LL};
      sig = sigtimedwait(&waited, &info, &ts);
    } else {
      sig = sigwaitinfo(&waited, &info);
    }
    if (sig < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) {
        warn_errno("wait for signals", NULL);
        return EXIT_SETUP;
      }
      long long t = now_ns();
      if (term_at >= 0 && t >= term_at) {
        timed_out = 1;
        term_at = -1;
        signal_child(&o, child, SIGTERM);
        signal_child(&o, child, SIGCONT); /* a stopped command gets the SIGTERM too */
        if (o.kill_after > 0) kill_at = t + (long long)(o.kill_after * 1e9);
      } else if (kill_at >= 0 && t >= kill_at) {
        kill_at = -1;
        signal_child(&o, child, SIGKILL);
      }
      continue;
    }
    /* The caller's death (or the helper's own hang-up coming back): handled at the top of the loop. */
    if (sig == SIGHUP && o.caller && (hung_up || getppid() != (pid_t)o.caller)) continue;
    /* Without -g the command is in the helper's process group and was signalled with it. */
    if (sig != SIGCHLD && o.own_group) signal_child(&o, child, sig);
  }
}
