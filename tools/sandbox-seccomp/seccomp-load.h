/*
 * seccomp-load.h: installs a precompiled seccomp filter (the raw classic-BPF program that
 * sap-seccomp-gen writes) in the calling thread, without libseccomp. Header only:
 *
 *   #define _GNU_SOURCE
 *   #include "../sandbox-seccomp/seccomp-load.h"
 *   char err[256];
 *   if (sap_load_seccomp(path, err, sizeof err) < 0) { fprintf(stderr, "seccomp: %s\n", err); ... }
 *
 * It sets no_new_privs (needed to install a filter without CAP_SYS_ADMIN; setting it again is
 * harmless), then installs the filter: it applies to this thread and to every process and thread it
 * starts from then on, and survives execve. Load it last, just before the exec, after every mount,
 * setns and unshare the helper makes itself: the filter refuses those. The filter is not synced to
 * other threads (the helpers have one).
 *
 * The file is checked before it is handed to the kernel: not empty, a whole number of instructions
 * (struct sock_filter, 8 bytes), at most BPF_MAXINSNS of them. Returns 0, or -1 with a message in err
 * (which names the step that failed and errno's text), nothing installed.
 */
#ifndef SAP_SECCOMP_LOAD_H
#define SAP_SECCOMP_LOAD_H

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_SET_NO_NEW_PRIVS
#define PR_SET_NO_NEW_PRIVS 38
#endif

__attribute__((unused, format(printf, 4, 5))) static int sap_seccomp_fail_(char *err, size_t errlen, int error, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (error && n >= 0 && (size_t)n < errlen) snprintf(err + n, errlen - n, ": %s", strerror(error));
  }
  return -1;
}

/*
 * Reads and checks the filter into `prog` (its instructions in a buffer of their own, freed never: a
 * helper installs one filter and execs). Separate from the install for helpers that must read the
 * file before they leave the host's file system and install it later.
 */
__attribute__((unused)) static int sap_read_seccomp(const char *bpf_path, struct sock_fprog *prog, char *err, size_t errlen) {
  int fd = open(bpf_path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return sap_seccomp_fail_(err, errlen, errno, "opening the filter %s", bpf_path);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return sap_seccomp_fail_(err, errlen, e, "reading the filter %s", bpf_path);
  }
  if (!S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0 ||
      st.st_size > (off_t)(BPF_MAXINSNS * sizeof(struct sock_filter))) {
    close(fd);
    return sap_seccomp_fail_(err, errlen, 0,
                             "the filter %s is not a seccomp BPF program (%lld bytes: it must be a regular file of "
                             "1 to %d instructions of %zu bytes)",
                             bpf_path, (long long)st.st_size, BPF_MAXINSNS, sizeof(struct sock_filter));
  }
  size_t size = (size_t)st.st_size, got = 0;
  struct sock_filter *insns = malloc(size);
  if (!insns) {
    close(fd);
    return sap_seccomp_fail_(err, errlen, ENOMEM, "reading the filter %s", bpf_path);
  }
  while (got < size) {
    ssize_t n = read(fd, (char *)insns + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : 0;
      close(fd);
      free(insns);
      return sap_seccomp_fail_(err, errlen, e, "reading the filter %s%s", bpf_path, n == 0 ? ": it shrank while read" : "");
    }
    got += (size_t)n;
  }
  close(fd);
  prog->len = (unsigned short)(size / sizeof(struct sock_filter));
  prog->filter = insns;
  return 0;
}

/* Sets no_new_privs and installs a filter read by sap_read_seccomp (from `bpf_path`, named in errors) in the calling thread. */
__attribute__((unused)) static int sap_install_seccomp(const struct sock_fprog *prog, const char *bpf_path, char *err, size_t errlen) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return sap_seccomp_fail_(err, errlen, errno, "setting no_new_privs");
#ifdef SYS_seccomp
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog) == 0) return 0;
  if (errno != ENOSYS) return sap_seccomp_fail_(err, errlen, errno, "installing the filter %s", bpf_path);
#endif
  /* Kernels before 3.17 have no seccomp(2). */
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) < 0) return sap_seccomp_fail_(err, errlen, errno, "installing the filter %s", bpf_path);
  return 0;
}

/* Reads the filter at `bpf_path` and installs it (see the top of this file). */
__attribute__((unused)) static int sap_load_seccomp(const char *bpf_path, char *err, size_t errlen) {
  struct sock_fprog prog;
  if (sap_read_seccomp(bpf_path, &prog, err, errlen) < 0) return -1;
  return sap_install_seccomp(&prog, bpf_path, err, errlen);
}

#endif
