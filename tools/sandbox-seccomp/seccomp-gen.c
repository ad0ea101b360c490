/*
 * sap-seccomp-gen: builds the sandbox's default seccomp filter with libseccomp and writes it as a
 * raw classic-BPF program (an array of struct sock_filter, what seccomp(SECCOMP_SET_MODE_FILTER)
 * takes), so that the sandbox helpers load it without libseccomp (see seccomp-load.h).
 *
 *   sap-seccomp-gen [-v] OUT.bpf   write the filter to OUT.bpf (-v: say what was skipped, and the size)
 *   sap-seccomp-gen --pfc          print libseccomp's pseudo filter code (to read the filter)
 *   sap-seccomp-gen --list         print the refused calls, one group a line (for the README)
 *
 * The filter is a deny list modelled on Docker's default profile: every call is allowed except those
 * in the table below. The same rules apply to the native ABI and to the host's compat ABIs (on x86-64:
 * i386 through int 0x80, and x32), so switching ABI is no way around them; a call made with any other
 * ABI kills the process. A name the libseccomp table or an ABI does not know is skipped for that ABI
 * (stime exists on i386 only, kexec_file_load not there, ...).
 *
 * Exit status: 0 written, 1 libseccomp or I/O failure (message on stderr), 2 usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

enum kind {
  REFUSE,      /* EPERM, whatever the arguments */
  NAMESPACES,  /* EPERM when the flags (argument 0; 1 on s390) ask for any new namespace */
  PERSONALITY, /* EPERM unless the persona is one of Docker's harmless values */
  NOSYS,       /* ENOSYS, whatever the arguments */
};

struct group {
  enum kind kind;
  const char *reason;
  const char *names[16];
};

/* The whole filter. Each group: what it does, why, and its calls. */
static const struct group groups[] = {
  {REFUSE, "kernel keyrings are not namespaced: they hold the host's keys", {"keyctl", "add_key", "request_key"}},
  {REFUSE, "eBPF programs run in the host kernel", {"bpf"}},
  {REFUSE, "performance counters expose the host kernel and other processes", {"perf_event_open"}},
  {REFUSE, "userfaultfd stalls the kernel at will, a staple of kernel exploits", {"userfaultfd"}},
  {REFUSE, "kernel modules", {"init_module", "finit_module", "delete_module", "create_module"}},
  {REFUSE, "booting another kernel", {"kexec_load", "kexec_file_load"}},
  {REFUSE, "rebooting the host", {"reboot"}},
  {REFUSE, "swap is the host's", {"swapon", "swapoff"}},
  {REFUSE, "the clock is the host's", {"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime"}},
  {REFUSE, "process accounting is host-wide", {"acct"}},
  {REFUSE, "disk quotas are host-wide", {"quotactl", "quotactl_fd"}},
  {REFUSE, "file handles reach files outside the sandbox's root: Docker's \"shocker\" escape", {"open_by_handle_at", "name_to_handle_at"}},
  {REFUSE, "mounts: the sandbox's file system is set up before the filter, and stays so",
   {"mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"}},
  {REFUSE, "joining another process's namespaces", {"setns"}},
  {REFUSE, "the kernel log is the host's", {"syslog"}},
  {REFUSE, "raw I/O port access", {"iopl", "ioperm"}},
  {REFUSE, "obsolete calls nothing needs, with a history of bugs", {"lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl"}},
  {REFUSE, "virtual 8086 mode", {"vm86", "vm86old"}},
  {REFUSE, "io_uring: a large attack surface, the source of many kernel exploits", {"io_uring_setup", "io_uring_enter", "io_uring_register"}},
  {PERSONALITY, "some execution domains turn ASLR off or make data executable: only 0x0, 0x8, 0x20000, 0x20008 and the query 0xffffffff pass",
   {"personality"}},
  {NAMESPACES, "new namespaces: mount, uts, ipc, user, pid, net, cgroup, time (clone cannot make a time one); fork, threads, CLONE_FILES... still work",
   {"unshare", "clone"}},
  {NOSYS, "its flags are behind a pointer no filter can read; ENOSYS makes glibc fall back to clone, checked above, where EPERM would fail pthread_create",
   {"clone3"}},
};

static const unsigned long namespace_flags[] = {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME};

/* The persona values that pass, as in Docker's profile: PER_LINUX, PER_LINUX32, UNAME26,
 * UNAME26|PER_LINUX32, and 0xffffffff, which reads the persona without changing it. */
static const uint32_t persona_allowed[] = {0x0, 0x8, 0x20000, 0x20008, 0xffffffff};

static int verbose;

static void die(const char *what, int rc) {
  fprintf(stderr, "sap-seccomp-gen: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
  exit(1);
}

static const char *arch_name(uint32_t arch) {
  switch (arch) {
  case SCMP_ARCH_X86_64: return "x86_64";
  case SCMP_ARCH_X86: return "x86";
  case SCMP_ARCH_X32: return "x32";
  case SCMP_ARCH_AARCH64: return "aarch64";
  case SCMP_ARCH_ARM: return "arm";
  default: return "native";
  }
}

/* The ABIs a process on this host can call the kernel with: the native one, and its compat ones. */
static int host_arches(uint32_t *out) {
  uint32_t native = seccomp_arch_native();
  int n = 0;
  out[n++] = native;
  if (native == SCMP_ARCH_X86_64) {
    out[n++] = SCMP_ARCH_X86;
    out[n++] = SCMP_ARCH_X32;
  } else if (native == SCMP_ARCH_AARCH64) {
    out[n++] = SCMP_ARCH_ARM;
  }
  return n;
}

static void add(scmp_filter_ctx ctx, uint32_t action, int nr, const char *name, unsigned count, const struct scmp_arg_cmp *cmp) {
  int rc = seccomp_rule_add_array(ctx, action, nr, count, cmp);
  if (rc < 0) {
    char what[128];
    snprintf(what, sizeof what, "adding a rule for %s", name);
    die(what, rc);
  }
}

/* personality: EPERM unless the persona is allowed. libseccomp 2.5 takes one comparison per argument
 * and rule, and rules are ORed, so the refused values are covered by masked comparisons on the low 32
 * bits (the kernel reads an unsigned int; the upper half is ignored by it, and so here):
 *   - for each bit i but 3 and 17: bit i set and bit i+1 (mod 32) clear;
 *   - bits 2 and 3 set and bit 4 clear; bits 16 and 17 set and bit 18 clear.
 * Why this is exactly the refused set: a value v other than 0 and 0xffffffff has, going round its 32
 * bits, a set bit followed by a clear one. If one such i is not 3 or 17, the first kind covers v. If
 * all are at 3 or 17, v's runs of set bits end at 3 or 17; runs of one bit give 0x8, 0x20000 or
 * 0x20008 (allowed), and a longer run ending at 3 (17) sets bits 2 and 3 (16 and 17), clearing 4
 * (18): the second kind. No rule covers an allowed value: the first kind needs a bit other than 3 and
 * 17 set, and its next bit clear, which 0xffffffff lacks; the second kind sets bit 2 or 16 and clears
 * another one. */
struct masked {
  uint32_t mask, value;
};

/* The masked comparisons above (32 of them). */
static size_t persona_rules(struct masked *out) {
  size_t n = 0;
  for (unsigned i = 0; i < 32; i++) {
    if (i == 3 || i == 17) continue;
    uint32_t bit = 1U << i, next = 1U << ((i + 1) % 32);
    out[n++] = (struct masked){bit | next, bit};
  }
  out[n++] = (struct masked){0x1c, 0xc};
  out[n++] = (struct masked){0x70000, 0x30000};
  return n;
}

static int persona_refused(const struct masked *rules, size_t n, uint32_t v) {
  for (size_t i = 0; i < n; i++)
    if ((v & rules[i].mask) == rules[i].value) return 1;
  return 0;
}

static int persona_allowed_value(uint32_t v) {
  for (size_t i = 0; i < sizeof persona_allowed / sizeof persona_allowed[0]; i++)
    if (v == persona_allowed[i]) return 1;
  return 0;
}

/* Checks the argument above on values it could get wrong: every value of up to 3 set bits, their
 * complements, every run of set bits, and a million pseudo-random values. */
static void check_persona_rules(const struct masked *rules, size_t n) {
  uint32_t bad = 0;
  int wrong = 0;
#define TRY(x)                                                                                     \
  do {                                                                                             \
    uint32_t v_ = (x);                                                                             \
    if (persona_refused(rules, n, v_) == persona_allowed_value(v_)) wrong = 1, bad = v_;           \
  } while (0)
  for (unsigned a = 0; a <= 32; a++)
    for (unsigned b = a; b <= 32; b++)
      for (unsigned c = b; c <= 32; c++) {
        uint32_t v = (a < 32 ? 1U << a : 0) | (b < 32 ? 1U << b : 0) | (c < 32 ? 1U << c : 0);
        TRY(v);
        TRY(~v);
      }
  for (unsigned from = 0; from < 32; from++)
    for (unsigned len = 1; len <= 32; len++) {
      uint32_t v = 0;
      for (unsigned k = 0; k < len; k++) v |= 1U << ((from + k) % 32);
      TRY(v);
      TRY(v | 0x8);
      TRY(v | 0x20000);
    }
  uint32_t x = 2463534242U;
  for (int i = 0; i < 1000000; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    TRY(x);
  }
#undef TRY
  if (wrong) {
    fprintf(stderr, "sap-seccomp-gen: the personality rules are wrong for 0x%x\n", bad);
    exit(1);
  }
}

static void add_personality(scmp_filter_ctx ctx, int nr, const char *name) {
  struct masked rules[40];
  static int checked;
  size_t n = persona_rules(rules);
  if (!checked++) check_persona_rules(rules, n);
  for (size_t i = 0; i < n; i++) {
    struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ, rules[i].mask, rules[i].value);
    add(ctx, SCMP_ACT_ERRNO(EPERM), nr, name, 1, &c);
  }
}

/* The filter for one ABI. */
static scmp_filter_ctx build_arch(uint32_t arch, uint32_t native) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) die("seccomp_init", ENOMEM);
  int rc;
  if (arch != native) {
    if ((rc = seccomp_arch_add(ctx, arch)) < 0) die("seccomp_arch_add", rc);
    if ((rc = seccomp_arch_remove(ctx, native)) < 0) die("seccomp_arch_remove", rc);
  }
  /* A call with an ABI not in the filter (none is left on x86-64) kills the whole process. */
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0) die("setting the bad-arch action", rc);
  /* A binary search on the call's number rather than one test after another: the kernel runs the
   * filter once per call number when it installs it (to cache the calls it always allows), and
   * that halves the time a load takes (about 0.3 ms to 0.13 ms). */
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)) < 0) die("setting the binary tree optimization", rc);

  int flags_arg = (arch == SCMP_ARCH_S390 || arch == SCMP_ARCH_S390X) ? 1 : 0; /* clone's flags */
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    for (const char *const *name = groups[g].names; *name; name++) {
      /* Negative: unknown to libseccomp, or a pseudo number (the call does not exist on this ABI). */
      if (seccomp_syscall_resolve_name_arch(arch, *name) < 0) {
        if (verbose) fprintf(stderr, "sap-seccomp-gen: %s: no %s, skipped\n", arch_name(arch), *name);
        continue;
      }
      /* Rules take the native numbering; libseccomp translates for the filter's ABI. */
      int nr = seccomp_syscall_resolve_name(*name);
      switch (groups[g].kind) {
      case REFUSE: add(ctx, SCMP_ACT_ERRNO(EPERM), nr, *name, 0, NULL); break;
      case NOSYS: add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, *name, 0, NULL); break;
      case PERSONALITY: add_personality(ctx, nr, *name); break;
      case NAMESPACES:
        for (size_t f = 0; f < sizeof namespace_flags / sizeof namespace_flags[0]; f++) {
          /* In clone's flags (not unshare's or clone3's), 0x80 is a bit of the exit signal: clone
           * cannot make a time namespace, and the bit must not refuse a clone. */
          if (namespace_flags[f] == CLONE_NEWTIME && strcmp(*name, "clone") == 0) continue;
          struct scmp_arg_cmp c = SCMP_CMP(flags_arg, SCMP_CMP_MASKED_EQ, namespace_flags[f], namespace_flags[f]);
          add(ctx, SCMP_ACT_ERRNO(EPERM), nr, *name, 1, &c);
        }
        break;
      }
    }
  }
  return ctx;
}

static scmp_filter_ctx build(void) {
  uint32_t arches[4], native = seccomp_arch_native();
  int n = host_arches(arches);
  /* A name no ABI knows is a typo, or a call newer than this libseccomp: say so, whatever -v says
   * (a deny list lets through what it does not name). */
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (const char *const *name = groups[g].names; *name; name++) {
      int known = 0;
      for (int i = 0; i < n; i++) known |= seccomp_syscall_resolve_name_arch(arches[i], *name) >= 0;
      if (!known) fprintf(stderr, "sap-seccomp-gen: warning: no ABI of this libseccomp knows %s: it is not filtered\n", *name);
    }
  scmp_filter_ctx ctx = build_arch(arches[0], native);
  for (int i = 1; i < n; i++) {
    int rc = seccomp_merge(ctx, build_arch(arches[i], native)); /* frees the merged filter */
    if (rc < 0) die("seccomp_merge", rc);
  }
  return ctx;
}

/* One line a group, a Markdown list: "- `keyctl`, `add_key`, `request_key`: EPERM — why". */
static void list(void) {
  static const char *const how[] = {
      [REFUSE] = "EPERM", [NAMESPACES] = "EPERM with any namespace flag", [PERSONALITY] = "EPERM but for harmless values", [NOSYS] = "ENOSYS"};
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    printf("-");
    for (const char *const *name = groups[g].names; *name; name++) printf("%s `%s`", name == groups[g].names ? "" : ",", *name);
    printf(": %s — %s\n", how[groups[g].kind], groups[g].reason);
  }
}

int main(int argc, char **argv) {
  int arg = 1;
  if (arg < argc && strcmp(argv[arg], "-v") == 0) verbose = 1, arg++;
  if (arg + 1 != argc) {
    fprintf(stderr, "usage: sap-seccomp-gen [-v] OUT.bpf | --pfc | --list\n");
    return 2;
  }
  if (strcmp(argv[arg], "--list") == 0) {
    list();
    return 0;
  }
  scmp_filter_ctx ctx = build();
  int rc;
  if (strcmp(argv[arg], "--pfc") == 0) {
    if ((rc = seccomp_export_pfc(ctx, STDOUT_FILENO)) < 0) die("seccomp_export_pfc", rc);
    return 0;
  }

  const char *out = argv[arg];
  int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die(out, errno);
  if ((rc = seccomp_export_bpf(ctx, fd)) < 0) die("seccomp_export_bpf", rc);
  struct stat st;
  if (fstat(fd, &st) < 0) die(out, errno);
  if (close(fd) < 0) die(out, errno);
  size_t insns = (size_t)st.st_size / sizeof(struct sock_filter);
  /* What the loader and the kernel accept. */
  if (st.st_size == 0 || st.st_size % sizeof(struct sock_filter) != 0 || insns > BPF_MAXINSNS) {
    unlink(out);
    fprintf(stderr, "sap-seccomp-gen: the filter has a bad size (%lld bytes)\n", (long long)st.st_size);
    return 1;
  }
  if (verbose) {
    const struct scmp_version *v = seccomp_version();
    fprintf(stderr, "sap-seccomp-gen: %zu instructions (libseccomp %u.%u.%u) written to %s\n", insns, v->major, v->minor, v->micro, out);
  }
  seccomp_release(ctx);
  return 0;
}
