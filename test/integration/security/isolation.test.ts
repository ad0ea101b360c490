import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { api, eventually, T, unique } from '../../helpers/env';
import { hostClient, newSandbox as createSandbox, run, sh } from '../../helpers/sandboxes';
import { CONNECT_PROBE } from '../../helpers/connect-probe';
import { createProbeAgent, freeBytes, probeApiSandbox, PROBES, ProbeResults, sessionResult } from '../../helpers/probes';

/*
 * The escape suite of the sandbox isolation issue: table-driven probes run in an /api sandbox and
 * in a session's sandbox, plus the cases that need more than one sandbox or a resource limit.
 * Every probe is harmless if it succeeds (see test/helpers/isolation-probes.py).
 */

jest.setTimeout(120_000);

/** What a test opened, closed in dependency order (sandboxes, sessions, then checkpoints, snapshots, agents) even on failure. */
class Opened {
  private sandboxes: string[] = [];
  private sessions: [string, string][] = [];
  private checkpoints: [string, string][] = [];
  private snapshots: string[] = [];
  private agents: string[] = [];
  /** Everything ever opened, to check at the end that nothing was left behind. */
  readonly ever = { sandboxes: new Set<string>(), agents: new Set<string>(), snapshots: new Set<string>() };

  sandbox(id: string): string {
    this.sandboxes.push(id);
    this.ever.sandboxes.add(id);
    return id;
  }
  session(agentId: string, id: string): void {
    this.sessions.push([agentId, id]);
  }
  checkpoint(sandboxId: string, id: string): void {
    this.checkpoints.push([sandboxId, id]);
  }
  snapshot(name: string): void {
    this.snapshots.push(name);
    this.ever.snapshots.add(name);
  }
  agent(id: string): void {
    this.agents.push(id);
    this.ever.agents.add(id);
  }

  async close(): Promise<void> {
    const quietly = (p: Promise<unknown>) => p.catch(() => undefined);
    await Promise.all(this.sandboxes.splice(0).map((id) => quietly(api('DELETE', `/api/sandboxes/${id}`))));
    await Promise.all(this.sessions.splice(0).map(([a, s]) => quietly(api('DELETE', `/v1/agents/${a}/sessions/${s}`))));
    for (const [sb, cp] of this.checkpoints.splice(0)) await quietly(api('DELETE', `/api/sandboxes/${sb}/checkpoints/${cp}`));
    for (const name of this.snapshots.splice(0)) await quietly(api('DELETE', `/api/snapshots/${name}`));
    for (const id of this.agents.splice(0)) await quietly(api('DELETE', `/v1/agents/${id}`));
  }
}

const opened = new Opened();
/** A sandbox closed after each test. */
/** A sandbox closed after each test; root unless the body says (the probes and cases below are root's). */
const newSandbox = async (body: Record<string, unknown> = {}): Promise<string> => opened.sandbox(await createSandbox({ user: 'root', ...body }));
afterEach(() => opened.close());
afterAll(() => opened.close());

/** A python3 one-liner run through exec/run. */
async function py(sandboxId: string, code: string, timeout = 60) {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body: { cmd: 'python3', args: ['-c', code], timeout } });
  if (r.status !== 200) throw new Error(`exec/run python3 in ${sandboxId}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as { exitCode: number; stdout: string; stderr: string };
}

/** The host id sandbox id 0 maps to, from /proc/self/uid_map. */
async function hostUidOfRoot(sandboxId: string): Promise<{ map: string; host: number }> {
  const map = (await sh(sandboxId, 'cat /proc/self/uid_map')).trim();
  const root = map
    .split('\n')
    .map((l) => l.trim().split(/\s+/).map(Number))
    .find((f) => f[0] === 0);
  return { map, host: root ? root[1]! : NaN };
}

async function healthz(): Promise<number> {
  return (await fetch(`${T.api()}/healthz`)).status;
}

// ---------------------------------------------------------------- the probe table, in both kinds of sandbox

const where: [string, () => Promise<ProbeResults>][] = [
  ['an /api sandbox', async () => probeApiSandbox(await newSandbox())],
  // The sandbox user become root with sudo: every probe holds, no_new_privs aside (see SUDO_DIFFERS).
  ['an /api sandbox of the sandbox user, through sudo', async () => probeApiSandbox(await newSandbox({ user: 'sandbox' }), { sudo: true })],
  [
    "a session's sandbox",
    async () => {
      const agentId = await createProbeAgent();
      opened.agent(agentId);
      const s = await api('POST', `/v1/agents/${agentId}/sessions`, { body: { input: {} } });
      if (s.status !== 201) throw new Error(`create session: ${s.status} ${JSON.stringify(s.body)}`);
      opened.session(agentId, s.body.id);
      const result = await sessionResult(agentId, s.body.id);
      if (result.status !== 'completed' || !result.data)
        throw new Error(`probe session ended ${result.status} (${result.reason}: ${result.message}); data ${JSON.stringify(result.data)}`);
      return result.data as ProbeResults;
    },
  ],
];

/**
 * What sudo's root has that a root command has not: no no_new_privs (the sandbox user's processes run
 * without it, so that sudo's setuid bit works; docs/isolation.md). Every id and capability it can
 * reach are still the sandbox's own.
 */
const SUDO_DIFFERS: Record<string, string> = { 'NoNewPrivs: 1': 'NoNewPrivs: 0' };

describe.each(where)('escape probes in %s', (label, probe) => {
  let results: ProbeResults | undefined;
  let failure: unknown;

  beforeAll(async () => {
    try {
      results = await probe();
      // SAP_ISOLATION_DUMP=<dir> keeps every probe's result (passing ones too) for reading.
      const dump = process.env.SAP_ISOLATION_DUMP;
      if (dump) fs.writeFileSync(path.join(dump, `probes-${label.replace(/\W+/g, '-')}.json`), JSON.stringify(results, null, 1));
    } catch (err) {
      failure = err;
    } finally {
      // The probe's sandbox/session/agent were tracked by the shared `opened`: close them now.
      await opened.close();
    }
  }, 120_000);

  const got = (): ProbeResults => {
    if (!results) throw new Error(`the probe script did not run in ${label}: ${String(failure)}`);
    return results;
  };

  it('reports exactly the probes of the table', () => {
    expect(Object.keys(got()).sort()).toEqual([...PROBES].sort());
  });

  it.each(PROBES)('%s', (name) => {
    const r = got()[name];
    if (!r) throw new Error(`probe "${name}" did not report in ${label}`);
    if (label.endsWith('through sudo') && SUDO_DIFFERS[name]) return expect([r.ok, r.detail]).toEqual([false, SUDO_DIFFERS[name]]);
    if (!r.ok) throw new Error(`probe "${name}" in ${label}: ${r.detail}`);
  });
});

// ---------------------------------------------------------------- cases that need more than one probe run

describe('isolation between sandboxes and of the host', () => {
  it('runs two /api sandboxes as different, non-root host uids (distinct 65536-id ranges)', async () => {
    const [a, b] = await Promise.all([newSandbox(), newSandbox()]);
    const [ua, ub] = await Promise.all([hostUidOfRoot(a), hostUidOfRoot(b)]);
    const why = `uid_map of ${a}: "${ua.map}"; of ${b}: "${ub.map}"`;
    if (!(ua.host > 0 && ub.host > 0)) throw new Error(`sandbox root is host root: ${why}`);
    if (Math.abs(ua.host - ub.host) < 65536) throw new Error(`the two sandboxes' id ranges overlap: ${why}`);
  });

  it('lets root chown inside; the owner survives checkpoint → spawn', async () => {
    const a = await newSandbox();
    const made = await run(
      a,
      'mkdir -p /workspace/own && echo x > /workspace/own/f && chown 1000:1000 /workspace/own/f && chown 1001:1002 /workspace/own && stat -c %u:%g /workspace/own/f /workspace/own',
    );
    if (made.exitCode !== 0) throw new Error(`chown inside the sandbox failed (exit ${made.exitCode}): ${made.stderr}`);
    expect(made.stdout).toBe('1000:1000\n1001:1002\n');
    const cp = await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: unique('owned') } });
    expect(cp.status).toBe(201);
    opened.checkpoint(a, cp.body.id);
    const spawned = await api('POST', `/api/sandboxes/from-checkpoint/${cp.body.id}`, { body: { user: 'root' } });
    expect(spawned.status).toBe(201);
    const b = opened.sandbox(spawned.body.sandboxID);
    expect(await sh(b, 'stat -c %u:%g /workspace/own/f /workspace/own')).toBe('1000:1000\n1001:1002\n');
    // The user it now belongs to can write it; root can give it back.
    expect(
      await sh(
        b,
        "python3 -c \"import os; os.setgid(1000); os.setuid(1000); open('/workspace/own/f','a').write('y'); print(os.getuid())\" && chown 0:0 /workspace/own/f && stat -c %u:%g /workspace/own/f",
      ),
    ).toBe('1000\n0:0\n');
  });

  it('keeps the owner of a file chowned by a snapshot step in sandboxes created from the snapshot', async () => {
    const name = unique('owned-snap');
    const r = await api('POST', '/api/snapshots', {
      body: {
        name,
        image: {
          base: 'base',
          steps: [
            { type: 'run', args: { commands: ['mkdir -p /opt/owned', 'echo x > /opt/owned/f', 'chown 1000:1000 /opt/owned/f', 'chown 1001:1002 /opt/owned'] } },
          ],
        },
      },
    });
    if (r.status !== 202 && r.status !== 201) throw new Error(`create snapshot: ${r.status} ${JSON.stringify(r.body)}`);
    opened.snapshot(name);
    let snap = r.body;
    for (const deadline = Date.now() + 60_000; snap.status === 'building' && Date.now() < deadline;) {
      await new Promise((res) => setTimeout(res, 250));
      snap = (await api('GET', `/api/snapshots/${name}`)).body;
    }
    if (snap.status !== 'ready') throw new Error(`snapshot with a chown step is ${snap.status}: ${JSON.stringify(snap.error ?? snap)}`);
    const sb = await newSandbox({ snapshot: name });
    expect(await sh(sb, 'stat -c %u:%g /opt/owned/f /opt/owned')).toBe('1000:1000\n1001:1002\n');
  });
});

async function connectFrom(sandboxId: string, targets: string[]): Promise<Record<string, string>> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body: { cmd: 'python3', args: ['-c', CONNECT_PROBE, ...targets], timeout: 60 } });
  if (r.status !== 200 || r.body.exitCode !== 0) throw new Error(`connect probe in ${sandboxId}: ${r.status} ${JSON.stringify(r.body)}`);
  return JSON.parse(r.body.stdout) as Record<string, string>;
}

/** The host's own addresses other than loopback (eth0 and the like). */
function hostAddresses(): string[] {
  return Object.values(os.networkInterfaces())
    .flat()
    .filter((a): a is os.NetworkInterfaceInfo => !!a && a.family === 'IPv4' && !a.internal)
    .map((a) => a.address);
}

describe('what one sandbox can reach of another and of the host', () => {
  it("cannot read another sandbox's files, see its processes or connect to its ports", async () => {
    const [a, b] = await Promise.all([newSandbox(), newSandbox()]);
    const mark = unique('secret').replace(/-/g, '');
    // In a: files in /workspace, /tmp and /root, a process named after the mark, a listener on every address.
    await sh(a, `echo ${mark} > /workspace/${mark}; echo ${mark} > /tmp/${mark}; echo ${mark} > /root/${mark}`);
    await sh(
      a,
      `setsid nohup python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8123)); s.listen(); time.sleep(600)' ${mark} > /dev/null 2>&1 < /dev/null &`,
    );
    // Positive controls, in a itself: the listener answers and the process is visible.
    await eventually(async () => (await connectFrom(a, ['127.0.0.1:8123']))['127.0.0.1:8123'] === 'connected', 20_000, 200);
    // (The pattern [x]yz matches "xyz" but not itself, so grep's own command line is not counted.)
    const own = `[${mark[0]}]${mark.slice(1)}`;
    expect(await sh(a, `grep -l '${own}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l`)).not.toBe('0\n');

    // From b: none of it.
    const found = await run(
      b,
      `find / \\( -path /proc -o -path /sys \\) -prune -o -name '${mark}*' -print 2>/dev/null; grep -rl ${mark} /workspace /tmp /root /dev/shm 2>/dev/null; true`,
    );
    expect(found.stdout).toBe('');
    expect(await sh(b, `grep -l '${own}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l`)).toBe('0\n');
    // b sees its own processes only: pid 1 and this exec's few.
    const pids = (await sh(b, 'ls -d /proc/[0-9]* | wc -l')).trim();
    expect(Number(pids)).toBeLessThan(10);
    const conn = await connectFrom(b, ['127.0.0.1:8123', ...hostAddresses().map((h) => `${h}:8123`)]);
    for (const [target, outcome] of Object.entries(conn)) {
      if (outcome === 'connected' || outcome === 'timeout')
        throw new Error(`from another sandbox, ${target} answered "${outcome}" (want refused or unreachable)`);
    }
  });

  it("cannot reach the host's services (API, FerretDB, Temporal, sandbox host) on loopback or on the host's addresses", async () => {
    const sb = await newSandbox();
    const ports = [new URL(T.api()).port, new URL(T.mongo()).port, T.temporal().split(':')[1]!, new URL(T.hostUrl()).port];
    // The services do listen: checked from the host first (a probe of closed ports would prove nothing).
    for (const port of ports) {
      await new Promise<void>((resolve, reject) => {
        const s = net.connect(Number(port), '127.0.0.1', () => {
          s.destroy();
          resolve();
        });
        s.once('error', (err) => reject(new Error(`the host's own service on port ${port} is not listening: ${err.message}`)));
      });
    }
    const targets = ports.flatMap((port) => ['127.0.0.1', 'localhost', ...hostAddresses()].map((h) => `${h === 'localhost' ? '127.0.0.1' : h}:${port}`));
    const conn = await connectFrom(sb, [...new Set(targets)]);
    expect(Object.keys(conn).length).toBeGreaterThanOrEqual(ports.length);
    for (const [target, outcome] of Object.entries(conn)) {
      // refused (its own loopback has nothing there) or unreachable (no route out): quick, never a hang.
      if (!['ECONNREFUSED', 'ENETUNREACH', 'EHOSTUNREACH'].includes(outcome)) throw new Error(`from a sandbox, ${target} answered "${outcome}"`);
    }
  });

  it("writes nothing outside its own root: not to the host's /, /usr or DATA_DIR", async () => {
    const sb = await newSandbox();
    const mark = unique('escape').replace(/-/g, '');
    // The sandbox's whole tree is writable, /usr included (the host's /usr is a read-only lower layer
    // under the sandbox's own writable layer): every write must land in that layer, none on the host.
    const r = await run(sb, `echo x > /${mark} && echo x > /usr/${mark} && echo x > /workspace/../../../${mark}-up && echo written`);
    expect(r.stdout).toBe('written\n');
    for (const p of [`/${mark}`, `/usr/${mark}`, `/${mark}-up`]) expect(fs.existsSync(p)).toBe(false);
    const onHostDisk = await new Promise<string>((resolve) => execFile('find', [T.dataDir(), '-name', `${mark}*`], (_err, out) => resolve(out)));
    expect(onHostDisk).toBe('');
  });
});

describe('limits', () => {
  it('stops a fork bomb at the pids limit; the sandbox and the API still answer', async () => {
    const sb = await newSandbox();
    // Bounded: at most 2000 children, each a `sleep` (a vfork + exec: no memory to speak of), all killed at the end.
    const bomb = String.raw`
import json, subprocess
kids, error = [], None
try:
    while len(kids) < 2000:
        kids.append(subprocess.Popen(['sleep', '120']))
except OSError as e:
    error = e.__class__.__name__ + ':' + str(e.errno)
for k in kids:
    k.kill()
for k in kids:
    k.wait()
print(json.dumps({'count': len(kids), 'error': error}))
`;
    const r = await py(sb, bomb, 120);
    if (r.exitCode !== 0) throw new Error(`fork bomb script exited ${r.exitCode}: ${r.stderr.slice(-500)}`);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { count: number; error: string | null };
    if (out.error === null) throw new Error(`2000 processes started without reaching a limit`);
    expect(out.error).toBe('BlockingIOError:11'); // EAGAIN: the pids cgroup said no
    expect(out.count).toBeLessThanOrEqual(512);
    expect(out.count).toBeGreaterThan(50);
    expect(await sh(sb, 'echo alive')).toBe('alive\n');
    expect(await healthz()).toBe(200);
  });

  const HOG = "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived', len(b))";

  it('OOM-kills a memory hog inside its sandbox (memoryMB: 64) while another sandbox and the API keep answering', async () => {
    const [small, other] = await Promise.all([newSandbox({ memoryMB: 64 }), newSandbox()]);
    const [hog, meanwhile] = await Promise.all([py(small, HOG), sh(other, 'echo still here')]);
    if (hog.stdout.includes('survived')) throw new Error(`512 MB were allocated and touched in a sandbox with memoryMB 64 (exit ${hog.exitCode})`);
    expect(hog.exitCode).toBe(137); // SIGKILL from the OOM killer
    expect(meanwhile).toBe('still here\n');
    expect(await sh(other, 'echo after')).toBe('after\n');
    expect(await sh(small, 'echo the small one lives on')).toBe('the small one lives on\n');
    expect(await healthz()).toBe(200);
  });

  it("ends a session whose agent's memory hog is OOM-killed as failed with reason oom", async () => {
    const id = unique('isohog');
    const a = await api('POST', '/v1/agents', { body: { id, core: 'python', entrypoint: ['python3', '-c', HOG], memoryMB: 64, timeoutSeconds: 60 } });
    if (a.status !== 201) throw new Error(`an agent with memoryMB 64: ${a.status} ${JSON.stringify(a.body)}`);
    opened.agent(id);
    const s = await api('POST', `/v1/agents/${id}/sessions`, { body: {} });
    expect(s.status).toBe(201);
    opened.session(id, s.body.id);
    const result = await sessionResult(id, s.body.id);
    expect({ status: result.status, reason: result.reason }).toEqual({ status: 'failed', reason: 'oom' });
    expect(await healthz()).toBe(200);
  });

  it('gives a disk filler ENOSPC at diskMB (64) while the host free space barely moves', async () => {
    const sb = await newSandbox({ diskMB: 64 });
    const before = { data: freeBytes(T.dataDir()), shm: freeBytes('/dev/shm') };
    const r = await run(sb, 'dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1; echo "dd exit $?"; stat -c %s /workspace/fill', { timeout: 120 });
    const after = { data: freeBytes(T.dataDir()), shm: freeBytes('/dev/shm') };
    const filled = Number(r.stdout.trim().split('\n').pop());
    const what = `dd printed: ${r.stdout.trim()}; host free space of DATA_DIR moved ${((before.data - after.data) / 2 ** 20).toFixed(0)} MB, of /dev/shm ${((before.shm - after.shm) / 2 ** 20).toFixed(0)} MB`;
    if (!/No space left on device/.test(r.stdout)) throw new Error(`no ENOSPC writing 200 MB into a sandbox with diskMB 64: ${what}`);
    expect(r.stdout).toMatch(/dd exit [1-9]/);
    if (!(filled >= 32 * 2 ** 20 && filled <= 72 * 2 ** 20)) throw new Error(`the filler stopped at ${filled} bytes, not about 64 MB: ${what}`);
    if (Math.abs(before.data - after.data) > 100 * 2 ** 20 || Math.abs(before.shm - after.shm) > 100 * 2 ** 20)
      throw new Error(`host free space moved: ${what}`);
    expect(await sh(sb, 'rm /workspace/fill && echo freed')).toBe('freed\n');
  });
});

describe('a plain sandbox still works', () => {
  it('files (the host files API), exec, checkpoint + spawn', async () => {
    const sb = await newSandbox();
    // A file written through the files API belongs to the sandbox's root, who can change it.
    await hostClient().writeFile(sb, '/workspace/in.txt', 'from the host\n');
    expect(await sh(sb, 'stat -c %u:%g /workspace/in.txt && cat /workspace/in.txt && echo appended >> /workspace/in.txt && echo $((6 * 7))')).toBe(
      '0:0\nfrom the host\n42\n',
    );
    expect((await hostClient().readFile(sb, '/workspace/in.txt'))?.toString()).toBe('from the host\nappended\n');
    await sh(sb, 'echo kept > /workspace/kept');
    const cp = await api('POST', `/api/sandboxes/${sb}/checkpoints`, { body: {} });
    expect(cp.status).toBe(201);
    opened.checkpoint(sb, cp.body.id);
    const spawned = await api('POST', `/api/sandboxes/from-checkpoint/${cp.body.id}`, { body: { user: 'root' } });
    expect(spawned.status).toBe(201);
    const b = opened.sandbox(spawned.body.sandboxID);
    expect(await sh(b, 'cat /workspace/kept /workspace/in.txt')).toBe('kept\nfrom the host\nappended\n');
  });
});

describe('cleanup', () => {
  it('left no sandbox, agent or snapshot of this file behind', async () => {
    await opened.close();
    const running = ((await api('GET', '/api/sandboxes')).body as { sandboxID: string }[]).map((s) => s.sandboxID);
    expect(running.filter((id) => opened.ever.sandboxes.has(id))).toEqual([]);
    for (const id of opened.ever.agents) expect([id, (await api('GET', `/v1/agents/${id}`)).status]).toEqual([id, 404]);
    for (const name of opened.ever.snapshots) expect([name, (await api('GET', `/api/snapshots/${name}`)).status]).toEqual([name, 404]);
  });
});
