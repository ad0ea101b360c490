import { spawnSync } from 'node:child_process';
import { findStackRoot, stackCpuMs, stackPids } from '../../scripts/bench-cpu';

describe('bench-cpu: the CPU of a process tree from /proc', () => {
  it('finds the tree below a root and counts the CPU of children that have ended', () => {
    expect(stackPids(process.pid)).toContain(process.pid);
    expect(stackPids(2 ** 30)).toEqual([]);
    const before = stackCpuMs(process.pid).total;
    // A child that burns about 200 ms of CPU and is reaped: its time is in this process's cutime.
    spawnSync(process.execPath, ['-e', 'const t = Date.now(); while (Date.now() - t < 200);']);
    const spent = stackCpuMs(process.pid).total - before;
    expect(spent).toBeGreaterThanOrEqual(150);
    expect(findStackRoot('http://127.0.0.1:1', 1234)).toBe(1234);
    expect(() => findStackRoot('http://127.0.0.1:1')).toThrow(/give --stack-pid/);
  });
});
