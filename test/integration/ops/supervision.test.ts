/**
 * The launcher's supervisor (scripts/supervisor.ts, on for the test stack as for npm start): a process
 * killed behind its back (SIGKILL by pid, not through the launcher) is logged and restarted, and the
 * others carry on without a restart of their own. The pids come from <DATA_DIR>/stack.json.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { StackFile } from '../../../scripts/launcher';
import { api, eventually, T } from '../../helpers/env';
import { newSandbox } from '../../helpers/sandboxes';
import { attach, getExec, startExec } from '../../helpers/exec';
import { bashAgent, startSession, waitForStatus } from '../../helpers/sessions';

type Proc = keyof StackFile['pids'];

/** The agent's input becomes its result. */
const COPY = 'cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json';

const stackFile = (): StackFile => JSON.parse(fs.readFileSync(path.join(T.dataDir(), 'stack.json'), 'utf8')) as StackFile;
const supervisorLog = (): string => {
  const file = path.join(T.logDir(), 'supervisor.log');
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
};

/** SIGKILLs `name` by the pid in stack.json, as a crash would; returns the pid. */
function crash(name: Proc): number {
  const pid = stackFile().pids[name];
  if (!pid) throw new Error(`no pid for ${name} in stack.json: ${JSON.stringify(stackFile())}`);
  process.kill(pid, 'SIGKILL');
  return pid;
}

/** Waits until the supervisor has logged the death of `pid` and the restart of `name`; returns the new pid. */
async function restarted(name: Proc, pid: number): Promise<number> {
  await eventually(async () => supervisorLog().includes(`${name} (pid ${pid}) exited unexpectedly with signal SIGKILL; restart #`), 30_000);
  const line = new RegExp(`^\\S+ ${name} restarted \\(pid (\\d+), restart #\\d+\\)$`, 'gm');
  const next = await eventually(
    async () => [...supervisorLog().matchAll(line)].map((m) => Number(m[1])).find((p) => p !== pid && p === stackFile().pids[name]),
    90_000,
    200,
  );
  expect(() => process.kill(next, 0)).not.toThrow();
  return next;
}

const readyz = async () => (await fetch(`${T.api()}/readyz`).catch(() => null))?.status === 200;

afterAll(async () => {
  // Whatever happened above, leave a serving stack to the files that run next.
  await eventually(readyz, 120_000, 250);
}, 130_000);

describe('supervised stack', () => {
  it('keeps the pids and addresses of every process in stack.json, without secrets', () => {
    const f = stackFile();
    expect(Object.keys(f.pids).sort()).toEqual(['api', 'host', 'mongo', 'temporal', 'worker']);
    for (const pid of Object.values(f.pids)) expect(() => process.kill(pid!, 0)).not.toThrow();
    expect(f).toMatchObject({ apiUrl: T.api(), hostUrl: T.hostUrl(), temporalAddress: T.temporal(), mongoUrl: T.mongo() });
    const text = JSON.stringify(f);
    expect(text).not.toContain(T.key());
    expect(text).not.toContain(T.hostToken());
  });

  it('restarts a SIGKILLed worker; a session created right after the kill completes', async () => {
    const agent = await bashAgent(COPY);
    const { api: apiPid, host: hostPid } = stackFile().pids;
    const pid = crash('worker');
    const s = await startSession(agent, { input: { after: 'worker kill' } });
    await restarted('worker', pid);
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
    expect(done).toMatchObject({ status: 'completed', result: { after: 'worker kill' } });
    expect(stackFile().pids).toMatchObject({ api: apiPid, host: hostPid });
  }, 180_000);

  it('restarts a SIGKILLed sandbox host; a session running across the kill completes, attached exec clients get 1011', async () => {
    const agent = await bashAgent(`sleep 5; ${COPY}`);
    const s = await startSession(agent, { input: { across: 'host kill' } });
    await waitForStatus(agent, s.id, ['running']);
    // An exec session lives in the host's memory: its attached client is told, and the session is gone after the restart.
    const sb = await newSandbox();
    try {
      const es = await startExec(sb, { cmd: 'bash', args: ['-c', 'echo started; sleep 600'] });
      const a = attach(sb, es.sessionID);
      await a.until(() => a.text('stdout').includes('started'));
      const { worker: workerPid } = stackFile().pids;
      const pid = crash('host');
      const closed = await a.closed;
      expect(closed.code).toBe(1011);
      expect(JSON.parse(a.texts[0])).toEqual({ error: { type: 'bad_gateway', message: expect.stringContaining('connection to the sandbox host dropped') } });
      await restarted('host', pid);
      const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
      expect(done).toMatchObject({ status: 'completed', result: { across: 'host kill' } });
      // The restarted host adopted the sandbox (it still answers) but not the exec session.
      expect((await api('GET', `/api/sandboxes/${sb}`)).status).toBe(200);
      expect(await getExec(sb, es.sessionID)).toMatchObject({ running: false });
      // Nobody can attach to or stop that command any more: it was hung up with the host (SIGHUP to
      // its group, see sap-sandbox-enter -P), not left running unattended.
      const leftover = async () => {
        const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, {
          body: { cmd: 'bash', args: ['-c', "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '[s]leep 600'; true"] },
        });
        return Number(String(r.body.stdout).trim());
      };
      await eventually(async () => (await leftover()) === 0, 30_000, 250).catch(async () => {
        const ps = execFileSync('ps', ['-eo', 'pid,ppid,pgid,sid,stat,args'], { encoding: 'utf8' })
          .split('\n')
          .filter((l) => /sleep 600|sap-sandbox-enter/.test(l) && l.includes(sb));
        const sig = ps.map((l) => {
          const pid = l.trim().split(/\s+/)[0];
          try {
            return `${pid}: ${fs
              .readFileSync(`/proc/${pid}/status`, 'utf8')
              .split('\n')
              .filter((x) => /^(Sig|Shd|PPid)/.test(x))
              .join(' ')}`;
          } catch {
            return `${pid}: gone`;
          }
        });
        throw new Error(
          `the exec session's command still runs in its sandbox after the host restart (${await leftover()} processes)\n${ps.join('\n')}\n${sig.join('\n')}`,
        );
      });
      const again = attach(sb, es.sessionID);
      expect((await again.closed).code).toBe(1011);
      expect(JSON.parse(again.texts[0])).toEqual({ error: { type: 'not_found', message: expect.any(String) } });
      expect(stackFile().pids.worker).toBe(workerPid);
    } finally {
      await api('DELETE', `/api/sandboxes/${sb}`);
    }
  }, 180_000);

  it('restarts a SIGKILLed API; the worker and the host carry on', async () => {
    const agent = await bashAgent(COPY);
    const { worker: workerPid, host: hostPid } = stackFile().pids;
    const pid = crash('api');
    await restarted('api', pid);
    const s = await startSession(agent, { input: { after: 'api kill' } });
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
    expect(done).toMatchObject({ status: 'completed', result: { after: 'api kill' } });
    expect(stackFile().pids).toMatchObject({ worker: workerPid, host: hostPid });
  }, 180_000);

  it('restarts a SIGKILLed FerretDB; the API and the worker reconnect without a restart of their own', async () => {
    const agent = await bashAgent(COPY);
    const { api: apiPid, worker: workerPid, host: hostPid } = stackFile().pids;
    const pid = crash('mongo');
    await restarted('mongo', pid);
    await eventually(async () => (await api('GET', `/v1/agents/${agent}`)).status === 200, 60_000, 250);
    const s = await startSession(agent, { input: { after: 'mongo kill' } });
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
    expect(done).toMatchObject({ status: 'completed', result: { after: 'mongo kill' } });
    expect(stackFile().pids).toMatchObject({ api: apiPid, worker: workerPid, host: hostPid });
  }, 180_000);

  it('restarts a SIGKILLed Temporal dev server; the API and the worker reconnect without a restart of their own', async () => {
    const agent = await bashAgent(COPY);
    const { api: apiPid, worker: workerPid, host: hostPid } = stackFile().pids;
    const pid = crash('temporal');
    await restarted('temporal', pid);
    const s = await eventually(() => startSession(agent, { input: { after: 'temporal kill' } }), 60_000, 500);
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
    expect(done).toMatchObject({ status: 'completed', result: { after: 'temporal kill' } });
    expect(stackFile().pids).toMatchObject({ api: apiPid, worker: workerPid, host: hostPid });
  }, 180_000);
});
