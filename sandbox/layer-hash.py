#!/usr/bin/env python3
"""
The content hash of a layer's directory (see NamespaceProvider.hashOfDir), computed in a process of its
own so that the host's event loop never waits on it.

usage: layer-hash.py DIR
prints one JSON line: {"sha256": HEX, "setid": [[RELATIVE PATH, MODE], ...]}: the first SETID_SHOWN
regular files that carry set-id bits, which a layer on disk must not have (see id-slots.ts).

What is hashed, in name order (bytes) at each level, layer.json at the top left out:
  d <path> <mode> <uid>:<gid>
  l <path> <target> <uid>:<gid>
  f <path> <mode> <size> <uid>:<gid>, then for every 64 KiB chunk of the file that holds a byte other
      than zero, "@<offset>\n" and the chunk's bytes; then "\n"
  s <path> <mode> <rdev>   (whiteouts and other special files)
A chunk of zeros is left out whether it is a hole or written zeros, so two copies of a file hash the
same however sparse each is. Only the file's data extents (SEEK_DATA / SEEK_HOLE) are read: an 8 GiB
hole costs nothing.

Every name is opened relative to its directory's descriptor, never following a symlink; the top
directory itself must be a directory, not a link to one.
"""
import errno
import hashlib
import json
import os
import stat
import sys

CHUNK = 1 << 16
SETID_SHOWN = 10
ZEROS = bytes(CHUNK)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def data_chunks(fd, size):
    """The offsets of the CHUNK-aligned chunks that hold the file's data extents, in order."""
    last = -1
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return  # only a hole from here to the end
            if e.errno == errno.EINVAL:
                start = pos  # no SEEK_DATA on this filesystem: all of it is data
            else:
                raise
        try:
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            end = size
        end = min(end, size)
        c = (start // CHUNK) * CHUNK
        while c < end:
            if c > last:
                yield c
                last = c
            c += CHUNK
        pos = end


def hash_file(h, fd, size):
    for off in data_chunks(fd, size):
        buf = os.pread(fd, min(CHUNK, size - off), off)
        if buf != ZEROS[: len(buf)]:
            h.update(b"@%d\n" % off)
            h.update(buf)


def walk(h, dfd, rel, setid):
    for name in sorted(os.fsencode(n) for n in os.listdir(dfd)):
        r = rel + b"/" + name if rel else name
        if r == b"layer.json":
            continue
        st = os.lstat(name, dir_fd=dfd)
        mode = b"%o" % stat.S_IMODE(st.st_mode)
        owner = b"%d:%d" % (st.st_uid, st.st_gid)
        if stat.S_ISDIR(st.st_mode):
            h.update(b"d " + r + b" " + mode + b" " + owner + b"\n")
            sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
            try:
                walk(h, sub, r, setid)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            h.update(b"l " + r + b" " + os.readlink(name, dir_fd=dfd) + b" " + owner + b"\n")
        elif stat.S_ISREG(st.st_mode):
            h.update(b"f " + r + b" " + mode + b" %d " % st.st_size + owner + b"\n")
            fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
            try:
                fst = os.fstat(fd)
                if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
                    raise OSError(errno.ESTALE, "changed while hashed", r)
                hash_file(h, fd, st.st_size)
            finally:
                os.close(fd)
            h.update(b"\n")
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and len(setid) < SETID_SHOWN:
                setid.append([r.decode("utf-8", "surrogateescape"), stat.S_IMODE(st.st_mode)])
        else:
            h.update(b"s " + r + b" " + mode + b" %d\n" % st.st_rdev)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: layer-hash.py DIR\n")
        return 2
    top = os.open(os.fsencode(sys.argv[1]), DIR_FLAGS)
    h = hashlib.sha256()
    setid = []
    try:
        walk(h, top, b"", setid)
    finally:
        os.close(top)
    sys.stdout.write(json.dumps({"sha256": h.hexdigest(), "setid": setid}) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as e:
        sys.stderr.write("layer-hash: %s\n" % e)
        sys.exit(1)
