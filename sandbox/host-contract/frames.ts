/**
 * WebSocket framing (RFC 6455 section 5) for the exec streams' hot path, without copying payloads.
 *
 * The `ws` library builds a frame from one buffer, so prefixing the stream byte costs a copy of every
 * chunk, and its receiver copies every frame that spans two socket reads. Here a frame is written as
 * a small header (which carries the stream byte) followed by the caller's buffers in one corked write,
 * and frames are read as views of the received chunks. Handshakes, and the ws objects that read the
 * other direction, stay with `ws`: these helpers only put whole frames on a socket, so they never
 * interleave with frames `ws` writes on the same socket (pongs, close frames).
 */
import { randomFillSync } from 'node:crypto';

export const OP_CONTINUATION = 0x0;
export const OP_TEXT = 0x1;
export const OP_BINARY = 0x2;
export const OP_CLOSE = 0x8;
export const OP_PING = 0x9;
export const OP_PONG = 0xa;

/** The part of a socket the writers need. */
export interface FrameSink {
  cork(): void;
  uncork(): void;
  write(chunk: Buffer, cb?: (err?: Error | null) => void): boolean;
}

/**
 * Header of one final frame of `payloadLength` bytes with `extra` appended (the payload's first bytes,
 * counted in payloadLength). Masked (client → server) when `mask` is given: then only the header is
 * returned with the key; the caller masks the payload.
 */
function header(opcode: number, payloadLength: number, extra: number, mask?: Buffer): { head: Buffer; at: number } {
  const lenBytes = payloadLength < 126 ? 0 : payloadLength < 65536 ? 2 : 8;
  const size = 2 + lenBytes + (mask ? 4 : 0);
  const head = Buffer.allocUnsafe(size + extra);
  head[0] = 0x80 | opcode;
  const maskBit = mask ? 0x80 : 0;
  if (lenBytes === 0) head[1] = maskBit | payloadLength;
  else if (lenBytes === 2) {
    head[1] = maskBit | 126;
    head.writeUInt16BE(payloadLength, 2);
  } else {
    head[1] = maskBit | 127;
    head.writeUInt32BE(Math.floor(payloadLength / 2 ** 32), 2);
    head.writeUInt32BE(payloadLength >>> 0, 6);
  }
  if (mask) mask.copy(head, 2 + lenBytes);
  return { head, at: size };
}

/**
 * Writes one final binary server → client frame whose payload is the byte `first` followed by
 * `chunks`, as one corked write (one writev); the chunks are not copied and must not change until
 * the write completes. `cb` runs when the frame is handed to the kernel. Returns the socket's
 * write() result (false: its buffer is above its high-water mark).
 */
export function writeBinaryFrame(sink: FrameSink, first: number, chunks: readonly Buffer[], cb?: (err?: Error | null) => void): boolean {
  let length = 1;
  for (const c of chunks) length += c.length;
  const { head, at } = header(OP_BINARY, length, 1);
  head[at] = first;
  if (chunks.length === 0) return sink.write(head, cb);
  sink.cork();
  sink.write(head);
  let ok = true;
  for (let i = 0; i < chunks.length; i++) ok = sink.write(chunks[i]!, i === chunks.length - 1 ? cb : undefined);
  sink.uncork();
  return ok;
}

/** Writes frames received from elsewhere (FrameReader's `raw`) as they are, in one corked write. */
export function writeRawFrame(sink: FrameSink, raw: readonly Buffer[], cb?: (err?: Error | null) => void): boolean {
  if (raw.length === 1) return sink.write(raw[0]!, cb);
  sink.cork();
  let ok = true;
  for (let i = 0; i < raw.length; i++) ok = sink.write(raw[i]!, i === raw.length - 1 ? cb : undefined);
  sink.uncork();
  return ok;
}

/** One masked client → server frame (the payload is copied to mask it: for the small control and stdin frames). */
export function maskedFrame(opcode: number, payload: Buffer): Buffer {
  const key = randomFillSync(Buffer.allocUnsafe(4));
  const { head, at } = header(opcode, payload.length, payload.length, key);
  for (let i = 0; i < payload.length; i++) head[at + i] = payload[i]! ^ key[i & 3]!;
  return head;
}

/** The payload of a close frame: the code, then the reason (UTF-8, cut to fit 123 bytes). */
export function closePayload(code: number, reason = ''): Buffer {
  const text = Buffer.from(reason).subarray(0, 123);
  const out = Buffer.allocUnsafe(2 + text.length);
  out.writeUInt16BE(code, 0);
  text.copy(out, 2);
  return out;
}

/** A frame read from a stream of server → client (unmasked) frames. */
export interface ReadFrame {
  fin: boolean;
  opcode: number;
  /** Payload length in bytes. */
  length: number;
  /** The whole frame as received, header included, as views of the received chunks (not copied). */
  raw: Buffer[];
  /** The payload in one buffer, for frames of at most `FrameReader.smallPayload` bytes; else null. */
  payload: Buffer | null;
  /** The first payload byte, or -1 when the payload is empty. */
  first: number;
}

/** A protocol error in the frame stream (the caller fails the connection, 1002). */
export class FrameError extends Error {
  override readonly name = 'FrameError';
}

/**
 * Splits a byte stream of unmasked frames into frames (`push` each received chunk; `onFrame` is
 * called for each complete frame, in order). A frame is held until it is complete, as views of the
 * chunks it spans; nothing is copied except the payloads of small frames.
 */
export class FrameReader {
  static readonly smallPayload = 125;
  private readonly queue: Buffer[] = [];
  private queued = 0;

  constructor(
    private readonly onFrame: (f: ReadFrame) => void,
    private readonly maxPayload = 64 * 1024 * 1024,
  ) {}

  /** Bytes received but not yet part of a complete frame. */
  get pending(): number {
    return this.queued;
  }

  /** Throws FrameError on a masked frame, reserved bits or a frame longer than maxPayload. */
  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.queue.push(chunk);
    this.queued += chunk.length;
    for (;;) {
      if (this.queued < 2) return;
      const b0 = this.byteAt(0);
      const b1 = this.byteAt(1);
      if (b0 & 0x70) throw new FrameError('reserved bits set (no extension was negotiated)');
      if (b1 & 0x80) throw new FrameError('a server frame must not be masked');
      let length = b1 & 0x7f;
      let headLen = 2;
      if (length === 126) {
        headLen = 4;
        if (this.queued < headLen) return;
        length = (this.byteAt(2) << 8) | this.byteAt(3);
      } else if (length === 127) {
        headLen = 10;
        if (this.queued < headLen) return;
        const high = ((this.byteAt(2) << 24) >>> 0) + (this.byteAt(3) << 16) + (this.byteAt(4) << 8) + this.byteAt(5);
        const low = ((this.byteAt(6) << 24) >>> 0) + (this.byteAt(7) << 16) + (this.byteAt(8) << 8) + this.byteAt(9);
        length = high * 2 ** 32 + low;
      }
      const opcode = b0 & 0x0f;
      if (opcode >= 0x8 && (length > 125 || !(b0 & 0x80))) throw new FrameError('invalid control frame');
      if (length > this.maxPayload) throw new FrameError(`frame of ${length} bytes exceeds ${this.maxPayload}`);
      if (this.queued < headLen + length) return;
      const first = length > 0 ? this.byteAt(headLen) : -1;
      const raw = this.take(headLen + length);
      let payload: Buffer | null = null;
      if (length <= FrameReader.smallPayload) {
        const whole = raw.length === 1 ? raw[0]! : Buffer.concat(raw);
        payload = whole.subarray(headLen);
      }
      this.onFrame({ fin: (b0 & 0x80) !== 0, opcode, length, raw, payload, first });
    }
  }

  private byteAt(i: number): number {
    for (const c of this.queue) {
      if (i < c.length) return c[i]!;
      i -= c.length;
    }
    throw new RangeError('byteAt past the queued bytes');
  }

  /** Removes the first n queued bytes, as views. */
  private take(n: number): Buffer[] {
    const out: Buffer[] = [];
    this.queued -= n;
    while (n > 0) {
      const c = this.queue[0]!;
      if (c.length <= n) {
        out.push(c);
        this.queue.shift();
        n -= c.length;
      } else {
        out.push(c.subarray(0, n));
        this.queue[0] = c.subarray(n);
        n = 0;
      }
    }
    return out;
  }
}
