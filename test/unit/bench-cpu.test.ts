import { spawnSync } from 'node:child_process';
import { findStackRoot, stackCpuMs, stackPids } from '../../scripts/bench-cpu';

/** A child that burns 200 ms of CPU (by its own count, not the clock's: a loaded machine only slows it) and prints what it used. */
const BURN =
  'const used = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; }; while (used() < 200); process.stdout.write(String(used()));';

describe('bench-cpu: the CPU of a process tree from /proc', () => {
  it('finds the tree below a root and counts the CPU of children that have ended', () => {
    expect(stackPids(process.pid)).toContain(process.pid);
    expect(stackPids(2 ** 30)).toEqual([]);
    const before = stackCpuMs(process.pid).total;
    // The child is reaped by spawnSync: its time is in this process's cutime/cstime.
    const child = spawnSync(process.execPath, ['-e', BURN], { encoding: 'utf8' });
    expect(child.status).toBe(0);
    const childMs = Number(child.stdout);
    expect(childMs).toBeGreaterThanOrEqual(200);
    const spent = stackCpuMs(process.pid).total - before;
    // /proc counts in clock ticks (10 ms), truncated: each of the two readings may be short by up to one.
    expect(spent).toBeGreaterThanOrEqual(childMs - 20);
    expect(findStackRoot('http://127.0.0.1:1', 1234)).toBe(1234);
    expect(() => findStackRoot('http://127.0.0.1:1')).toThrow(/give --stack-pid/);
  });
});
