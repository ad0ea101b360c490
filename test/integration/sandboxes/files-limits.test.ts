/**
 * A sandbox's filesystem through the public API under attack (descriptors, long paths, every errno
 * the sandbox can provoke) and uploads charged to the sandbox's memory and disk.
 */
import fs from 'node:fs';
import http from 'node:http';
import { Readable } from 'node:stream';
import { api, stackPid, T } from '../../helpers/env';
import { getFile, patterned, peakRise, putStream, putStreamAnswer, q } from '../../helpers/files';
import { newSandbox, sh } from '../../helpers/sandboxes';

let sb: string;
/** GETs a file's bytes from the file's sandbox. */
const get = (p: string, key?: string) => getFile(sb, p, key);

beforeAll(async () => {
  sb = await newSandbox({});
});

afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

const stackPids = (): { api: number; host: number } => ({ api: stackPid('api'), host: stackPid('host') });
const fdCount = (pid: number): number => fs.readdirSync(`/proc/${pid}/fd`).length;

/** The highest rise of a process's descriptor count (sampled every 2 ms) while `fn` runs. */
async function peakFdRise<T>(pid: number, fn: () => Promise<T>): Promise<{ value: T; rise: number }> {
  const first = fdCount(pid);
  let peak = first;
  const timer = setInterval(() => (peak = Math.max(peak, fdCount(pid))), 2);
  try {
    const value = await fn();
    return { value, rise: Math.max(peak, fdCount(pid)) - first };
  } finally {
    clearInterval(timer);
  }
}

/** True when an error message names something of the host rather than of the sandbox. */
const namesHostPath = (msg: string): boolean => /\/proc\/(self\/fd|\d+\/(root|fd))\//.test(msg) || msg.includes(T.dataDir()) || /\/sys\/fs\/cgroup/.test(msg);

describe('files API under attack: descriptors, long paths, errno answers', () => {
  it('answers 400 to paths past the depth limit and holds O(1) descriptors for deep paths that are allowed', async () => {
    const host = stackPids().host;
    const tooDeep = '/' + Array.from({ length: 2000 }, () => 'a').join('/');
    const refused = await peakFdRise(host, () =>
      Promise.all(Array.from({ length: 10 }, () => api('GET', `/api/sandboxes/${sb}/files/stat?path=${q(tooDeep)}`))),
    );
    for (const r of refused.value) {
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
      expect(namesHostPath(r.body.error.message)).toBe(false);
    }
    // Held one descriptor per component, ten of these held 20,000 (the host's limit).
    expect(refused.rise).toBeLessThan(50);

    // 250 directories deep (under the limit of 256): walked with the parents closed on the way down.
    const deep = '/workspace/deep/' + Array.from({ length: 248 }, () => 'd').join('/');
    await sh(sb, `mkdir -p ${deep} && echo bottom > ${deep}/f`);
    const walked = await peakFdRise(host, () =>
      Promise.all(Array.from({ length: 20 }, () => api('GET', `/api/sandboxes/${sb}/files/stat?path=${q(`${deep}/f`)}`))),
    );
    for (const r of walked.value) expect({ status: r.status, size: r.body.size }).toEqual({ status: 200, size: 7 });
    // 20 walks of 250 directories held 5,000 before; now a few each (and sockets of the requests).
    expect(walked.rise).toBeLessThan(200);
    expect((await get(`${deep}/f`)).bytes.toString()).toBe('bottom\n');
    // A symlink that makes the resolved path deeper than the limit: 400, not a deeper walk.
    await sh(sb, `ln -s ${deep} ${deep}/again`);
    const r = await api('GET', `/api/sandboxes/${sb}/files/stat?path=${q(`${deep}/again/d/d/d/d/d/d/d/d/d/d`)}`);
    expect(r.status).toBe(400);
    await sh(sb, 'rm -rf /workspace/deep');
  }, 120_000);

  it('answers 400 without a host path to a component over 255 bytes, in the path or in a link target', async () => {
    const long = 'a'.repeat(300);
    await sh(sb, `mkdir -p /workspace/long && ln -sfn ${long} /workspace/long/link && ln -sfn ${long}/x /workspace/long/link2`);
    const calls: [string, string, object?][] = [
      ['GET', `/api/sandboxes/${sb}/files/stat?path=${q(`/workspace/${long}`)}`],
      ['GET', `/api/sandboxes/${sb}/files?path=${q(`/workspace/${long}/x`)}`],
      ['PUT', `/api/sandboxes/${sb}/files?path=${q(`/workspace/${long}`)}`],
      ['GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/long/link')}`],
      ['GET', `/api/sandboxes/${sb}/files?path=${q('/workspace/long/link')}`],
      ['GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/long/link2')}`],
      ['PUT', `/api/sandboxes/${sb}/files?path=${q('/workspace/long/link2')}`],
      ['GET', `/api/sandboxes/${sb}/files/list?path=${q('/workspace/long/link')}`],
      ['POST', `/api/sandboxes/${sb}/files/mkdir`, { path: '/workspace/long/link/sub' }],
      ['POST', `/api/sandboxes/${sb}/files/rename`, { from: '/workspace/long/link', to: `/workspace/long/${long}` }],
    ];
    for (const [method, url, body] of calls) {
      const r = method === 'PUT' ? await api('PUT', url, { raw: 'x' }) : await api(method as 'GET', url, body ? { body } : {});
      expect({ url: url.slice(0, 80), status: r.status, type: r.body?.error?.type }).toEqual({ url: url.slice(0, 80), status: 400, type: 'invalid_request' });
      expect(namesHostPath(r.body.error.message)).toBe(false);
    }
    await sh(sb, 'rm -rf /workspace/long');
  });

  it('answers every errno the sandbox can provoke with a 4xx that names only the sandbox path', async () => {
    await sh(
      sb,
      [
        'mkdir -p /workspace/e/dir/sub /workspace/e/full',
        'echo x > /workspace/e/file',
        'ln -sfn loop-b /workspace/e/loop-a; ln -sfn loop-a /workspace/e/loop-b',
        'mkfifo /workspace/e/fifo',
        'echo y > /workspace/e/dir/sub/z',
      ].join(' && '),
    );
    const cases: [string, string, { body?: object; raw?: string }][] = [
      ['GET', `files?path=${q('/workspace/e/file/x')}`, {}], // ENOTDIR
      ['PUT', `files?path=${q('/workspace/e/file/x')}`, { raw: 'x' }], // ENOTDIR on create
      ['GET', `files?path=${q('/workspace/e/loop-a')}`, {}], // ELOOP
      ['GET', `files/stat?path=${q('/workspace/e/loop-a/x')}`, {}],
      ['GET', `files?path=${q('/workspace/e/dir')}`, {}], // EISDIR
      ['PUT', `files?path=${q('/workspace/e/dir')}`, { raw: 'x' }],
      ['GET', `files?path=${q('/workspace/e/fifo')}`, {}], // not a regular file
      ['PUT', `files?path=${q('/workspace/e/fifo')}`, { raw: 'x' }],
      ['GET', `files/list?path=${q('/workspace/e/file')}`, {}],
      ['POST', 'files/mkdir', { body: { path: '/workspace/e/file' } }], // EEXIST, not a directory
      ['POST', 'files/mkdir', { body: { path: '/workspace/e/file/sub' } }],
      ['POST', 'files/rename', { body: { from: '/workspace/e/dir', to: '/workspace/e/dir/sub/in' } }], // EINVAL
      ['POST', 'files/rename', { body: { from: '/workspace/e/file', to: '/workspace/e/dir' } }], // EISDIR
      ['POST', 'files/rename', { body: { from: '/workspace/e/full', to: '/workspace/e/dir' } }], // ENOTEMPTY
      ['POST', 'files/rename', { body: { from: '/workspace/e/dir', to: '/workspace/e/file' } }], // ENOTDIR
      ['POST', 'files/rename', { body: { from: '/workspace/e/file', to: '/usr/lib/moved' } }], // EXDEV (another mount)
      ['POST', 'files/rename', { body: { from: '/workspace/e/none', to: '/workspace/e/x' } }], // ENOENT
      ['DELETE', `files?path=${q('/workspace/e/dir')}&recursive=false`, {}], // ENOTEMPTY
      ['DELETE', `files?path=${q('/workspace/e/none')}`, {}],
      ['GET', `files?path=${q('/proc/self/environ')}`, {}],
      ['PUT', `files?path=${q('/proc/sys/kernel/hostname')}`, { raw: 'x' }],
      ['DELETE', `files?path=${q('/proc')}`, {}],
      ['POST', 'files/mkdir', { body: { path: '/dev/x' } }],
    ];
    for (const [method, rel, opts] of cases) {
      const r = await api(method as 'GET', `/api/sandboxes/${sb}/${rel}`, opts);
      const what = `${method} ${rel}`;
      expect({ what, status: r.status >= 400 && r.status < 500, body: typeof r.body?.error?.message }).toEqual({ what, status: true, body: 'string' });
      expect({ what, hostPath: namesHostPath(r.body.error.message) }).toEqual({ what, hostPath: false });
    }
    await sh(sb, 'rm -rf /workspace/e');
  });
});

describe('uploads count against the sandbox', () => {
  let small: string;
  beforeAll(async () => {
    small = await newSandbox({ memoryMB: 64, diskMB: 1024 });
  });
  afterAll(async () => {
    await api('DELETE', `/api/sandboxes/${small}`);
  });

  const memUsage = (id: string): number => Number(fs.readFileSync(`/sys/fs/cgroup/memory/sap/${id}/memory.usage_in_bytes`, 'utf8'));

  /** PUTs `n` MiB streamed into the small sandbox; the answer's status and body. */
  const upload = (p: string, n: number) => putStream(small, p, patterned(n).stream);

  it("writes an upload to the sandbox's disk, not its memory: three times its memory fits, nothing is OOM-killed", async () => {
    if (!fs.existsSync(`/sys/fs/cgroup/memory/sap/${small}`)) throw new Error('no memory cgroup for the sandbox: cannot check the charge');
    // The writable layer is an ext4 image of diskMB (docs/disk.md): an upload's pages are page cache
    // that the kernel reclaims, not tmpfs pages pinned in the sandbox's memory.
    expect(await sh(small, "df -m / | awk 'NR==2 {print $2}'")).toMatch(/^(9[5-9]\d|10[0-2]\d)\n$/);
    const hostPid = stackPids().host;
    const oomKills = () => Number(/^oom_kill (\d+)$/m.exec(fs.readFileSync(`/sys/fs/cgroup/memory/sap/${small}/memory.oom_control`, 'utf8'))?.[1] ?? 0);
    const oomBefore = oomKills();
    const src = patterned(192);
    const big = await peakRise(hostPid, () => putStream(small, '/workspace/huge.bin', src.stream));
    expect(big.value.status).toBe(204);
    // Streamed: the host holds no more than a window of it.
    expect(big.riseMb).toBeLessThan(64);
    expect(oomKills()).toBe(oomBefore);
    expect(memUsage(small)).toBeLessThanOrEqual(64 * 1024 * 1024);
    // Whole, byte for byte, and the sandbox lives on.
    expect(await sh(small, 'stat -c %s /workspace/huge.bin; sha256sum < /workspace/huge.bin')).toBe(`${192 * 1024 * 1024}\n${src.sha256()}  -\n`);
    expect((await upload('/workspace/after.bin', 1)).status).toBe(204);
  }, 180_000);

  it("refuses an upload past the sandbox's disk (diskMB) with 413 and gives the space back", async () => {
    const tiny = await newSandbox({ memoryMB: 256, diskMB: 16 });
    // One connection at a time: the next call goes over the refused upload's connection if its answer left it open.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const r = await putStreamAnswer(tiny, '/workspace/fill.bin', Readable.from([Buffer.alloc(48 * 1024 * 1024, 7)]), { agent });
      const body = JSON.parse(r.body) as { error: { type: string; message: string } };
      expect({ status: r.status, type: body.error.type }).toEqual({ status: 413, type: 'payload_too_large' });
      expect(body.error.message).toMatch(/disk/);
      expect(namesHostPath(body.error.message)).toBe(false);
      const after = await putStreamAnswer(tiny, '/workspace/small.txt', Readable.from([Buffer.from('still room')]), { agent });
      expect(after.status).toBe(204);
      // The answer tells the truth about its connection. Mostly the refusal reaches the API while the
      // rest of the body is still on its way: the API reads no more of it and answers `Connection:
      // close`, and the next call takes a new connection. But the API may have read all 48 MiB before
      // the host's answer reached it (what the host has not taken waits in the socket buffers between
      // the two, which the kernel grows to tens of MiB): then the request was read to its end,
      // keep-alive is right, and the next call goes over that same connection.
      expect({ connection: r.headers.connection, nextCallReused: after.reused }).toEqual(
        r.headers.connection === 'keep-alive' ? { connection: 'keep-alive', nextCallReused: true } : { connection: 'close', nextCallReused: false },
      );
    } finally {
      agent.destroy();
      await api('DELETE', `/api/sandboxes/${tiny}`);
    }
  }, 120_000);
});
