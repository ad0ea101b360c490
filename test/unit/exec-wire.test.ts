/**
 * The exec channel's wire (sandbox/host-contract/exec-wire) and the host's end of it
 * (sandbox/namespaces/exec-channel) against a fake exec server that misbehaves as a sandbox could
 * make it: garbage, oversized frames, unknown types, frames for commands the host never started,
 * output past its window. Each closes that channel alone; what the host holds stays bounded.
 */
import { promises as fsp } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import pino from 'pino';
import {
  EXEC_CHUNK,
  EXEC_OUT_MAX,
  EXEC_WINDOW,
  EXEC_WIRE_VERSION,
  ExecFrameReader,
  ExecWireError,
  T_EOF,
  T_EXIT,
  T_HELLO,
  T_START,
  T_STARTED,
  T_STDOUT,
  T_CREDIT,
  encodeStart,
  type ServerFrame,
} from '../../sandbox/host-contract/exec-wire';
import { ExecChannel } from '../../sandbox/namespaces/exec-channel';

function frame(type: number, id: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const b = Buffer.alloc(9 + payload.length);
  b.writeUInt32BE(5 + payload.length, 0);
  b.writeUInt8(type, 4);
  b.writeUInt32BE(id, 5);
  payload.copy(b, 9);
  return b;
}
const u32s = (...v: number[]) => {
  const b = Buffer.alloc(4 * v.length);
  v.forEach((x, i) => b.writeInt32BE(x | 0, 4 * i));
  return b;
};
const hello = () => frame(T_HELLO, 0, u32s(EXEC_WIRE_VERSION, 64));

describe('exec wire: the frame reader', () => {
  const parse = (...chunks: Buffer[]) => {
    const r = new ExecFrameReader();
    const out: ServerFrame[] = [];
    for (const c of chunks) r.push(c, (f) => out.push(f));
    return out;
  };

  it('reads frames split anywhere and joined in any way', () => {
    const all = Buffer.concat([hello(), frame(T_STARTED, 1, u32s(7)), frame(T_STDOUT, 1, Buffer.from('hi')), frame(T_EXIT, 1, u32s(3, 0))]);
    const whole = parse(all);
    const bytewise = parse(...[...all].map((b) => Buffer.from([b])));
    expect(bytewise).toEqual(whole);
    expect(whole.map((f) => f.type)).toEqual([T_HELLO, T_STARTED, T_STDOUT, T_EXIT]);
    expect(whole[3]).toEqual({ type: T_EXIT, id: 1, code: 3, signal: null });
  });

  it.each([
    ['a length past the bound', Buffer.from([0x7f, 0xff, 0xff, 0xff])],
    [
      'a length just past the bound',
      (() => {
        const b = Buffer.alloc(4);
        b.writeUInt32BE(EXEC_OUT_MAX + 1, 0);
        return b;
      })(),
    ],
    ['a length too short for a header', Buffer.from([0, 0, 0, 2, 1, 2])],
    ['an unknown type', frame(0x42, 1)],
    ['a host-bound type', frame(T_START, 1)],
    ['output over a chunk', frame(T_STDOUT, 1, Buffer.alloc(EXEC_CHUNK + 1))],
    ['empty output', frame(T_STDOUT, 1)],
    ['output for command 0', frame(T_STDOUT, 0, Buffer.from('x'))],
    ['a short exit', frame(T_EXIT, 1, u32s(0))],
    ['an exit code out of range', frame(T_EXIT, 1, u32s(300, 0))],
    ['an end of stream 3', frame(T_EOF, 1, Buffer.from([3]))],
    ['a hello for a command', frame(T_HELLO, 5, u32s(1, 64))],
  ])('refuses %s', (_what, bytes) => {
    expect(() => parse(bytes)).toThrow(ExecWireError);
  });

  it('holds at most one frame of what it has not parsed', () => {
    const r = new ExecFrameReader();
    const big = frame(T_STDOUT, 1, Buffer.alloc(EXEC_CHUNK, 1));
    // 100 frames' worth minus a byte: all but the last are handed out, only the tail is kept.
    const many = Buffer.concat(Array.from({ length: 100 }, () => big));
    let n = 0;
    r.push(many.subarray(0, many.length - 1), () => n++);
    expect(n).toBe(99);
    expect((r as unknown as { pending: Buffer }).pending.length).toBe(big.length - 1);
  });

  it('encodes a start with its strings, and refuses NUL bytes and what does not fit a frame', () => {
    const f = encodeStart(9, { uid: 1000, cwd: '/w', argv: ['/bin/echo', 'a'], env: ['A=1'] })!;
    expect(f.readUInt32BE(0)).toBe(f.length - 4);
    expect(f[4]).toBe(T_START);
    expect(f.readUInt32BE(5)).toBe(9);
    expect(f.subarray(9 + 16).toString()).toBe('/w\0/bin/echo\0a\0A=1\0');
    expect(encodeStart(1, { uid: 0, cwd: '/', argv: ['a\0b'], env: [] })).toBeNull();
    expect(encodeStart(1, { uid: 0, cwd: '/', argv: ['x'], env: ['A=' + 'x'.repeat(1024 * 1024)] })).toBeNull();
  });
});

describe('exec channel against a misbehaving exec server', () => {
  let dir: string;
  let server: net.Server;
  const accepted: net.Socket[] = [];
  const log = pino({ level: 'silent' });
  const channels: ExecChannel[] = [];

  beforeAll(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-exec-wire-'));
    server = net.createServer((s) => accepted.push(s));
    await new Promise<void>((r) => server.listen(path.join(dir, 's'), r));
  });
  afterEach(() => {
    for (const c of channels.splice(0)) c.close();
    for (const s of accepted.splice(0)) s.destroy();
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
    await fsp.rm(dir, { recursive: true, force: true });
  });

  /** A channel on the host's side and the fake server's socket. */
  async function pair(): Promise<{ ch: ExecChannel; srv: net.Socket; fromHost: Buffer[] }> {
    const before = accepted.length;
    const sock = net.connect(path.join(dir, 's'));
    await new Promise((r) => sock.once('connect', r));
    while (accepted.length === before) await new Promise((r) => setImmediate(r));
    const srv = accepted[accepted.length - 1]!;
    const fromHost: Buffer[] = [];
    srv.on('data', (d: Buffer) => fromHost.push(d));
    srv.on('error', () => undefined);
    const ch = new ExecChannel(sock, `sb-${channels.length}`, log);
    channels.push(ch);
    srv.write(hello());
    expect(await ch.ready).toBe(true);
    return { ch, srv, fromHost };
  }
  const closed = (ch: ExecChannel) => ch.gone;

  it('runs a command: start, output with credits, exit', async () => {
    const { ch, srv, fromHost } = await pair();
    const started = ch.start({ uid: 0, cwd: '/', argv: ['/bin/true'], env: [] });
    while (!fromHost.length) await new Promise((r) => setImmediate(r));
    expect(Buffer.concat(fromHost)[4]).toBe(T_START);
    srv.write(
      Buffer.concat([
        frame(T_STARTED, 1, u32s(42)),
        frame(T_STDOUT, 1, Buffer.from('out')),
        frame(T_EOF, 1, Buffer.from([1])),
        frame(T_EOF, 1, Buffer.from([2])),
        frame(T_EXIT, 1, u32s(0, 0)),
      ]),
    );
    const proc = (await started)!;
    const out: Buffer[] = [];
    proc.stdout.on('data', (d: Buffer) => out.push(d));
    proc.stderr.resume();
    const [code] = await new Promise<[number | null]>((r) => proc.on('close', (c: number | null) => r([c])));
    expect(code).toBe(0);
    expect(Buffer.concat(out).toString()).toBe('out');
    expect(proc.sandboxPid).toBe(42);
    expect(ch.running).toBe(0);
    // the output was acknowledged: CREDIT for stdout, 3 bytes
    const credit = frame(T_CREDIT, 1, Buffer.from([1, 0, 0, 0, 3]));
    while (!Buffer.concat(fromHost).includes(credit)) await new Promise((r) => srv.once('data', r));
  });

  it.each([
    ['garbage', () => Buffer.from('GET / HTTP/1.1\r\n\r\n')],
    ['an oversized frame', () => Buffer.from([0x7f, 0, 0, 0])],
    ['a frame of an unknown type', () => frame(0x99, 1)],
    ['a frame for a command it was never asked to run', () => frame(T_STARTED, 77, u32s(5))],
    ['a second hello', () => hello()],
  ])('closes the channel on %s; another channel goes on', async (_what, bad) => {
    const a = await pair();
    const b = await pair();
    const running = a.ch.start({ uid: 0, cwd: '/', argv: ['/bin/sleep'], env: [] });
    a.srv.write(bad());
    await expect(running).rejects.toThrow(/exec server/);
    await closed(a.ch);
    expect(a.ch.usable).toBe(false);
    expect(b.ch.usable).toBe(true);
    const other = b.ch.start({ uid: 0, cwd: '/', argv: ['/bin/true'], env: [] });
    b.srv.write(frame(T_STARTED, 1, u32s(3)));
    expect((await other)!.sandboxPid).toBe(3);
  });

  it('closes the channel when output runs past its window, and holds no more than the window meanwhile', async () => {
    const { ch, srv } = await pair();
    const started = ch.start({ uid: 0, cwd: '/', argv: ['/bin/yes'], env: [] });
    srv.write(frame(T_STARTED, 1, u32s(9)));
    const proc = (await started)!;
    // Nobody reads the command's output: past what the stream buffers, the server may send
    // EXEC_WINDOW bytes unacknowledged, not one more. This one ignores the credits.
    const chunk = frame(T_STDOUT, 1, Buffer.alloc(EXEC_CHUNK, 0x79));
    const lost = new Promise((r) => proc.once('exit', (code, signal) => r([code, signal])));
    for (let k = 0; k < (EXEC_WINDOW + 64 * 1024) / EXEC_CHUNK + 2; k++) srv.write(chunk);
    await closed(ch);
    expect(ch.closedReason).toMatch(/past the window/);
    expect(proc.stdout.readableLength).toBeLessThanOrEqual(EXEC_WINDOW + 64 * 1024);
    expect(await lost).toEqual([null, 'SIGHUP']);
  });

  it('a flood within the window never grows what the host holds', async () => {
    const { ch, srv, fromHost } = await pair();
    const started = ch.start({ uid: 0, cwd: '/', argv: ['/bin/yes'], env: [] });
    srv.write(frame(T_STARTED, 1, u32s(9)));
    const proc = (await started)!;
    // A server that honours the credits: sends a window, then only what the host has acknowledged.
    let credited = 0;
    let inflight = 0;
    let total = 0;
    const chunk = frame(T_STDOUT, 1, Buffer.alloc(EXEC_CHUNK, 0x79));
    const pump = () => {
      while (inflight + EXEC_CHUNK <= EXEC_WINDOW && total < 64 * 1024 * 1024) {
        srv.write(chunk);
        inflight += EXEC_CHUNK;
        total += EXEC_CHUNK;
      }
    };
    srv.removeAllListeners('data');
    const reader = new ExecFrameReaderForHost((n) => {
      credited += n;
      inflight -= n;
      pump();
    });
    srv.on('data', (d: Buffer) => reader.push(d));
    fromHost.length = 0;
    pump();
    // A slow consumer: reads a little at a time; the host holds at most its window plus the stream's buffer.
    let maxHeld = 0;
    let got = 0;
    await new Promise<void>((resolve) => {
      proc.stdout.on('data', (d: Buffer) => {
        got += d.length;
        maxHeld = Math.max(maxHeld, proc.stdout.readableLength);
        if (got >= 64 * 1024 * 1024) resolve();
      });
    });
    expect(ch.usable).toBe(true);
    expect(credited).toBeGreaterThan(60 * 1024 * 1024);
    expect(maxHeld).toBeLessThanOrEqual(EXEC_WINDOW + 64 * 1024);
  });
});

/** Reads CREDIT frames the host sends (the fake server's side). */
class ExecFrameReaderForHost {
  private pending = Buffer.alloc(0);
  constructor(private readonly onCredit: (n: number) => void) {}
  push(d: Buffer): void {
    let buf = Buffer.concat([this.pending, d]);
    while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
      const len = buf.readUInt32BE(0);
      if (buf[4] === T_CREDIT) this.onCredit(buf.readUInt32BE(10));
      buf = buf.subarray(4 + len);
    }
    this.pending = Buffer.from(buf);
  }
}
