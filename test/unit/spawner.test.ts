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
    const mounted = () =>
      fs
        .readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .some((l) => l.split(' ')[4] === target);
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

describe('Spawner.exec (commands with pipes, started by the helper)', () => {
  const spawner = new Spawner();
  afterAll(() => spawner.close());

  /** Runs a command to its 'close', with stdin, and answers its output and status. */
  async function run(
    argv: string[],
    stdin = '',
  ): Promise<{ pid: number; out: string; err: string; code: number | null; signal: string | null; events: string[] }> {
    const helperPid = spawner.helperPid();
    expect(helperPid).toEqual(expect.any(Number));
    const child = await spawner.exec(argv, { PATH: '/usr/bin:/bin' }, helperPid!);
    expect(child).not.toBeNull();
    const events: string[] = [];
    let out = '';
    let err = '';
    child!.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child!.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    child!.stdin?.on('error', () => undefined);
    child!.stdin?.end(stdin);
    child!.on('exit', () => events.push('exit'));
    const [code, signal] = await new Promise<[number | null, string | null]>((resolve) =>
      child!.on('close', (c: number | null, s: string | null) => {
        events.push('close');
        resolve([c, s]);
      }),
    );
    return { pid: child!.pid!, out, err, code, signal, events };
  }

  it('passes stdin, stdout, stderr and the exit code, in a session of its own', async () => {
    const r = await run(['/bin/sh', '-c', 'read line; echo "got $line sid=$(ps -o sid= -p $$ | tr -d " ") pid=$$"; echo oops >&2; exit 7'], 'hello\n');
    expect(r.out).toBe(`got hello sid=${r.pid} pid=${r.pid}\n`);
    expect(r.err).toBe('oops\n');
    expect([r.code, r.signal]).toEqual([7, null]);
    expect(r.events).toEqual(['exit', 'close']);
  });

  it('reports a signal by name, and reads large output to the end', async () => {
    const killed = await run(['/bin/sh', '-c', 'kill -TERM $$']);
    expect([killed.code, killed.signal]).toEqual([null, 'SIGTERM']);
    const big = await run(['/bin/sh', '-c', 'head -c 3000000 /dev/zero | tr "\\0" x']);
    expect(big.out.length).toBe(3_000_000);
    expect(big.code).toBe(0);
  });

  it('serves many at once, including commands that exit before the host opens their pipes', async () => {
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) => run(i % 2 ? ['/bin/true'] : ['/bin/echo', String(i)])));
    for (const [i, r] of results.entries()) {
      expect(r.code).toBe(0);
      expect(r.out).toBe(i % 2 ? '' : `${i}\n`);
    }
    // The helper keeps none of the pipes once the host has its ends. The host asks it to close them
    // ("release") without waiting for the answer, so on a loaded machine the last releases can still be
    // on their way when the commands have closed: wait for them (a leak never goes down).
    const helperPipes = () =>
      fs
        .readdirSync(`/proc/${spawner.helperPid()}/fd`)
        .map((fd) => {
          try {
            return fs.readlinkSync(`/proc/${spawner.helperPid()}/fd/${fd}`);
          } catch {
            return '';
          }
        })
        .filter((l) => l.startsWith('pipe:')).length;
    const until = Date.now() + 10_000;
    while (helperPipes() > 3 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(helperPipes()).toBeLessThanOrEqual(3); // its own stdin, stdout (and maybe stderr)
  });

  it('ends its commands as hung up when the helper is gone', async () => {
    const other = new Spawner();
    try {
      const helperPid = other.helperPid()!;
      const child = await other.exec(['/bin/sleep', '30'], {}, helperPid);
      const exited = new Promise<[number | null, string | null]>((resolve) => child!.on('exit', (c: number | null, s: string | null) => resolve([c, s])));
      process.kill(helperPid, 'SIGKILL');
      expect(await exited).toEqual([null, 'SIGHUP']);
      process.kill(-child!.pid!, 'SIGKILL');
    } finally {
      other.close();
    }
  });
});

describe('Spawner.exec when a command exits before its start is answered', () => {
  // A helper whose main thread answers 100 ms after starting each command, so that a command that
  // exits at once is reported (by the reaper thread) before its start: what a loaded machine
  // sometimes does. The copy differs from sandbox/spawner.py by that pause only.
  const slowDir = fs.mkdtempSync(path.join(os.tmpdir(), 'spawner-slow-'));
  const source = fs.readFileSync(path.resolve(__dirname, '..', '..', 'sandbox', 'spawner.py'), 'utf8');
  const marker = '    return {"pid": pid, "fds": ours}';
  const script = path.join(slowDir, 'spawner.py');
  const python = path.join(slowDir, 'python');
  fs.writeFileSync(script, source.replace(marker, `    __import__("time").sleep(0.1)\n${marker}`));
  // The Spawner runs `<python> -I -u <its script>`: this stands in for python and runs the copy.
  fs.writeFileSync(python, `#!/bin/sh\nexec /usr/bin/python3 -I -u ${script}\n`, { mode: 0o755 });
  const spawner = new Spawner(python);
  afterAll(() => {
    spawner.close();
    fs.rmSync(slowDir, { recursive: true, force: true });
  });

  it('still emits exit after exec() has answered, as a child process does, then close', async () => {
    expect(source).toContain(marker);
    for (const argv of [['/bin/true'], ['/bin/echo', 'early'], ['/bin/sh', '-c', 'exit 5']]) {
      const child = await spawner.exec(argv, { PATH: '/usr/bin:/bin' }, spawner.helperPid()!);
      expect(child).not.toBeNull();
      // Listeners attached right after the await, as ExecManager does: neither event may be missed.
      const events: string[] = [];
      let out = '';
      child!.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      const exited = new Promise<[number | null, string | null]>((resolve) =>
        child!.once('exit', (c: number | null, s: string | null) => {
          events.push('exit');
          resolve([c, s]);
        }),
      );
      const closed = new Promise<void>((resolve) => child!.once('close', () => resolve(void events.push('close'))));
      const timeout = new Promise<string>((resolve) => setTimeout(() => resolve('no exit event within 5 s'), 5_000).unref());
      expect(await Promise.race([exited.then(() => 'exit'), timeout])).toBe('exit');
      await closed;
      expect(events).toEqual(['exit', 'close']);
      expect((await exited)[0]).toBe(argv[0] === '/bin/sh' ? 5 : 0);
      expect(out).toBe(argv[1] === 'early' ? 'early\n' : '');
    }
  });
});
