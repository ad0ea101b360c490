/**
 * Terminals: a real pseudo-terminal of the sandbox through the API's WebSocket and the published
 * client's `sandbox.pty`, with resize, reattach, and the usual 401/404s.
 */
import { WebSocket } from 'ws';
import { api, eventually, T } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { newSandbox } from '../../helpers/sandboxes';
import { runSdk } from '../../helpers/sdk';

let sb: string;
const open: WebSocket[] = [];
beforeAll(async () => {
  sb = await newSandbox({});
});
afterAll(async () => {
  for (const ws of open) ws.terminate();
  await api('DELETE', `/api/sandboxes/${sb}`);
});

/** A raw client of a terminal: what it received so far as text, and how it closed. */
function attach(sessionID: string, key: string | null = T.key()): { ws: WebSocket; text: () => string; closed: Promise<{ code: number; firstText: string }> } {
  const url = `${T.api().replace(/^http/, 'ws')}/api/sandboxes/${sb}/pty/${sessionID}${key ? `?api_key=${encodeURIComponent(key)}` : ''}`;
  const ws = new WebSocket(url);
  open.push(ws);
  const chunks: Buffer[] = [];
  let firstText = '';
  ws.on('message', (d: Buffer, isBinary: boolean) => {
    if (!isBinary && !firstText) firstText = d.toString();
    chunks.push(Buffer.from(d));
  });
  const closed = new Promise<{ code: number; firstText: string }>((resolve) => ws.on('close', (code) => resolve({ code, firstText })));
  return { ws, text: () => Buffer.concat(chunks).toString('utf8'), closed };
}

async function createPty(body: Record<string, unknown> = {}): Promise<string> {
  const r = await api('POST', `/api/sandboxes/${sb}/pty`, { body });
  expect(r.status).toBe(201);
  expect(r.body).toMatchObject({ sandboxID: sb, running: true });
  return r.body.sessionID as string;
}

describe('terminals', () => {
  it('is a real terminal of the sandbox: tty, size, resize with SIGWINCH, exit closes the socket', async () => {
    const id = await createPty({ cols: 100, rows: 30 });
    const a = attach(id);
    await new Promise((r) => a.ws.once('open', r));
    a.ws.send('trap \'echo GOT-WINCH\' WINCH; tty; stty size; echo "TERM=$TERM"\n');
    await eventually(async () => /30 100/.test(a.text()) && /TERM=xterm-256color/.test(a.text()));
    expect(a.text()).toMatch(/\/dev\/pts\/\d+/);
    a.ws.send(JSON.stringify({ type: 'resize', cols: 132, rows: 43 }));
    await eventually(async () => a.text().includes('GOT-WINCH'));
    a.ws.send('stty size\n');
    await eventually(async () => a.text().includes('43 132'));
    // A JSON-looking keystroke that is not a resize is typed as it is.
    a.ws.send('echo {"type":"other"}\n');
    await eventually(async () => a.text().includes('{type:other}'));
    a.ws.send('exit\n');
    expect((await a.closed).code).toBe(1000);
  });

  it('keeps running when the client leaves, and a new client gets the recent output', async () => {
    const id = await createPty();
    const a = attach(id);
    await new Promise((r) => a.ws.once('open', r));
    a.ws.send('echo first-$((6*7))\n');
    await eventually(async () => a.text().includes('first-42'));
    a.ws.close();
    await a.closed;
    const b = attach(id);
    await new Promise((r) => b.ws.once('open', r));
    await eventually(async () => b.text().includes('first-42'));
    b.ws.send('echo second-$((7*7))\n');
    await eventually(async () => b.text().includes('second-49'));
    b.ws.send('exit\n');
    expect((await b.closed).code).toBe(1000);
  });

  it('refuses without a key, for another organisation, and for unknown terminals', async () => {
    const id = await createPty();
    const none = attach(id, null);
    expect(await none.closed).toMatchObject({ code: 1008 });
    const other = await otherOrgKey();
    const theirs = attach(id, other);
    const c = await theirs.closed;
    expect(c.code).toBe(1008);
    expect(JSON.parse(c.firstText).error.type).toBe('not_found');
    const ghost = attach('pty-0000000000000000');
    expect(await ghost.closed).toMatchObject({ code: 1008 });
    expect((await api('POST', `/api/sandboxes/${sb}/pty`, { body: {}, key: other })).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/pty`, { body: { cols: 0 } })).status).toBe(400);
    const mine = attach(id);
    await new Promise((r) => mine.ws.once('open', r));
    mine.ws.send('exit\n');
    await mine.closed;
  });

  it('works through the client: sandbox.pty.create with onOutput, send and close', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      let text = '';
      const dec = new TextDecoder();
      const term = await sb.pty.create({ cols: 90, rows: 20, onOutput: (d) => { text += dec.decode(d); } });
      // The shell is reading once it has printed its prompt.
      for (const t0 = Date.now(); !text && Date.now() - t0 < 10000; ) await new Promise((r) => setTimeout(r, 20));
      term.send('stty size; echo sdk-$((2+3))\\n');
      const t0 = Date.now();
      while (!text.includes('sdk-5') && Date.now() - t0 < 10000) await new Promise((r) => setTimeout(r, 50));
      term.send('exit\\n');
      term.close();
      out({ id: term.sessionId, size: text.includes('20 90'), done: text.includes('sdk-5') });
    `,
      { SB: sb },
    );
    expect(r).toEqual({ id: expect.stringMatching(/^pty-/), size: true, done: true });
  });
});
