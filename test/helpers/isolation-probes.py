"""
Escape probes for the sandbox isolation suite (test/integration/security/isolation.test.ts).

Run inside a sandbox as `python3 isolation-probes.py '<json config>'` (or `python3 -c SCRIPT
'<json config>'`). Config: {"dataDir": host DATA_DIR, "out": optional path to write the result to}.
Prints one JSON object {probeName: {"ok": bool, "detail": str}}; `ok` means "isolated as expected
once the hardened runtime is in place". Always exits 0: a probe that crashes reports ok=false.

Every probe is harmless if it succeeds: a sysctl is written back with the value just read from it
(vm.drop_caches is only opened, never written); /proc/sysrq-trigger is never opened; syscalls get
arguments that cannot do anything even when the call is allowed (nonexistent paths, bad flags, bad
magic numbers, bad commands); namespace-creating calls run in a throw-away child process.
"""
import ctypes
import errno
import json
import os
import platform
import subprocess
import sys

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
DATA_DIR = CONFIG.get("dataDir") or ""

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

NR = {
    "x86_64": dict(
        keyctl=250, add_key=248, request_key=249, bpf=321, perf_event_open=298, userfaultfd=323,
        init_module=175, finit_module=313, delete_module=176, kexec_load=246, kexec_file_load=320,
        reboot=169, swapon=167, swapoff=168, clock_settime=227, settimeofday=164, acct=163,
        quotactl=179, open_by_handle_at=304, mount=165, umount2=166, pivot_root=155, open_tree=428,
        move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        unshare=272, clone=56, clone3=435,
    ),
    "aarch64": dict(
        keyctl=219, add_key=217, request_key=218, bpf=280, perf_event_open=241, userfaultfd=282,
        init_module=105, finit_module=273, delete_module=106, kexec_load=104, kexec_file_load=294,
        reboot=142, swapon=224, swapoff=225, clock_settime=112, settimeofday=170, acct=89,
        quotactl=60, open_by_handle_at=265, mount=40, umount2=39, pivot_root=41, open_tree=428,
        move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        unshare=97, clone=220, clone3=435,
    ),
}.get(platform.machine(), {})

CLONE_NEWUSER = 0x10000000
SIGCHLD = 17
NOWHERE = b"/nonexistent-sap-probe/none"
NOWHERE2 = b"/nonexistent-sap-probe/none2"

results = {}


def record(name, ok, detail):
    results[name] = {"ok": bool(ok), "detail": str(detail)[:600]}


def probe(name):
    """Decorator: runs the probe now; a crash is recorded as a failure of that probe."""

    def wrap(fn):
        try:
            ok, detail = fn()
            record(name, ok, detail)
        except Exception as e:  # noqa: BLE001 - any crash is a finding
            record(name, False, "probe crashed: %r" % (e,))
        return fn

    return wrap


def ename(e):
    return errno.errorcode.get(e, str(e))


def arg(a):
    if a is None:
        return None
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a  # a ctypes object or pointer


def raw(name, *args):
    """syscall(nr, args...) → (return value, errno)."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *[arg(a) for a in args])
    return r, (ctypes.get_errno() if r == -1 else 0)


def read_text(path, limit=1 << 20):
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def status_field(field):
    for line in read_text("/proc/self/status").splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


# ---------------------------------------------------------------- identity, user namespace, privileges


@probe("id -u is 0")
def _():
    out = subprocess.run(["id", "-u"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() == "0", "id -u printed %r (exit %d)" % (out.stdout.strip(), out.returncode)


def idmap_probe(path):
    lines = [l.split() for l in read_text(path).splitlines() if l.strip()]
    rows = [(int(a), int(b), int(c)) for a, b, c in lines]
    text = "; ".join("%d %d %d" % r for r in rows)
    root = [r for r in rows if r[0] == 0]
    if not root:
        return False, "%s does not map 0: %s" % (path, text)
    inside, outside, count = root[0]
    touches_host_root = any(o <= 0 < o + c for _, o, c in rows)
    ok = outside != 0 and count == 65536 and not touches_host_root
    return ok, "%s: %s (expected one range 0 <non-zero host id> 65536, never host id 0)" % (path, text)


@probe("uid_map maps 0 to a non-zero host uid, 65536 long")
def _():
    return idmap_probe("/proc/self/uid_map")


@probe("gid_map maps 0 to a non-zero host gid, 65536 long")
def _():
    return idmap_probe("/proc/self/gid_map")


DOCKER_CAPS = {
    0: "CHOWN", 1: "DAC_OVERRIDE", 3: "FOWNER", 4: "FSETID", 5: "KILL", 6: "SETGID", 7: "SETUID",
    8: "SETPCAP", 10: "NET_BIND_SERVICE", 13: "NET_RAW", 18: "SYS_CHROOT", 27: "MKNOD",
    29: "AUDIT_WRITE", 31: "SETFCAP",
}
DOCKER_MASK = sum(1 << b for b in DOCKER_CAPS)
NEEDED = {0: "CHOWN", 1: "DAC_OVERRIDE", 3: "FOWNER", 6: "SETGID", 7: "SETUID"}


@probe("capabilities within Docker's default set, with CHOWN/DAC_OVERRIDE/FOWNER/SETUID/SETGID")
def _():
    eff = int(status_field("CapEff"), 16)
    bnd = int(status_field("CapBnd"), 16)
    extra = [b for b in range(64) if (eff | bnd) >> b & 1 and not DOCKER_MASK >> b & 1]
    missing = [n for b, n in NEEDED.items() if not eff >> b & 1]
    ok = not extra and not missing
    return ok, "CapEff=%016x CapBnd=%016x; outside Docker's set: %s; missing: %s" % (eff, bnd, extra or "none", missing or "none")


@probe("NoNewPrivs: 1")
def _():
    v = status_field("NoNewPrivs")
    return v == "1", "NoNewPrivs: %s" % v


@probe("root can chown a file to 1000:1000")
def _():
    path = "/tmp/sap-probe-chown-%d" % os.getpid()
    with open(path, "w") as f:
        f.write("x")
    try:
        os.chown(path, 1000, 1000)
        st = os.stat(path)
        return (st.st_uid, st.st_gid) == (1000, 1000), "after chown: %d:%d" % (st.st_uid, st.st_gid)
    except OSError as e:
        return False, "chown failed: %s" % ename(e.errno)
    finally:
        os.unlink(path)


@probe("root can setgid/setuid to 1000")
def _():
    code = "import os; os.setgid(1000); os.setuid(1000); print(os.getuid())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() == "1000", "exit %d, stdout %r, stderr %r" % (out.returncode, out.stdout.strip(), out.stderr.strip()[-200:])


# ---------------------------------------------------------------- host-global sysctls

REFUSED = (errno.EACCES, errno.EROFS, errno.EPERM)

for _name in ["kernel.core_pattern", "kernel.pid_max", "fs.file-max", "vm.overcommit_memory", "kernel.panic"]:

    @probe("sysctl %s is not writable" % _name)
    def _(_name=_name):
        path = "/proc/sys/" + _name.replace(".", "/")
        with open(path, "rb") as f:
            current = f.read()
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            return e.errno in REFUSED, "open for writing: %s" % ename(e.errno)
        try:
            os.write(fd, current)  # its own current value: harmless if it goes through
        except OSError as e:
            return e.errno in REFUSED, "opened for writing; write-back: %s" % ename(e.errno)
        finally:
            os.close(fd)
        return False, "wrote its own value back (%r): the host's setting is writable" % current.strip()[:80]


@probe("sysctl vm.drop_caches cannot be opened for writing")
def _():
    path = "/proc/sys/vm/drop_caches"
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        return e.errno in REFUSED, "open for writing: %s" % ename(e.errno)
    os.close(fd)  # nothing written
    return False, "opened for writing (closed without writing)"


# ---------------------------------------------------------------- seccomp


@probe("Seccomp: 2")
def _():
    v = status_field("Seccomp")
    return v == "2", "Seccomp: %s; Seccomp_filters: %s" % (v, status_field("Seccomp_filters"))


def expect_eperm(name, *args, fd_result=False):
    if name not in NR:
        record("syscall %s -> EPERM" % name, False, "no syscall table for %s" % platform.machine())
        return

    @probe("syscall %s -> EPERM" % name)
    def _():
        r, e = raw(name, *args)
        if r >= 0:
            if fd_result:
                os.close(r)
            return False, "returned %d: reachable" % r
        return e == errno.EPERM, "failed with %s" % ename(e)


class Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


BAD_TV = Timeval(-1, 2_000_000)  # invalid: refused with EINVAL before any permission check

expect_eperm("keyctl", 9999, 0, 0, 0, 0)  # unknown command
expect_eperm("add_key", b"user", b"sap-probe", None, 0, 0)  # keyring 0 does not exist
expect_eperm("request_key", b"user", b"sap-probe-none", None, 0x7FFFFFF0)  # nonexistent destination keyring
expect_eperm("bpf", 9999, None, 0)  # unknown command
expect_eperm("perf_event_open", None, 0, -1, -1, 0)  # NULL attr
expect_eperm("userfaultfd", -1)  # invalid flags
expect_eperm("init_module", None, 0, b"")  # empty image
expect_eperm("finit_module", -1, b"", 0)  # bad fd
expect_eperm("delete_module", b"sap_probe_no_such_module", os.O_NONBLOCK)
expect_eperm("kexec_load", 0, 1000, None, 0x8000)  # too many segments, unknown flag
expect_eperm("kexec_file_load", -1, -1, 0, None, 0x8000)  # bad fds, unknown flag
expect_eperm("reboot", 0xDEAD, 0xBEEF, 0, None)  # bad magic numbers
expect_eperm("swapon", NOWHERE, 0)
expect_eperm("swapoff", NOWHERE)
expect_eperm("clock_settime", 9999, None)  # unknown clock
expect_eperm("settimeofday", ctypes.byref(BAD_TV), None)
expect_eperm("acct", NOWHERE)
expect_eperm("quotactl", 0xDEADBEEF, NOWHERE, 0, None)  # bad command, nonexistent device
expect_eperm("open_by_handle_at", -1, None, 0)
expect_eperm("mount", NOWHERE, NOWHERE2, b"tmpfs", 0, None)  # nonexistent target
expect_eperm("umount2", NOWHERE, 0)
expect_eperm("pivot_root", NOWHERE, NOWHERE2)
expect_eperm("open_tree", -1, NOWHERE, 0x2)  # unknown flag
expect_eperm("move_mount", -1, NOWHERE, -1, NOWHERE2, 0)
expect_eperm("fsopen", b"tmpfs", 0x80, fd_result=True)  # unknown flag
expect_eperm("fsconfig", -1, 0xDEAD, None, None, 0)
expect_eperm("fsmount", -1, 0xDEAD, 0)
expect_eperm("fspick", -1, NOWHERE, 0xDEAD)
expect_eperm("mount_setattr", -1, NOWHERE, 0xDEAD, None, 0)


def in_child(fn):
    """Runs fn() in a forked child that exits at once; returns its exit status (200 = the call succeeded)."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(fn())
        except BaseException:  # noqa: BLE001
            os._exit(254)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def child_result(code):
    if code == 200:
        return False, "succeeded: a new user namespace was created (in a throw-away child)"
    if code < 0:
        return False, "child killed by signal %d" % -code
    return code == errno.EPERM, "failed with %s" % ename(code)


@probe("syscall unshare(CLONE_NEWUSER) -> EPERM")
def _():
    def call():
        r, e = raw("unshare", CLONE_NEWUSER)
        return 200 if r == 0 else e

    return child_result(in_child(call))


@probe("syscall clone(CLONE_NEWUSER|SIGCHLD) -> EPERM")
def _():
    def call():
        r, e = raw("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
        if r == 0:
            os._exit(0)  # the grandchild, in its new user namespace: leave at once
        if r > 0:
            os.waitpid(r, 0)
            return 200
        return e

    return child_result(in_child(call))


@probe("syscall clone3 -> ENOSYS")
def _():
    r, e = raw("clone3", None, 0)  # NULL args, size 0: EINVAL if it reaches the kernel
    if r >= 0:
        if r == 0:
            os._exit(0)
        os.waitpid(r, 0)
        return False, "returned %d" % r
    return e == errno.ENOSYS, "failed with %s" % ename(e)


# ---------------------------------------------------------------- commands


for _argv in (["unshare", "-U", "true"], ["unshare", "-m", "true"]):

    @probe("command `%s` fails" % " ".join(_argv))
    def _(_argv=_argv):
        try:
            out = subprocess.run(_argv, capture_output=True, text=True, timeout=10)
        except FileNotFoundError:
            return False, "%s not found: cannot tell" % _argv[0]
        return out.returncode != 0, "exit %d: %s" % (out.returncode, out.stderr.strip()[-200:])


# ---------------------------------------------------------------- /proc


for _path in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"]:

    @probe("%s reads empty or fails" % _path)
    def _(_path=_path):
        if not os.path.lexists(_path):
            return True, "missing"
        try:
            with open(_path, "rb") as f:
                data = f.read(4096)
        except OSError as e:
            return True, "read fails: %s" % ename(e.errno)
        return data == b"", "read %d bytes: %r" % (len(data), data[:120])


for _path in ["/proc/acpi", "/proc/scsi"]:

    @probe("%s is empty or unreadable" % _path)
    def _(_path=_path):
        if not os.path.lexists(_path):
            return True, "missing"
        try:
            entries = os.listdir(_path) if os.path.isdir(_path) else None
            if entries is None:
                with open(_path, "rb") as f:
                    data = f.read(4096)
                return data == b"", "a file; read %d bytes" % len(data)
        except OSError as e:
            return True, "unreadable: %s" % ename(e.errno)
        return not entries, "entries: %s" % sorted(entries)[:20]


def mounts():
    """(mount point, mount options) of /proc/self/mountinfo, in order (later entries are on top)."""
    out = []
    for line in read_text("/proc/self/mountinfo").splitlines():
        f = line.split()
        point = f[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        out.append((point, f[5].split(",")))
    return out


def covering_mount(path):
    best = None
    for point, opts in mounts():
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                best = (point, opts)
    return best


for _path in ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"]:

    @probe("%s is read-only" % _path)
    def _(_path=_path):
        # No open at all: the mount table says whether the mount it is on is read-only, and
        # access(W_OK) asks the kernel without opening (EROFS on a read-only mount).
        if not os.path.lexists(_path):
            return True, "missing"
        point, opts = covering_mount(_path) or ("?", [])
        writable = os.access(_path, os.W_OK)
        return "ro" in opts, "on mount %s (%s); access(W_OK)=%s" % (point, ",".join(opts), writable)


# ---------------------------------------------------------------- host layout


def needles():
    n = ["/dev/shm/sap-", "upperdir=/"]
    if DATA_DIR:
        n.append(DATA_DIR)
        real = os.path.realpath(DATA_DIR)
        if real != DATA_DIR:
            n.append(real)
    return n


def no_host_paths(text, what):
    found = []
    for line in text.splitlines():
        hits = [x for x in needles() if x in line]
        if hits:
            found.append("%s in: %s" % (hits, line[:300]))
    if not DATA_DIR:
        return False, "no dataDir given to the probe script"
    return not found, ("%s names host paths: %s" % (what, " | ".join(found[:3]))) if found else "%s: no host path found" % what


for _path in ["/proc/self/mountinfo", "/proc/1/mountinfo", "/proc/self/mounts"]:

    @probe("%s names no host path (DATA_DIR, /dev/shm/sap-, upperdir=/)" % _path)
    def _(_path=_path):
        return no_host_paths(read_text(_path), _path)


@probe("environment names no host path")
def _():
    return no_host_paths("\n".join("%s=%s" % kv for kv in os.environ.items()), "environ")


# ---------------------------------------------------------------- output

text = json.dumps(results, sort_keys=True)
if CONFIG.get("out"):
    with open(CONFIG["out"], "w") as f:
        f.write(text)
print(text)
