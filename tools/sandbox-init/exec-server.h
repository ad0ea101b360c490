/*
 * The sandbox's exec server: the sandbox's pid 1 starts the commands of exec sessions itself, with
 * pipes, and reports their output and exits to the host over one unix stream connection (the
 * "exec channel"). No setns, no cgroup join and no helper execve per command: pid 1 already sits in
 * every namespace and cgroup of the sandbox, after its mounts. See docs/exec-server.md.
 *
 * The connection: the init helper (still on the host's side, before any namespace) connects to the
 * host's socket (the path given with -w -s, never visible in the sandbox) and says "exec KEY\n";
 * the descriptor is inherited by pid 1, which keeps it and nothing else of the host.
 *
 * The wire (sandbox/host-contract/exec-wire.ts is the host's declaration; keep both in step): frames
 * of u32 big-endian LENGTH, then LENGTH bytes: u8 TYPE, u32 big-endian ID (a command, chosen by the
 * host; 0 for the channel), payload. Host -> server frames are at most EXEC_IN_MAX bytes, server ->
 * host frames at most EXEC_OUT_MAX. Output flows under credit: at most EXEC_WINDOW bytes of each
 * stream are unacknowledged; the host acknowledges what it has consumed. Stdin the same way, the
 * other direction.
 *
 * Isolation of what it starts (docs/isolation.md): pid 1 installs the seccomp filter while it still
 * holds every capability of the sandbox's user namespace (so without no_new_privs), then limits its
 * capabilities to the container set. A root command sets no_new_privs and execs: the same
 * capabilities, no_new_privs and single filter a command through sap-sandbox-enter gets. A command
 * as the sandbox user changes its ids (which empties its capabilities) and clears the inheritable
 * set, without no_new_privs: also what sap-sandbox-enter -u does. Both raise their oom_score_adj to
 * 500 and get every signal's default action and an empty mask.
 */
#ifndef SAP_EXEC_SERVER_H
#define SAP_EXEC_SERVER_H

#include <poll.h>
#include <sys/signalfd.h>

#define EXEC_VERSION 1
#define EXEC_HDR 9 /* u32 length + u8 type + u32 id */
#define EXEC_IN_MAX (1024 * 1024) /* largest host -> server frame (a START with its argv and environment) */
#define EXEC_CHUNK (64 * 1024) /* largest output payload per frame (a pipe's default capacity) */
#define EXEC_OUT_MAX (EXEC_CHUNK + 16) /* largest server -> host frame, after the length */
#define EXEC_WINDOW (1024 * 1024) /* unacknowledged bytes per stream, each way */
#define EXEC_MAX_CMDS 64
#define EXEC_OUTBUF (EXEC_WINDOW) /* output the server queues toward the host at most (plus one frame) */
/* The whole outgoing buffer: output up to EXEC_OUTBUF, and room beyond it for the small frames (starts, exits, credits). */
#define EXEC_WBUF_CAP (EXEC_OUTBUF + 2 * (EXEC_HDR + EXEC_OUT_MAX) + 64 * 1024)

/* Host -> server */
#define EXEC_T_START 0x01   /* u32 uid, u32 flags (0), u32 argc, u32 envc, then cwd, argv..., env... each NUL-ended */
#define EXEC_T_STDIN 0x02   /* bytes */
#define EXEC_T_STDIN_EOF 0x03
#define EXEC_T_SIGNAL 0x04  /* u32 signal: to the command's process group */
#define EXEC_T_CREDIT 0x05  /* u8 stream (1 stdout, 2 stderr), u32 bytes consumed */
/* Server -> host */
#define EXEC_T_HELLO 0x81   /* u32 version, u32 max commands (id 0) */
#define EXEC_T_STARTED 0x82 /* u32 pid (in the sandbox) */
#define EXEC_T_FAILED 0x83  /* u32 errno, message: the command was not started */
#define EXEC_T_STDOUT 0x84  /* bytes */
#define EXEC_T_STDERR 0x85  /* bytes */
#define EXEC_T_EOF 0x86     /* u8 stream: the command's side of that pipe is closed */
#define EXEC_T_EXIT 0x87    /* i32 code (-1 when killed), u32 signal (0 when exited) */
#define EXEC_T_STDIN_CREDIT 0x88 /* u32 bytes written to the command's stdin (or dropped: it closed it) */

/* Set by exec_channel_open (the init helper, on the host's side); -1: no exec server. */
static int exec_channel = -1;

/* Connects the exec channel ("exec KEY\n" on the host's socket); quietly none when it fails. */
static void exec_channel_open(const char *sock_path, const char *key) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(sock_path) >= sizeof addr.sun_path) return;
  strcpy(addr.sun_path, sock_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  char line[256];
  int n = snprintf(line, sizeof line, "exec %s\n", key);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || n <= 0 || n >= (int)sizeof line || sap_write_all(fd, line, (size_t)n) != 0) {
    close(fd);
    return;
  }
  /* Above the descriptors the helper puts in place (0-3) and the writable layer's (10). */
  exec_channel = fcntl(fd, F_DUPFD_CLOEXEC, 20);
  close(fd);
}

struct exec_cmd {
  unsigned id;
  pid_t pid; /* 0: slot free */
  int out[2]; /* read ends of stdout, stderr; -1 once at EOF */
  int in; /* write end of stdin; -1 once closed */
  long inflight[2];
  char *inbuf; /* stdin not yet written: at most EXEC_WINDOW */
  size_t inlen;
  int in_eof; /* close stdin once inbuf is written */
  int exited;
};

struct exec_server {
  int ch;
  char *rbuf;
  size_t rlen;
  char *wbuf;
  size_t wstart, wlen;
  struct exec_cmd cmds[EXEC_MAX_CMDS];
};

static void put32(unsigned char *p, unsigned v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static unsigned get32(const unsigned char *p) {
  return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | (unsigned)p[3];
}

/* Room for one more output frame of payload `len` (output is read only when there is). */
static int exec_room(const struct exec_server *s, size_t len) {
  return s->wlen + EXEC_HDR + len <= EXEC_OUTBUF + EXEC_HDR + EXEC_OUT_MAX;
}

/* Queues one frame (a small one always finds room beyond the output's bound; see EXEC_WBUF_CAP). */
static void exec_send(struct exec_server *s, unsigned type, unsigned id, const void *a, size_t alen, const void *b, size_t blen) {
  if (s->ch < 0 || s->wlen + EXEC_HDR + alen + blen > EXEC_WBUF_CAP) return;
  if (s->wstart > 0) {
    memmove(s->wbuf, s->wbuf + s->wstart, s->wlen);
    s->wstart = 0;
  }
  unsigned char *p = (unsigned char *)s->wbuf + s->wlen;
  put32(p, (unsigned)(5 + alen + blen));
  p[4] = (unsigned char)type;
  put32(p + 5, id);
  if (alen) memcpy(p + EXEC_HDR, a, alen);
  if (blen) memcpy(p + EXEC_HDR + alen, b, blen);
  s->wlen += EXEC_HDR + alen + blen;
}

static void exec_send_u32s(struct exec_server *s, unsigned type, unsigned id, unsigned a, unsigned b, int two) {
  unsigned char p[8];
  put32(p, a);
  put32(p + 4, b);
  exec_send(s, type, id, p, two ? 8 : 4, NULL, 0);
}

static void exec_fail(struct exec_server *s, unsigned id, int e, const char *msg) {
  unsigned char p[4];
  put32(p, (unsigned)e);
  exec_send(s, EXEC_T_FAILED, id, p, 4, msg, strlen(msg));
}

static struct exec_cmd *exec_find(struct exec_server *s, unsigned id) {
  for (int k = 0; k < EXEC_MAX_CMDS; k++) {
    if (s->cmds[k].pid && s->cmds[k].id == id) return &s->cmds[k];
  }
  return NULL;
}

static void exec_close_in(struct exec_cmd *c) {
  if (c->in >= 0) close(c->in);
  c->in = -1;
  free(c->inbuf);
  c->inbuf = NULL;
  c->inlen = 0;
}

/* Frees the slot once the command has exited and both pipes are at their end. */
static void exec_maybe_free(struct exec_cmd *c) {
  if (!c->exited || c->out[0] >= 0 || c->out[1] >= 0) return;
  exec_close_in(c);
  memset(c, 0, sizeof *c);
  c->out[0] = c->out[1] = c->in = -1;
}

/* The command's side of the fork: never returns (see the top of this file for what it ends with). */
static void exec_child(int fds[3], unsigned uid, const char *cwd, char **argv, char **envp) {
  for (int k = 0; k < 3; k++) {
    if (dup2(fds[k], k) < 0) _exit(125);
  }
  syscall(SYS_close_range, 3U, ~0U, 0);
  if (setsid() < 0) _exit(125);
  if (uid) {
    gid_t groups[1] = {(gid_t)uid};
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (setgroups(1, groups) != 0 || setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0 || setresuid(uid, uid, uid) != 0 ||
        syscall(SYS_capset, &hdr, none) != 0) {
      dprintf(2, "sap-exec: become user %u of the sandbox: %s\n", uid, strerror(errno));
      _exit(125);
    }
  } else if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    dprintf(2, "sap-exec: no_new_privs: %s\n", strerror(errno));
    _exit(125);
  }
  /*
   * Dumpable (once its ids and no_new_privs are final), as any process the sandbox execs is:
   * /proc/self is then the sandbox's (its files owned by its own user, not the host's root), so that
   * it can raise its own oom_score_adj. What this copy of pid 1's memory holds until the exec below
   * is the sandbox's own (its commands' requests).
   */
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (adj >= 0) {
    (void)write(adj, "500", 3);
    close(adj);
  }
  /* As the command's own user: a directory it cannot enter is refused. */
  if (chdir(cwd) != 0) {
    dprintf(2, "sap-exec: cannot change directory to %s: %s\n", cwd, strerror(errno));
    _exit(125);
  }
  /* Every signal's default action, also glibc's own (32, 33: its sigaction refuses them). */
  struct {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
  } dfl = {SIG_DFL, 0, NULL, 0};
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  extern char **environ;
  environ = envp;
  execvp(argv[0], argv);
  int e = errno;
  dprintf(2, "sap-exec: %s: %s\n", argv[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

/* START: parses the request (bounded by the frame), makes the pipes, forks. */
static void exec_start(struct exec_server *s, unsigned id, const unsigned char *p, size_t len) {
  if (id == 0 || exec_find(s, id)) return exec_fail(s, id, EINVAL, "bad or duplicate id");
  struct exec_cmd *c = NULL;
  for (int k = 0; k < EXEC_MAX_CMDS && !c; k++) {
    if (!s->cmds[k].pid) c = &s->cmds[k];
  }
  if (!c) return exec_fail(s, id, EAGAIN, "too many commands");
  if (len < 16 || p[len - 1] != '\0') return exec_fail(s, id, EINVAL, "malformed start");
  unsigned uid = get32(p), argc = get32(p + 8), envc = get32(p + 12);
  if (uid >= SAP_ID_COUNT || argc < 1 || argc > 65536 || envc > 65536) return exec_fail(s, id, EINVAL, "malformed start");
  size_t want = 1 + (size_t)argc + envc, have = 0;
  for (size_t i = 16; i < len; i++) have += p[i] == '\0';
  if (have != want) return exec_fail(s, id, EINVAL, "malformed start");
  char **strs = calloc(want + 2, sizeof *strs);
  if (!strs) return exec_fail(s, id, ENOMEM, "out of memory");
  size_t at = 16;
  for (size_t k = 0; k < want; k++) {
    strs[k] = (char *)p + at;
    at += strlen(strs[k]) + 1;
  }
  /* argv = strs[1..argc], NULL; env = strs[argc+1..], NULL (the array holds a NULL after each). */
  char **argv = calloc((size_t)argc + 1, sizeof *argv), **envp = calloc((size_t)envc + 1, sizeof *envp);
  if (!argv || !envp) {
    free(strs);
    free(argv);
    free(envp);
    return exec_fail(s, id, ENOMEM, "out of memory");
  }
  for (unsigned k = 0; k < argc; k++) argv[k] = strs[1 + k];
  for (unsigned k = 0; k < envc; k++) envp[k] = strs[1 + argc + k];
  int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
  pid_t pid = -1;
  int e = 0;
  if (strs[0][0] != '/') e = EINVAL;
  else if (pipe2(pin, O_CLOEXEC) != 0 || pipe2(pout, O_CLOEXEC) != 0 || pipe2(perr, O_CLOEXEC) != 0) e = errno;
  else {
    pid = fork();
    if (pid == 0) {
      int fds[3] = {pin[0], pout[1], perr[1]};
      exec_child(fds, uid, strs[0], argv, envp);
    }
    if (pid < 0) e = errno;
  }
  free(strs);
  free(argv);
  free(envp);
  if (pin[0] >= 0) close(pin[0]);
  if (pout[1] >= 0) close(pout[1]);
  if (perr[1] >= 0) close(perr[1]);
  if (pid < 0) {
    int fds[3] = {pin[1], pout[0], perr[0]};
    for (int k = 0; k < 3; k++) {
      if (fds[k] >= 0) close(fds[k]);
    }
    return exec_fail(s, id, e, e == EINVAL ? "cwd must be absolute" : strerror(e));
  }
  memset(c, 0, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->in = pin[1];
  c->out[0] = pout[0];
  c->out[1] = perr[0];
  for (int k = 0; k < 2; k++) fcntl(c->out[k], F_SETFL, O_NONBLOCK);
  fcntl(c->in, F_SETFL, O_NONBLOCK);
  exec_send_u32s(s, EXEC_T_STARTED, id, (unsigned)pid, 0, 0);
}

/* One frame from the host. */
static void exec_frame(struct exec_server *s, unsigned type, unsigned id, const unsigned char *p, size_t len) {
  if (type == EXEC_T_START) return exec_start(s, id, p, len);
  struct exec_cmd *c = exec_find(s, id);
  if (!c) return; /* a command already gone: nothing to do */
  if (type == EXEC_T_STDIN) {
    if (c->in < 0 || c->in_eof) {
      exec_send_u32s(s, EXEC_T_STDIN_CREDIT, id, (unsigned)len, 0, 0); /* dropped: it closed its stdin */
      return;
    }
    if (c->inlen + len > EXEC_WINDOW) return; /* past the window: the host broke its side; dropped */
    char *more = realloc(c->inbuf, c->inlen + len);
    if (!more) return;
    memcpy(more + c->inlen, p, len);
    c->inbuf = more;
    c->inlen += len;
  } else if (type == EXEC_T_STDIN_EOF) {
    c->in_eof = 1;
    if (c->inlen == 0) exec_close_in(c);
  } else if (type == EXEC_T_SIGNAL && len == 4) {
    int sig = (int)get32(p);
    if (sig > 0 && sig < NSIG && !c->exited) {
      if (kill(-c->pid, sig) != 0) kill(c->pid, sig);
    } else if (sig > 0 && sig < NSIG) {
      kill(-c->pid, sig); /* what it left behind in its group, until its pipes close */
    }
  } else if (type == EXEC_T_CREDIT && len == 5 && (p[0] == 1 || p[0] == 2)) {
    c->inflight[p[0] - 1] -= (long)get32(p + 1);
    if (c->inflight[p[0] - 1] < 0) c->inflight[p[0] - 1] = 0;
  }
}

/* The host's side is gone: its commands are hung up (as a terminal's would be) and forgotten. */
static void exec_hang_up(struct exec_server *s) {
  for (int k = 0; k < EXEC_MAX_CMDS; k++) {
    struct exec_cmd *c = &s->cmds[k];
    if (!c->pid) continue;
    if (!c->exited) {
      kill(-c->pid, SIGHUP);
      kill(-c->pid, SIGCONT);
    }
    for (int j = 0; j < 2; j++) {
      if (c->out[j] >= 0) close(c->out[j]);
    }
    exec_close_in(c);
    memset(c, 0, sizeof *c);
    c->out[0] = c->out[1] = c->in = -1;
  }
  if (s->ch >= 0) close(s->ch);
  s->ch = -1;
}

/* Reaps every child (pid 1 reaps orphans too); reports the exits of commands. */
static void exec_reap(struct exec_server *s) {
  int status;
  pid_t r;
  while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int k = 0; k < EXEC_MAX_CMDS; k++) {
      struct exec_cmd *c = &s->cmds[k];
      if (c->pid != r || c->exited) continue;
      c->exited = 1;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      unsigned sig = WIFSIGNALED(status) ? (unsigned)WTERMSIG(status) : 0;
      /* Exits always get room: at most one per command beyond the output bound. */
      exec_send_u32s(s, EXEC_T_EXIT, c->id, (unsigned)code, sig, 1);
      exec_maybe_free(c);
    }
  }
}

/* Pid 1's loop once it serves; never returns. */
static void exec_serve(int ch) {
  static struct exec_server srv;
  struct exec_server *s = &srv;
  s->ch = ch;
  s->rbuf = malloc(EXEC_IN_MAX + 4);
  s->wbuf = malloc(EXEC_WBUF_CAP);
  for (int k = 0; k < EXEC_MAX_CMDS; k++) s->cmds[k].out[0] = s->cmds[k].out[1] = s->cmds[k].in = -1;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  signal(SIGPIPE, SIG_IGN);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (!s->rbuf || !s->wbuf || sfd < 0) exec_hang_up(s);
  if (s->ch >= 0) fcntl(s->ch, F_SETFL, O_NONBLOCK);
  exec_send_u32s(s, EXEC_T_HELLO, 0, EXEC_VERSION, EXEC_MAX_CMDS, 1);
  static char chunk[EXEC_CHUNK];
  for (;;) {
    struct pollfd pf[2 + EXEC_MAX_CMDS * 3];
    struct exec_cmd *who[2 + EXEC_MAX_CMDS * 3];
    int what[2 + EXEC_MAX_CMDS * 3];
    int n = 0;
    pf[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    if (s->ch >= 0) pf[n++] = (struct pollfd){.fd = s->ch, .events = (short)(POLLIN | (s->wlen ? POLLOUT : 0))};
    for (int k = 0; k < EXEC_MAX_CMDS && s->ch >= 0; k++) {
      struct exec_cmd *c = &s->cmds[k];
      if (!c->pid) continue;
      for (int j = 0; j < 2; j++) {
        if (c->out[j] < 0 || c->inflight[j] >= EXEC_WINDOW || !exec_room(s, EXEC_CHUNK)) continue;
        who[n] = c;
        what[n] = j;
        pf[n++] = (struct pollfd){.fd = c->out[j], .events = POLLIN};
      }
      if (c->in >= 0 && c->inlen) {
        who[n] = c;
        what[n] = 2;
        pf[n++] = (struct pollfd){.fd = c->in, .events = POLLOUT};
      }
    }
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      exec_hang_up(s);
    }
    if (pf[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      exec_reap(s);
    }
    if (s->ch >= 0 && pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(s->ch, s->rbuf + s->rlen, EXEC_IN_MAX + 4 - s->rlen);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) exec_hang_up(s);
      else if (r > 0) {
        s->rlen += (size_t)r;
        size_t at = 0;
        while (s->ch >= 0 && s->rlen - at >= 4) {
          unsigned flen = get32((unsigned char *)s->rbuf + at);
          if (flen < 5 || flen > EXEC_IN_MAX) {
            exec_hang_up(s); /* the host broke the wire: nothing it says can be trusted to line up */
            break;
          }
          if (s->rlen - at - 4 < flen) break;
          const unsigned char *f = (unsigned char *)s->rbuf + at + 4;
          exec_frame(s, f[0], get32(f + 1), f + 5, flen - 5);
          at += 4 + flen;
        }
        if (s->ch >= 0) {
          memmove(s->rbuf, s->rbuf + at, s->rlen - at);
          s->rlen -= at;
        }
      }
    }
    if (s->ch >= 0 && s->wlen && pf[1].revents & POLLOUT) {
      ssize_t w = send(s->ch, s->wbuf + s->wstart, s->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        s->wstart += (size_t)w;
        s->wlen -= (size_t)w;
        if (!s->wlen) s->wstart = 0;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        exec_hang_up(s);
      }
    }
    for (int i = 2; i < n && s->ch >= 0; i++) {
      if (!pf[i].revents) continue;
      struct exec_cmd *c = who[i];
      if (!c->pid) continue;
      int j = what[i];
      if (j == 2) {
        ssize_t w = write(c->in, c->inbuf, c->inlen);
        if (w > 0) {
          memmove(c->inbuf, c->inbuf + w, c->inlen - (size_t)w);
          c->inlen -= (size_t)w;
          exec_send_u32s(s, EXEC_T_STDIN_CREDIT, c->id, (unsigned)w, 0, 0);
          if (!c->inlen && c->in_eof) exec_close_in(c);
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
          exec_send_u32s(s, EXEC_T_STDIN_CREDIT, c->id, (unsigned)c->inlen, 0, 0);
          exec_close_in(c);
          c->in_eof = 1;
        }
        continue;
      }
      if (c->out[j] < 0 || !exec_room(s, EXEC_CHUNK)) continue;
      /* Never past the window: the host closes a channel that sends more. */
      size_t want = sizeof chunk;
      if ((long)want > EXEC_WINDOW - c->inflight[j]) want = (size_t)(EXEC_WINDOW - c->inflight[j]);
      ssize_t r = read(c->out[j], chunk, want);
      if (r > 0) {
        c->inflight[j] += r;
        exec_send(s, j ? EXEC_T_STDERR : EXEC_T_STDOUT, c->id, chunk, (size_t)r, NULL, 0);
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(c->out[j]);
        c->out[j] = -1;
        unsigned char stream = (unsigned char)(j + 1);
        exec_send(s, EXEC_T_EOF, c->id, &stream, 1, NULL, 0);
        exec_maybe_free(c);
      }
    }
  }
}

/*
 * Pid 1 becomes the exec server (called where it would lock itself down; never returns): the seccomp
 * filter while it holds its user namespace's capabilities, then the container's capability set,
 * without no_new_privs (see the top of this file); "ready" to the helper; nothing of the host kept
 * but the channel; then serve.
 */
static void exec_server_main(const struct sock_fprog *filter, int report) {
  step = "capabilities";
#ifdef SYS_seccomp
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, filter) != 0) child_die("install the seccomp filter for the exec server");
#else
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, filter, 0, 0) != 0) child_die("install the seccomp filter for the exec server");
#endif
  char err[256];
  if (sap_drop_capabilities(err, sizeof err) != 0) {
    errno = 0;
    child_die("%s", err);
  }
  if (sap_write_all(report, "ready\n", 6) != 0) _exit(1);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
  }
  if (dup2(exec_channel, 3) != 3) _exit(1);
  syscall(SYS_close_range, 4U, ~0U, 0);
  exec_serve(3);
}

#endif
