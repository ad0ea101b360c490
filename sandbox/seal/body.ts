/**
 * Placeholders in request bodies (docs/sealed-secrets.md, "Bodies"): the proxy searches every body
 * it forwards, chunk by chunk, without holding more than a placeholder's length between chunks (a
 * placeholder split across chunks is still found). A whole placeholder (`osb_sealed_` and 32 hex)
 * is swapped for its value when its secret allows the host; any other whole placeholder refuses the
 * request before its bytes are forwarded. Text that only starts like one passes unchanged (bodies
 * carry arbitrary text: a bare prefix in a file being uploaded is not a key).
 */
import type * as http from 'node:http';
import { PLACEHOLDER_PREFIX } from '../../contract/sealed';

const PREFIX = Buffer.from(PLACEHOLDER_PREFIX, 'latin1');
/** A placeholder's length: the prefix and 32 hex digits. */
export const PLACEHOLDER_LENGTH = PREFIX.length + 32;
/** Bodies with a content-length up to this are held whole, so a swap can fix the length. Larger ones stream. */
export const BODY_HOLD_MAX = 64 * 1024;
const EMPTY = Buffer.alloc(0);
/** How much of a refused request's body is read and dropped before its connection is closed instead. */
const DROP_MAX = 1 << 20;

/** What a whole placeholder becomes: the value's bytes, or the refusal (the secret's name when it is one of the sandbox's). */
export type TokenSwap = (placeholder: string) => Buffer | { refused: string | null };

const isHex = (b: number) => (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x66);

/** Whether `data` holds a whole placeholder at `i` (the prefix is there already). */
function wholeAt(data: Buffer, i: number): boolean {
  if (i + PLACEHOLDER_LENGTH > data.length) return false;
  for (let j = i + PREFIX.length; j < i + PLACEHOLDER_LENGTH; j++) if (!isHex(data[j]!)) return false;
  return true;
}

/** Where the part of `data` that may be the start of a placeholder continued by the next chunk begins. */
function holdFrom(data: Buffer): number {
  const i = data.indexOf(PREFIX, Math.max(0, data.length - (PLACEHOLDER_LENGTH - 1)));
  if (i >= 0) return i;
  for (let k = Math.min(PREFIX.length - 1, data.length); k > 0; k--) {
    if (PREFIX.compare(data, data.length - k, data.length, 0, k) === 0) return data.length - k;
  }
  return data.length;
}

/** Searches a body chunk by chunk; `push` answers the bytes that may be forwarded now, or the refusal. */
export class BodyScan {
  private held: Buffer = EMPTY;
  /** How many bytes the swaps added (or removed) so far. */
  delta = 0;

  constructor(private readonly swap: TokenSwap) {}

  push(chunk: Buffer, last: boolean): Buffer | { refused: string | null } {
    const data = this.held.length ? Buffer.concat([this.held, chunk]) : chunk;
    const cut = last ? data.length : holdFrom(data);
    this.held = cut === data.length ? EMPTY : Buffer.from(data.subarray(cut));
    const head = cut === data.length ? data : data.subarray(0, cut);
    let i = head.indexOf(PREFIX);
    if (i < 0) return head;
    const parts: Buffer[] = [];
    let from = 0;
    for (; i >= 0; i = head.indexOf(PREFIX, i + 1)) {
      if (!wholeAt(head, i)) continue;
      const r = this.swap(head.toString('latin1', i, i + PLACEHOLDER_LENGTH));
      if (!Buffer.isBuffer(r)) return r;
      parts.push(head.subarray(from, i), r);
      this.delta += r.length - PLACEHOLDER_LENGTH;
      from = i + PLACEHOLDER_LENGTH;
      i = from - 1;
    }
    if (!parts.length) return head;
    parts.push(head.subarray(from));
    return Buffer.concat(parts);
  }
}

/** Reads a body of at most `max` bytes (its content-length, which Node's parser enforces). */
export function readBody(req: http.IncomingMessage, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > max) return req.destroy(new Error('request body larger than its content-length'));
      chunks.push(c);
    });
    req.once('end', () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.once('error', reject);
    req.once('close', () => {
      if (!req.complete) reject(new Error('request body cut short'));
    });
  });
}

/**
 * Streams `req`'s body into `up` through `scan`, with backpressure. `fixedLength`: the request went
 * upstream with its content-length, so a swap that changes the length cannot be sent (refused).
 * `onRefused` is called once, before any byte of the refused placeholder left; the caller answers and
 * ends the upstream request; the rest of the body is dropped.
 */
export function pumpBody(
  req: http.IncomingMessage,
  up: http.ClientRequest,
  scan: BodyScan,
  fixedLength: boolean,
  onRefused: (secret: string | null, tooLarge: boolean) => void,
): void {
  let stopped = false;
  const step = (chunk: Buffer, last: boolean): boolean => {
    if (stopped) return false;
    const r = scan.push(chunk, last);
    const tooLarge = fixedLength && scan.delta !== 0;
    if (!Buffer.isBuffer(r) || tooLarge) {
      stopped = true;
      onRefused(Buffer.isBuffer(r) ? null : r.refused, tooLarge);
      return false;
    }
    if (last) {
      up.end(r.length ? r : undefined);
      return true;
    }
    return r.length === 0 || up.write(r);
  };
  let dropped = 0;
  req.on('data', (c: Buffer) => {
    // After a refusal the rest of the body is read and dropped (the client then reads the answer on a
    // connection that stays usable), up to a bound: past it the connection is closed.
    if (stopped) return void ((dropped += c.length) > DROP_MAX && req.socket.destroy());
    if (!step(c, false) && !stopped) req.pause();
  });
  up.on('drain', () => {
    if (!stopped) req.resume();
  });
  req.once('end', () => step(EMPTY, true));
}

/**
 * Searches an answer, chunk by chunk, for sealed values and replaces each with its placeholder
 * (docs/sealed-secrets.md, "Answers"): an upstream that echoes its request (errors, debug endpoints)
 * never hands a value back to the sandbox. Between chunks it keeps back only a tail that is the start
 * of some value (never more than the longest value's length less one), so a value split across
 * chunks is still found while a stream's events are not held back (an event ends in a newline that
 * starts no value).
 */
export class ValueScan {
  private held: Buffer = EMPTY;
  private readonly firsts = new Set<number>();
  private readonly values: { value: Buffer; placeholder: Buffer }[];

  constructor(pairs: { value: string; placeholder: string }[]) {
    // Longest first: where two values start at one place, the longer one is replaced.
    this.values = pairs
      .map((p) => ({ value: Buffer.from(p.value, 'utf8'), placeholder: Buffer.from(p.placeholder, 'latin1') }))
      .filter((p) => p.value.length > 0)
      .sort((a, b) => b.value.length - a.value.length);
    for (const v of this.values) this.firsts.add(v.value[0]!);
  }

  get empty(): boolean {
    return this.values.length === 0;
  }

  /** The bytes that may go to the sandbox now (everything, when `last`). */
  push(chunk: Buffer, last: boolean): Buffer {
    const data = this.held.length ? Buffer.concat([this.held, chunk]) : chunk;
    const parts: Buffer[] = [];
    let from = 0;
    let stop = -1;
    for (;;) {
      let at = -1;
      let hit: { value: Buffer; placeholder: Buffer } | null = null;
      for (const v of this.values) {
        const i = data.indexOf(v.value, from);
        if (i >= 0 && (at < 0 || i < at)) [at, hit] = [i, v];
      }
      if (!hit) break;
      // A longer value that starts the same way may still be coming: wait for the next chunk.
      if (!last && this.values.some((w) => w.value.length > data.length - at && w.value.compare(data, at, data.length, 0, data.length - at) === 0)) {
        stop = at;
        break;
      }
      parts.push(data.subarray(from, at), hit.placeholder);
      from = at + hit.value.length;
    }
    const cut = last ? data.length : stop >= 0 ? stop : Math.max(from, this.holdFrom(data, from));
    parts.push(data.subarray(from, cut));
    this.held = cut === data.length ? EMPTY : Buffer.from(data.subarray(cut));
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  /** Where the tail of `data` that is a proper start of some value begins (data.length: none). */
  private holdFrom(data: Buffer, from: number): number {
    const longest = this.values[0]?.value.length ?? 0;
    for (let i = Math.max(from, data.length - longest + 1); i < data.length; i++) {
      if (!this.firsts.has(data[i]!)) continue;
      const k = data.length - i;
      if (this.values.some((v) => v.value.length > k && v.value.compare(data, i, data.length, 0, k) === 0)) return i;
    }
    return data.length;
  }

  /** A header value (latin1, as Node gives them) with every value replaced. */
  text(s: string): string {
    if (!s) return s;
    let out = s;
    for (const v of this.values) {
      const needle = v.value.toString('latin1');
      if (out.includes(needle)) out = out.split(needle).join(v.placeholder.toString('latin1'));
    }
    return out;
  }
}
