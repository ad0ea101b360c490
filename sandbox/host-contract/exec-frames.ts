/** The exec WebSocket's message payloads: server→client output and exit frames, client→server stdin (see sandbox/host/exec-session.ts). */

/** A decoded server→client exec WebSocket frame (see exec.ts for the wire format). */
export type ExecFrame = { kind: 'stdout'; data: Buffer } | { kind: 'stderr'; data: Buffer } | { kind: 'exit'; exitCode: number } | { kind: 'scrollback-end' };

/** Decodes one binary frame from an exec WebSocket; null for an unknown kind. */
export function decodeExecFrame(buf: Buffer): ExecFrame | null {
  switch (buf[0]) {
    case 0x01:
      return { kind: 'stdout', data: buf.subarray(1) };
    case 0x02:
      return { kind: 'stderr', data: buf.subarray(1) };
    case 0x03:
      return { kind: 'exit', exitCode: buf.readInt32BE(1) };
    case 0x04:
      return { kind: 'scrollback-end' };
    default:
      return null;
  }
}

/** Encodes stdin bytes as a client→server frame (an empty payload closes the command's stdin). */
export function encodeStdinFrame(data: Buffer | string): Buffer {
  return Buffer.concat([Buffer.from([0x00]), Buffer.from(data)]);
}
