"""Starts detached processes for the sandbox host, so that the host (a Node process of 100 MB or
more) does not fork itself for every sandbox and entrypoint it starts.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout, in order.
  request: {"id": n, "argv": [...], "env": {...}, "stdout": path?, "stderr": path?, "fd3": path?}
  answer:  {"id": n, "pid": pid} or {"id": n, "error": "..."}
  request: {"id": n, "op": "umount", "paths": [...], "lazy": bool}
  answer:  {"id": n, "failed": [{"path": ..., "error": ...}, ...]}   (umount2 without an exec)
  request: {"id": n, "op": "exec", "argv": [...], "env": {...}}
  answer:  {"id": n, "pid": pid, "fds": [stdin, stdout, stderr]}
           a command with pipes: the numbers are the spawner's ends of its stdin, stdout and stderr
           pipes, which the host opens as /proc/<spawner>/fd/<n> and then releases:
  request: {"id": n, "op": "release", "fds": [...]}          answer: {"id": n, "ok": true}
  event:   {"exit": pid, "code": c, "signal": s}             (once an "exec" command has exited)
The process starts in a new session (setsid), with stdin from /dev/null and stdout/stderr appended
to the given files (/dev/null when absent); "fd3" opens a file for writing as descriptor 3.
Children are reaped by a thread; only an "exec" command's exit is reported (whoever needs another
one's status records it itself: the entrypoint wrapper writes an exit file). The spawner exits when
its stdin closes (the host is gone); the processes it started live on, except "exec" commands
started with the spawner as the caller to hang up with (sap-sandbox-enter -P).
"""
import ctypes
import json
import os
import signal
import sys
import threading

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
        # Python ignores SIGPIPE and SIGXFSZ (and the host may have ignored others): the child gets every
        # signal's default action back (it must wait for its own children, and see broken pipes).
        setsigdef=DEFAULT_SIGNALS,
        # and no signal blocked, whatever mask the helper itself inherited.
        setsigmask=(),
    )


class Reaper:
    """Waits for every child; reports the exits of "exec" commands."""

    def __init__(self, send):
        self.send = send
        self.watched = set()
        self.count = 0
        self.lock = threading.Condition()
        threading.Thread(target=self.loop, daemon=True).start()

    def spawn(self, start, watch):
        """Runs start() (which answers a pid) under the lock: its child cannot be reaped unwatched."""
        with self.lock:
            pid = start()
            self.count += 1
            if watch:
                self.watched.add(pid)
            self.lock.notify()
            return pid

    def loop(self):
        while True:
            with self.lock:
                while self.count == 0:
                    self.lock.wait()
            try:
                pid, status = os.wait()
            except ChildProcessError:
                with self.lock:
                    self.count = 0
                continue
            with self.lock:
                self.count = max(0, self.count - 1)
                watched = pid in self.watched
                self.watched.discard(pid)
            if watched:
                if os.WIFSIGNALED(status):
                    self.send({"exit": pid, "code": None, "signal": os.WTERMSIG(status)})
                else:
                    self.send({"exit": pid, "code": os.waitstatus_to_exitcode(status), "signal": None})


def start_exec(req, reaper):
    """A command with three pipes; answers its pid and the spawner's ends (stdin's write end, stdout's and stderr's read ends)."""
    argv = req["argv"]
    pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
    child_ends = [pipes[0][0], pipes[1][1], pipes[2][1]]
    ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(child_ends)]
        pid = reaper.spawn(lambda: os.posix_spawn(argv[0], argv, req.get("env") or {}, file_actions=actions,
                                                  setsid=True, setsigdef=DEFAULT_SIGNALS, setsigmask=()), True)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in child_ends:
            os.close(fd)
    return {"pid": pid, "fds": ours}


def main():
    out = sys.stdout
    out_lock = threading.Lock()

    def send(obj):
        with out_lock:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    reaper = Reaper(send)
    for line in sys.stdin:
        if not line.strip():
            continue
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            op = req.get("op")
            if op == "umount":
                answer = {"id": req_id, "failed": umount(req["paths"], bool(req.get("lazy")))}
            elif op == "exec":
                answer = {"id": req_id, **start_exec(req, reaper)}
            elif op == "release":
                for fd in req["fds"]:
                    os.close(fd)
                answer = {"id": req_id, "ok": True}
            else:
                answer = {"id": req_id, "pid": reaper.spawn(lambda: start(req), False)}
        except Exception as err:  # noqa: BLE001 - every failure is answered, the loop goes on
            answer = {"id": req_id, "error": f"{type(err).__name__}: {err}"}
        send(answer)


if __name__ == "__main__":
    main()
