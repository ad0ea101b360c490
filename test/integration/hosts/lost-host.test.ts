import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { Stack } from '../../../scripts/launcher';
import { startTwoHostStack } from '../../helpers/two-hosts';
import { HostClient } from '../../../sandbox/host-contract/client';
import { newSandbox, sh, type ApiCall } from '../../helpers/sandboxes';
import { PROJECT_ROOT } from '../../../config';

/**
 * A lost host's sandboxes, on a stack of its own with two sandbox hosts (SANDBOX_HOSTS=2): the
 * second host and its worker are frozen (SIGSTOP), as a machine that stops answering without dying.
 * While the host is lost its API sandboxes answer 410 `gone` (listed as `lost`), exec and files on
 * them answer 410 at once, a kill is recorded; once it is back (SIGCONT) it rejoins: the sandboxes
 * it still has are `running` again with their files, one it no longer has is `error` (never
 * `running`), and one killed while it was away is destroyed. Whatever happens, afterAll thaws both
 * processes before it stops the stack, so nothing is left frozen.
 */
jest.setTimeout(300_000);

const KEY = 'lost-host-test-key';
const TOKEN = 'lost-host-token-0123456789abcdef';
/** A host silent this long (s) is lost: short, so that the test is quick. */
const DEAD_AFTER_S = 4;

let stack: Stack;
let dataDir: string;
/** Pids this file stopped with SIGSTOP: afterAll sends each SIGCONT. */
const frozen = new Set<number>();

beforeAll(async () => {
  ({ stack, dataDir } = await startTwoHostStack({ prefix: 'sap-lost-', apiKey: KEY, hostToken: TOKEN, deadAfterS: DEAD_AFTER_S }));
}, 180_000);

afterAll(async () => {
  for (const pid of frozen) {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // Already gone.
    }
  }
  await stack?.stop({ destroySandboxes: true });
  const keep = path.join(os.tmpdir(), 'sap-lost-host-last-logs');
  fs.rmSync(keep, { recursive: true, force: true });
  if (stack) fs.cpSync(stack.logDir, keep, { recursive: true });
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
});

async function call<T = any>(method: string, p: string, body?: unknown, key = KEY): Promise<{ status: number; body: T }> {
  const res = await fetch(`${stack.apiUrl}${p}`, {
    method,
    headers: { 'x-api-key': key, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T };
}

const via: ApiCall = (method, p, opts) => call(method, p, opts.body, opts.key);

/** The ids of the sandboxes host `i` has (0: the first). */
async function onHost(i: number): Promise<string[]> {
  const res = await fetch(`${stack.hostList[i]!.url}/sandboxes`, { headers: { authorization: `Bearer ${TOKEN}` } });
  return ((await res.json()) as { id: string }[]).map((s) => s.id);
}

/** Creates API sandboxes until one lands on host `i` (placement is random by free capacity); the others are killed. */
async function sandboxOnHost(i: number): Promise<string> {
  for (let n = 0; n < 30; n++) {
    const id = await newSandbox({}, { via });
    if ((await onHost(i)).includes(id)) return id;
    await call('DELETE', `/api/sandboxes/${id}`);
  }
  throw new Error(`30 sandboxes in a row landed elsewhere than host ${i + 1}`);
}

/** Polls `probe` every 200 ms until it answers something other than undefined; throws with `what` after `ms`. */
async function until<T>(what: string, ms: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const got = await probe();
      if (got !== undefined) return got;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms${last ? ` (last error: ${String(last)})` : ''}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function signal(proc: 'host' | 'worker', sig: 'SIGSTOP' | 'SIGCONT'): void {
  const second = stack.hostList[1]!;
  const pid = stack.pid(proc === 'host' ? second.proc : second.worker);
  if (!pid) throw new Error(`no pid for the second ${proc}`);
  process.kill(pid, sig);
  if (sig === 'SIGSTOP') frozen.add(pid);
}

/** A key of another organisation, made with the project's key tool against this stack's store. */
async function otherOrgKey(): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(PROJECT_ROOT, 'dist/scripts/keys.js'), 'create', '--org', 'lost-host-other'], {
    env: { ...process.env, MONGO_URL: stack.mongoUrl },
  });
  return (JSON.parse(stdout) as { key: string }).key;
}

describe('a frozen sandbox host', () => {
  it('answers 410 for its sandboxes while lost, and shows what it still has running once it rejoins', async () => {
    const second = stack.hostList[1]!;
    const other = await otherOrgKey();
    const elsewhere = await sandboxOnHost(0);
    const keep = await sandboxOnHost(1);
    const vanish = await sandboxOnHost(1);
    const killed = await sandboxOnHost(1);
    await sh(keep, 'echo kept > /workspace/kept.txt', { via });

    signal('host', 'SIGSTOP');
    signal('worker', 'SIGSTOP');

    // Lost once its heartbeat is older than HOST_DEAD_AFTER and it does not answer a probe.
    const gone = await until('GET of a sandbox on the frozen host answers 410', (DEAD_AFTER_S + 30) * 1000, async () => {
      const r = await call('GET', `/api/sandboxes/${keep}`);
      return r.status === 410 ? r : undefined;
    });
    expect(gone.body.error).toEqual({ type: 'gone', message: expect.stringContaining(second.hostId) });

    const listed = await call('GET', '/api/sandboxes');
    expect(listed.status).toBe(200);
    const statusOf = (id: string) => (listed.body as { sandboxID: string; status: string }[]).find((s) => s.sandboxID === id)?.status;
    expect([statusOf(keep), statusOf(vanish), statusOf(killed), statusOf(elsewhere)]).toEqual(['lost', 'lost', 'lost', 'running']);

    // Exec and files answer 410 instead of waiting on a host that does not answer.
    const exec = await call('POST', `/api/sandboxes/${keep}/exec/run`, { cmd: 'true' });
    expect(exec.status).toBe(410);
    expect(exec.body.error.type).toBe('gone');
    const file = await call('GET', `/api/sandboxes/${keep}/files?path=/workspace/kept.txt`);
    expect(file.status).toBe(410);
    expect(file.body.error.type).toBe('gone');
    expect((await call('POST', `/api/sandboxes/${keep}/timeout`, { timeout: 60 })).status).toBe(410);

    // Another organisation learns nothing: 404, not 410.
    expect((await call('GET', `/api/sandboxes/${keep}`, undefined, other)).status).toBe(404);
    // The first host's sandbox is untouched.
    expect(await sh(elsewhere, 'echo fine', { via })).toBe('fine\n');

    // A kill while the host is lost is recorded; the host destroys the sandbox when it rejoins.
    const kill = await call('DELETE', `/api/sandboxes/${killed}`);
    expect(kill.status).toBe(200);
    expect(kill.body.status).toBe('stopped');

    // Written off by the first worker's host watch (marked lost); then the host alone thaws: it
    // answers again but has not rejoined (its worker is still frozen), so its sandboxes stay gone.
    await until('the host is marked lost', 30_000, async () => {
      const r = await call('GET', `/api/sandboxes/${keep}`);
      return r.status === 410 && /not rejoined yet/.test(r.body.error.message) ? true : undefined;
    });
    signal('host', 'SIGCONT');
    // Gone on the host while it was away (as if its machine had lost it).
    expect(await new HostClient({ url: second.url, token: TOKEN }).destroySandbox(vanish)).toBe(true);
    expect((await call('GET', `/api/sandboxes/${keep}`)).status).toBe(410);

    signal('worker', 'SIGCONT');
    const back = await until('GET of the kept sandbox answers 200 again', 30_000, async () => {
      const r = await call('GET', `/api/sandboxes/${keep}`);
      return r.status === 200 ? r : undefined;
    });
    expect(back.body.status).toBe('running');
    expect(await sh(keep, 'cat /workspace/kept.txt', { via })).toBe('kept\n');

    // What the host no longer has is never shown running; what was killed meanwhile is destroyed.
    const lostOne = await call('GET', `/api/sandboxes/${vanish}`);
    expect([lostOne.status, lostOne.body.status]).toEqual([200, 'error']);
    expect((await call('POST', `/api/sandboxes/${vanish}/exec/run`, { cmd: 'true' })).status).not.toBe(200);
    expect((await call('GET', `/api/sandboxes/${killed}`)).body.status).toBe('stopped');
    const hostHas = await onHost(1);
    expect(hostHas).toContain(keep);
    expect(hostHas).not.toContain(killed);
    expect(hostHas).not.toContain(vanish);
    const after = (await call('GET', '/api/sandboxes')).body as { sandboxID: string; status: string }[];
    expect(after.filter((s) => [keep, vanish, killed, elsewhere].includes(s.sandboxID)).map((s) => [s.sandboxID, s.status])).toEqual(
      expect.arrayContaining([
        [keep, 'running'],
        [elsewhere, 'running'],
      ]),
    );
    expect(after.map((s) => s.sandboxID)).not.toContain(vanish);
    expect(after.map((s) => s.sandboxID)).not.toContain(killed);
  });
});
