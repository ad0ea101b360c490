/**
 * The server name of a TLS ClientHello, read from the first bytes of a connection before anything
 * is decided (seal/proxy.ts): a connection steered to the proxy for a name no sealed secret is for
 * (a name sharing an address with a sealed host) is passed through untouched.
 */

/** The largest first record the proxy waits for (a TLS record's payload is at most 16 KiB, plus its header). */
export const MAX_HELLO_BYTES = 5 + 16_384 + 256;

/**
 * `undefined`: more bytes are needed; `null`: not a ClientHello with a host name in its first record;
 * else the name, lower-cased.
 */
export function clientHelloName(buf: Buffer): string | null | undefined {
  if (buf.length < 5) return undefined;
  if (buf[0] !== 0x16) return null;
  const recordEnd = 5 + buf.readUInt16BE(3);
  if (buf.length < recordEnd) return recordEnd <= MAX_HELLO_BYTES ? undefined : null;
  let p = 5;
  const need = (n: number) => p + n <= recordEnd;
  if (!need(4) || buf[p] !== 0x01) return null;
  p += 4 + 2 + 32; // handshake type and length, client version, random
  if (!need(1)) return null;
  p += 1 + buf[p]!; // session id
  if (!need(2)) return null;
  p += 2 + buf.readUInt16BE(p); // cipher suites
  if (!need(1)) return null;
  p += 1 + buf[p]!; // compression methods
  if (!need(2)) return null;
  const extEnd = Math.min(recordEnd, p + 2 + buf.readUInt16BE(p));
  p += 2;
  while (p + 4 <= extEnd) {
    const type = buf.readUInt16BE(p);
    const len = buf.readUInt16BE(p + 2);
    p += 4;
    if (p + len > extEnd) return null;
    if (type === 0x0000) {
      // server_name: a list of (type, length, name); host_name is type 0.
      let q = p + 2;
      const listEnd = Math.min(p + len, q + buf.readUInt16BE(p));
      while (q + 3 <= listEnd) {
        const nameType = buf[q]!;
        const nameLen = buf.readUInt16BE(q + 1);
        q += 3;
        if (q + nameLen > listEnd) return null;
        if (nameType === 0) {
          const name = buf.toString('latin1', q, q + nameLen).toLowerCase();
          return /^[a-z0-9.-]{1,253}$/.test(name) ? name.replace(/\.$/, '') : null;
        }
        q += nameLen;
      }
      return null;
    }
    p += len;
  }
  return null;
}
