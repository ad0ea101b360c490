/**
 * An entrypoint runs once even when its sandbox host is SIGKILLed in the middle of starting it
 * (the duplicate runs under `npm run chaos`). The host is stopped at a point of the start
 * (SANDBOX_TEST_PAUSE_FILE, set by global-setup), killed there, and restarted by the supervisor;
 * the session must end, its agent must have run exactly once (it counts its own runs in its
 * sandbox), and the audit log must say one run.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { StackFile } from '../../../scripts/launcher';
import { countRuns, defaultAuditLogPath } from '../../../sandbox/audit-log';
import { eventually, T } from '../../helpers/env';
import { bashAgent, startSession, waitForStatus } from '../../helpers/sessions';

const stackFile = (): StackFile => JSON.parse(fs.readFileSync(path.join(T.dataDir(), 'stack.json'), 'utf8')) as StackFile;
const pauseFile = () => path.join(T.dataDir(), 'test-pause-entrypoint');
const readyz = async () => (await fetch(`${T.api()}/readyz`).catch(() => null))?.status === 200;
const auditLines = (sessionId: string) => {
  const file = defaultAuditLogPath(T.dataDir());
  const text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  const lines = text.split('\n').filter((l) => l && (JSON.parse(l) as { owner?: { id: string } }).owner?.id === sessionId);
  return { lines: lines.map((l) => JSON.parse(l) as { run?: string; recovered?: boolean }), runs: countRuns(text).get(sessionId) ?? 0 };
};

/**
 * The agent appends to a file of its sandbox when it starts and reports, two seconds later, how many
 * starts that file holds: a second start of the same sandbox's entrypoint (what a retried create did
 * after a host restart) shows as runs > 1. The marker lets the pause point pick this agent's start.
 */
const agentScript = (marker: string) =>
  `: ${marker}; echo "$$" >> /tmp/starts; sleep 2; n=$(wc -l < /tmp/starts); printf '{"runs":%s}' "$n" > /tmp/agent_result.json`;

afterEach(async () => {
  // Never leave a pause behind for the tests that come next.
  for (const f of [pauseFile(), `${pauseFile()}.reached`]) fs.rmSync(f, { force: true });
});

afterAll(async () => {
  await eventually(readyz, 120_000, 250);
}, 130_000);

describe('a sandbox host killed while starting an entrypoint', () => {
  for (const point of ['before-spawn', 'after-claim'] as const) {
    it(`(${point}) runs the entrypoint exactly once, and the session ends`, async () => {
      await eventually(readyz, 120_000, 250);
      const marker = `once-${point}-${Date.now().toString(36)}`;
      const agent = await bashAgent(agentScript(marker));
      fs.writeFileSync(pauseFile(), `${point} ${marker}\n`);
      const s = await startSession(agent, { input: {} });
      // The host has stopped at the point (it renamed the file): kill it there, as a crash would.
      await eventually(async () => fs.existsSync(`${pauseFile()}.reached`), 120_000, 50);
      const pid = stackFile().pids.host!;
      process.kill(pid, 'SIGKILL');
      fs.rmSync(`${pauseFile()}.reached`, { force: true });
      await eventually(async () => stackFile().pids.host !== pid && (await readyz()), 120_000, 250);
      const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 240_000);
      expect(done).toMatchObject({ status: 'completed', result: { runs: 1 } });
      const audit = auditLines(s.id);
      expect(audit.runs).toBe(1);
      if (point === 'after-claim') {
        // The run began before the kill: the restarted host adopted it and wrote its line.
        expect(audit.lines).toEqual([expect.objectContaining({ recovered: true, run: expect.any(String) })]);
      } else {
        // The kill came before any run began: the one line is the retry's, written by the host that started it.
        expect(audit.lines).toEqual([expect.not.objectContaining({ recovered: true })]);
      }
    }, 400_000);
  }
});
