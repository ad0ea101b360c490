import { execFileSync } from 'node:child_process';

/**
 * Every regular file under `dirs` (symlinks not followed) whose bytes hold `needle`. Sparse files
 * (the sandboxes' disk images: GiBs of holes around a few MiB) are read by their data extents
 * only (SEEK_DATA / SEEK_HOLE), in chunks that overlap by the needle's length, so a multi-GiB image
 * costs what was written into it. Runs `sync` first, so that what sandboxes wrote into their
 * mounted images is in the image files.
 */
export function filesHolding(needle: string, dirs: string[]): string[] {
  execFileSync('sync');
  const out = execFileSync('python3', ['-c', SCAN, needle, ...dirs], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, timeout: 600_000 });
  return out.split('\n').filter(Boolean);
}

const SCAN = String.raw`
import os, stat, sys
needle = sys.argv[1].encode()
CHUNK = 8 << 20
def holds(p):
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        end = os.fstat(fd).st_size
        o = 0
        while o < end:
            try:
                d = os.lseek(fd, o, os.SEEK_DATA)
            except OSError:
                return False
            h = os.lseek(fd, d, os.SEEK_HOLE)
            tail = b''
            while d < h:
                b = os.pread(fd, min(CHUNK, h - d), d)
                if not b:
                    break
                if needle in tail + b:
                    return True
                tail = b[-(len(needle) - 1):] if len(needle) > 1 else b''
                d += len(b)
            o = h
        return False
    finally:
        os.close(fd)
seen = set()
for top in sys.argv[2:]:
    for root, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            try:
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                if holds(p):
                    print(p)
            except FileNotFoundError:
                pass
`;
