/**
 * The exec streams' zero-copy WebSocket framing, checked against the ws library on real sockets:
 * frames we write are what ws reads, frames ws writes are what we read (split anywhere), and the
 * relay client (ExecStream) handshakes, pings, sends stdin and closes the way a ws server expects.
 */
import { createHash } from 'node:crypto';
import * as http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import * as wsLib from 'ws';
import { WebSocket, WebSocketServer } from 'ws';
import { ExecStream } from '../../sandbox/host-contract/exec-stream';
import { FrameError, FrameReader, maskedFrame, OP_BINARY, OP_CLOSE, OP_PING, writeBinaryFrame, type ReadFrame } from '../../sandbox/host-contract/frames';

/** A ws server on a free port; `onConnection` gets each client with the socket it was upgraded on. */
async function server(onConnection: (ws: WebSocket, socket: Socket) => void): Promise<{ url: string; close(): Promise<void> }> {
  const srv = http.createServer();
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
  srv.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => onConnection(ws, socket as Socket)));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  return {
    url: `ws://127.0.0.1:${port}/x`,
    close: () =>
      new Promise<void>((r) => {
        for (const c of wss.clients) c.terminate();
        srv.close(() => r());
      }),
  };
}

/** Frames as ws's sender writes them (server side: unmasked). */
function wsFrames(payloads: Buffer[]): Buffer {
  const { Sender } = wsLib as unknown as { Sender: { frame(data: Buffer, o: object): Buffer[] } };
  return Buffer.concat(payloads.flatMap((p) => Sender.frame(p, { fin: true, opcode: 2, mask: false, readOnly: true, rsv1: false })));
}

/** n bytes as two chunks: 'a's then 'b's. */
const halves = (n: number) => [Buffer.alloc(n >> 1, 'a'), Buffer.alloc(n - (n >> 1), 'b')];

describe('writeBinaryFrame', () => {
  it('writes frames that ws reads as one message each: stream byte, then the chunks, for every length encoding', async () => {
    const sizes = [0, 1, 124, 125, 126, 65534, 65535, 65536, 200_000];
    const got: Buffer[] = [];
    const srv = await server((ws, socket) => {
      for (const n of sizes) writeBinaryFrame(socket, 0x01, n === 0 ? [] : halves(n));
      writeBinaryFrame(socket, 0x03, [Buffer.from([0, 0, 0, 7])], () => ws.close(1000, 'done'));
    });
    const client = new WebSocket(srv.url, { perMessageDeflate: false });
    client.on('message', (d: Buffer) => got.push(d));
    const closed = await new Promise<number>((r) => client.on('close', (code) => r(code)));
    await srv.close();
    expect(closed).toBe(1000);
    expect(got.map((g) => g.length)).toEqual([...sizes.map((n) => n + 1), 5]);
    for (const [i, n] of sizes.map((s, j) => [j, s] as const)) {
      expect(got[i]![0]).toBe(0x01);
      expect(got[i]!.subarray(1).equals(Buffer.concat(halves(n)))).toBe(true);
    }
    expect(got[sizes.length]!.readInt32BE(1)).toBe(7);
  });
});

describe('FrameReader', () => {
  const payloads = [Buffer.from([0x04]), Buffer.alloc(70_000, 7), Buffer.from([0x03, 0, 0, 0, 2]), Buffer.alloc(300, 9), Buffer.alloc(65_536, 1)];
  const wire = wsFrames(payloads);

  it('reads frames split at any byte, as views whose bytes are the frame as sent', () => {
    for (const cut of [1, 2, 3, 5, 9, 10, 11, 127, 4096, 65_536, wire.length]) {
      const frames: ReadFrame[] = [];
      const r = new FrameReader((f) => frames.push(f));
      for (let i = 0; i < wire.length; i += cut) r.push(wire.subarray(i, i + cut));
      expect(r.pending).toBe(0);
      expect(frames.map((f) => [f.opcode, f.fin, f.length, f.first])).toEqual(payloads.map((p) => [OP_BINARY, true, p.length, p[0]]));
      expect(Buffer.concat(frames.flatMap((f) => f.raw)).equals(wire)).toBe(true);
      expect(frames[2]!.payload!.equals(payloads[2]!)).toBe(true);
      expect(frames[1]!.payload).toBeNull();
    }
  });

  it('does not copy large payloads: the frame is made of views of the pushed chunks', () => {
    const frames: ReadFrame[] = [];
    const r = new FrameReader((f) => frames.push(f));
    const chunk = wsFrames([Buffer.alloc(1000, 5)]);
    r.push(chunk);
    expect(frames[0]!.raw[0]!.buffer).toBe(chunk.buffer);
  });

  it('refuses masked frames, reserved bits, bad control frames and oversized frames', () => {
    const bad = [
      maskedFrame(OP_BINARY, Buffer.from('x')),
      Buffer.from([0xc2, 0x00]),
      Buffer.from([0x09, 0x00]),
      Buffer.from([0x89, 126, 0, 200]),
      Buffer.from([0x82, 127, 0, 0, 0, 1, 0, 0, 0, 0]),
    ];
    for (const b of bad) expect(() => new FrameReader(() => undefined).push(b)).toThrow(FrameError);
  });
});

describe('ExecStream', () => {
  it('handshakes with a ws server, reads its frames, answers pings, sends masked stdin and closes cleanly', async () => {
    const stdin: Buffer[] = [];
    // The pong listener is attached in the connection handler, before the ping goes out: attached any
    // later (the test once polled for the server side every 5 ms), a quick pong could come first and be
    // missed, and the test waited for it until its timeout.
    let gotPong!: (b: Buffer) => void;
    const pong = new Promise<Buffer>((r) => (gotPong = r));
    const srv = await server((ws) => {
      ws.once('pong', gotPong);
      ws.on('message', (d: Buffer) => {
        stdin.push(d);
        ws.send(Buffer.concat([Buffer.from([0x01]), d.subarray(1)]));
      });
      ws.ping(Buffer.from('are you there'));
    });
    try {
      const frames: ReadFrame[] = [];
      let closedWith: [number, string] | undefined;
      const done = new Promise<void>((resolve, reject) => {
        const s: ExecStream = new ExecStream(srv.url, 'token', {
          onOpen: () => s.send(Buffer.concat([Buffer.from([0x00]), Buffer.alloc(100_000, 'z')])),
          onFrame: (f) => {
            frames.push(f);
            s.close(1000, 'client left');
          },
          onClose: (code, reason) => {
            closedWith = [code, reason];
            resolve();
          },
          onError: reject,
        });
      });
      await done;
      expect((await pong).toString()).toBe('are you there');
      expect(stdin).toHaveLength(1);
      expect(stdin[0]!.equals(Buffer.concat([Buffer.from([0x00]), Buffer.alloc(100_000, 'z')]))).toBe(true);
      expect(frames).toHaveLength(1);
      expect(
        Buffer.concat(frames[0]!.raw)
          .subarray(-100_001)
          .equals(Buffer.concat([Buffer.from([0x01]), Buffer.alloc(100_000, 'z')])),
      ).toBe(true);
      expect(closedWith).toEqual([1000, 'client left']);
    } finally {
      await srv.close();
    }
  });

  it('reports the HTTP status of a refused handshake, then closes', async () => {
    const srv = http.createServer((_req, res) => res.writeHead(404).end('no'));
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const { port } = srv.address() as AddressInfo;
    const events: unknown[] = [];
    await new Promise<void>((resolve) => {
      new ExecStream(`ws://127.0.0.1:${port}/x`, 't', {
        onOpen: () => events.push('open'),
        onFrame: () => events.push('frame'),
        onError: (err) => events.push(err.status),
        onClose: (code) => {
          events.push(code);
          resolve();
        },
      });
    });
    await new Promise<void>((r) => srv.close(() => r()));
    expect(events).toEqual([404, 1006]);
  });

  it('passes the host close code and reason on, and fails on a wrong accept key', async () => {
    const srv = await server((ws) => ws.close(4001, 'bye'));
    const closed = await new Promise<[number, string]>((resolve, reject) => {
      new ExecStream(srv.url, 't', { onOpen: () => undefined, onFrame: () => undefined, onError: reject, onClose: (c, r) => resolve([c, r]) });
    });
    await srv.close();
    expect(closed).toEqual([4001, 'bye']);

    const liar = http.createServer();
    const sockets: Socket[] = [];
    liar.on('upgrade', (_req, socket: Socket) => {
      sockets.push(socket);
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n');
      socket.write(`Sec-WebSocket-Accept: ${createHash('sha1').update('wrong').digest('base64')}\r\n\r\n`);
    });
    await new Promise<void>((r) => liar.listen(0, '127.0.0.1', r));
    const { port } = liar.address() as AddressInfo;
    const err = await new Promise<Error>((resolve) => {
      new ExecStream(`ws://127.0.0.1:${port}/x`, 't', { onOpen: () => undefined, onFrame: () => undefined, onError: resolve, onClose: () => undefined });
    });
    for (const sock of sockets) sock.destroy();
    await new Promise<void>((r) => liar.close(() => r()));
    expect(err.message).toMatch(/handshake/);
  });

  it('builds valid masked control frames', () => {
    for (const [op, p] of [
      [OP_PING, Buffer.from('hi')],
      [OP_CLOSE, Buffer.from([3, 232])],
    ] as const) {
      const f = maskedFrame(op, p);
      expect(f[0]).toBe(0x80 | op);
      expect(f[1]).toBe(0x80 | p.length);
      const key = f.subarray(2, 6);
      expect(Buffer.from(f.subarray(6).map((b, i) => b ^ key[i & 3]!)).equals(p)).toBe(true);
    }
  });
});
