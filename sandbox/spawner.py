"""Starts detached processes for the sandbox host, so that the host (a Node process of 100 MB or
more) does not fork itself for every sandbox and entrypoint it starts.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout, in order.
  request: {"id": n, "argv": [...], "env": {...}, "stdout": path?, "stderr": path?, "fd3": path?}
  answer:  {"id": n, "pid": pid} or {"id": n, "error": "..."}
  request: {"id": n, "op": "umount", "paths": [...], "lazy": bool}
  answer:  {"id": n, "failed": [{"path": ..., "error": ...}, ...]}   (umount2 without an exec)
The process starts in a new session (setsid), with stdin from /dev/null and stdout/stderr appended
to the given files (/dev/null when absent); "fd3" opens a file for writing as descriptor 3.
Children are reaped automatically: whoever needs an exit status records it itself (the entrypoint
wrapper writes an exit file). The spawner exits when its stdin closes (the host is gone); the
processes it started live on.
"""
import ctypes
import json
import os
import signal
import sys

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
DEFAULT_SIGNALS = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
MNT_DETACH = 2
libc = ctypes.CDLL(None, use_errno=True)


def umount(paths, lazy):
    failed = []
    for p in paths:
        if libc.umount2(os.fsencode(p), MNT_DETACH if lazy else 0) != 0:
            failed.append({"path": p, "error": os.strerror(ctypes.get_errno())})
    return failed


def start(req):
    argv = req["argv"]
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
    for fd, key in ((1, "stdout"), (2, "stderr")):
        actions.append((os.POSIX_SPAWN_OPEN, fd, req.get(key) or "/dev/null", APPEND, 0o600))
    if req.get("fd3"):
        actions.append((os.POSIX_SPAWN_OPEN, 3, req["fd3"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    return os.posix_spawn(
        argv[0],
        argv,
        req.get("env") or {},
        file_actions=actions,
        setsid=True,
        # SIGCHLD is ignored here, and Python ignores SIGPIPE and SIGXFSZ: the child gets every
        # signal's default action back (it must wait for its own children, and see broken pipes).
        setsigdef=DEFAULT_SIGNALS,
        # and no signal blocked, whatever mask the helper itself inherited.
        setsigmask=(),
    )


def main():
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            if req.get("op") == "umount":
                answer = {"id": req_id, "failed": umount(req["paths"], bool(req.get("lazy")))}
            else:
                answer = {"id": req_id, "pid": start(req)}
        except Exception as err:  # noqa: BLE001 - every failure is answered, the loop goes on
            answer = {"id": req_id, "error": f"{type(err).__name__}: {err}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
