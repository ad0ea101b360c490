import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { shiftIdsToSandbox, stripSetIds } from '../../sandbox/id-slots';

const execFileP = promisify(execFile);
const SCRIPT = path.resolve(__dirname, '..', '..', 'sandbox', 'layer-hash.py');
const GiB = 1024 ** 3;

/**
 * Runs the layer hasher in this Python process and reports, besides its answer, how many bytes the
 * process read through read syscalls of any kind (rchar of /proc/self/io, counted after the hash).
 */
const COUNTING = `
import runpy, sys
script, d = sys.argv[1], sys.argv[2]
sys.argv = [script, d]
try:
    runpy.run_path(script, run_name='__main__')
except SystemExit as e:
    if e.code:
        raise
io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())
sys.stderr.write('rchar %s\\n' % io['rchar'])
`;

async function hash(dir: string): Promise<{ sha256: string; setid: [string, number][]; rchar: number }> {
  const { stdout, stderr } = await execFileP('python3', ['-c', COUNTING, SCRIPT, dir]);
  const rchar = Number(/rchar (\d+)/.exec(stderr)?.[1]);
  return { ...(JSON.parse(stdout) as { sha256: string; setid: [string, number][] }), rchar };
}

describe('layer hash (sandbox/layer-hash.py)', () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-layer-hash-'));
  });
  afterAll(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('hashes an 8 GiB sparse file without reading its holes', async () => {
    const dir = path.join(tmp, 'sparse');
    await fsp.mkdir(path.join(dir, 'root'), { recursive: true });
    const fh = await fsp.open(path.join(dir, 'root', 'big'), 'w');
    try {
      await fh.write('head');
      await fh.write('tail', 8 * GiB - 4);
    } finally {
      await fh.close();
    }
    const r = await hash(dir);
    expect(r.sha256).toMatch(/^[0-9a-f]{64}$/);
    // Two data extents and the interpreter's own files: megabytes, not gigabytes.
    expect(r.rchar).toBeLessThan(64 * 1024 * 1024);
    // A change in the data changes the hash.
    const fh2 = await fsp.open(path.join(dir, 'root', 'big'), 'r+');
    try {
      await fh2.write('TAIL', 8 * GiB - 4);
    } finally {
      await fh2.close();
    }
    expect((await hash(dir)).sha256).not.toBe(r.sha256);
  });

  it('hashes a file the same whether its zeros are holes or written (a sparse copy matches the original)', async () => {
    const size = 3 * 1024 * 1024 + 123;
    const sparse = path.join(tmp, 'a');
    const dense = path.join(tmp, 'b');
    for (const d of [sparse, dense]) await fsp.mkdir(path.join(d, 'root'), { recursive: true, mode: 0o755 });
    const data = Buffer.alloc(size);
    data.write('middle', 1024 * 1024 + 7);
    data.write('end', size - 3);
    await fsp.writeFile(path.join(dense, 'root', 'f'), data);
    const fh = await fsp.open(path.join(sparse, 'root', 'f'), 'w');
    try {
      await fh.write(Buffer.from('middle'), 0, 6, 1024 * 1024 + 7);
      await fh.write(Buffer.from('end'), 0, 3, size - 3);
    } finally {
      await fh.close();
    }
    const [a, b] = [await hash(sparse), await hash(dense)];
    expect(a.sha256).toBe(b.sha256);
  });

  it('lists regular files with set-id bits, and refuses a top directory that is a symlink', async () => {
    const dir = path.join(tmp, 'setid');
    await fsp.mkdir(path.join(dir, 'usr', 'bin'), { recursive: true });
    await fsp.writeFile(path.join(dir, 'usr', 'bin', 'su'), 'x');
    await fsp.chmod(path.join(dir, 'usr', 'bin', 'su'), 0o4755);
    await fsp.writeFile(path.join(dir, 'usr', 'bin', 'plain'), 'x');
    expect((await hash(dir)).setid).toEqual([['usr/bin/su', 0o4755]]);
    await fsp.symlink(dir, path.join(tmp, 'link'));
    await expect(execFileP('python3', [SCRIPT, path.join(tmp, 'link')])).rejects.toMatchObject({ code: 1 });
  });
});

describe('shiftIdsToSandbox', () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-shift-'));
  });
  afterAll(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('shifts owners to the sandbox ids, strips set-id bits of files and returns them, leaves the top directory alone', async () => {
    const base = 1207959552 + 65536 * 7;
    const f = path.join(tmp, 'root', 'workspace', 'suid');
    await fsp.mkdir(path.dirname(f), { recursive: true });
    await fsp.writeFile(f, 'x');
    const g = path.join(tmp, 'root', 'shared');
    await fsp.mkdir(g);
    for (const p of [path.join(tmp, 'root'), path.dirname(f), f, g]) await fsp.chown(p, base, base + 1000);
    await fsp.chmod(f, 0o6755);
    await fsp.chmod(g, 0o2775);
    const found = await shiftIdsToSandbox(tmp, base);
    expect(found).toEqual([['root/workspace/suid', 0o6755]]);
    const st = await fsp.lstat(f);
    expect([st.uid, st.gid, st.mode & 0o7777]).toEqual([0, 1000, 0o755]);
    const gst = await fsp.lstat(g);
    expect([gst.uid, gst.gid, gst.mode & 0o7777]).toEqual([0, 1000, 0o2775]);
    const top = await fsp.lstat(tmp);
    expect(top.uid).toBe(process.getuid!());
  });
});

describe('stripSetIds (layers of an older host)', () => {
  it('removes the set-id bits of regular files, returns them, and leaves owners, directories and links alone', async () => {
    const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-strip-'));
    try {
      const f = path.join(tmp, 'usr', 'bin', 'su');
      await fsp.mkdir(path.dirname(f), { recursive: true });
      await fsp.writeFile(f, 'x');
      await fsp.chown(f, 0, 42);
      await fsp.chmod(f, 0o4750);
      await fsp.chmod(path.dirname(f), 0o2755);
      await fsp.symlink('su', path.join(tmp, 'usr', 'bin', 'link'));
      expect(await stripSetIds(tmp)).toEqual([['usr/bin/su', 0o4750]]);
      const st = await fsp.lstat(f);
      expect([st.uid, st.gid, st.mode & 0o7777]).toEqual([0, 42, 0o750]);
      expect((await fsp.lstat(path.dirname(f))).mode & 0o7777).toBe(0o2755);
      expect(await stripSetIds(tmp)).toEqual([]);
    } finally {
      await fsp.rm(tmp, { recursive: true, force: true });
    }
  });
});
