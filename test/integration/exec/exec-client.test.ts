/**
 * Exec as the OpenComputer client uses it, whole: exec.run over run-async + result (env, cwd, the
 * server-side timeout and the client's ExecTimeoutError), many commands at once, reattaching after a
 * dropped connection, and the stateful shell.
 */
import { api } from '../../helpers/env';
import { newSandbox } from '../../helpers/sandboxes';
import { runSdk } from '../../helpers/sdk';

let sb: string;
beforeAll(async () => {
  sb = await newSandbox({ envs: { BASE: 'base-env' } });
});
afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

describe('exec through the OpenComputer client', () => {
  it('exec.run with env and cwd per command, a server-side timeout, and the client timeout error', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const a = await sb.exec.run('echo "$BASE $MINE"; pwd; echo err >&2; exit 4', { env: { MINE: 'mine' }, cwd: '/tmp' });
      const killed = await sb.exec.run('sleep 30', { timeout: 1 });
      let timeoutError = null;
      const t0 = Date.now();
      try { await sb.exec.run('sleep 30; echo late', { timeoutMs: 700 }); } catch (e) { timeoutError = { isIt: e instanceof sdk.ExecTimeoutError, execId: e.execId, ms: Date.now() - t0 }; }
      const still = (await sb.exec.list()).find((s) => s.sessionID === timeoutError?.execId);
      if (timeoutError?.execId) await sb.exec.kill(timeoutError.execId);
      out({ a, killed, timeoutError, stillRunning: still?.running ?? null });
    `,
      { SB: sb },
    );
    expect(r.a).toEqual({ exitCode: 4, stdout: 'base-env mine\n/tmp\n', stderr: 'err\n' });
    expect(r.killed.exitCode).toBe(137);
    expect(r.timeoutError).toMatchObject({ isIt: true, execId: expect.stringMatching(/^es-/) });
    // The client gave up at its deadline, not at the command's end: the command (30 s) still runs;
    // and not before the deadline (the client throws only once it has passed).
    expect(r.stillRunning).toBe(true);
    expect(r.timeoutError.ms).toBeGreaterThanOrEqual(700);
  });

  it('runs many commands at once in one sandbox', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const rs = await Promise.all(Array.from({ length: 24 }, (_, i) => sb.exec.run('sleep 0.2; echo ' + i)));
      out(rs.map((x) => x.stdout.trim()));
    `,
      { SB: sb },
    );
    expect(r).toEqual(Array.from({ length: 24 }, (_, i) => String(i)));
  });

  it('reattaches to a running command after the connection drops and sees all of its output', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const dec = new TextDecoder();
      let first = '';
      const s = await sb.exec.start('bash', { args: ['-c', 'for i in 1 2 3 4 5 6; do echo line$i; sleep 0.25; done; exit 3'], onStdout: (d) => { first += dec.decode(d); } });
      const t0 = Date.now();
      while (!first.includes('line1') && Date.now() - t0 < 10000) await new Promise((r) => setTimeout(r, 20));
      s.close(); // the connection drops; the command goes on (a new attachment gets its scrollback)
      let again = '';
      const b = await sb.exec.attach(s.sessionId, { onStdout: (d) => { again += dec.decode(d); } });
      const code = await b.done;
      out({ first, again, code });
    `,
      { SB: sb },
    );
    expect(r.first.startsWith('line1\n')).toBe(true);
    expect(r.again).toBe('line1\nline2\nline3\nline4\nline5\nline6\n');
    expect(r.code).toBe(3);
  });

  it('attaching to finished commands, one by one and many at once, gets their output and exit code every time', async () => {
    // The whole answer of a finished command (scrollback, its end, the exit) is ready at once: the
    // client, which sets its message handler only after awaiting `open`, must still see all of it.
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const dec = new TextDecoder();
      const ids = [];
      for (let i = 0; i < 4; i++) {
        const s = await sb.exec.start('sh', { args: ['-c', 'echo out' + i + '; exit ' + (10 + i)] });
        await s.done;
        ids.push(s.sessionId);
      }
      const one = async (i) => {
        let o = '';
        let ends = 0;
        const a = await sb.exec.attach(ids[i], { onStdout: (d) => { o += dec.decode(d); }, onScrollbackEnd: () => { ends++; } });
        const code = await a.done;
        return o === 'out' + i + '\\n' && ends === 1 && code === 10 + i ? 'ok' : JSON.stringify({ i, o, ends, code });
      };
      const seq = [];
      for (let k = 0; k < 12; k++) seq.push(await one(k % 4));
      const par = [];
      for (let round = 0; round < 2; round++) par.push(...(await Promise.all(Array.from({ length: 24 }, (_, k) => one(k % 4)))));
      out({ seq, par });
    `,
      { SB: sb },
    );
    expect(r.seq).toEqual(Array(12).fill('ok'));
    expect(r.par).toEqual(Array(48).fill('ok'));
  });

  it('keeps state in a shell across runs', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const sh = await sb.exec.shell({ cwd: '/workspace' });
      await sh.run('cd /tmp && export KEPT=yes');
      const a = await sh.run('pwd; echo $KEPT');
      await sh.close?.();
      out({ a: a.stdout ?? a });
    `,
      { SB: sb },
    );
    expect(r.a).toBe('/tmp\nyes\n');
  });
});

describe('exec results over raw HTTP', () => {
  it('run-async answers a handle; result waits for the exit and 404s for unknown ids', async () => {
    const h = await api('POST', `/api/sandboxes/${sb}/exec/run-async`, { body: { cmd: 'sh', args: ['-c', 'sleep 0.3; echo done'] } });
    expect(h.status).toBe(201);
    expect(h.body.execId).toMatch(/^es-/);
    const r = await api('GET', `/api/sandboxes/${sb}/exec/${h.body.execId}/result`);
    expect(r.body).toMatchObject({ execId: h.body.execId, running: false, exitCode: 0, timedOut: false, stdout: 'done\n', stderr: '' });
    expect((await api('GET', `/api/sandboxes/${sb}/exec/es-0000000000000000/result`)).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/exec/run-async`, { body: { cmd: '' } })).status).toBe(400);
  });
});
