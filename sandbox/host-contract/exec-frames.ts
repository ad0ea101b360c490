/**
 * The exec WebSocket's message payloads, declared once (the host writes them, sandbox/host/exec-session.ts;
 * the client and the API's relay read them). Binary frames, first byte the kind:
 *   client → host  FRAME_STDIN + bytes             stdin (an empty FRAME_STDIN frame closes stdin)
 *   host → client  FRAME_STDOUT + bytes            stdout
 *                  FRAME_STDERR + bytes            stderr
 *                  FRAME_EXIT + int32BE exit code  (128 + n when killed by signal n); the socket then closes
 *                  FRAME_SCROLLBACK_END            end of scrollback: what follows is live
 */

export const FRAME_STDIN = 0x00;
export const FRAME_STDOUT = 0x01;
export const FRAME_STDERR = 0x02;
export const FRAME_EXIT = 0x03;
export const FRAME_SCROLLBACK_END = 0x04;

/** A decoded server→client exec WebSocket frame. */
export type ExecFrame = { kind: 'stdout'; data: Buffer } | { kind: 'stderr'; data: Buffer } | { kind: 'exit'; exitCode: number } | { kind: 'scrollback-end' };

/** Decodes one binary frame from an exec WebSocket; null for an unknown kind. */
export function decodeExecFrame(buf: Buffer): ExecFrame | null {
  switch (buf[0]) {
    case FRAME_STDOUT:
      return { kind: 'stdout', data: buf.subarray(1) };
    case FRAME_STDERR:
      return { kind: 'stderr', data: buf.subarray(1) };
    case FRAME_EXIT:
      return { kind: 'exit', exitCode: buf.readInt32BE(1) };
    case FRAME_SCROLLBACK_END:
      return { kind: 'scrollback-end' };
    default:
      return null;
  }
}

/** Encodes stdin bytes as a client→server frame (an empty payload closes the command's stdin). */
export function encodeStdinFrame(data: Buffer | string): Buffer {
  return Buffer.concat([Buffer.from([FRAME_STDIN]), Buffer.from(data)]);
}
