/**
 * A sandbox's filesystem through the public API, against real sandboxes: raw HTTP (streamed content,
 * list, stat, mkdir, rename, remove, signed URLs, bad paths) and the published OpenComputer client.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { Readable } from 'node:stream';
import { api, stackPid, T } from '../helpers/env';
import { otherOrgKey } from '../helpers/checkpoints';
import { newSandbox, sh } from '../helpers/sandboxes';
import { runSdk } from '../helpers/sdk';

let sb: string;

beforeAll(async () => {
  sb = await newSandbox({});
});

afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

const q = (p: string) => encodeURIComponent(p);

/** PUTs raw bytes as a file. */
function put(p: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${T.api()}/api/sandboxes/${sb}/files?path=${q(p)}`, { method: 'PUT', headers: { 'x-api-key': T.key(), ...headers }, body });
}

/** GETs a file's bytes. */
async function get(p: string, key: string = T.key()): Promise<{ status: number; bytes: Buffer; headers: Headers }> {
  const res = await fetch(`${T.api()}/api/sandboxes/${sb}/files?path=${q(p)}`, { headers: { 'x-api-key': key } });
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()), headers: res.headers };
}

/** The resident memory of a process in kB. */
function rssKb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

/** Samples a process's RSS every 20 ms while `fn` runs; returns fn's value and the highest sample's rise over the first. */
async function peakRise<T>(pid: number, fn: () => Promise<T>): Promise<{ value: T; riseMb: number }> {
  const first = rssKb(pid);
  let peak = first;
  const timer = setInterval(() => (peak = Math.max(peak, rssKb(pid))), 20);
  try {
    const value = await fn();
    return { value, riseMb: (peak - first) / 1024 };
  } finally {
    clearInterval(timer);
  }
}

const apiPid = (): number => stackPid('api');

/** `n` MiB of deterministic bytes as a stream (never whole in memory), and their sha256 once read. */
function patterned(n: number): { stream: Readable; sha256: () => string } {
  const hash = createHash('sha256');
  let i = 0;
  const stream = new Readable({
    read() {
      if (i === n) return this.push(null);
      const chunk = Buffer.alloc(1024 * 1024, i % 251);
      chunk.writeUInt32BE(i++, 0);
      hash.update(chunk);
      this.push(chunk);
    },
  });
  return { stream, sha256: () => hash.digest('hex') };
}

/**
 * PUTs a stream to a sandbox's file through the API; the answer's status and body. An answer that
 * comes before the whole body went out (a refusal) is no failure here.
 */
function putStream(sandbox: string, p: string, body: Readable): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${T.api()}/api/sandboxes/${sandbox}/files?path=${q(p)}`, {
      method: 'PUT',
      headers: { 'x-api-key': T.key(), 'content-type': 'application/octet-stream' },
    });
    req.on('response', (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', (err) => (req.writableEnded ? undefined : reject(err)));
    body.pipe(req);
  });
}

describe('files over raw HTTP', () => {
  it('writes, reads, lists, stats, makes directories, renames and removes', async () => {
    // Content types do not matter: a JSON or NDJSON file is stored as sent, not parsed.
    expect((await put('/workspace/a/b/hello.txt', 'hello\n', { 'content-type': 'text/plain' })).status).toBe(200);
    expect((await put('/workspace/a/data.json', '{"not":"parsed"', { 'content-type': 'application/json' })).status).toBe(200);
    expect((await put('/workspace/a/empty', '')).status).toBe(200);
    expect((await get('/workspace/a/b/hello.txt')).bytes.toString()).toBe('hello\n');
    const json = await get('/workspace/a/data.json');
    expect(json.bytes.toString()).toBe('{"not":"parsed"');
    expect(json.headers.get('content-length')).toBe('15');
    expect((await get('/workspace/a/empty')).bytes.length).toBe(0);
    expect(await sh(sb, 'cat /workspace/a/b/hello.txt; stat -c "%U %a" /workspace/a/b/hello.txt /workspace/a/b')).toBe('hello\nroot 644\nroot 755\n');

    const list = await api('GET', `/api/sandboxes/${sb}/files/list?path=${q('/workspace/a')}`);
    expect(list.status).toBe(200);
    expect(list.body.map((e: { name: string }) => e.name)).toEqual(['b', 'data.json', 'empty']);
    expect(list.body[0]).toMatchObject({ name: 'b', path: '/workspace/a/b', isDir: true, type: 'dir', size: 0, mode: 0o755 });
    expect(list.body[1]).toMatchObject({ name: 'data.json', path: '/workspace/a/data.json', isDir: false, type: 'file', size: 15, mode: 0o644 });
    expect(Date.parse(list.body[1].modTime)).toBeGreaterThan(Date.now() - 60_000);

    const mk = await api('POST', `/api/sandboxes/${sb}/files/mkdir?path=${q('/workspace/x/y/z')}`);
    expect(mk.status).toBe(200);
    expect(mk.body).toMatchObject({ path: '/workspace/x/y/z', isDir: true });
    expect((await api('POST', `/api/sandboxes/${sb}/files/mkdir?path=${q('/workspace/x/y/z')}`)).status).toBe(200); // mkdir -p
    expect((await api('POST', `/api/sandboxes/${sb}/files/mkdir`, { body: { path: '/workspace/x/w' } })).status).toBe(200);
    const blocked = await api('POST', `/api/sandboxes/${sb}/files/mkdir?path=${q('/workspace/a/empty/sub')}`);
    expect(blocked.status).toBe(409);
    expect(blocked.body.error.type).toBe('conflict');

    const st = await api('GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/a/b/hello.txt')}`);
    expect(st.body).toMatchObject({ type: 'file', size: 6 });
    await sh(sb, 'ln -s /workspace/a/b/hello.txt /workspace/link');
    expect((await api('GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/link')}`)).body).toMatchObject({ type: 'file', path: '/workspace/a/b/hello.txt' });
    expect((await api('GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/link')}&noFollow=true`)).body).toMatchObject({
      type: 'symlink',
      target: '/workspace/a/b/hello.txt',
    });

    const mv = await api('POST', `/api/sandboxes/${sb}/files/rename`, { body: { from: '/workspace/a/b/hello.txt', to: '/workspace/moved/hi.txt' } });
    expect(mv.status).toBe(200);
    expect(mv.body).toMatchObject({ path: '/workspace/moved/hi.txt', type: 'file', size: 6 });
    expect((await get('/workspace/a/b/hello.txt')).status).toBe(404);
    expect((await get('/workspace/moved/hi.txt')).bytes.toString()).toBe('hello\n');
    expect((await api('POST', `/api/sandboxes/${sb}/files/rename`, { body: { from: '/workspace/nope', to: '/workspace/n2' } })).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/files/rename`, { body: { from: '/workspace/moved/hi.txt', to: '/workspace/x' } })).status).toBe(409);

    const notEmpty = await api('DELETE', `/api/sandboxes/${sb}/files?path=${q('/workspace/x')}&recursive=false`);
    expect(notEmpty.status).toBe(409);
    // A removed symlink is the link, not its target.
    expect((await api('DELETE', `/api/sandboxes/${sb}/files?path=${q('/workspace/link')}`)).status).toBe(200);
    expect((await api('DELETE', `/api/sandboxes/${sb}/files?path=${q('/workspace/x')}`)).status).toBe(200);
    expect((await api('DELETE', `/api/sandboxes/${sb}/files?path=${q('/workspace/a/empty')}`)).status).toBe(200);
    expect(await sh(sb, 'ls /workspace; ls /workspace/a; test -e /workspace/x || echo gone')).toBe('a\nmoved\nb\ndata.json\ngone\n');
    const missing = await api('DELETE', `/api/sandboxes/${sb}/files?path=${q('/workspace/x')}`);
    expect(missing.status).toBe(404);
    expect(missing.body.error.type).toBe('not_found');
  });

  it('refuses bad paths with the error body, and never reaches the host', async () => {
    const secret = path.join('/tmp', `sap-host-secret-${process.pid}`);
    fs.writeFileSync(secret, 'host secret');
    try {
      await sh(sb, `ln -sf ${secret} /workspace/to-host; ln -sf /proc/1/root/etc /workspace/to-proc; mkdir -p /workspace/d`);
      const cases: [string, number][] = [
        ['/workspace/../etc/passwd', 400],
        ['workspace/relative', 400],
        ['/workspace/d', 400], // a directory where a file is expected
        ['/workspace/none', 404],
        ['/workspace/to-host', 404], // the link resolves in the sandbox, where that file does not exist
        ['/workspace/to-proc/hostname', 400], // the sandbox's /proc is not part of its files
        ['/proc/self/environ', 400],
        ['/dev/null', 400],
      ];
      for (const [p, status] of cases) {
        const r = await api('GET', `/api/sandboxes/${sb}/files?path=${q(p)}`);
        expect({ p, status: r.status, type: typeof r.body?.error?.type }).toEqual({ p, status, type: 'string' });
        expect(JSON.stringify(r.body)).not.toContain('host secret');
      }
      // Writes through a link land inside the sandbox; the host file is untouched.
      expect((await put('/workspace/to-host', 'overwritten')).status).toBe(200);
      expect(fs.readFileSync(secret, 'utf8')).toBe('host secret');
      expect(await sh(sb, `cat ${secret}`)).toBe('overwritten');
      expect((await put('/proc/sys/kernel/hostname', 'x')).status).toBe(400);
      expect((await put('/workspace/d', 'x')).status).toBe(400);
      expect((await api('DELETE', `/api/sandboxes/${sb}/files?path=/`)).status).toBe(400);
      expect((await api('GET', `/api/sandboxes/${sb}/files/list?path=${q('/workspace/to-host')}`)).status).toBe(400);
      expect((await api('GET', `/api/sandboxes/${sb}/files`)).status).toBe(400); // no path
    } finally {
      fs.rmSync(secret, { force: true });
    }
  });

  it('answers 404 for another organisation, 401 without a key, 409 for a stopped sandbox', async () => {
    const other = await otherOrgKey();
    expect((await get('/etc/hostname', other)).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb}/files/list?path=/`, { key: other })).status).toBe(404);
    expect((await api('PUT', `/api/sandboxes/${sb}/files?path=/x`, { key: other, raw: 'x' })).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb}/files/list?path=/`, { key: null })).status).toBe(401);
    const gone = await newSandbox({});
    expect((await api('DELETE', `/api/sandboxes/${gone}`)).status).toBe(200);
    const r = await api('GET', `/api/sandboxes/${gone}/files/list?path=/`);
    expect([404, 409]).toContain(r.status);
    expect(r.body.error.type).toMatch(/not_found|conflict/);
  });

  it('streams 100 MB up and down byte for byte while the API stays flat', async () => {
    const pid = apiPid();
    const src = patterned(100);
    const up = await peakRise(pid, () => putStream(sb, '/workspace/big.bin', src.stream));
    expect(up.value.status).toBe(200);
    expect(JSON.parse(up.value.body)).toEqual({ path: '/workspace/big.bin', size: 100 * 1024 * 1024 });
    const want = src.sha256();
    expect((await sh(sb, 'sha256sum /workspace/big.bin')).split(' ')[0]).toBe(want);

    const down = await peakRise(pid, () =>
      new Promise<{ sha: string; size: number; length: string | undefined }>((resolve, reject) => {
        http.get(`${T.api()}/api/sandboxes/${sb}/files?path=${q('/workspace/big.bin')}`, { headers: { 'x-api-key': T.key() } }, (res) => {
          const hash = createHash('sha256');
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            hash.update(c);
          });
          res.on('end', () => resolve({ sha: hash.digest('hex'), size, length: res.headers['content-length'] }));
          res.on('error', reject);
        }).on('error', reject);
      }),
    );
    expect(down.value).toEqual({ sha: want, size: 100 * 1024 * 1024, length: String(100 * 1024 * 1024) });
    // Holding the file would add 100 MB or more; streaming adds socket buffers plus chunks already
    // passed on but not yet collected (they count in RSS until V8 frees them: 42 MB was seen once
    // on a loaded CI machine), so the bound sits well under the file's size, not near zero.
    expect(up.riseMb).toBeLessThan(64);
    expect(down.riseMb).toBeLessThan(64);
    await sh(sb, 'rm /workspace/big.bin');
  }, 120_000);

  it('hands out signed URLs that work without a key, for one file, one method, until they expire', async () => {
    const mk = async (kind: 'download' | 'upload', p: string, expiresIn?: number) => {
      const r = await api('POST', `/api/sandboxes/${sb}/files/${kind}-url`, { body: { path: p, ...(expiresIn ? { expiresIn } : {}) } });
      expect(r.status).toBe(200);
      expect(Date.parse(r.body.expiresAt)).toBeGreaterThan(Date.now());
      return r.body.url as string;
    };
    const upUrl = await mk('upload', '/workspace/signed.txt');
    expect(upUrl.startsWith(`${T.api()}/api/files/`)).toBe(true);
    expect((await fetch(upUrl, { method: 'PUT', body: 'via url', headers: { 'content-type': 'text/plain' } })).status).toBe(200);
    const downUrl = await mk('download', '/workspace/signed.txt');
    const d = await fetch(downUrl);
    expect(d.status).toBe(200);
    expect(d.headers.get('content-disposition')).toBe('attachment; filename="signed.txt"');
    expect(await d.text()).toBe('via url');
    // The wrong method, a changed path or signature, and an expired URL: 403 with the body.
    const wrong = await fetch(downUrl, { method: 'PUT', body: 'x' });
    expect(wrong.status).toBe(403);
    expect(((await wrong.json()) as { error: { type: string } }).error.type).toBe('forbidden');
    const [payload, sig] = downUrl.split('/api/files/')[1]!.split('.');
    const forged = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), p: '/etc/shadow' })).toString('base64url');
    expect((await fetch(`${T.api()}/api/files/${forged}.${sig}`)).status).toBe(403);
    expect((await fetch(`${downUrl.slice(0, -2)}xx`)).status).toBe(403);
    const short = await mk('download', '/workspace/signed.txt', 1);
    await new Promise((r) => setTimeout(r, 2100));
    const expired = await fetch(short);
    expect(expired.status).toBe(403);
    expect(((await expired.json()) as { error: { message: string } }).error.message).toMatch(/expired/);
    expect((await api('POST', `/api/sandboxes/${sb}/files/download-url`, { body: { path: '/x', expiresIn: 999_999 } })).status).toBe(400);
  });
});

describe('files through the OpenComputer client', () => {
  it('read, readBytes, write (text, bytes, stream), list, makeDir, exists, remove, download and upload URLs', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      await sb.files.write('/workspace/sdk/t.txt', 'text ✓');
      await sb.files.write('/workspace/sdk/b.bin', new Uint8Array([0, 1, 2, 255]));
      const chunks = [new TextEncoder().encode('stre'), new TextEncoder().encode('amed')];
      await sb.files.write('/workspace/sdk/s.txt', new ReadableStream({ pull(c) { const n = chunks.shift(); n ? c.enqueue(n) : c.close(); } }));
      await sb.files.makeDir('/workspace/sdk/dir/sub');
      const list = await sb.files.list('/workspace/sdk');
      const out1 = {
        text: await sb.files.read('/workspace/sdk/t.txt'),
        bytes: [...await sb.files.readBytes('/workspace/sdk/b.bin')],
        streamed: await sb.files.read('/workspace/sdk/s.txt'),
        list: list.map((e) => [e.name, e.isDir, e.path, e.size]),
        exists: await sb.files.exists('/workspace/sdk/t.txt'),
      };
      await sb.files.remove('/workspace/sdk/dir');
      out1.existsAfter = await sb.files.exists('/workspace/sdk/dir/sub');
      const up = await sb.uploadUrl('/workspace/sdk/u.txt');
      await fetch(up, { method: 'PUT', body: 'uploaded' });
      out1.viaUrl = await (await fetch(await sb.downloadUrl('/workspace/sdk/u.txt', { expiresIn: 60 }))).text();
      let err = '';
      try { await sb.files.read('/workspace/sdk/none'); } catch (e) { err = e.message; }
      out1.err = err;
      out(out1);
    `,
      { SB: sb },
    );
    expect(r).toEqual({
      text: 'text ✓',
      bytes: [0, 1, 2, 255],
      streamed: 'streamed',
      list: [
        ['b.bin', false, '/workspace/sdk/b.bin', 4],
        ['dir', true, '/workspace/sdk/dir', 0],
        ['s.txt', false, '/workspace/sdk/s.txt', 8],
        ['t.txt', false, '/workspace/sdk/t.txt', 8],
      ],
      exists: true,
      existsAfter: false,
      viaUrl: 'uploaded',
      err: 'Failed to read /workspace/sdk/none: 404',
    });
  });
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
    const refused = await peakFdRise(host, () => Promise.all(Array.from({ length: 10 }, () => api('GET', `/api/sandboxes/${sb}/files/stat?path=${q(tooDeep)}`))));
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
    const walked = await peakFdRise(host, () => Promise.all(Array.from({ length: 20 }, () => api('GET', `/api/sandboxes/${sb}/files/stat?path=${q(`${deep}/f`)}`))));
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
    await sh(sb, 
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

  it("charges an upload's pages to the sandbox's memory, and refuses one past it cleanly", async () => {
    if (!fs.existsSync(`/sys/fs/cgroup/memory/sap/${small}`)) throw new Error('no memory cgroup for the sandbox: cannot check the charge');
    const before = memUsage(small);
    const ok = await upload('/workspace/charged.bin', 24);
    expect(ok.status).toBe(200);
    // The 24 MiB sit in the sandbox's tmpfs and count in its memory (they counted 0 before).
    expect(memUsage(small) - before).toBeGreaterThan(20 * 1024 * 1024);

    // Three times the sandbox's memory: refused with the error body, the host's memory flat.
    const hostPid = stackPids().host;
    const oomKills = () => Number(/^oom_kill (\d+)$/m.exec(fs.readFileSync(`/sys/fs/cgroup/memory/sap/${small}/memory.oom_control`, 'utf8'))?.[1] ?? 0);
    const oomBefore = oomKills();
    const big = await peakRise(hostPid, () => upload('/workspace/huge.bin', 192));
    expect(big.value.status).toBe(413);
    const body = JSON.parse(big.value.body) as { error: { type: string; message: string } };
    expect(body.error.type).toBe('payload_too_large');
    expect(body.error.message).toMatch(/memory/);
    expect(namesHostPath(body.error.message)).toBe(false);
    expect(big.riseMb).toBeLessThan(64);
    // Refused before the kernel had to OOM-kill anything in the sandbox.
    expect(oomKills()).toBe(oomBefore);
    // The sandbox holds no more than its limit, the partial file was given back, the sandbox lives on.
    expect(memUsage(small)).toBeLessThanOrEqual(64 * 1024 * 1024);
    const r = await api('POST', `/api/sandboxes/${small}/exec/run`, { body: { cmd: 'bash', args: ['-c', 'stat -c %s /workspace/huge.bin; stat -c %s /workspace/charged.bin'] } });
    expect(r.status).toBe(200);
    expect(r.body.stdout).toBe(`0\n${24 * 1024 * 1024}\n`);
    // And the files API still works for it.
    expect((await upload('/workspace/after.bin', 1)).status).toBe(200);
  }, 180_000);

  it('refuses an upload past the sandbox\'s disk (diskMB) with 413 and gives the space back', async () => {
    const tiny = await newSandbox({ memoryMB: 256, diskMB: 16 });
    try {
      const r = await fetch(`${T.api()}/api/sandboxes/${tiny}/files?path=${q('/workspace/fill.bin')}`, {
        method: 'PUT',
        headers: { 'x-api-key': T.key(), 'content-type': 'application/octet-stream' },
        body: Buffer.alloc(48 * 1024 * 1024, 7),
      });
      const body = (await r.json()) as { error: { type: string; message: string } };
      expect({ status: r.status, type: body.error.type }).toEqual({ status: 413, type: 'payload_too_large' });
      expect(body.error.message).toMatch(/disk/);
      expect(namesHostPath(body.error.message)).toBe(false);
      const after = await api('PUT', `/api/sandboxes/${tiny}/files?path=${q('/workspace/small.txt')}`, { raw: 'still room' });
      expect(after.status).toBe(200);
    } finally {
      await api('DELETE', `/api/sandboxes/${tiny}`);
    }
  }, 120_000);
});
