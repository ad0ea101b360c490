/**
 * The start of an entrypoint run, decided by one rename on each side (sandbox/base.ts
 * settleInterruptedRun, sap-sandbox-enter -R): a restarted host either cancels a run for good or
 * finds the helper's durable claim and adopts it, never both, never neither; and the audit log
 * counts runs, not lines (countRuns).
 */
import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AuditLog, countRuns } from '../../sandbox/audit-log';
import { runFiles, settleInterruptedRun } from '../../sandbox/base';

const ENTER = path.resolve(__dirname, '..', '..', '.tools', 'bin', 'sap-sandbox-enter');

/** Runs the helper with -R and no -n: it claims (or not), then stops at its missing -n (exit 125). */
function helper(claimed: string): Promise<{ code: number | null; stderr: string; pid: number }> {
  return new Promise((resolve, reject) => {
    const p = spawn(ENTER, ['-R', claimed, '--', '/bin/true'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    p.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
    p.on('error', reject);
    p.on('close', (code) => resolve({ code, stderr, pid: p.pid! }));
  });
}

const exists = (f: string) =>
  fsp.access(f).then(
    () => true,
    () => false,
  );

describe('entrypoint runs: claim or cancel', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-run-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it("a run its helper claimed is found started, with the helper's pid; it cannot be cancelled any more", async () => {
    const f = runFiles(dir, 'r1');
    await fsp.writeFile(f.pending, '');
    const h = await helper(f.claimed);
    // It went past the claim: what stopped it is the missing -n, after.
    expect(h.stderr).toContain('(no -n)');
    expect(await fsp.readFile(f.claimed, 'utf8')).toBe(`${h.pid}\n`);
    expect(await exists(f.pending)).toBe(false);
    expect(await settleInterruptedRun(dir, 'r1')).toEqual({ outcome: 'started', pid: h.pid });
    // Settling again decides the same.
    expect(await settleInterruptedRun(dir, 'r1')).toEqual({ outcome: 'started', pid: h.pid });
  });

  it('a run cancelled before its helper claimed it never starts: a helper that comes later does nothing, silently', async () => {
    const f = runFiles(dir, 'r2');
    await fsp.writeFile(f.pending, '');
    expect(await settleInterruptedRun(dir, 'r2')).toEqual({ outcome: 'cancelled' });
    const h = await helper(f.claimed);
    expect(h.code).toBe(125);
    // Nothing written: its stderr would be another run's log.
    expect(h.stderr).toBe('');
    expect(await exists(f.claimed)).toBe(false);
    expect(await fsp.readdir(dir)).toEqual([]);
  });

  it('a run whose pending file was never written was never started, and a helper for it does nothing', async () => {
    expect(await settleInterruptedRun(dir, 'r3')).toEqual({ outcome: 'never' });
    const h = await helper(runFiles(dir, 'r3').claimed);
    expect(h.code).toBe(125);
    expect(await fsp.readdir(dir)).toEqual([]);
  });

  it('a helper never claims over an existing claim (another run of the same name)', async () => {
    const f = runFiles(dir, 'r4');
    await fsp.writeFile(f.claimed, '1\n');
    await fsp.writeFile(f.pending, '');
    const h = await helper(f.claimed);
    expect(h.code).toBe(125);
    expect(h.stderr).toBe('');
    expect(await fsp.readFile(f.claimed, 'utf8')).toBe('1\n');
  });

  it('a helper and a restarted host racing for the same run: exactly one wins, every time', async () => {
    for (let i = 0; i < 40; i++) {
      const run = `race${i}`;
      const f = runFiles(dir, run);
      await fsp.writeFile(f.pending, '');
      const [h, settled] = await Promise.all([helper(f.claimed), new Promise((r) => setImmediate(r)).then(() => settleInterruptedRun(dir, run))]);
      const claimed = await exists(f.claimed);
      if (settled.outcome === 'cancelled') {
        expect(claimed).toBe(false);
        expect(h.stderr).toBe('');
      } else {
        expect(settled).toEqual({ outcome: 'started', pid: h.pid });
        expect(claimed).toBe(true);
      }
      expect(await exists(f.pending)).toBe(false);
    }
  });
});

describe('countRuns', () => {
  const line = (owner: string, run?: string, extra: Record<string, unknown> = {}) =>
    JSON.stringify({
      at: 't',
      event: 'entrypoint_start',
      sandboxId: 's',
      orgId: 'o',
      hostId: 'h',
      owner: { kind: 'session', id: owner },
      ...(run ? { run } : {}),
      ...extra,
    });

  it('counts the distinct runs of each session: a run recorded again by the next host counts once', () => {
    const text = [
      line('a', 'r1'),
      line('a', 'r1', { recovered: true }),
      line('b', 'r2'),
      line('b', 'r3'),
      // Lines of an older host (no run): each one a run.
      line('c'),
      line('c'),
      JSON.stringify({ at: 't', event: 'entrypoint_start', sandboxId: 's', orgId: 'o', hostId: 'h', owner: { kind: 'batch', id: 'a' }, run: 'x' }),
      '',
    ].join('\n');
    expect(Object.fromEntries(countRuns(text))).toEqual({ a: 1, b: 2, c: 2 });
  });
});

describe('AuditLog.hasRun', () => {
  it('finds a run recorded near the end of the log, and no other', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-run-audit-'));
    const log = new AuditLog(path.join(dir, 'a.ndjson'));
    try {
      expect(await log.hasRun('r1')).toBe(false);
      await log.record({ at: 't', event: 'entrypoint_start', sandboxId: 's', orgId: 'o', hostId: 'h', run: 'r1' });
      expect(await log.hasRun('r1')).toBe(true);
      expect(await log.hasRun('r')).toBe(false);
      expect(await log.hasRun('r2')).toBe(false);
    } finally {
      await log.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
