/**
 * The API's reading of a streamed exec (services/exec/exec-stream.ts), against a stand-in for the
 * host's socket: output kept before the piping starts, a reader that stops reading (the stream ends
 * after the stall, the host's socket is closed), a host that refused the early attach.
 */
import { EventEmitter } from 'node:events';
import { HostExecStream, pipeExecStream, type ExecStreamOut } from '../../services/exec/exec-stream';
import type { ExecLive } from '../../services/exec/exec-live';
import type { HostClient } from '../../sandbox';

/** Stands in for the `ws` WebSocket to the host. */
class FakeSocket extends EventEmitter {
  readonly OPEN = 1;
  readyState = 0;
  isPaused = false;
  closedWith: number | null = null;
  terminated = false;
  pause(): void {
    this.isPaused = true;
  }
  resume(): void {
    this.isPaused = false;
  }
  close(code: number): void {
    this.closedWith = code;
    this.readyState = 3;
  }
  terminate(): void {
    this.terminated = true;
    this.readyState = 3;
  }
  open(): void {
    this.readyState = 1;
    this.emit('open');
  }
  frame(kind: number, data: string | Buffer): void {
    const payload = typeof data === 'string' ? Buffer.from(data) : data;
    this.emit('message', Buffer.concat([Buffer.from([kind]), payload]), true);
  }
  exit(code: number): void {
    const b = Buffer.alloc(5);
    b[0] = 3;
    b.writeInt32BE(code, 1);
    this.emit('message', b, true);
  }
}

function setup() {
  const sockets: FakeSocket[] = [];
  const urls: { awaitStartMs?: number }[] = [];
  const host = {
    openExecSocket: (_id: string, _sid: string, opts: { awaitStartMs?: number } = {}) => {
      const s = new FakeSocket();
      sockets.push(s);
      urls.push(opts);
      return s;
    },
    getExec: async () => ({ sessionID: 'es-0', running: false, exitCode: 0, exitedAt: new Date().toISOString(), oomKilled: false }),
  } as unknown as HostClient;
  const recorded: unknown[][] = [];
  const live = { touch: () => undefined, recordExit: async (...a: unknown[]) => void recorded.push(a) } as unknown as ExecLive;
  const written: [string, string][] = [];
  const ends: unknown[] = [];
  let writable = true;
  let drain: (() => void) | null = null;
  const abort = new AbortController();
  const out: ExecStreamOut = {
    output: (k, t) => {
      written.push([k, t]);
      return writable;
    },
    drained: () => new Promise<void>((r) => (drain = r)),
    end: (last) => void ends.push(last),
    signal: abort.signal,
  };
  return {
    sockets,
    urls,
    host,
    live,
    out,
    written,
    ends,
    recorded,
    abort,
    block: () => (writable = false),
    drainNow: () => {
      writable = true;
      drain?.();
    },
  };
}

describe('a streamed exec read by the API', () => {
  it('keeps what comes before the piping, then passes output in order and ends with the exit', async () => {
    const t = setup();
    const stream = new HostExecStream(t.host, 'sb-1', 'es-0123456789abcdef');
    expect(t.urls[0]).toEqual({ awaitStartMs: 5000 });
    const ws = t.sockets[0]!;
    ws.open();
    ws.frame(1, 'early ');
    ws.frame(4, '');
    const done = pipeExecStream(t.live, stream, t.out, 30_000);
    ws.frame(2, 'warn\n');
    ws.frame(1, Buffer.from([0xc3]));
    ws.frame(1, Buffer.from([0xa9, 0x0a]));
    ws.exit(7);
    await done;
    expect(t.written).toEqual([
      ['stdout', 'early '],
      ['stderr', 'warn\n'],
      ['stdout', 'é\n'],
    ]);
    expect(t.ends).toEqual([{ exit: { exitCode: 7 } }]);
    expect(t.recorded[0]!.slice(0, 3)).toEqual(['exec', 'es-0123456789abcdef', 7]);
    expect(ws.closedWith).toBe(1000);
  });

  it('pauses the host while the reader is behind, and ends the stream once it has stalled too long', async () => {
    jest.useFakeTimers();
    try {
      const t = setup();
      const stream = new HostExecStream(t.host, 'sb-1', 'es-0123456789abcdef');
      const ws = t.sockets[0]!;
      ws.open();
      const done = pipeExecStream(t.live, stream, t.out, 1000);
      t.block();
      ws.frame(1, 'a');
      expect(ws.isPaused).toBe(true);
      ws.frame(1, 'b');
      // Drained in time: reading goes on.
      t.drainNow();
      await Promise.resolve();
      expect(ws.isPaused).toBe(false);
      t.block();
      ws.frame(1, 'c');
      jest.advanceTimersByTime(1001);
      await done;
      expect(t.ends).toHaveLength(1);
      expect(t.ends[0]).toMatchObject({ error: { type: 'rate_limited' } });
      expect(ws.closedWith).toBe(1000);
    } finally {
      jest.useRealTimers();
    }
  });

  it('closes the host socket when the reader leaves, and writes nothing more', async () => {
    const t = setup();
    const stream = new HostExecStream(t.host, 'sb-1', 'es-0123456789abcdef');
    const ws = t.sockets[0]!;
    ws.open();
    const done = pipeExecStream(t.live, stream, t.out, 30_000);
    t.abort.abort();
    await done;
    ws.frame(1, 'late');
    expect(t.written).toEqual([]);
    expect(t.ends).toEqual([]);
    expect(ws.closedWith).toBe(1000);
  });

  it('attaches again when the host refused the early attach, and reports a stream lost after it opened', async () => {
    const t = setup();
    const stream = new HostExecStream(t.host, 'sb-1', 'es-0123456789abcdef');
    t.sockets[0]!.emit('close');
    const done = pipeExecStream(t.live, stream, t.out, 30_000);
    expect(t.sockets).toHaveLength(2);
    expect(t.urls[1]).toEqual({});
    const again = t.sockets[1]!;
    again.open();
    again.frame(1, 'x');
    again.emit('close');
    await done;
    expect(t.written).toEqual([['stdout', 'x']]);
    expect(t.ends).toEqual([{ error: expect.objectContaining({ type: 'bad_gateway' }) }]);
  });
});
