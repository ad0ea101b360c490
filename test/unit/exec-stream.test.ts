/**
 * The API's reading of a streamed exec (services/exec/exec-stream.ts), against a stand-in for the
 * host's answer: output kept before the piping starts, a reader that stops reading (the stream ends
 * after the stall, the host's answer is dropped), a host that refused the early request (an older
 * host: the WebSocket attach is used instead).
 */
import { EventEmitter } from 'node:events';
import { HostExecStream, pipeExecStream, type ExecStreamOut } from '../../services/exec/exec-stream';
import type { ExecLive } from '../../services/exec/exec-live';
import type { HostClient } from '../../sandbox';
import type { ExecFramesHandlers } from '../../sandbox/host-contract/exec-frames-reader';

/** Stands in for the host's `execFrames` answer being read (and, as a fallback, its WebSocket). */
class FakeSource extends EventEmitter {
  readonly OPEN = 1;
  readyState = 1;
  paused = false;
  closed = false;
  constructor(readonly h?: ExecFramesHandlers) {
    super();
  }
  pause(): void {
    this.paused = true;
  }
  resume(): void {
    this.paused = false;
  }
  close(): void {
    this.closed = true;
  }
  terminate(): void {
    this.closed = true;
  }
  open(): void {
    this.h?.onOpen();
  }
  send(payload: Buffer): void {
    if (this.h) this.h.onFrame(payload);
    else this.emit('message', payload, true);
  }
  frame(kind: number, data: string | Buffer): void {
    this.send(Buffer.concat([Buffer.from([kind]), typeof data === 'string' ? Buffer.from(data) : data]));
  }
  exit(code: number): void {
    const b = Buffer.alloc(5);
    b[0] = 3;
    b.writeInt32BE(code, 1);
    this.send(b);
  }
  end(err?: Error): void {
    if (this.h) this.h.onEnd(err);
    else this.emit('close');
  }
}

function setup() {
  const sockets: FakeSource[] = [];
  const urls: { awaitStartMs?: number }[] = [];
  const host = {
    openExecFrames: (_id: string, _sid: string, opts: { awaitStartMs?: number }, h: ExecFramesHandlers) => {
      const s = new FakeSource(h);
      sockets.push(s);
      urls.push(opts);
      return s;
    },
    openExecSocket: () => {
      const s = new FakeSource();
      sockets.push(s);
      urls.push({});
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
    expect(ws.closed).toBe(true);
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
      expect(ws.paused).toBe(true);
      ws.frame(1, 'b');
      // Drained in time: reading goes on.
      t.drainNow();
      await Promise.resolve();
      expect(ws.paused).toBe(false);
      t.block();
      ws.frame(1, 'c');
      jest.advanceTimersByTime(1001);
      await done;
      expect(t.ends).toHaveLength(1);
      expect(t.ends[0]).toMatchObject({ error: { type: 'rate_limited' } });
      expect(ws.closed).toBe(true);
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
    expect(ws.closed).toBe(true);
  });

  it('attaches by WebSocket when the host refused the early request, and reports a stream lost after that', async () => {
    const t = setup();
    const stream = new HostExecStream(t.host, 'sb-1', 'es-0123456789abcdef');
    t.sockets[0]!.end(Object.assign(new Error('no such route'), { status: 404 }));
    const done = pipeExecStream(t.live, stream, t.out, 30_000);
    expect(t.sockets).toHaveLength(2);
    expect(t.urls[1]).toEqual({});
    const again = t.sockets[1]!;
    again.frame(1, 'x');
    again.end();
    await done;
    expect(t.written).toEqual([['stdout', 'x']]);
    expect(t.ends).toEqual([{ error: expect.objectContaining({ type: 'bad_gateway' }) }]);
  });
});
