/**
 * An exec session streamed in its own start's answer (`POST …/exec` with `Accept: text/event-stream`,
 * api/exec-events.ts): one request to the first output. And the host's side of it: the session's
 * frames as an HTTP answer (`execFrames`), asked for before the start (`awaitStartMs`, bounded in time).
 */
import { randomBytes } from 'node:crypto';
import { api, eventually, T } from '../../helpers/env';
import { hostClient, newSandbox } from '../../helpers/sandboxes';
import { getExec } from '../../helpers/exec';
import { otherOrgKey } from '../../helpers/checkpoints';

interface Ev {
  event: string;
  data: any;
}

/** Starts a streamed exec; answers the response (the caller reads `events` from it). */
function post(sb: string, body: unknown, opts: { key?: string; signal?: AbortSignal } = {}): Promise<Response> {
  return fetch(`${T.api()}/api/sandboxes/${sb}/exec`, {
    method: 'POST',
    headers: { 'x-api-key': opts.key ?? T.key(), 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
    signal: opts.signal,
  });
}

/** Reads server-sent events from an answer, as far as asked. */
class Sse {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>;
  private readonly dec = new TextDecoder();
  private buf = '';
  readonly seen: Ev[] = [];
  constructor(res: Response) {
    this.reader = res.body!.getReader();
  }
  /** Events until one `until` accepts (it included), or to the end of the answer. */
  async read(until?: (e: Ev) => boolean): Promise<Ev[]> {
    const out: Ev[] = [];
    for (;;) {
      let i;
      while ((i = this.buf.indexOf('\n\n')) >= 0) {
        const block = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 2);
        if (block.startsWith(':')) continue;
        const e = { event: /^event: (.*)$/m.exec(block)?.[1] ?? 'message', data: JSON.parse(/^data: (.*)$/m.exec(block)?.[1] ?? 'null') };
        out.push(e);
        this.seen.push(e);
        if (until?.(e)) return out;
      }
      const { value, done } = await this.reader.read();
      if (done) return out;
      this.buf += this.dec.decode(value, { stream: true });
    }
  }
  cancel(): Promise<void> {
    return this.reader.cancel();
  }
}

/** Every event of an answer. */
const events = (res: Response): Promise<Ev[]> => new Sse(res).read();

/** Sandboxes made by this file (deleted after it), and the one most of its tests share. */
const created: string[] = [];
let sb: string;

beforeAll(async () => {
  sb = await newSandbox({}, { created });
});

afterAll(async () => {
  for (const id of created) await api('DELETE', `/api/sandboxes/${id}`);
});

describe('exec session streamed in its start answer', () => {
  it('answers the session, its output in order, and its exit; the session is recorded like any other', async () => {
    const res = await post(sb, { cmd: 'bash', args: ['-c', 'echo one; echo two >&2; sleep 0.2; echo three; exit 5'] });
    expect(res.status).toBe(201);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const evs = await events(res);
    expect(evs[0]!.event).toBe('session');
    expect(evs[0]!.data).toMatchObject({ sandboxID: sb, command: 'bash', running: true, exitCode: null });
    const id = evs[0]!.data.sessionID as string;
    expect(id).toMatch(/^es-/);
    const text = (k: string) =>
      evs
        .filter((e) => e.event === k)
        .map((e) => e.data.data)
        .join('');
    expect(text('stdout')).toBe('one\nthree\n');
    expect(text('stderr')).toBe('two\n');
    expect(evs[evs.length - 1]).toEqual({ event: 'exit', data: { exitCode: 5 } });
    // "three" came after "two" came after "one": the stdout events around the stderr one are in order.
    const order = evs.filter((e) => e.event === 'stdout' || e.event === 'stderr').map((e) => e.data.data as string);
    expect(order.join('')).toBe('one\ntwo\nthree\n');
    await eventually(async () => {
      const s = await getExec(sb, id);
      return s.running === false && s.exitCode === 5 ? s : null;
    });
    const list = await api('GET', `/api/sandboxes/${sb}/exec`);
    expect(list.body.map((s: { sessionID: string }) => s.sessionID)).toContain(id);
  });

  it('sends a character split between two writes whole', async () => {
    const res = await post(sb, { cmd: 'bash', args: ['-c', "printf '\\xc3'; sleep 0.3; printf '\\xa9\\n'"] });
    const evs = await events(res);
    const out = evs.filter((e) => e.event === 'stdout').map((e) => e.data.data as string);
    expect(out.join('')).toBe('é\n');
    expect(out.every((s) => !s.includes('\ufffd'))).toBe(true);
  });

  it('answers JSON as before without the Accept header, and JSON errors before any stream', async () => {
    const plain = await api('POST', `/api/sandboxes/${sb}/exec`, { body: { cmd: 'true' } });
    expect(plain.status).toBe(201);
    expect(plain.headers.get('content-type')).toMatch(/^application\/json/);
    const bad = await post(sb, { cmd: '' });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { type: 'invalid_request' } });
    const missing = await post('sb-doesnotexist0000', { cmd: 'true' });
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ error: { type: 'not_found' } });
    const stranger = await post(sb, { cmd: 'true' }, { key: await otherOrgKey() });
    expect(stranger.status).toBe(404);
    expect(await stranger.json()).toMatchObject({ error: { type: 'not_found' } });
    const anonymous = await post(sb, { cmd: 'true' }, { key: '' });
    expect(anonymous.status).toBe(401);
  });

  it('counts the caller as an attached client; a caller that leaves is a client that detached (maxRunAfterDisconnect)', async () => {
    const abort = new AbortController();
    const res = await post(sb, { cmd: 'bash', args: ['-c', 'echo up; exec sleep 600'], maxRunAfterDisconnect: 0 }, { signal: abort.signal });
    const evs = await new Sse(res).read((e) => e.event === 'stdout');
    const id = evs[0]!.data.sessionID as string;
    expect((await getExec(sb, id)).attachedClients).toBe(1);
    abort.abort();
    const s = await eventually(async () => {
      const now = await getExec(sb, id);
      return now.running === false ? now : null;
    });
    expect(s.exitCode).toBe(137);
  });

  it('is timed in the latency histogram to its headers, not to the end of the stream', async () => {
    // The route's total of seconds: other files' exec starts add a few milliseconds each meanwhile.
    const key = `sap_http_request_duration_seconds_sum{method="POST",route="/api/sandboxes/:id/exec",status="201"}`;
    const total = async () => {
      const text = await (await fetch(`${T.api()}/metrics`)).text();
      const line = text.split('\n').find((l) => l.startsWith(key));
      return line ? Number(line.slice(key.length).trim()) : 0;
    };
    const before = await total();
    const t0 = Date.now();
    const evs = await events(await post(sb, { cmd: 'bash', args: ['-c', 'echo up; sleep 3'] }));
    expect(evs[evs.length - 1]).toEqual({ event: 'exit', data: { exitCode: 0 } });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(3000);
    // Timed to its end, the answer alone would add 3 s.
    expect((await total()) - before).toBeLessThan(1.5);
  });

  it('ends with an error event when the sandbox goes while the command runs', async () => {
    const other = await newSandbox({}, { created });
    const res = await post(other, { cmd: 'bash', args: ['-c', 'echo up; exec sleep 600'] });
    const sse = new Sse(res);
    const first = await sse.read((e) => e.event === 'stdout');
    expect(first.map((e) => e.event)).toEqual(['session', 'stdout']);
    const rest = sse.read();
    expect((await api('DELETE', `/api/sandboxes/${other}`)).status).toBeLessThan(300);
    const evs = await rest;
    const last = evs[evs.length - 1]!;
    // The host reports the kill as the command's exit, or the stream ends without one.
    if (last.event === 'exit') expect(last.data.exitCode).toBe(137);
    else expect(last).toMatchObject({ event: 'error', data: { error: { type: 'bad_gateway' } } });
  });
});

describe("the host's execFrames: a session's output as an HTTP answer, asked for before its start", () => {
  const host = hostClient();
  const newId = () => `es-${randomBytes(8).toString('hex')}`;

  /** The answer's outcome: the frames' first bytes until it ended, or the error it was refused with. */
  function read(id: string, awaitStartMs?: number): Promise<{ err?: Error & { status?: number }; kinds: number[]; text: string }> {
    return new Promise((resolve) => {
      const kinds: number[] = [];
      let text = '';
      host.openExecFrames(
        sb,
        id,
        { awaitStartMs },
        {
          onOpen: () => undefined,
          onFrame: (p) => {
            kinds.push(p[0]!);
            if (p[0] === 1) text += p.subarray(1).toString();
          },
          onEnd: (err) => resolve({ err, kinds, text }),
        },
      );
    });
  }

  it('answers the output of a session started after it asked, to the exit, and counts its reader as a client', async () => {
    const id = newId();
    const outcome = read(id, 5000);
    await new Promise((r) => setTimeout(r, 200));
    await host.createExec(sb, { cmd: 'bash', args: ['-c', 'echo late; sleep 0.3'], sessionID: id });
    await eventually(async () => ((await host.getExec(sb, id)).attachedClients === 1 ? true : null));
    const { err, kinds, text } = await outcome;
    expect(err).toBeUndefined();
    expect(text).toBe('late\n');
    // Output (1) and the end of the scrollback (4) in either order, then the exit (3) last.
    expect(kinds).toContain(4);
    expect(kinds[kinds.length - 1]).toBe(3);
  });

  it('answers 404 once the wait is over without a start, and 400 for a wait on an id the control plane would never choose', async () => {
    const t0 = Date.now();
    const none = await read(newId(), 300);
    expect(none.err).toMatchObject({ status: 404, type: 'not_found' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    const bad = await read('es-notanid', 300);
    expect(bad.err).toMatchObject({ status: 400, type: 'invalid_request' });
  });

  it('refuses a caller without the host token', async () => {
    const res = await fetch(`${T.hostUrl()}/sandboxes/${sb}/exec/${newId()}/frames?awaitStartMs=100`);
    expect(res.status).toBe(401);
  });
});
