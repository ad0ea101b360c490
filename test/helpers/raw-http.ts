import net from 'node:net';

/** An HTTP answer as read off the wire: status, lower-cased headers, body text. */
export interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Sends `request` (bytes as given: a request line and headers the way a client that ignores limits
 * writes them) on a new TCP connection to `url`'s host and port, and reads until the server closes
 * the connection (or `timeoutMs`, which fails). For requests that fetch() would refuse to send or
 * could not express: over-long URLs and headers, malformed request lines.
 */
export function rawRequest(url: string, request: string | Buffer, timeoutMs = 10_000): Promise<RawAnswer> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const sock = net.connect({ host: hostname, port: Number(port) });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`no complete answer within ${timeoutMs} ms: ${Buffer.concat(chunks).toString('latin1').slice(0, 300)}`));
    }, timeoutMs);
    sock.on('connect', () => sock.write(request));
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    sock.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('utf8');
      const split = text.indexOf('\r\n\r\n');
      const head = split < 0 ? text : text.slice(0, split);
      const [statusLine = '', ...lines] = head.split('\r\n');
      const headers: Record<string, string> = {};
      for (const l of lines) {
        const i = l.indexOf(':');
        if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
      }
      resolve({ status: Number(statusLine.split(' ')[1] ?? 0), headers, body: split < 0 ? '' : text.slice(split + 4) });
    });
  });
}
