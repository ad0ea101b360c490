import { ChildProcess, spawn } from 'node:child_process';
import { ProcSpec, Supervisor, SupervisorOptions } from '../../scripts/supervisor';

/** A real node child running `code`. */
const node = (code: string): ChildProcess => spawn(process.execPath, ['-e', code], { stdio: 'ignore' });

/** A spec whose children run `code`; ready as soon as they are spawned (or once `ready` says so). */
const spec = (code: string, ready: (c: ChildProcess) => Promise<void> = async () => undefined): ProcSpec => ({ spawn: () => node(code), ready });

const STAY = 'setInterval(() => {}, 1000)';

async function until(what: string, check: () => boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A supervisor whose log lines are kept, with the given options. */
function make(opts: Partial<SupervisorOptions> = {}) {
  const lines: string[] = [];
  const gaveUp: string[] = [];
  const sup = new Supervisor({
    restart: true,
    initialBackoffMs: 50,
    maxBackoffMs: 400,
    log: (l) => lines.push(l),
    onGiveUp: (name, message) => gaveUp.push(`${name}: ${message}`),
    ...opts,
  });
  return { sup, lines, gaveUp };
}

const supervisors: Supervisor[] = [];
afterEach(async () => {
  for (const s of supervisors.splice(0)) {
    s.close();
    for (const name of Object.keys(s.pids())) await s.stop(name, 'SIGKILL');
  }
});

describe('Supervisor', () => {
  it('restarts a child that is killed, and logs the death and the restart', async () => {
    const { sup, lines } = make();
    supervisors.push(sup);
    await sup.start('svc', spec(STAY));
    const first = sup.pid('svc')!;
    expect(first).toBeGreaterThan(0);
    process.kill(first, 'SIGKILL');
    await until('a new pid', () => sup.pid('svc') !== undefined && sup.pid('svc') !== first);
    await until('the restart line', () => lines.some((l) => l.startsWith('svc restarted')));
    expect(sup.restarts('svc')).toBe(1);
    expect(lines[0]).toBe(`svc (pid ${first}) exited unexpectedly with signal SIGKILL; restart #1 in 50 ms`);
    expect(lines[1]).toBe(`svc restarted (pid ${sup.pid('svc')}, restart #1)`);
  });

  it('restarts a child that exits with a code by itself, naming the code', async () => {
    const { sup, lines } = make({ maxDeaths: 100 });
    supervisors.push(sup);
    // The first child exits 3 after a moment; the next ones stay.
    let n = 0;
    await sup.start('svc', { spawn: () => node(n++ === 0 ? 'setTimeout(() => process.exit(3), 200)' : STAY), ready: async () => undefined });
    await until('the restart line', () => lines.some((l) => l.startsWith('svc restarted')));
    expect(lines[0]).toMatch(/^svc \(pid \d+\) exited unexpectedly with code 3; restart #1 in 50 ms$/);
    expect(sup.pid('svc')).toBeGreaterThan(0);
  });

  it('does not restart after a deliberate stop, and start() brings it back', async () => {
    const { sup, lines } = make();
    supervisors.push(sup);
    await sup.start('svc', spec(STAY));
    const first = sup.pid('svc')!;
    await sup.stop('svc', 'SIGKILL');
    expect(sup.pid('svc')).toBeUndefined();
    // The child's exit has been handled (stop() waited for it): no restart was scheduled.
    expect(sup.restartScheduled('svc')).toBe(false);
    expect(lines).toEqual([]);
    await sup.start('svc', spec(STAY));
    expect(sup.pid('svc')).toBeGreaterThan(0);
    expect(sup.pid('svc')).not.toBe(first);
    expect(sup.restarts('svc')).toBe(0);
  });

  it('a deliberate stop during a restart backoff cancels the restart', async () => {
    const { sup, lines } = make({ initialBackoffMs: 60_000 });
    supervisors.push(sup);
    await sup.start('svc', spec(STAY));
    process.kill(sup.pid('svc')!, 'SIGKILL');
    await until('the restart to be scheduled', () => sup.restartScheduled('svc'));
    expect(lines).toEqual([expect.stringMatching(/^svc \(pid \d+\) exited unexpectedly with signal SIGKILL; restart #1 in 60000 ms$/)]);
    await sup.stop('svc');
    expect(sup.restartScheduled('svc')).toBe(false);
    expect(sup.pid('svc')).toBeUndefined();
  });

  it('doubles the backoff per death up to the maximum, then gives up on a crash loop', async () => {
    const { sup, lines, gaveUp } = make({ maxDeaths: 6 });
    supervisors.push(sup);
    await sup.start('loop', spec('setTimeout(() => process.exit(7), 20)'));
    await until('give-up', () => gaveUp.length > 0);
    const delays = lines.filter((l) => l.includes('exited unexpectedly')).map((l) => Number(/in (\d+) ms$/.exec(l)![1]));
    expect(delays).toEqual([50, 100, 200, 400, 400]);
    expect(gaveUp).toEqual([expect.stringMatching(/^loop: loop died 6 times within 60 s \(last: code 7\); giving up$/)]);
    expect(lines[lines.length - 1]).toMatch(/giving up$/);
    // Nothing more is started after the give-up: no restart is scheduled.
    expect(sup.restartScheduled('loop')).toBe(false);
    expect(sup.pid('loop')).toBeUndefined();
    expect(sup.restarts('loop')).toBe(5);
  });

  it('starts again from the first backoff after a healthy run', async () => {
    // The supervisor's clock is the test's: a healthy spell is a step of it, not a wait.
    let clock = 1_000_000;
    const { sup, lines } = make({ healthyAfterMs: 3000, maxDeaths: 100, now: () => clock });
    supervisors.push(sup);
    await sup.start('svc', spec(STAY));
    for (let i = 0; i < 3; i++) {
      const pid = sup.pid('svc')!;
      process.kill(pid, 'SIGKILL');
      await until('a new pid', () => sup.pid('svc') !== undefined && sup.pid('svc') !== pid);
      await until('restarted', () => lines.filter((l) => l.includes(' restarted ')).length === i + 1);
    }
    // Three quick deaths: 50, 100, 200. Then a healthy spell (the restarted child was ready at `clock`) resets it.
    clock += 3000;
    process.kill(sup.pid('svc')!, 'SIGKILL');
    await until('the fourth death', () => lines.filter((l) => l.includes('exited unexpectedly')).length === 4);
    const delays = lines.filter((l) => l.includes('exited unexpectedly')).map((l) => Number(/in (\d+) ms$/.exec(l)![1]));
    expect(delays).toEqual([50, 100, 200, 50]);
  });

  it('a start whose child never gets ready throws and leaves nothing running or restarting', async () => {
    const { sup, lines } = make();
    supervisors.push(sup);
    const notReady = spec(STAY, async () => {
      throw new Error('not ready');
    });
    await expect(sup.start('svc', notReady)).rejects.toThrow('not ready');
    expect(sup.pid('svc')).toBeUndefined();
    expect(sup.restartScheduled('svc')).toBe(false);
    expect(lines).toEqual([]);
  });

  it('reports the running pids on every change', async () => {
    const seen: Record<string, number>[] = [];
    const { sup } = make({ onChange: () => seen.push(sup.pids()) });
    supervisors.push(sup);
    await sup.start('a', spec(STAY));
    await sup.start('b', spec(STAY));
    const a = sup.pid('a')!;
    const b = sup.pid('b')!;
    expect(seen[seen.length - 1]).toEqual({ a, b });
    await sup.stop('a');
    expect(seen[seen.length - 1]).toEqual({ b });
  });
});
