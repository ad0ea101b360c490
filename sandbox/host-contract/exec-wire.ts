/**
 * The wire between the sandbox host and a sandbox's exec server (pid 1 of the sandbox, see
 * tools/sandbox-init/exec-server.h, which declares the same constants; keep both in step), declared
 * once. It imports nothing of the runtime: the host wire contract (issue 43) can take it whole.
 *
 * A frame: u32 big-endian LENGTH, then LENGTH bytes: u8 TYPE, u32 big-endian ID (a command, chosen
 * by the host; 0 for the channel itself), payload. Everything the server sends is untrusted: the
 * parser bounds every frame (EXEC_OUT_MAX), knows every type and its payload's size, and answers a
 * violation (the caller then closes that sandbox's channel, and only that one).
 *
 * Flow control: at most EXEC_WINDOW bytes of each output stream of a command are unacknowledged
 * (the host sends CREDIT once it has consumed them); at most EXEC_WINDOW bytes of stdin are
 * unacknowledged the other way (STDIN_CREDIT). A server that sends more than the window is in
 * violation: what the host holds per sandbox stays bounded whatever the sandbox does.
 */

export const EXEC_WIRE_VERSION = 1;
/** u32 length + u8 type + u32 id. */
export const EXEC_HEADER_BYTES = 9;
/** Largest host → server frame (after the length): a START with its argv and environment. */
export const EXEC_IN_MAX = 1024 * 1024;
/** Largest output payload the server puts in one frame. */
export const EXEC_CHUNK = 64 * 1024;
/** Largest server → host frame (after the length). */
export const EXEC_OUT_MAX = EXEC_CHUNK + 16;
/** Unacknowledged bytes per stream, each way. */
export const EXEC_WINDOW = 1024 * 1024;
/** Commands one exec server runs at once. */
export const EXEC_MAX_COMMANDS = 64;

/** Host → server. */
export const T_START = 0x01;
export const T_STDIN = 0x02;
export const T_STDIN_EOF = 0x03;
export const T_SIGNAL = 0x04;
export const T_CREDIT = 0x05;
/** Server → host. */
export const T_HELLO = 0x81;
export const T_STARTED = 0x82;
export const T_FAILED = 0x83;
export const T_STDOUT = 0x84;
export const T_STDERR = 0x85;
export const T_EOF = 0x86;
export const T_EXIT = 0x87;
export const T_STDIN_CREDIT = 0x88;

/** Stream numbers (CREDIT, EOF). */
export const STREAM_STDOUT = 1;
export const STREAM_STDERR = 2;

/** A frame from the server, checked. `data` is a view of the received bytes (copy it to keep it). */
export type ServerFrame =
  | { type: typeof T_HELLO; id: 0; version: number; maxCommands: number }
  | { type: typeof T_STARTED; id: number; pid: number }
  | { type: typeof T_FAILED; id: number; errno: number; message: string }
  | { type: typeof T_STDOUT | typeof T_STDERR; id: number; data: Buffer }
  | { type: typeof T_EOF; id: number; stream: 1 | 2 }
  | { type: typeof T_EXIT; id: number; code: number | null; signal: number | null }
  | { type: typeof T_STDIN_CREDIT; id: number; bytes: number };

export class ExecWireError extends Error {}

function frame(type: number, id: number, payload: Buffer | null): Buffer {
  const len = payload ? payload.length : 0;
  const b = Buffer.allocUnsafe(EXEC_HEADER_BYTES + len);
  b.writeUInt32BE(5 + len, 0);
  b.writeUInt8(type, 4);
  b.writeUInt32BE(id >>> 0, 5);
  if (payload) payload.copy(b, EXEC_HEADER_BYTES);
  return b;
}

/** What a command is started with. `cwd` and argv[0] non-empty; no NUL byte anywhere. */
export interface StartRequest {
  uid: number;
  cwd: string;
  argv: string[];
  /** "NAME=VALUE" pairs. */
  env: string[];
}

/** START, or null when it would be larger than EXEC_IN_MAX (or a string holds a NUL byte). */
export function encodeStart(id: number, req: StartRequest): Buffer | null {
  const strings = [req.cwd, ...req.argv, ...req.env];
  if (strings.some((s) => s.includes('\0'))) return null;
  const body = Buffer.from(strings.join('\0') + '\0', 'utf8');
  if (16 + body.length + 5 > EXEC_IN_MAX) return null;
  const head = Buffer.alloc(16);
  head.writeUInt32BE(req.uid >>> 0, 0);
  head.writeUInt32BE(0, 4);
  head.writeUInt32BE(req.argv.length, 8);
  head.writeUInt32BE(req.env.length, 12);
  return frame(T_START, id, Buffer.concat([head, body]));
}

/** STDIN frames for `data`, each at most EXEC_CHUNK bytes. */
export function encodeStdin(id: number, data: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < data.length; at += EXEC_CHUNK) out.push(frame(T_STDIN, id, data.subarray(at, at + EXEC_CHUNK)));
  return out;
}

export function encodeStdinEof(id: number): Buffer {
  return frame(T_STDIN_EOF, id, null);
}

export function encodeSignal(id: number, signal: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt32BE(signal, 0);
  return frame(T_SIGNAL, id, p);
}

export function encodeCredit(id: number, stream: 1 | 2, bytes: number): Buffer {
  const p = Buffer.alloc(5);
  p.writeUInt8(stream, 0);
  p.writeUInt32BE(bytes, 1);
  return frame(T_CREDIT, id, p);
}

/** Text without control characters (a failure message is shown to the caller). */
function printable(text: string): string {
  let out = '';
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (c >= 0x20 && c !== 0x7f) out += ch;
  }
  return out;
}

/** Checks one frame's payload against its type; throws ExecWireError. */
function decode(type: number, id: number, p: Buffer): ServerFrame {
  const need = (n: number) => {
    if (p.length !== n) throw new ExecWireError(`frame 0x${type.toString(16)}: payload of ${p.length} bytes, expected ${n}`);
  };
  const command = () => {
    if (id === 0) throw new ExecWireError(`frame 0x${type.toString(16)} for command 0`);
  };
  switch (type) {
    case T_HELLO:
      need(8);
      if (id !== 0) throw new ExecWireError('hello for a command');
      return { type, id: 0, version: p.readUInt32BE(0), maxCommands: p.readUInt32BE(4) };
    case T_STARTED:
      command();
      need(4);
      return { type, id, pid: p.readUInt32BE(0) };
    case T_FAILED:
      command();
      if (p.length < 4 || p.length > 4 + 512) throw new ExecWireError('malformed failure');
      // Shown to the caller as text: control characters dropped.
      return {
        type,
        id,
        errno: p.readUInt32BE(0),
        message: printable(p.subarray(4).toString('utf8')),
      };
    case T_STDOUT:
    case T_STDERR:
      command();
      if (p.length === 0 || p.length > EXEC_CHUNK) throw new ExecWireError(`output frame of ${p.length} bytes`);
      return { type, id, data: p };
    case T_EOF:
      command();
      need(1);
      if (p[0] !== STREAM_STDOUT && p[0] !== STREAM_STDERR) throw new ExecWireError(`end of unknown stream ${p[0]}`);
      return { type, id, stream: p[0] as 1 | 2 };
    case T_EXIT: {
      command();
      need(8);
      const code = p.readInt32BE(0);
      const signal = p.readUInt32BE(4);
      if (signal > 64 || (signal === 0 && (code < 0 || code > 255)) || (signal !== 0 && code !== -1)) throw new ExecWireError('malformed exit');
      return { type, id, code: signal ? null : code, signal: signal || null };
    }
    case T_STDIN_CREDIT:
      command();
      need(4);
      return { type, id, bytes: p.readUInt32BE(0) };
    default:
      throw new ExecWireError(`unknown frame type 0x${type.toString(16)}`);
  }
}

/** The length of the frame at `at`, checked against the bounds; throws ExecWireError. */
function frameLength(buf: Buffer, at: number): number {
  const len = buf.readUInt32BE(at);
  if (len < 5 || len > EXEC_OUT_MAX) throw new ExecWireError(`frame of ${len} bytes (at most ${EXEC_OUT_MAX})`);
  return len;
}

/**
 * Splits what the server sends into checked frames. Holds at most one frame (EXEC_OUT_MAX + 4
 * bytes) of what it has not yet parsed; `push` throws ExecWireError on the first violation (the
 * reader is then useless: close the channel).
 */
export class ExecFrameReader {
  private pending: Buffer | null = null;

  push(chunk: Buffer, onFrame: (f: ServerFrame) => void): void {
    let buf = chunk;
    if (this.pending) {
      // The frame begun in an earlier chunk, completed from this one: only its own bytes are copied.
      let head = this.pending;
      let used = 0;
      if (head.length < 4) {
        used = Math.min(4 - head.length, chunk.length);
        head = Buffer.concat([head, chunk.subarray(0, used)]);
        if (head.length < 4) {
          this.pending = head;
          return;
        }
      }
      const need = 4 + frameLength(head, 0) - head.length;
      if (chunk.length - used < need) {
        this.pending = Buffer.concat([head, chunk.subarray(used)]);
        return;
      }
      this.pending = null;
      const whole = Buffer.concat([head, chunk.subarray(used, used + need)]);
      onFrame(decode(whole[4]!, whole.readUInt32BE(5), whole.subarray(EXEC_HEADER_BYTES)));
      buf = chunk.subarray(used + need);
    }
    let at = 0;
    while (buf.length - at >= 4) {
      const len = frameLength(buf, at);
      if (buf.length - at - 4 < len) break;
      onFrame(decode(buf[at + 4]!, buf.readUInt32BE(at + 5), buf.subarray(at + EXEC_HEADER_BYTES, at + 4 + len)));
      at += 4 + len;
    }
    // Copied: the rest of a large chunk is not kept alive by a small tail.
    if (at < buf.length) this.pending = Buffer.from(buf.subarray(at));
  }
}
