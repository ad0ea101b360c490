/**
 * A client of the host's exec WebSocket (`/sandboxes/:id/exec/:sid/ws`) for relays: the output frames
 * arrive as views of what the socket read (FrameReader), so a relay forwards them without decoding,
 * re-encoding or copying. `HostClient.openExecSocket` (a `ws` WebSocket) remains for everything else.
 */
import { createHash, randomBytes } from 'node:crypto';
import * as http from 'node:http';
import type { Socket } from 'node:net';
import { closePayload, FrameError, FrameReader, maskedFrame, OP_BINARY, OP_CLOSE, OP_CONTINUATION, OP_PING, OP_PONG, OP_TEXT, type ReadFrame } from './frames';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
/** How long a close handshake may take before the connection is dropped. */
const CLOSE_TIMEOUT_MS = 5000;

export interface ExecStreamHandlers {
  /** The handshake succeeded. */
  onOpen(): void;
  /** A binary frame (or a continuation of one), as received: forward `f.raw` or read `f.first`. */
  onFrame(f: ReadFrame): void;
  /** The stream ended: the host's close code and reason, or 1006 when the connection dropped without one. Called once. */
  onClose(code: number, reason: string): void;
  /** The handshake failed (`status` is the host's HTTP answer, if any) or the stream broke. onClose follows once the socket is gone. */
  onError(err: Error & { status?: number }): void;
}

/** The exec WebSocket to a host, read frame by frame. */
export class ExecStream {
  private socket: Socket | undefined;
  private readonly req: http.ClientRequest;
  private readonly reader: FrameReader;
  private closeSent = false;
  private closed = false;
  private inText = false;
  private paused = false;

  constructor(
    url: string,
    token: string,
    private readonly h: ExecStreamHandlers,
  ) {
    const key = randomBytes(16).toString('base64');
    const u = new URL(url.replace(/^ws/, 'http'));
    this.reader = new FrameReader((f) => this.frame(f));
    this.req = http.request({
      hostname: u.hostname.replace(/^\[|\]$/g, ''),
      port: u.port,
      path: u.pathname + u.search,
      headers: {
        connection: 'Upgrade',
        upgrade: 'websocket',
        'sec-websocket-version': '13',
        'sec-websocket-key': key,
        authorization: `Bearer ${token}`,
      },
    });
    this.req.on('upgrade', (res: http.IncomingMessage, socket: Socket, head: Buffer) => {
      const expected = createHash('sha1')
        .update(key + GUID)
        .digest('base64');
      if (res.headers['sec-websocket-accept'] !== expected || res.headers['sec-websocket-extensions']) {
        socket.destroy();
        this.fail(new Error('the host answered the WebSocket handshake wrongly'));
        return;
      }
      this.socket = socket;
      socket.setNoDelay(true);
      socket.setTimeout(0);
      socket.on('data', (d: Buffer) => this.read(d));
      socket.on('error', (err) => this.fail(err));
      socket.on('close', () => this.finish(1006, ''));
      if (this.paused) socket.pause();
      this.h.onOpen();
      if (head.length) this.read(head);
    });
    this.req.on('response', (res: http.IncomingMessage) => {
      res.resume();
      const err = Object.assign(new Error(`Unexpected server response: ${res.statusCode}`), { status: res.statusCode });
      this.fail(err);
    });
    this.req.on('error', (err) => this.fail(err));
    this.req.end();
  }

  get open(): boolean {
    return this.socket !== undefined && !this.closeSent && !this.closed;
  }

  /** Bytes queued toward the host. */
  get bufferedAmount(): number {
    return this.socket?.writableLength ?? 0;
  }

  /** Sends one binary frame (stdin); returns false when the socket's buffer is above its mark. */
  send(payload: Buffer, cb?: () => void): boolean {
    if (!this.open) return false;
    return this.socket!.write(maskedFrame(OP_BINARY, payload), cb);
  }

  /** Runs `fn` once the bytes queued toward the host are written. */
  onDrain(fn: () => void): void {
    this.socket?.once('drain', fn);
  }

  /** Stops reading from the host (backpressure); `resume` reads again. */
  pause(): void {
    this.paused = true;
    this.socket?.pause();
  }

  resume(): void {
    this.paused = false;
    this.socket?.resume();
  }

  /** Starts the close handshake (the host answers and closes); drops the connection if it takes too long. */
  close(code = 1000, reason = ''): void {
    if (this.closed) return;
    if (!this.socket) {
      this.terminate();
      return;
    }
    if (!this.closeSent) {
      this.closeSent = true;
      this.socket.write(maskedFrame(OP_CLOSE, closePayload(code, reason)));
      // Read the answer even if reading was paused.
      this.socket.resume();
      setTimeout(() => this.terminate(), CLOSE_TIMEOUT_MS).unref();
    }
  }

  /** Drops the connection at once. */
  terminate(): void {
    if (this.socket) this.socket.destroy();
    else {
      this.req.destroy();
      this.finish(1006, '');
    }
  }

  private read(d: Buffer): void {
    if (this.closed) return;
    try {
      this.reader.push(d);
    } catch (err) {
      if (!(err instanceof FrameError)) throw err;
      if (this.socket && !this.closeSent) {
        this.closeSent = true;
        this.socket.end(maskedFrame(OP_CLOSE, closePayload(1002, 'protocol error')));
      }
      this.fail(err);
      this.socket?.destroy();
    }
  }

  private frame(f: ReadFrame): void {
    if (this.closed) return;
    switch (f.opcode) {
      case OP_BINARY:
        this.inText = false;
        if (!this.closeSent) this.h.onFrame(f);
        break;
      case OP_TEXT:
        this.inText = !f.fin;
        break;
      case OP_CONTINUATION:
        if (!this.inText && !this.closeSent) this.h.onFrame(f);
        if (f.fin) this.inText = false;
        break;
      case OP_PING:
        if (!this.closeSent) this.socket?.write(maskedFrame(OP_PONG, f.payload!));
        break;
      case OP_PONG:
        break;
      case OP_CLOSE: {
        const p = f.payload!;
        const code = p.length >= 2 ? p.readUInt16BE(0) : 1005;
        const reason = p.length > 2 ? p.subarray(2).toString('utf8') : '';
        if (!this.closeSent) {
          this.closeSent = true;
          this.socket?.end(maskedFrame(OP_CLOSE, p.length >= 2 ? closePayload(code) : Buffer.alloc(0)));
        } else this.socket?.end();
        this.finish(code, reason);
        break;
      }
      default:
        this.fail(new FrameError(`unknown opcode ${f.opcode}`));
        this.socket?.destroy();
    }
  }

  private fail(err: Error & { status?: number }): void {
    if (this.closed) return;
    this.h.onError(err);
    if (!this.socket) this.finish(1006, '');
  }

  private finish(code: number, reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.h.onClose(code, reason);
  }
}
