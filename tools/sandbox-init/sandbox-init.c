/*
 * sap-sandbox-init: builds a sandbox and becomes its pid 1. The only way a sandbox starts.
 *
 *   sap-sandbox-init -w -s SOCKET KEY [-c CGROUP_PROCS]...   a spare: the rest of the arguments come later
 *   sap-sandbox-init -w -s SOCKET KEY [-c CGROUP_PROCS]... SETUP...   a spare made whole ahead: only its
 *                                   name and staging directory come later (see whole_spare_claim)
 *   sap-sandbox-init [-c CGROUP_PROCS]... SETUP...            all at once (tests)
 *
 * SETUP, every option required unless marked:
 *   -l LOG      stdout and stderr of the helper go to LOG (appended)           (optional)
 *   -m DIR      the sandbox's staging directory on the host (made if missing)
 *   -u BASE     host uid and gid of sandbox root: sandbox ids 0..65535 are host ids BASE..BASE+65535
 *   -r DIR      a read-only layer of `/`, topmost first (repeat; the last is the base skeleton)
 *   -p DIR      a read-only layer of `/usr`, topmost first (repeat; the last is the host's /usr)
 *   -D MB       size of the writable layer (writes past it get ENOSPC)
 *   -I FILE     the writable layer's filesystem image (optional; an ext4 image the host made, root's
 *               alone): attached to a free loop device that goes away with its last mount and mounted
 *               nosuid,nodev; without -I the writable layer is a tmpfs of -D MB (RAM). A spare given
 *               -I among its first arguments mounts it ahead, and uses it unless SETUP names another
 *   -H NAME     hostname, also the name of the overlay mounts
 *   -S FILE     the seccomp filter (a classic BPF program, see tools/sandbox-seccomp)
 *   -N HOSTIF   a way out (optional; without it the sandbox has loopback only): a veth pair, HOSTIF on
 *               the host with -A, "eth0" in the sandbox with -B and a default route via -A (see net.h)
 *   -A ADDR/LEN the host end's IPv4 address and prefix length (with -N)
 *   -B ADDR     the sandbox end's IPv4 address (with -N)
 *   -d ADDR     a name server for the sandbox's /etc/resolv.conf (repeat, up to 3; optional)
 *
 * With -w the helper joins its cgroups ahead of a request (the first move of a process into a cgroup
 * waits for a kernel RCU grace period, 5-15 ms), connects to the unix socket SOCKET, writes
 * "ready KEY\n", reads the SETUP arguments (each ended by a NUL byte) until the host shuts down its
 * side, and keeps the socket as descriptor 3. It then connects once more and writes "exec KEY\n":
 * pid 1 inherits that descriptor and serves the sandbox's exec sessions on it (exec-server.h). A
 * spare made whole ahead opens that channel first, before it builds anything (its pid 1 is forked
 * before any claim).
 *
 * Steps, in this fixed order; a failing step names itself on stderr ("sap-sandbox-init: STEP: ...")
 * and the helper exits 1 (2 on bad usage):
 *   cgroups       join each cgroup (-c)
 *   namespaces    a private mount namespace for the helper, then the sandbox's user namespace
 *   id maps       sandbox ids 0..65535 -> host ids BASE.. (uid_map, gid_map)
 *   mounts        in the helper's namespace: a small tmpfs on DIR (relative names below, so that no
 *                 host path appears in the sandbox's mountinfo); each read-only layer cloned as an
 *                 idmapped mount (on disk ids 0..65535 are the sandbox's ids, so layers stay portable
 *                 between sandboxes and hosts), opened one component at a time without following a
 *                 symlink, every directory above it root's alone (see open_layer); the writable layer
 *                 (the image of -I on a loop device, or a tmpfs of -D MB); the overlays of `/` and `/usr`;
 *                 the overlay's /workspace bound onto itself (a mount of its own, see workspace_mount)
 *   pid 1         a child joins the user namespace as its root and unshares the mount, pid, net, ipc,
 *                 uts and cgroup namespaces (all owned by the sandbox's user namespace); its child is
 *                 the sandbox's pid 1
 *   root          pid 1 binds the overlay, brings up loopback, sets the hostname, writes
 *                 /etc/resolv.conf (with -d)
 *   network       (with -N, by the helper while pid 1 goes on) the veth pair, addresses, route
 *   /proc         mounts proc; /proc/sys, sysrq-trigger, irq, bus and fs read-only; kcore, keys,
 *                 timer_list, sched_debug, acpi, scsi (and the rest of the OCI runtime spec's list) masked
 *   /dev          a tmpfs with null, zero, full, random, urandom, tty, a devpts of its own, shm
 *   pivot_root    into the overlay; the host's tree is detached
 *   capabilities  Docker's default set (inside the user namespace only), no_new_privs, seccomp
 * Then the helper writes {"child-pid": PID} (PID: pid 1's pid on the host) to descriptor 3 when it is
 * open, and waits for pid 1; pid 1 reaps orphans until it is killed. The helper stays as the keeper of
 * the mount namespace that holds the writable layer: the host reaches that layer through
 * /proc/<helper>/root (checkpoints). Both are the OOM killer's last choice (see run).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/loop.h>
#include <linux/mount.h>

#include "../sandbox-common/isolation.h"
#include "net.h"

#ifndef MOUNT_ATTR_IDMAP
#define MOUNT_ATTR_IDMAP 0x00100000
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

#define MAX_LAYERS 64

struct setup {
  char *cgroups[64];
  int ncgroups;
  const char *log, *staging, *hostname, *seccomp, *image;
  /* The writable layer mounted ahead (a spare given -I before its request), or -1. */
  int upper;
  long base;
  long disk_mb;
  struct sock_fprog filter;
  const char *root_layers[MAX_LAYERS];
  int nroot;
  const char *usr_layers[MAX_LAYERS];
  int nusr;
  const char *hostif;
  struct in_addr host_addr, guest_addr;
  int prefix;
  int has_host, has_guest;
  const char *nameservers[3];
  int nns;
};

static const char *step = "arguments";

/* Prints "sap-sandbox-init: STEP: message: strerror(errno)" and exits 1. */
static void die(const char *fmt, ...) {
  int e = errno;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (e) fprintf(stderr, "sap-sandbox-init: %s: %s: %s\n", step, msg, strerror(e));
  else fprintf(stderr, "sap-sandbox-init: %s: %s\n", step, msg);
  exit(1);
}

static int usage(const char *arg) {
  fprintf(stderr, "sap-sandbox-init: bad argument %s\n"
                  "usage: sap-sandbox-init [-w -s SOCKET KEY] [-c FILE]... -l LOG -m DIR -u BASE -r DIR... -p DIR... -D MB [-I FILE] -H NAME -S FILE [-N HOSTIF -A ADDR/LEN -B ADDR] [-d ADDR]...\n",
          arg);
  return 2;
}

static void write_file(const char *file, const char *text) {
  int fd = open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || sap_write_all(fd, text, strlen(text)) != 0) die("write %s", file);
  close(fd);
}

static long parse_long(const char *s, long min, long max) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < min || v > max) return -1;
  return v;
}

/* Parses options into `o`; returns 0, or an exit code. `need_setup`: the SETUP options must all be there. */
static int parse(char **args, int n, struct setup *o, int need_setup) {
  for (int i = 0; i < n; i++) {
    const char *a = args[i];
    const char *v = i + 1 < n ? args[i + 1] : NULL;
    if (a[0] != '-' || !a[1] || a[2] || !v) return usage(a);
    i++;
    switch (a[1]) {
      case 'c':
        if (o->ncgroups >= 64) return usage(a);
        o->cgroups[o->ncgroups++] = args[i];
        break;
      case 'l': o->log = v; break;
      case 'm': o->staging = v; break;
      case 'H': o->hostname = v; break;
      case 'S': o->seccomp = v; break;
      case 'I': o->image = v; break;
      case 'u':
        if ((o->base = parse_long(v, 1, 4294967295L - SAP_ID_COUNT)) < 0) return usage(v);
        break;
      case 'D':
        if ((o->disk_mb = parse_long(v, 1, 1L << 30)) < 0) return usage(v);
        break;
      case 'r':
        if (o->nroot >= MAX_LAYERS) return usage(a);
        o->root_layers[o->nroot++] = v;
        break;
      case 'p':
        if (o->nusr >= MAX_LAYERS) return usage(a);
        o->usr_layers[o->nusr++] = v;
        break;
      case 'N':
        if (strlen(v) >= IFNAMSIZ || !*v) return usage(v);
        o->hostif = v;
        break;
      case 'A': {
        char addr[32];
        const char *slash = strchr(v, '/');
        if (!slash || (size_t)(slash - v) >= sizeof addr) return usage(v);
        memcpy(addr, v, (size_t)(slash - v));
        addr[slash - v] = '\0';
        if (inet_pton(AF_INET, addr, &o->host_addr) != 1 || (o->prefix = (int)parse_long(slash + 1, 8, 31)) < 0) return usage(v);
        o->has_host = 1;
        break;
      }
      case 'B':
        if (inet_pton(AF_INET, v, &o->guest_addr) != 1) return usage(v);
        o->has_guest = 1;
        break;
      case 'd': {
        struct in6_addr any;
        if (o->nns >= 3 || (inet_pton(AF_INET, v, &any) != 1 && inet_pton(AF_INET6, v, &any) != 1)) return usage(v);
        o->nameservers[o->nns++] = v;
        break;
      }
      default: return usage(a);
    }
  }
  if (need_setup && (!o->staging || !o->hostname || !o->seccomp || o->base <= 0 || o->disk_mb <= 0 || !o->nroot || !o->nusr)) {
    return usage("(missing -m, -u, -r, -p, -D, -H or -S)");
  }
  if (o->hostif && (!o->has_host || !o->has_guest)) return usage("(-N needs -A and -B)");
  return 0;
}

static void join_cgroups(const struct setup *o) {
  step = "cgroups";
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  for (int k = 0; k < o->ncgroups; k++) {
    int fd = open(o->cgroups[k], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || sap_write_all(fd, pid, (size_t)len) != 0) die("join %s", o->cgroups[k]);
    close(fd);
  }
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

/* A user namespace whose ids 0..65535 are host ids base..: returns a descriptor of it. */
static int make_userns(long base) {
  step = "namespaces";
  int hold[2];
  if (pipe2(hold, O_CLOEXEC) != 0) die("pipe");
  /* A child in a new user namespace that waits for the pipe to close; its namespace outlives it through the descriptor. */
  pid_t child = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
  if (child < 0) die("new user namespace");
  if (child == 0) {
    char c;
    close(hold[1]);
    while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  close(hold[0]);
  step = "id maps";
  char file[64], map[64];
  snprintf(map, sizeof map, "0 %ld %d\n", base, SAP_ID_COUNT);
  snprintf(file, sizeof file, "/proc/%d/uid_map", (int)child);
  write_file(file, map);
  snprintf(file, sizeof file, "/proc/%d/gid_map", (int)child);
  write_file(file, map);
  snprintf(file, sizeof file, "/proc/%d/ns/user", (int)child);
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("open %s", file);
  close(hold[1]);
  while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {
  }
  return fd;
}

/*
 * Opens the layer directory `src` (an absolute path without symlinks) one component at a time, never
 * following a symlink (O_NOFOLLOW; O_PATH so that nothing is read), and checks each before going on:
 * every component is a directory; every one above the layer is owned by host root and writable by
 * nobody else (unless sticky, like /tmp), so no other host user can redirect the path (replace a
 * layer's root/ with a link to a host directory, say); the layer itself is owned by one of the ids a
 * layer holds on disk (0..65535). Dies otherwise.
 */
static int open_layer(const char *src) {
  if (src[0] != '/') die("layer %s: not an absolute path", src);
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) die("open /");
  char part[256];
  const char *p = src;
  for (;;) {
    struct stat st;
    if (fstat(fd, &st) != 0) die("stat layer %s", src);
    while (*p == '/') p++;
    int last = *p == '\0';
    if (!S_ISDIR(st.st_mode)) {
      errno = ENOTDIR;
      die("layer %s: not a directory", src);
    }
    if (last) {
      if (st.st_uid >= SAP_ID_COUNT || st.st_gid >= SAP_ID_COUNT) {
        errno = EPERM;
        die("layer %s: owned by %u:%u", src, (unsigned)st.st_uid, (unsigned)st.st_gid);
      }
      return fd;
    }
    if (st.st_uid != 0 || ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      errno = EPERM;
      die("layer %s: a directory on the way is not root's alone (owner %u, mode %o)", src, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    }
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= sizeof part) die("layer %s: bad path", src);
    memcpy(part, p, n);
    part[n] = '\0';
    p += n;
    if (!strcmp(part, "..") || !strcmp(part, ".")) die("layer %s: bad path", src);
    int next = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) die("open layer %s (at %s; a symlink is refused)", src, part);
    close(fd);
    fd = next;
  }
}

/* Clones the layer `src` as a read-only mount whose ids go through the user namespace `userns`, attached at `at` (relative). */
static void idmapped_layer(const char *src, const char *at, int userns) {
  if (mkdir(at, 0755) != 0) die("mkdir %s", at);
  int dfd = open_layer(src);
  int fd = (int)syscall(SYS_open_tree, dfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (fd < 0) die("clone layer %s", src);
  close(dfd);
  struct mount_attr attr = {
      .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
      .userns_fd = (unsigned long long)userns,
  };
  if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) die("idmap layer %s", src);
  if (syscall(SYS_move_mount, fd, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) != 0) die("attach layer %s", src);
  close(fd);
}

/* Appends "PREFIX0:PREFIX1:..." for n layers to buf. */
static void layer_list(char *buf, size_t size, const char *prefix, int n) {
  size_t len = strlen(buf);
  for (int i = 0; i < n; i++) len += (size_t)snprintf(buf + len, size - len, "%s%s%d", i ? ":" : "", prefix, i);
}

/*
 * The writable layer on real storage: `image` (made by the host with mkfs.ext4, a regular file of
 * root's that no one else may read or write, so never bytes a sandbox wrote raw) attached to a free loop
 * device and mounted on "w". LO_FLAGS_AUTOCLEAR: the device is detached when its last user goes, that
 * is when this mount namespace ends with the helper; the sandbox never sees the device nor the image.
 * Direct I/O to the image: the data is cached once (by the ext4 above, charged to the sandbox).
 */
static int open_image(const char *image) {
  int img = open(image, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
  struct stat st;
  if (img < 0 || fstat(img, &st) != 0) die("open image %s", image);
  errno = 0;
  if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 077) != 0) die("image %s is not a regular file of root's alone", image);
  int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) die("open /dev/loop-control");
  int dev = -1, flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
  char name[32];
  /* Sandboxes starting at once race for the same free device: the loser gets EBUSY and asks again. */
  for (int tries = 0; dev < 0; tries++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) die("free loop device");
    snprintf(name, sizeof name, "/dev/loop%d", n);
    dev = open(name, O_RDWR | O_CLOEXEC);
    if (dev < 0) {
      if ((errno == ENOENT || errno == ENXIO) && tries < 100) continue;
      die("open %s", name);
    }
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (unsigned)img;
    cfg.info.lo_flags = (unsigned)flags;
    if (ioctl(dev, LOOP_CONFIGURE, &cfg) != 0) {
      int e = errno;
      close(dev);
      dev = -1;
      if (e == EBUSY && tries < 100) continue;
      /* A file system under DATA_DIR without direct I/O: buffered. */
      if (e == EINVAL && (flags & LO_FLAGS_DIRECT_IO) && tries < 100) {
        flags &= ~LO_FLAGS_DIRECT_IO;
        continue;
      }
      errno = e;
      die("attach %s to %s", image, name);
    }
  }
  close(ctl);
  close(img);
  /* A detached mount (new mount API), so that a spare can make it before it knows where it goes.
   * noinit_itable: no kernel thread zeroing inode tables behind the sandbox's back (mkfs left them lazy);
   * discard: a file deleted inside gives its blocks back to the host (holes punched in the image). */
  int fs = (int)syscall(SYS_fsopen, "ext4", FSOPEN_CLOEXEC);
  if (fs < 0) die("fsopen ext4");
  if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "source", name, 0) != 0 || syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) != 0 ||
      syscall(SYS_fsconfig, fs, FSCONFIG_SET_FLAG, "discard", NULL, 0) != 0 || syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "errors", "remount-ro", 0) != 0 ||
      syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0)
    die("mount %s (writable layer)", name);
  int mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME);
  if (mnt < 0) die("fsmount %s", name);
  close(fs);
  close(dev);
  return mnt;
}

/*
 * /workspace as a mount of its own (as OpenComputer's sandboxes have it: `df /workspace` names it): a
 * bind of the overlay's own /workspace onto itself, so that what is written there stays in the
 * writable layer (checkpoints, hibernation, diskMB) and keeps the overlay's flags (nosuid, nodev).
 * Made before any process of the sandbox runs. The last component is opened without following a
 * symlink: a /workspace that a layer replaced by a symlink or a file, or removed, gets no mount.
 */
static void workspace_mount(void) {
  int ws = open("root/workspace", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (ws < 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return;
    die("open /workspace");
  }
  struct stat st;
  if (fstat(ws, &st) != 0) die("stat /workspace");
  if (!S_ISDIR(st.st_mode)) {
    close(ws);
    return;
  }
  int tree = (int)syscall(SYS_open_tree, ws, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (tree < 0) die("clone /workspace");
  if (syscall(SYS_move_mount, tree, "", ws, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) die("mount /workspace");
  close(tree);
  close(ws);
}

/*
 * The mounts, in the helper's own namespace, under the staging directory (the working directory from
 * here on): l<i> and p<i> the idmapped layers of / and /usr, w the writable layer (w/root, w/usr and
 * their work directories), root the overlay of / with the overlay of /usr on root/usr.
 */
static void mount_layers(const struct setup *o, int userns) {
  step = "mounts";
  if (unshare(CLONE_NEWNS) != 0) die("private mount namespace");
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("make mounts private");
  if (mkdir(o->staging, 0711) != 0 && errno != EEXIST) die("mkdir %s", o->staging);
  if (mount("sap", o->staging, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,nr_inodes=256,mode=0711") != 0) die("staging tmpfs on %s", o->staging);
  if (chdir(o->staging) != 0) die("chdir %s", o->staging);
  char at[32];
  for (int i = 0; i < o->nroot; i++) {
    snprintf(at, sizeof at, "l%d", i);
    idmapped_layer(o->root_layers[i], at, userns);
  }
  for (int i = 0; i < o->nusr; i++) {
    snprintf(at, sizeof at, "p%d", i);
    idmapped_layer(o->usr_layers[i], at, userns);
  }
  if (mkdir("w", 0755) != 0) die("mkdir w");
  char opts[4096];
  if (o->image || o->upper >= 0) {
    int mnt = o->upper;
    if (o->image) {
      if (mnt >= 0) close(mnt);
      mnt = open_image(o->image);
    }
    if (syscall(SYS_move_mount, mnt, "", AT_FDCWD, "w", MOVE_MOUNT_F_EMPTY_PATH) != 0) die("attach the writable layer");
    close(mnt);
    if (chmod("w", 0755) != 0) die("chmod w");
  } else {
    /* A tmpfs: about one inode per 4 KiB, so that empty files cannot exhaust the host's memory either. */
    long inodes = o->disk_mb * 256 < 16384 ? 16384 : o->disk_mb * 256;
    snprintf(opts, sizeof opts, "size=%ldm,nr_inodes=%ld,mode=0755", o->disk_mb, inodes);
    if (mount("sap-upper", "w", "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) die("writable layer tmpfs (%s)", opts);
  }
  const char *dirs[] = {"w/root", "w/usr", "w/work-root", "w/work-usr", "root"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    if (mkdir(dirs[i], 0755) != 0 && !(errno == EEXIST && o->upper >= 0 && !o->image && i < 4)) die("mkdir %s", dirs[i]);
  }
  /* The overlay's own root directories take their owner from the upper ones: sandbox root's. */
  if (chown("w/root", (uid_t)o->base, (gid_t)o->base) != 0 || chown("w/usr", (uid_t)o->base, (gid_t)o->base) != 0) die("chown the writable layer");
  snprintf(opts, sizeof opts, "lowerdir=");
  layer_list(opts, sizeof opts, "l", o->nroot);
  snprintf(opts + strlen(opts), sizeof opts - strlen(opts), ",upperdir=w/root,workdir=w/work-root");
  if (mount(o->hostname, "root", "overlay", MS_NOSUID | MS_NODEV, opts) != 0) die("overlay of / (%s)", opts);
  snprintf(opts, sizeof opts, "lowerdir=");
  layer_list(opts, sizeof opts, "p", o->nusr);
  snprintf(opts + strlen(opts), sizeof opts - strlen(opts), ",upperdir=w/usr,workdir=w/work-usr");
  if (mkdir("root/usr", 0755) != 0 && errno != EEXIST) die("mkdir /usr");
  /*
   * /usr alone honours setuid bits, for the sandbox user's sudo (docs/isolation.md): every id a setuid
   * program there can take is one of the sandbox's own (its user namespace), and root's commands run
   * with no_new_privs, which makes the bits inert for them.
   */
  if (mount(o->hostname, "root/usr", "overlay", MS_NODEV, opts) != 0) die("overlay of /usr (%s)", opts);
  workspace_mount();
}

/* Reports a failure of pid 1's setup to the helper (one line on `report`) and exits. */
static int report_fd = -1;
static void child_die(const char *fmt, ...) {
  int e = errno;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  int len = snprintf(msg, sizeof msg, "error %s: ", step);
  len += vsnprintf(msg + len, sizeof msg - (size_t)len, fmt, ap);
  va_end(ap);
  if (e && len < (int)sizeof msg) len += snprintf(msg + len, sizeof msg - (size_t)len, ": %s", strerror(e));
  if (len >= (int)sizeof msg) len = (int)sizeof msg - 1;
  msg[len++] = '\n';
  (void)sap_write_all(report_fd, msg, (size_t)len);
  _exit(1);
}

#include "exec-server.h"

static void bind_onto(const char *src, const char *dst, unsigned long extra) {
  if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0) child_die("bind %s", dst);
  if (extra && mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | extra, NULL) != 0) child_die("remount %s", dst);
}

/* Creates an empty file (or keeps an existing one) to bind a file onto. */
static void touch(const char *file) {
  int fd = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) child_die("create %s", file);
  close(fd);
}

static void setup_proc(void) {
  step = "/proc";
  if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) child_die("mount proc");
  /* Read-only: kernel settings and interfaces that are not namespaced (OCI runtime spec's readonlyPaths). */
  const char *ro[] = {"proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus", "proc/fs"};
  for (size_t i = 0; i < sizeof ro / sizeof ro[0]; i++) {
    struct stat st;
    if (lstat(ro[i], &st) != 0) continue;
    bind_onto(ro[i], ro[i], MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
  }
  /* Masked: files under /dev/null, directories under an empty read-only tmpfs (maskedPaths). */
  const char *masked[] = {"proc/kcore", "proc/keys", "proc/timer_list", "proc/timer_stats", "proc/sched_debug", "proc/latency_stats",
                          "proc/acpi", "proc/scsi", "proc/asound", "proc/kallsyms", "proc/kmsg", "proc/kpagecount", "proc/kpageflags",
                          "proc/kpagecgroup", "proc/pagetypeinfo", "proc/sysvipc"};
  for (size_t i = 0; i < sizeof masked / sizeof masked[0]; i++) {
    struct stat st;
    if (lstat(masked[i], &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (mount("sap-masked", masked[i], "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,nr_inodes=1,mode=0555") != 0) child_die("mask %s", masked[i]);
    } else if (mount("/dev/null", masked[i], NULL, MS_BIND, NULL) != 0) {
      child_die("mask %s", masked[i]);
    }
  }
}

static void setup_dev(long disk_mb) {
  step = "/dev";
  if (mount("sap-dev", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,nr_inodes=64,mode=0755") != 0) child_die("tmpfs");
  const char *nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  char src[64], dst[64];
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
    snprintf(src, sizeof src, "/dev/%s", nodes[i]);
    snprintf(dst, sizeof dst, "dev/%s", nodes[i]);
    touch(dst);
    if (mount(src, dst, NULL, MS_BIND, NULL) != 0) child_die("bind %s", src);
  }
  if (mkdir("dev/pts", 0755) != 0 || mkdir("dev/shm", 01777) != 0) child_die("mkdir pts, shm");
  /* POSIX shared memory: RAM, charged to the sandbox's memory cgroup like every tmpfs page it writes. */
  char opts[64];
  snprintf(opts, sizeof opts, "size=%ldm,mode=1777", disk_mb);
  if (mount("sap-shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) child_die("shm");
  if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") != 0) child_die("devpts");
  const char *links[][2] = {{"pts/ptmx", "dev/ptmx"}, {"/proc/self/fd", "dev/fd"}, {"/proc/self/fd/0", "dev/stdin"},
                            {"/proc/self/fd/1", "dev/stdout"}, {"/proc/self/fd/2", "dev/stderr"}};
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
    if (symlink(links[i][0], links[i][1]) != 0) child_die("symlink %s", links[i][1]);
  }
}

static void loopback_up(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) child_die("socket");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strcpy(ifr.ifr_name, "lo");
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) child_die("loopback flags");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) child_die("bring up loopback");
  close(s);
}

/* pid 1's side: finishes the sandbox's root in its own namespaces, locks itself down, then reaps. */
static void run_pid1(const struct setup *o) {
  step = "root";
  if (mount("root", "root", NULL, MS_BIND | MS_REC, NULL) != 0) child_die("bind the overlay");
  if (chdir("root") != 0) child_die("chdir");
  loopback_up();
  if (sethostname(o->hostname, strlen(o->hostname)) != 0) child_die("hostname");
  if (o->nns) {
    char text[256];
    size_t len = 0;
    for (int i = 0; i < o->nns; i++) len += (size_t)snprintf(text + len, sizeof text - len, "nameserver %s\n", o->nameservers[i]);
    int fd = open("etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || sap_write_all(fd, text, len) != 0) child_die("write /etc/resolv.conf");
    close(fd);
  }
  setup_proc();
  setup_dev(o->disk_mb);
  step = "pivot_root";
  if (syscall(SYS_pivot_root, ".", ".") != 0) child_die("pivot_root");
  if (umount2(".", MNT_DETACH) != 0) child_die("detach the host's tree");
  if (chdir("/") != 0) child_die("chdir /");
  /* With an exec channel pid 1 serves the sandbox's exec sessions (exec-server.h); it does not return. */
  if (exec_channel >= 0) exec_server_main(&o->filter, report_fd);
  step = "capabilities";
  char err[256];
  if (sap_lock_down(&o->filter, o->seccomp, err, sizeof err) != 0) {
    errno = 0;
    child_die("%s", err);
  }
  /* Ready: nothing of the host stays open. */
  if (sap_write_all(report_fd, "ready\n", 6) != 0) _exit(1);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
  }
  syscall(SYS_close_range, 3U, ~0U, 0);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    siginfo_t info;
    sigwaitinfo(&chld, &info);
  }
}

/*
 * Spares made whole ahead: `-w -s SOCKET KEY` followed by a whole SETUP (every required option; -H
 * is a placeholder name). The helper builds the whole sandbox first (user namespace and id maps,
 * idmapped layers, writable layer, overlays, pid 1 in its namespaces, the link and its addresses),
 * then connects, writes "ready KEY\n" and waits for its claim: arguments ended by NUL bytes until
 * the host shuts down its side, of which only `-H NAME` (the sandbox's hostname, set through pid 1's
 * UTS namespace), `-m DIR` (the sandbox's staging directory, where the spare's is moved) and `-E 1`
 * (write /etc/hosts naming it, see write_hosts) are taken. No argument at all: the host let go of the spare, which then ends with its sandbox. The
 * helper (and so pid 1) runs at nice 10 until the claim. Kept apart from run(), which calls
 * whole_spare_claim once pid 1 is ready.
 */
static struct {
  const char *sock_path, *key;
} whole_spare;

/*
 * /etc/hosts naming the sandbox (sudo resolves its host name at every call), written at a claim
 * through the overlay the helper holds (root/ in its staging directory) and owned by the sandbox's
 * root. Nothing of the sandbox has run yet: its files are the base layer's, none followed.
 */
static int write_hosts(const char *name, long base) {
  for (const char *c = name; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' || *c == '_')) {
      errno = EINVAL;
      return -1;
    }
  }
  int etc = open("root/etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (etc < 0) return -1;
  int fd = openat(etc, "hosts", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  int e = errno;
  close(etc);
  if (fd < 0) {
    errno = e;
    return -1;
  }
  char text[256];
  int len = snprintf(text, sizeof text, "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", name);
  int rc = (len > 0 && (size_t)len < sizeof text && sap_write_all(fd, text, (size_t)len) == 0 && fchown(fd, (uid_t)base, (gid_t)base) == 0 &&
            fchmod(fd, 0644) == 0)
               ? 0
               : -1;
  e = errno;
  close(fd);
  errno = e;
  return rc;
}

static void whole_spare_claim(const struct setup *o, pid_t init) {
  step = "connect";
  int sock = connect_to(whole_spare.sock_path);
  if (sock < 0) {
    kill(init, SIGKILL);
    die("connect to %s", whole_spare.sock_path);
  }
  char line[256];
  snprintf(line, sizeof line, "ready %s\n", whole_spare.key);
  if (sap_write_all(sock, line, strlen(line)) != 0 || (sock != 3 && dup2(sock, 3) < 0)) {
    int e = errno;
    kill(init, SIGKILL);
    errno = e;
    die("write ready");
  }
  if (sock != 3) close(sock);
  step = "claim";
  char **args = NULL;
  int n = read_args(3, &args);
  if (n <= 0) {
    kill(init, SIGKILL);
    if (n == 0) exit(0);
    die("read the claim");
  }
  const char *name = NULL, *staging = NULL;
  int hosts = 0;
  for (int i = 0; i + 1 < n; i += 2) {
    if (strcmp(args[i], "-H") == 0) name = args[i + 1];
    else if (strcmp(args[i], "-m") == 0) staging = args[i + 1];
    else if (strcmp(args[i], "-E") == 0) hosts = strcmp(args[i + 1], "1") == 0;
  }
  /* The staging directory moves to the sandbox's own (-m), in the helper's mount namespace only: the
   * host finds the sandbox's writable layer where it finds every other's (/proc/HELPER/root/DIR/w). */
  if (staging && strcmp(staging, o->staging) != 0) {
    if ((mkdir(staging, 0711) != 0 && errno != EEXIST) || mount(o->staging, staging, NULL, MS_MOVE, NULL) != 0) {
      int e = errno;
      kill(init, SIGKILL);
      errno = e;
      die("move the staging directory to %s", staging);
    }
  }
  size_t len = name ? strlen(name) : 0;
  if (!name || len == 0 || len > 64) {
    kill(init, SIGKILL);
    errno = EINVAL;
    die("the claim names no hostname (-H NAME, at most 64 bytes)");
  }
  char file[64];
  snprintf(file, sizeof file, "/proc/%d/ns/uts", (int)init);
  int uts = open(file, O_RDONLY | O_CLOEXEC);
  if (uts < 0 || setns(uts, CLONE_NEWUTS) != 0 || sethostname(name, len) != 0) {
    int e = errno;
    kill(init, SIGKILL);
    errno = e;
    die("set the hostname");
  }
  close(uts);
  if (hosts && write_hosts(name, o->base) != 0) {
    int e = errno;
    kill(init, SIGKILL);
    errno = e;
    die("write /etc/hosts");
  }
  if (setpriority(PRIO_PROCESS, 0, 0) != 0 || setpriority(PRIO_PROCESS, init, 0) != 0) {
    int e = errno;
    kill(init, SIGKILL);
    errno = e;
    die("priority");
  }
}

/* Builds the sandbox described by `o` and waits for its pid 1; returns the exit code. */
static int run(struct setup *o) {
  if (o->log) {
    int fd = open(o->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) die("open log %s", o->log);
    close(fd);
  }
  step = "seccomp";
  char err[256];
  if (sap_read_seccomp(o->seccomp, &o->filter, err, sizeof err) != 0) {
    errno = 0;
    die("%s", err);
  }
  /*
   * Never the OOM killer's choice when that can be set (it needs CAP_SYS_RESOURCE, which some hosts
   * withhold); in any case the sandbox's own processes are its first choice (sap-sandbox-enter raises
   * theirs). Inherited by pid 1.
   */
  int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (adj >= 0) {
    (void)write(adj, "-1000", 5);
    close(adj);
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) die("subreaper");
  int userns = make_userns(o->base);
  mount_layers(o, userns);
  step = "pid 1";
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) die("pipe");
  pid_t setup_pid = fork();
  if (setup_pid < 0) die("fork");
  if (setup_pid == 0) {
    close(report[0]);
    report_fd = report[1];
    if (setns(userns, CLONE_NEWUSER) != 0) child_die("join the user namespace");
    if (sap_become_root(err, sizeof err) != 0) {
      errno = 0;
      child_die("%s", err);
    }
    if (unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP) != 0) child_die("unshare");
    pid_t init = fork();
    if (init < 0) child_die("fork");
    if (init == 0) run_pid1(o);
    char line[32];
    int len = snprintf(line, sizeof line, "pid %d\n", (int)init);
    _exit(sap_write_all(report_fd, line, (size_t)len) == 0 ? 0 : 1);
  }
  close(report[1]);
  close(userns);
  /* Lines from the setup child ("pid N") and from pid 1 ("ready", or "error STEP: ..."). */
  char buf[1024];
  size_t len = 0;
  long init = -1;
  int ready = 0, connected = !o->hostif;
  /* Both lines are needed; they come from two processes, in either order. */
  while (!ready || init <= 0) {
    ssize_t r = read(report[0], buf + len, sizeof buf - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      errno = 0;
      die("the sandbox's pid 1 ended before it was ready");
    }
    len += (size_t)r;
    buf[len] = '\0';
    char *nl;
    while ((nl = strchr(buf, '\n'))) {
      *nl = '\0';
      if (strncmp(buf, "pid ", 4) == 0) init = atol(buf + 4);
      else if (strcmp(buf, "ready") == 0) ready = 1;
      else if (strncmp(buf, "error ", 6) == 0) {
        fprintf(stderr, "sap-sandbox-init: %s\n", buf + 6);
        if (init > 0) kill((pid_t)init, SIGKILL);
        exit(1);
      }
      len -= (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, len + 1);
    }
    /* The network, as soon as pid 1's namespace exists, while pid 1 finishes its own setup. */
    if (init > 0 && !connected) {
      step = "network";
      const char *what;
      if (sap_connect_netns((int)init, o->hostif, o->host_addr, o->guest_addr, o->prefix, &what) != 0) {
        int e = errno;
        kill((pid_t)init, SIGKILL);
        errno = e;
        die("%s (%s)", what, o->hostif);
      }
      connected = 1;
    }
  }
  close(report[0]);
  while (waitpid(setup_pid, NULL, 0) < 0 && errno == EINTR) {
  }
  /* A spare made whole ahead (-w with a whole SETUP): waits here for its claim (see whole_spare_claim). */
  if (whole_spare.key) whole_spare_claim(o, (pid_t)init);
  char info[64];
  int n = snprintf(info, sizeof info, "{\"child-pid\": %ld}\n", init);
  if (fcntl(3, F_GETFD) >= 0) {
    (void)sap_write_all(3, info, (size_t)n);
    close(3);
  }
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) dup2(devnull, 0);
  int status = 0;
  for (;;) {
    pid_t r = waitpid(-1, &status, 0);
    if (r == (pid_t)init) break;
    if (r < 0 && errno != EINTR) break;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int main(int argc, char **argv) {
  struct setup o;
  memset(&o, 0, sizeof o);
  o.upper = -1;
  if (argc > 1 && strcmp(argv[1], "-w") == 0) {
    if (argc < 5 || strcmp(argv[2], "-s") != 0) return usage(argv[1]);
    const char *sock_path = argv[3], *key = argv[4];
    int code = parse(argv + 5, argc - 5, &o, 0);
    if (code) return code;
    join_cgroups(&o);
    /* A whole SETUP on the command line: a spare made whole ahead (see whole_spare_claim). */
    if (o.staging && o.hostname && o.seccomp && o.base > 0 && o.disk_mb > 0 && o.nroot && o.nusr) {
      whole_spare.sock_path = sock_path;
      whole_spare.key = key;
      /* Made at a low priority (creates come first); the claim gives the sandbox the normal one. */
      if (setpriority(PRIO_PROCESS, 0, 10) != 0) die("nice");
      /* Its pid 1 is forked before the claim and inherits the exec channel: opened now, and held by
       * the host until a claim hands it to the sandbox (exec-server.h). pid 1 serves at nice 10 until
       * whole_spare_claim gives it the normal priority, before the host learns pid 1. */
      exec_channel_open(sock_path, key);
      return run(&o);
    }
    if (o.image) {
      step = "disk";
      int mnt = open_image(o.image);
      /* Above the descriptors the helper puts in place (3: the socket; 0-2). */
      if ((o.upper = fcntl(mnt, F_DUPFD_CLOEXEC, 10)) < 0) die("dup the writable layer");
      close(mnt);
      /* Its directories made ahead too: the filesystem's first metadata reads (each a round trip
       * through the loop device's worker) are then off the create path. */
      const char *ahead[] = {"root", "usr", "work-root", "work-usr"};
      for (size_t i = 0; i < sizeof ahead / sizeof ahead[0]; i++) {
        if (mkdirat(o.upper, ahead[i], 0755) != 0) die("mkdir %s on the writable layer", ahead[i]);
      }
      o.image = NULL;
    }
    step = "connect";
    int sock = connect_to(sock_path);
    if (sock < 0) die("connect to %s", sock_path);
    char line[256];
    snprintf(line, sizeof line, "ready %s\n", key);
    if (sap_write_all(sock, line, strlen(line)) != 0) die("write ready");
    if (sock != 3) {
      if (dup2(sock, 3) < 0) die("dup socket");
      close(sock);
    }
    char **args = NULL;
    step = "arguments";
    int n = read_args(3, &args);
    if (n < 0) die("read arguments");
    if (n == 0) return 0; /* the host let go of this spare */
    exec_channel_open(sock_path, key);
    code = parse(args, n, &o, 1);
    if (code) return code;
    return run(&o);
  }
  int code = parse(argv + 1, argc - 1, &o, 1);
  if (code) return code;
  join_cgroups(&o);
  return run(&o);
}
