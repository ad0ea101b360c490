/**
 * A reader of an exec session's `execFrames` answer (./wire.ts): the session's WebSocket frames as
 * an HTTP body on the host client's kept-alive connections. Each binary frame's payload is handed
 * on whole (`0x01` stdout, `0x02` stderr, `0x03` exit, `0x04` end of scrollback: ./exec-frames.ts).
 */
import * as http from 'node:http';
import * as https from 'node:https';
import { hostErrorOf } from './host-error';
import { FrameError, FrameReader, OP_BINARY, type ReadFrame } from './frames';

export interface ExecFramesHandlers {
  /** The host answered 200: frames follow. */
  onOpen(): void;
  /** One binary frame's payload. */
  onFrame(payload: Buffer): void;
  /** The answer ended (after the exit frame, normally), failed, or was refused (`err.status`). Called once. */
  onEnd(err?: Error & { status?: number }): void;
}

/** A frame's payload in one buffer (a large frame's spans the chunks it was read in). */
function payloadOf(f: ReadFrame): Buffer {
  if (f.payload) return f.payload;
  const whole = f.raw.length === 1 ? f.raw[0]! : Buffer.concat(f.raw);
  return whole.subarray(whole.length - f.length);
}

/** How often a request on a kept-alive connection the host had just closed is sent again. */
const STALE_RETRIES = 3;

/** One `execFrames` answer being read. */
export class ExecFramesReader {
  private req: http.ClientRequest | undefined;
  private res: http.IncomingMessage | undefined;
  private ended = false;
  private paused = false;

  constructor(
    private readonly url: string,
    private readonly token: string,
    private readonly agent: http.Agent,
    private readonly h: ExecFramesHandlers,
  ) {
    this.send(1);
  }

  private send(attempt: number): void {
    const req = (this.url.startsWith('https:') ? https : http).request(this.url, {
      method: 'GET',
      headers: { authorization: `Bearer ${this.token}` },
      agent: this.agent,
    });
    this.req = req;
    req.on('response', (res) => {
      this.res = res;
      if (res.statusCode !== 200) {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => this.end(hostErrorOf(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
        res.on('error', (err) => this.end(err));
        return;
      }
      const reader = new FrameReader((f) => {
        if (f.opcode === OP_BINARY && !this.ended) this.h.onFrame(payloadOf(f));
      });
      if (this.paused) res.pause();
      this.h.onOpen();
      res.on('data', (d: Buffer) => {
        try {
          reader.push(d);
        } catch (err) {
          if (!(err instanceof FrameError)) throw err;
          this.end(err);
          req.destroy();
        }
      });
      res.on('end', () => this.end());
      // A connection lost mid-answer is an 'error' (ECONNRESET, "aborted") on the answer.
      res.on('error', (err) => this.end(err));
    });
    req.on('error', (err: Error & { code?: string }) => {
      // A kept-alive connection the host closed as this went out: the request never reached it.
      if (!this.res && req.reusedSocket && err.code === 'ECONNRESET' && attempt < STALE_RETRIES && !this.ended) this.send(attempt + 1);
      else this.end(err);
    });
    req.end();
  }

  /** Stops reading (backpressure); `resume` reads again. */
  pause(): void {
    this.paused = true;
    this.res?.pause();
  }

  resume(): void {
    this.paused = false;
    this.res?.resume();
  }

  /** Leaves: the connection is dropped (the host counts the client as gone). */
  close(): void {
    if (this.ended) return;
    this.ended = true;
    this.req?.destroy();
  }

  private end(err?: Error & { status?: number }): void {
    if (this.ended) return;
    this.ended = true;
    this.h.onEnd(err);
  }
}
