import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Spawner } from '../../sandbox/spawner';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** The file's text once it ends with `last` (a whole line by default). */
async function fileWithin(file: string, last = '\n', ms = 20_000): Promise<string> {
  const end = Date.now() + ms;
  for (;;) {
    const text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
    if (text.endsWith(last)) return text;
    if (Date.now() > end) throw new Error(`${file} not written: ${JSON.stringify(text)}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe.each([
  ['the python helper', () => new Spawner()],
  ['the fallback (no python)', () => new Spawner('/nonexistent/python3')],
])('Spawner through %s', (_name, make) => {
  const spawner = make();
  afterAll(() => spawner.close());

  it('starts a detached process with the given env, output files, descriptor 3 and default signals', async () => {
    const out = path.join(dir, `${_name}.out`);
    const err = path.join(dir, `${_name}.err`);
    const fd3 = path.join(dir, `${_name}.fd3`);
    const script =
      'echo "env=$ONLY sid=$(ps -o sid= -p $$ | tr -d " ") pid=$$ home=${HOME:-none}"; echo to-stderr >&2; echo three >&3; ' +
      // The shell reads its own status with builtins: a child (grep) reading /proc/<shell>/status
      // can catch the shell inside a fork, when dash blocks every signal for a moment.
      'while read -r k v; do case $k in SigBlk:|SigIgn:) echo "$k $v";; esac; done < /proc/self/status; echo end';
    const pid = await spawner.spawn({ argv: ['/bin/sh', '-c', script], env: { ONLY: 'yes', PATH: '/usr/bin:/bin' }, stdout: out, stderr: err, fd3 });
    expect(pid).toBeGreaterThan(1);
    const text = await fileWithin(out, 'end\n');
    expect(text).toContain(`env=yes sid=${pid} pid=${pid} home=none`);
    // Nothing blocked, and no standard signal ignored in the child (SIGCHLD, SIGPIPE, SIGXFSZ…
    // back to their defaults; glibc's internal signals 32 and 33 are not ours to reset).
    expect(text).toMatch(/SigBlk:\s+0+\n/);
    const ignored = BigInt('0x' + /SigIgn:\s+([0-9a-f]+)/.exec(text)![1]);
    expect(ignored & ((1n << 31n) - 1n)).toBe(0n);
    expect(await fileWithin(err)).toBe('to-stderr\n');
    expect(await fileWithin(fd3)).toBe('three\n');
  });

  it('starts many at once and answers each with its own pid', async () => {
    const files = Array.from({ length: 20 }, (_, i) => path.join(dir, `${_name}-many-${i}`));
    const pids = await Promise.all(files.map((f, i) => spawner.spawn({ argv: ['/bin/sh', '-c', `echo ${i}:$$`], env: {}, stdout: f })));
    expect(new Set(pids).size).toBe(20);
    for (const [i, f] of files.entries()) expect(await fileWithin(f)).toBe(`${i}:${pids[i]}\n`);
  });

  it('unmounts without an exec, and reports what it could not unmount', async () => {
    const target = fs.mkdtempSync(path.join(dir, 'mnt-'));
    execFileSync('mount', ['-t', 'tmpfs', 'sap-test', target]);
    const mounted = () => fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === target);
    expect(mounted()).toBe(true);
    expect(await spawner.umount([target])).toEqual([]);
    expect(mounted()).toBe(false);
    const failed = await spawner.umount([target]);
    expect(failed).toEqual([{ path: target, error: expect.any(String) }]);
  });

  it('refuses a relative program path, and reports one that does not exist', async () => {
    await expect(spawner.spawn({ argv: ['sh', '-c', 'true'], env: {} })).rejects.toThrow(/absolute/);
    await expect(spawner.spawn({ argv: ['/no/such/program'], env: {} })).rejects.toThrow();
  });
});
