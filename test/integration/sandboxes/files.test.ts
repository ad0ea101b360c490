/**
 * A sandbox's filesystem through the public API, against real sandboxes: raw HTTP (streamed content,
 * list, stat, mkdir, rename, remove, signed URLs, bad paths) and the published OpenComputer client.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { api, stackPid, T } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { newSandbox, sh } from '../../helpers/sandboxes';
import { getFile, patterned, peakRise, putStream, q } from '../../helpers/files';
import { runSdk } from '../../helpers/sdk';

let sb: string;

beforeAll(async () => {
  sb = await newSandbox({});
});

afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

/** PUTs raw bytes as a file. */
function put(p: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${T.api()}/api/sandboxes/${sb}/files?path=${q(p)}`, { method: 'PUT', headers: { 'x-api-key': T.key(), ...headers }, body });
}

/** GETs a file's bytes. */
const get = (p: string, key?: string) => getFile(sb, p, key);

const apiPid = (): number => stackPid('api');

describe('files over raw HTTP', () => {
  it('writes, reads, lists, stats, makes directories, renames and removes', async () => {
    // Content types do not matter: a JSON or NDJSON file is stored as sent, not parsed.
    const writing = Date.now();
    expect((await put('/workspace/a/b/hello.txt', 'hello\n', { 'content-type': 'text/plain' })).status).toBe(204);
    expect((await put('/workspace/a/data.json', '{"not":"parsed"', { 'content-type': 'application/json' })).status).toBe(204);
    expect((await put('/workspace/a/empty', '')).status).toBe(204);
    expect((await get('/workspace/a/b/hello.txt')).bytes.toString()).toBe('hello\n');
    const json = await get('/workspace/a/data.json');
    expect(json.bytes.toString()).toBe('{"not":"parsed"');
    expect(json.headers.get('content-length')).toBe('15');
    expect((await get('/workspace/a/empty')).bytes.length).toBe(0);
    // Owned by the sandbox's user (sandbox, the default of /api sandboxes), who can then edit them.
    expect(await sh(sb, 'cat /workspace/a/b/hello.txt; stat -c "%U %a" /workspace/a/b/hello.txt /workspace/a/b')).toBe('hello\nsandbox 644\nsandbox 755\n');

    const list = await api('GET', `/api/sandboxes/${sb}/files/list?path=${q('/workspace/a')}`);
    expect(list.status).toBe(200);
    expect(list.body.map((e: { name: string }) => e.name)).toEqual(['b', 'data.json', 'empty']);
    expect(list.body[0]).toMatchObject({ name: 'b', path: '/workspace/a/b', isDir: true, type: 'dir', size: 0, mode: 0o755 });
    expect(list.body[1]).toMatchObject({ name: 'data.json', path: '/workspace/a/data.json', isDir: false, type: 'file', size: 15, mode: 0o644 });
    // Written by this test (the filesystem's clock is coarse: up to a tick, here 1 s of slack, behind Date.now()).
    expect(Date.parse(list.body[1].modTime)).toBeGreaterThanOrEqual(writing - 1000);
    expect(Date.parse(list.body[1].modTime)).toBeLessThanOrEqual(Date.now());

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
    expect((await api('GET', `/api/sandboxes/${sb}/files/stat?path=${q('/workspace/link')}`)).body).toMatchObject({
      type: 'file',
      path: '/workspace/a/b/hello.txt',
    });
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
      expect((await put('/workspace/to-host', 'overwritten')).status).toBe(204);
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
    // 204 with no body, as OpenComputer answers an upload (its examples check the status).
    expect(up.value).toEqual({ status: 204, body: '' });
    expect((await sh(sb, 'stat -c %s /workspace/big.bin')).trim()).toBe(String(100 * 1024 * 1024));
    const want = src.sha256();
    expect((await sh(sb, 'sha256sum /workspace/big.bin')).split(' ')[0]).toBe(want);

    const down = await peakRise(
      pid,
      () =>
        new Promise<{ sha: string; size: number; length: string | undefined }>((resolve, reject) => {
          http
            .get(`${T.api()}/api/sandboxes/${sb}/files?path=${q('/workspace/big.bin')}`, { headers: { 'x-api-key': T.key() } }, (res) => {
              const hash = createHash('sha256');
              let size = 0;
              res.on('data', (c: Buffer) => {
                size += c.length;
                hash.update(c);
              });
              res.on('end', () => resolve({ sha: hash.digest('hex'), size, length: res.headers['content-length'] }));
              res.on('error', reject);
            })
            .on('error', reject);
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
    expect((await fetch(upUrl, { method: 'PUT', body: 'via url', headers: { 'content-type': 'text/plain' } })).status).toBe(204);
    const downUrl = await mk('download', '/workspace/signed.txt');
    const d = await fetch(downUrl);
    expect(d.status).toBe(200);
    expect(d.headers.get('content-disposition')).toMatch(/^attachment; filename="signed.txt"/);
    expect(await d.text()).toBe('via url');
    // The wrong method, a changed path or signature, and an expired URL: 403 with the body.
    const wrong = await fetch(downUrl, { method: 'PUT', body: 'x' });
    expect(wrong.status).toBe(403);
    expect(((await wrong.json()) as { error: { type: string } }).error.type).toBe('forbidden');
    const [payload, sig] = downUrl.split('/api/files/')[1]!.split('.');
    const forged = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), p: '/etc/shadow' })).toString('base64url');
    expect((await fetch(`${T.api()}/api/files/${forged}.${sig}`)).status).toBe(403);
    expect((await fetch(`${downUrl.slice(0, -2)}xx`)).status).toBe(403);
    const shortUrl = await api('POST', `/api/sandboxes/${sb}/files/download-url`, { body: { path: '/workspace/signed.txt', expiresIn: 1 } });
    expect(shortUrl.status).toBe(200);
    // Once its expiry has passed (the API runs on this machine's clock): the event, not a pause.
    const expiresAt = Date.parse(shortUrl.body.expiresAt);
    while (Date.now() <= expiresAt) await new Promise((r) => setTimeout(r, expiresAt + 1 - Date.now()));
    const expired = await fetch(shortUrl.body.url);
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
      out1.uploadStatus = (await fetch(up, { method: 'PUT', body: 'uploaded' })).status;
      out1.viaUrl = await (await fetch(await sb.downloadUrl('/workspace/sdk/u.txt', { expiresIn: 60 }))).text();
      // As OpenComputer's test-large-files.ts does as the default user: an upload to /root.
      out1.toRoot = (await fetch(await sb.uploadUrl('/root/sdk-up.txt'), { method: 'PUT', body: 'in root' })).status;
      out1.rootRead = await sb.files.read('/root/sdk-up.txt');
      out1.user = (await sb.commands.run('whoami')).stdout.trim();
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
      uploadStatus: 204,
      viaUrl: 'uploaded',
      toRoot: 204,
      rootRead: 'in root',
      user: 'sandbox',
      err: 'Failed to read /workspace/sdk/none: 404',
    });
  });
});
