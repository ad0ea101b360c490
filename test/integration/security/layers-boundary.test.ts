/**
 * The boundary between checkpoint layers on disk and the host's other users, tried as an attacker:
 * set-id files made in a sandbox, DATA_DIR's permissions, a layer redirected by a symlink, and an
 * 8 GiB sparse file that must not be read (or sent) in full.
 */
import { execFile, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import { promisify } from 'node:util';
import * as path from 'node:path';
import { api, T } from '../../helpers/env';
import { hostClient, hostSh, newSandbox } from '../../helpers/sandboxes';

jest.setTimeout(180_000);

const execFileP = promisify(execFile);

const layerDir = (id: string) => path.join(T.dataDir(), 'layers', id);

/** Runs argv as `nobody` (uid and gid 65534, no groups): its exit code and output. */
function asNobody(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) =>
    execFile('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '--', ...argv], (err, stdout, stderr) =>
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : -1) : 0, stdout, stderr }),
    ),
  );
}

/**
 * Runs `file` as `nobody` although nobody cannot reach its path (DATA_DIR is root's alone): root
 * opens it and hands the descriptor over; nobody executes /proc/self/fd/3. What a user who got hold
 * of the file would run, set-id bits (if any) included.
 */
async function runAsNobodyByFd(file: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const fh = await fsp.open(file, 'r');
  try {
    return await new Promise((resolve, reject) => {
      const child = spawn('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '--', '/proc/self/fd/3', ...args], {
        stdio: ['ignore', 'pipe', 'pipe', fh.fd],
      });
      let stdout = '';
      let stderr = '';
      child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
  } finally {
    await fh.close();
  }
}

/** Every entry under `dir` (not following symlinks), with its lstat. */
async function walk(dir: string): Promise<{ path: string; st: import('node:fs').Stats }[]> {
  const out: { path: string; st: import('node:fs').Stats }[] = [];
  const go = async (p: string) => {
    const st = await fsp.lstat(p);
    out.push({ path: p, st });
    if (st.isDirectory()) for (const n of await fsp.readdir(p)) await go(path.join(p, n));
  };
  await go(dir);
  return out;
}

/** Sandboxes and checkpoints made by a test, removed after it whatever happened. */
const sandboxes: string[] = [];
const checkpoints: { sandbox: string; id: string }[] = [];
afterEach(async () => {
  for (const id of sandboxes.splice(0)) await api('DELETE', `/api/sandboxes/${id}`);
  for (const c of checkpoints.splice(0)) await api('DELETE', `/api/sandboxes/${c.sandbox}/checkpoints/${c.id}`);
});

async function sandbox(): Promise<string> {
  const id = await newSandbox({ user: 'root' });
  sandboxes.push(id);
  return id;
}

async function checkpoint(sandboxId: string): Promise<string> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/checkpoints`, { body: {} });
  if (r.status !== 201) throw new Error(`checkpoint: ${r.status} ${JSON.stringify(r.body)}`);
  checkpoints.unshift({ sandbox: sandboxId, id: r.body.id as string });
  return r.body.id as string;
}

async function spawnFrom(cpId: string): Promise<string> {
  const r = await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: { user: 'root' } });
  if (r.status !== 201) throw new Error(`spawn from ${cpId}: ${r.status} ${JSON.stringify(r.body)}`);
  sandboxes.push(r.body.sandboxID as string);
  return r.body.sandboxID as string;
}

describe('checkpoint layers and the host', () => {
  it('a set-id file made in a sandbox is never a set-id file on the host, and keeps its bits in sandboxes spawned from the checkpoint', async () => {
    const a = await sandbox();
    await hostSh(
      a,
      'cp /usr/bin/id /workspace/suid-id && chmod 4755 /workspace/suid-id && ' +
        'mkdir -p /usr/local/bin && cp /usr/bin/id /usr/local/bin/sgid-id && chmod 2755 /usr/local/bin/sgid-id && ' +
        'cp /usr/bin/id /workspace/later-plain && chmod 4755 /workspace/later-plain',
    );
    const cp1 = await checkpoint(a);

    const setIdOnDisk = async (id: string) =>
      (await walk(layerDir(id))).filter((e) => !e.st.isDirectory() && !e.st.isSymbolicLink() && e.st.mode & 0o6000).map((e) => e.path);
    expect(await setIdOnDisk(cp1)).toEqual([]);
    // The attack itself: nobody runs the file on the host and must not come out as root. It must
    // run (a run that failed would show nothing), as nobody: with a set-uid bit it would print 0.
    const onDisk = path.join(layerDir(cp1), 'root', 'workspace', 'suid-id');
    expect(await runAsNobodyByFd(onDisk, ['-u'])).toEqual({ code: 0, stdout: '65534\n', stderr: '' });
    // The control: a set-uid copy on the same filesystem, run the same way, does come out as root.
    const control = path.join(T.dataDir(), `suid-control-${process.pid}`);
    try {
      await fsp.copyFile('/usr/bin/id', control);
      await fsp.chmod(control, 0o4755);
      expect(await runAsNobodyByFd(control, ['-u'])).toEqual({ code: 0, stdout: '0\n', stderr: '' });
    } finally {
      await fsp.rm(control, { force: true });
    }

    const b = await spawnFrom(cp1);
    expect(await hostSh(b, 'stat -c %a /workspace/suid-id /usr/local/bin/sgid-id /workspace/later-plain')).toBe('4755\n2755\n4755\n');
    expect(await hostSh(b, 'stat -c %u:%g /workspace/suid-id')).toBe('0:0\n');

    // A checkpoint of a checkpoint: a record of the parent is not put on a file the child replaced.
    await hostSh(b, 'chmod 755 /workspace/later-plain && cp /usr/bin/id /workspace/new-suid && chmod 4711 /workspace/new-suid');
    const cp2 = await checkpoint(b);
    expect(await setIdOnDisk(cp2)).toEqual([]);
    const c = await spawnFrom(cp2);
    expect(await hostSh(c, 'stat -c %a /workspace/suid-id /usr/local/bin/sgid-id /workspace/later-plain /workspace/new-suid')).toBe('4755\n2755\n755\n4711\n');
  });

  it('DATA_DIR, its layers, sandboxes and logs are closed to other host users', async () => {
    const a = await sandbox();
    await hostSh(a, 'echo private > /workspace/p');
    const cp = await checkpoint(a);
    const data = T.dataDir();
    const dirs = ['', 'logs', 'layers', 'sandboxes', 'ferretdb', `layers/${cp}`, `sandboxes/${a}`].map((d) => path.join(data, d));
    for (const d of dirs) {
      const st = await fsp.stat(d);
      expect({ d, uid: st.uid, open: (st.mode & 0o066).toString(8) }).toEqual({ d, uid: 0, open: '0' });
    }
    // The layer's own directory: root's (the shift of sandbox ids to nobody must not land on it).
    expect((await fsp.lstat(layerDir(cp))).mode & 0o7777).toBe(0o700);
    for (const f of [...(await fsp.readdir(path.join(data, 'logs'))).map((n) => path.join(data, 'logs', n)), path.join(data, 'temporal.db')]) {
      const st = await fsp.stat(f);
      expect({ f, open: (st.mode & 0o037).toString(8) }).toEqual({ f, open: '0' });
    }
    for (const argv of [
      ['ls', data],
      ['ls', path.join(data, 'layers')],
      ['cat', path.join(data, 'logs', 'host.log')],
      ['cat', path.join(layerDir(cp), 'root', 'workspace', 'p')],
      ['ls', path.join(data, 'sandboxes', a)],
    ]) {
      const r = await asNobody(argv);
      expect({ argv, code: r.code === 0 ? 'succeeded' : 'refused' }).toEqual({ argv, code: 'refused' });
      expect(r.stdout).not.toContain('private');
    }
  });

  it('a layer redirected by a symlink, or under a directory another user owns, makes a spawn fail instead of reading the host', async () => {
    const a = await sandbox();
    await hostSh(a, 'echo from-layer > /workspace/marker');
    const cp = await checkpoint(a);
    const hostDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-secret-'));
    const root = path.join(layerDir(cp), 'root');
    try {
      await fsp.mkdir(path.join(hostDir, 'workspace'));
      await fsp.writeFile(path.join(hostDir, 'workspace', 'marker'), 'host secret\n');
      // What a host process could do with write access there: the layer's root/ becomes a link to a host directory.
      await fsp.rename(root, `${root}.moved`);
      await fsp.symlink(hostDir, root);
      const r = await api('POST', `/api/sandboxes/from-checkpoint/${cp}`, { body: {} });
      if (r.status === 201) {
        sandboxes.push(r.body.sandboxID as string);
        expect(await hostSh(r.body.sandboxID as string, 'cat /workspace/marker')).not.toContain('host secret');
      }
      expect(r.status).toBeGreaterThanOrEqual(400);
      expect(r.body.error).toEqual({ type: expect.any(String), message: expect.any(String) });
      expect(JSON.stringify(r.body)).not.toContain('host secret');
    } finally {
      await fsp.rm(root, { force: true });
      await fsp.rename(`${root}.moved`, root).catch(() => undefined);
      await fsp.rm(hostDir, { recursive: true, force: true });
    }
    // The layer's directory handed to another user (who could then swap what is inside).
    await fsp.chown(layerDir(cp), 65534, 65534);
    try {
      const r = await api('POST', `/api/sandboxes/from-checkpoint/${cp}`, { body: {} });
      if (r.status === 201) sandboxes.push(r.body.sandboxID as string);
      expect(r.status).toBeGreaterThanOrEqual(400);
    } finally {
      await fsp.chown(layerDir(cp), 0, 0);
    }
    // Put back, the layer spawns again.
    const b = await spawnFrom(cp);
    expect(await hostSh(b, 'cat /workspace/marker')).toBe('from-layer\n');
  });

  it('an 8 GiB sparse file checkpoints, hashes and exports without being read or sent in full, the host answering meanwhile', async () => {
    const a = await sandbox();
    expect(await hostSh(a, 'truncate -s 8G /workspace/big && printf tail >> /workspace/big && stat -c %s /workspace/big')).toBe(`${8 * 1024 ** 3 + 4}\n`);
    const cp = await checkpoint(a);
    const client = hostClient();
    const hashing = client.layerHash(cp);
    const health = await fetch(`${T.hostUrl()}/healthz`, { headers: { authorization: `Bearer ${T.hostToken()}` } });
    expect(health.status).toBe(200);
    expect(await hashing).toMatch(/^[0-9a-f]{64}$/);

    // The archive another host would receive: its size, read with a bound far below 8 GiB.
    const { stream } = await client.layerArchive(cp);
    let bytes = 0;
    const limit = 256 * 1024 * 1024;
    try {
      await new Promise<void>((resolve, reject) => {
        stream.on('data', (c: Buffer) => {
          bytes += c.length;
          if (bytes > limit) reject(new Error(`more than ${limit} bytes of archive`));
        });
        stream.once('end', resolve);
        stream.once('error', reject);
      });
    } finally {
      stream.destroy();
    }
    expect(bytes).toBeLessThan(64 * 1024 * 1024);

    const b = await spawnFrom(cp);
    expect(await hostSh(b, 'stat -c %s /workspace/big && tail -c 4 /workspace/big')).toBe(`${8 * 1024 ** 3 + 4}\ntail`);
  });

  it('a layer that arrives from another host with a set-id file is refused, even with the right hash', async () => {
    const layerId = `cp-evil${Date.now().toString(36)}`;
    const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-evil-layer-'));
    let server: http.Server | undefined;
    try {
      const dir = path.join(tmp, layerId);
      await fsp.mkdir(path.join(dir, 'root', 'workspace'), { recursive: true });
      await fsp.mkdir(path.join(dir, 'usr'));
      await fsp.copyFile('/usr/bin/id', path.join(dir, 'root', 'workspace', 'evil'));
      await fsp.chmod(path.join(dir, 'root', 'workspace', 'evil'), 0o4755);
      await fsp.writeFile(path.join(dir, 'layer.json'), JSON.stringify({ id: layerId, parents: [] }));
      const { stdout } = await execFileP('python3', [path.resolve(__dirname, '..', '..', '..', 'sandbox', 'layer-hash.py'), dir]);
      const sha256 = (JSON.parse(stdout) as { sha256: string }).sha256;
      const tar = (await execFileP('tar', ['-C', tmp, '--numeric-owner', '-cf', '-', layerId], { encoding: 'buffer', maxBuffer: 1 << 26 })).stdout;
      server = http.createServer((req, res) => {
        if (req.url !== `/layers/${layerId}/archive`) return void res.writeHead(404).end();
        res.writeHead(200, { 'content-type': 'application/x-tar', 'x-layer-sha256': sha256 });
        res.end(tar);
      });
      await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
      const from = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      await expect(hostClient().fetchLayer(layerId, from)).rejects.toMatchObject({ type: 'invalid_request' });
      await expect(hostClient().layerHash(layerId)).rejects.toMatchObject({ type: 'not_found' });
      expect((await fsp.readdir(path.join(T.dataDir(), 'layers'))).filter((n) => n.startsWith(layerId))).toEqual([]);
    } finally {
      if (server) await new Promise((r) => server!.close(r));
      await fsp.rm(tmp, { recursive: true, force: true });
    }
  });
});
