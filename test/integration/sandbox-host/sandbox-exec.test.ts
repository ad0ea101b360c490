/**
 * Exec sessions (HTTP + WebSocket) and checkpoints against real sandboxes.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { WebSocket } from 'ws';
import { HostClient, decodeExecFrame, encodeStdinFrame, type ExecFrame } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';

const TOKEN = 'exec-token';

/** Collects the frames of a socket until it closes. */
function collect(ws: WebSocket): Promise<ExecFrame[]> {
  const frames: ExecFrame[] = [];
  return new Promise((resolve, reject) => {
    ws.on('message', (d: Buffer) => {
      const f = decodeExecFrame(d);
      if (f) frames.push(f);
    });
    ws.on('close', () => resolve(frames));
    ws.on('error', reject);
  });
}
/** Polls `check` every 20 ms until it holds (at most `ms`). */
async function until(what: string, check: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  for (const end = Date.now() + ms; !(await check()); await new Promise((r) => setTimeout(r, 20))) {
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms`);
  }
}
const opened = (ws: WebSocket) => new Promise<void>((resolve, reject) => (ws.on('open', () => resolve()), ws.on('error', reject)));
const text = (frames: ExecFrame[], kind: 'stdout' | 'stderr') => Buffer.concat(frames.flatMap((f) => (f.kind === kind ? [f.data] : []))).toString();

describe('exec sessions and checkpoints (namespaces)', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  const sb = `sb-exec${process.pid}`;

  beforeAll(async () => {
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-exec-'));
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0' });
    client = new HostClient({ url: host.url, token: TOKEN });
    await client.createSandbox({ id: sb, orgId: 'o' });
  });

  afterAll(async () => {
    for (const s of await client.listSandboxes()) await client.destroySandbox(s.id);
    await host.close();
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('runs a command to completion; a non-zero exit is a result', async () => {
    const r = await client.execRun(sb, { cmd: 'bash', args: ['-c', 'cat; echo out; echo err >&2; exit 4'], stdin: 'in\n' });
    expect(r).toEqual({ exitCode: 4, signal: null, timedOut: false, stdout: 'in\nout\n', stderr: 'err\n' });
    const t = await client.execRun(sb, { cmd: 'sleep', args: ['10'], timeout: 1 });
    expect(t).toMatchObject({ timedOut: true, exitCode: 137, signal: 'SIGKILL' });
  });

  it('streams over WebSocket with scrollback, stdin, several clients and an exit frame', async () => {
    const es = await client.createExec(sb, { cmd: 'bash', args: ['-c', 'echo first; echo warn >&2; while read l; do echo "got $l"; done; exit 3'] });
    expect(es).toMatchObject({ sandboxID: sb, command: 'bash', running: true, exitCode: null, attachedClients: 0 });
    expect(es.sessionID).toMatch(/^es-/);
    // A first client sees both lines arrive: from then on they are in the scrollback of the next ones.
    const w = client.openExecSocket(sb, es.sessionID);
    const framesW: ExecFrame[] = [];
    w.on('message', (d: Buffer) => {
      const f = decodeExecFrame(d);
      if (f) framesW.push(f);
    });
    const fw = collect(w);
    await until('first and warn', () => text(framesW, 'stdout') === 'first\n' && text(framesW, 'stderr') === 'warn\n');
    const a = client.openExecSocket(sb, es.sessionID);
    const b = client.openExecSocket(sb, es.sessionID);
    const fa = collect(a);
    const fb = collect(b);
    await Promise.all([opened(a), opened(b)]);
    await until('three clients attached', async () => (await client.getExec(sb, es.sessionID)).attachedClients === 3);
    a.send(encodeStdinFrame('hello\n'));
    await until('the answer to hello', () => text(framesW, 'stdout').includes('got hello\n'));
    a.send(encodeStdinFrame(''));
    const [framesA, framesB] = await Promise.all([fa, fb]);
    expect(text(await fw, 'stdout')).toBe('first\ngot hello\n');
    for (const frames of [framesA, framesB]) {
      expect(frames[0]).toEqual({ kind: 'stdout', data: Buffer.from('first\n') });
      expect(frames.findIndex((f) => f.kind === 'scrollback-end')).toBe(2);
      expect(text(frames, 'stdout')).toBe('first\ngot hello\n');
      expect(text(frames, 'stderr')).toBe('warn\n');
      expect(frames[frames.length - 1]).toEqual({ kind: 'exit', exitCode: 3 });
    }
    expect(await client.getExec(sb, es.sessionID)).toMatchObject({ running: false, exitCode: 3, attachedClients: 0 });
    // A late client gets the scrollback and the exit.
    const late = await collect(client.openExecSocket(sb, es.sessionID));
    expect(text(late, 'stdout')).toBe('first\ngot hello\n');
    expect(late[late.length - 1]).toEqual({ kind: 'exit', exitCode: 3 });
    expect((await client.listExec(sb)).map((s) => s.sessionID)).toContain(es.sessionID);
  });

  it('passes 50 MB intact with backpressure', async () => {
    const es = await client.createExec(sb, { cmd: 'bash', args: ['-c', 'read; head -c 52428800 /dev/urandom | tee /tmp/big'] });
    const ws = client.openExecSocket(sb, es.sessionID);
    const hash = createHash('sha256');
    let bytes = 0;
    let exit: number | undefined;
    let slow = true;
    const done = new Promise<void>((resolve, reject) => {
      ws.on('message', (d: Buffer) => {
        const f = decodeExecFrame(d);
        if (f?.kind === 'stdout') {
          hash.update(f.data);
          bytes += f.data.length;
          if (slow && bytes > 8 * 1024 * 1024) {
            // Stop reading for a while: the host must pause the command rather than buffer without bound.
            slow = false;
            ws.pause();
            setTimeout(() => ws.resume(), 1000);
          }
        }
        if (f?.kind === 'exit') exit = f.exitCode;
      });
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    await opened(ws);
    ws.send(encodeStdinFrame('go\n'));
    await done;
    expect(exit).toBe(0);
    expect(bytes).toBe(52428800);
    const expected = (await client.execRun(sb, { cmd: 'sha256sum', args: ['/tmp/big'] })).stdout.split(' ')[0];
    expect(hash.digest('hex')).toBe(expected);
    await client.execRun(sb, { cmd: 'rm', args: ['/tmp/big'] });
  }, 60000);

  it('kills a session on request and after its clients left', async () => {
    const es = await client.createExec(sb, { cmd: 'sleep', args: ['100'] });
    const k = await client.killExec(sb, es.sessionID, 'SIGTERM');
    expect(k.sessionID).toBe(es.sessionID);
    await until('the killed command to exit', async () => !(await client.getExec(sb, es.sessionID)).running);
    expect(await client.getExec(sb, es.sessionID)).toMatchObject({ running: false, exitCode: 128 + 15 });

    // sleep 100 ends by itself only after 100 s: a SIGKILL (137) before that is maxRunAfterDisconnect's.
    const es2 = await client.createExec(sb, { cmd: 'sleep', args: ['100'], maxRunAfterDisconnect: 1 });
    const ws = client.openExecSocket(sb, es2.sessionID);
    await opened(ws);
    const leftAt = Date.now();
    ws.close();
    await until('the command to be killed', async () => !(await client.getExec(sb, es2.sessionID)).running);
    const ended = await client.getExec(sb, es2.sessionID);
    expect(ended).toMatchObject({ running: false, exitCode: 137 });
    // Not before the limit: the host's 1 s count starts when it sees the client leave, after leftAt
    // (2 ms: both clocks' millisecond rounding).
    expect(Date.parse(ended.exitedAt!) - leftAt).toBeGreaterThanOrEqual(1000 - 2);
    await expect(client.getExec(sb, 'es-nope')).rejects.toMatchObject({ type: 'not_found' });
  });

  it('takes the session id the control plane chose; refuses a second start with it and a malformed one', async () => {
    const sessionID = `es-${createHash('sha256').update(String(process.hrtime.bigint())).digest('hex').slice(0, 16)}`;
    const es = await client.createExec(sb, { cmd: 'sleep', args: ['100'], sessionID });
    expect(es.sessionID).toBe(sessionID);
    expect((await client.getExec(sb, sessionID)).running).toBe(true);
    // The same id again: conflict, and the first command is untouched.
    await expect(client.createExec(sb, { cmd: 'true', sessionID })).rejects.toMatchObject({ type: 'conflict' });
    for (const bad of ['es-../../x', 'es-0123', `as-${sessionID.slice(3)}`, `${sessionID}0`, 'ES-0123456789ABCDEF']) {
      await expect(client.createExec(sb, { cmd: 'true', sessionID: bad })).rejects.toMatchObject({ type: 'invalid_request' });
    }
    expect((await client.getExec(sb, sessionID)).running).toBe(true);
    await client.killExec(sb, sessionID, 'SIGKILL');
  });

  it('checkpoints a sandbox and spawns copy-on-write sandboxes from it, deletions included', async () => {
    const src = `sb-cp-src${process.pid}`;
    await client.createSandbox({ id: src, orgId: 'o' });
    const prep = await client.execRun(src, {
      cmd: 'bash',
      args: [
        '-c',
        'set -e; echo v1 > /workspace/app.txt; head -c 20000000 /dev/zero > /opt/blob; rm /etc/hosts; mkdir -p /usr/share/sap-x; echo x > /usr/share/sap-x/f; rm -rf /usr/share/doc; mkdir /usr/share/doc; echo only > /usr/share/doc/mine',
      ],
    });
    expect(prep).toMatchObject({ exitCode: 0 });
    await client.createCheckpoint(src, 'cp-1');
    await expect(client.createCheckpoint(src, 'cp-1')).rejects.toMatchObject({ type: 'conflict' });
    const h1 = await client.layerHash('cp-1');
    expect(h1).toMatch(/^[0-9a-f]{64}$/);
    expect(await client.layerHash('cp-1')).toBe(h1);

    // (Its time is measured by `npm run bench -- spawn --only checkpoint`, not here.)
    await client.createSandbox({ id: `sb-cp-a${process.pid}`, orgId: 'o', layers: ['cp-1'] });
    const check = 'cat /workspace/app.txt; stat -c %s /opt/blob; test -e /etc/hosts && echo hosts || echo no-hosts; cat /usr/share/sap-x/f; ls /usr/share/doc';
    const a = await client.execRun(`sb-cp-a${process.pid}`, { cmd: 'bash', args: ['-c', check] });
    expect(a.stdout).toBe('v1\n20000000\nno-hosts\nx\nmine\n');

    // A second generation: changes stack on the first checkpoint; the first stays untouched.
    await client.execRun(`sb-cp-a${process.pid}`, { cmd: 'bash', args: ['-c', 'echo v2 > /workspace/app.txt; rm /opt/blob'] });
    await client.createCheckpoint(`sb-cp-a${process.pid}`, 'cp-2');
    await client.createSandbox({ id: `sb-cp-b${process.pid}`, orgId: 'o', layers: ['cp-2'] });
    const b = await client.execRun(`sb-cp-b${process.pid}`, { cmd: 'bash', args: ['-c', check] });
    expect(b.stdout).toBe('v2\nno-hosts\nx\nmine\n');
    expect(b.stderr).toContain('/opt/blob');
    expect(await client.layerHash('cp-1')).toBe(h1);
    await expect(client.createSandbox({ id: 'sb-cp-none', orgId: 'o', layers: ['cp-missing'] })).rejects.toMatchObject({ type: 'not_found' });
    expect(await client.deleteLayer('cp-missing')).toBe(false);
  });
});
