/*
 * What every process of a sandbox gets, shared by sap-sandbox-init (the sandbox's pid 1) and
 * sap-sandbox-enter (everything started in it later): the user-namespace identity, the capability
 * set a container's root gets by default, no_new_privs and the seccomp filter. Header-only: each
 * helper is one translation unit.
 */
#ifndef SAP_ISOLATION_H
#define SAP_ISOLATION_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>

#include "../sandbox-seccomp/seccomp-load.h"

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

/* Writes all of buf, retrying on EINTR and partial writes; 0, or -1 with errno set. */
static int sap_write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    buf += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Sandbox ids 0..SAP_ID_COUNT-1 map to host ids BASE..BASE+SAP_ID_COUNT-1. */
#define SAP_ID_COUNT 65536

/*
 * The capabilities sandbox root keeps inside its user namespace: Docker's default set. All of them
 * act on objects of the sandbox's own namespaces only (files it owns, its own processes, its own
 * network namespace), never on the host's.
 */
static const int SAP_DEFAULT_CAPS[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,   CAP_KILL,  CAP_SETGID,     CAP_SETUID,
    CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_NET_RAW,    CAP_SYS_CHROOT, CAP_MKNOD, CAP_AUDIT_WRITE, CAP_SETFCAP,
};

/* Becomes root of the user namespace it has joined (host ids BASE), with no supplementary groups. */
static int sap_become_root(char *err, size_t errlen) {
  if (setgroups(0, NULL) != 0 || setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0) {
    snprintf(err, errlen, "become root of the sandbox's user namespace: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/*
 * Limits the capabilities to SAP_DEFAULT_CAPS: bounding set, then effective, permitted and
 * inheritable; ambient cleared. A root process exec'd afterwards gets exactly this set; other users none.
 */
static int sap_drop_capabilities(char *err, size_t errlen) {
  unsigned long long keep = 0;
  for (size_t i = 0; i < sizeof SAP_DEFAULT_CAPS / sizeof SAP_DEFAULT_CAPS[0]; i++) keep |= 1ULL << SAP_DEFAULT_CAPS[i];
  int last = 40;
  int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[16] = {0};
    if (read(fd, buf, sizeof buf - 1) > 0) last = atoi(buf);
    close(fd);
  }
  if (last > 63) last = 63;
  for (int c = 0; c <= last; c++) {
    if (keep & (1ULL << c)) continue;
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) {
      snprintf(err, errlen, "drop capability %d from the bounding set: %s", c, strerror(errno));
      return -1;
    }
  }
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  data[0].effective = data[0].permitted = data[0].inheritable = (unsigned)(keep & 0xffffffffu);
  data[1].effective = data[1].permitted = data[1].inheritable = (unsigned)(keep >> 32);
  if (syscall(SYS_capset, &hdr, data) != 0) {
    snprintf(err, errlen, "set capabilities: %s", strerror(errno));
    return -1;
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    snprintf(err, errlen, "clear ambient capabilities: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* The last steps before a sandbox process runs untrusted code: capabilities, no_new_privs, seccomp. */
static int sap_lock_down(const struct sock_fprog *seccomp, const char *seccomp_file, char *err, size_t errlen) {
  if (sap_drop_capabilities(err, errlen) != 0) return -1;
  /* no_new_privs, then seccomp (tools/sandbox-seccomp/seccomp-load.h). */
  return sap_install_seccomp(seccomp, seccomp_file, err, errlen);
}

#endif
