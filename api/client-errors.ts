import http from 'node:http';
import type { Duplex } from 'node:stream';
import { ApiError, type ApiErrorType } from '../contract/errors';

/** How long a connection answered by answerClientErrors stays open for the client to read the answer. */
const LINGER_MS = 2000;

/** What a parse error of Node's HTTP server is answered with. */
function classify(err: NodeJS.ErrnoException, maxHeaderSize: number): { type: ApiErrorType; message: string } {
  switch (err.code) {
    case 'HPE_HEADER_OVERFLOW':
      return {
        type: 'request_header_fields_too_large',
        message: `the request line and headers are longer than the server reads (${maxHeaderSize} bytes): shorten the URL or the headers`,
      };
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return { type: 'payload_too_large', message: 'the chunk extensions of the body are too long' };
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return { type: 'request_timeout', message: 'the request did not arrive in time' };
    default:
      return { type: 'invalid_request', message: 'the request is not valid HTTP/1.1' };
  }
}

/**
 * Answers what Node's HTTP server cannot parse ('clientError') with the API's error body instead of
 * Node's empty one: a request line and headers over the max header size is 431
 * `request_header_fields_too_large`, a timeout 408 `request_timeout`, anything else 400
 * `invalid_request`. As Node does, nothing is written when an answer on the connection has begun or
 * it cannot be written; the connection is closed after the answer (at the latest LINGER_MS later,
 * which lets the client read it before the rest of what it sent is discarded).
 */
export function answerClientErrors(server: http.Server): void {
  const answered = new WeakSet<Duplex>();
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // The parser reports every later chunk of a connection it gave up on: answer once.
    if (answered.has(socket)) return;
    answered.add(socket);
    const inFlight = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || inFlight?.headersSent) {
      socket.destroy();
      return;
    }
    const { type, message } = classify(err, (server as http.Server & { maxHeaderSize?: number }).maxHeaderSize ?? http.maxHeaderSize);
    const e = new ApiError(type, message);
    const body = JSON.stringify(e.toBody());
    socket.end(
      `HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status] ?? 'Error'}\r\n` +
        'Content-Type: application/json; charset=utf-8\r\n' +
        `Content-Length: ${Buffer.byteLength(body)}\r\n` +
        'Connection: close\r\n\r\n' +
        body,
    );
    // Keep reading (and discarding) what the client still sends, so that closing does not reset
    // the connection before it has read the answer; then close it.
    socket.resume();
    const timer = setTimeout(() => socket.destroy(), LINGER_MS);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
  });
}
