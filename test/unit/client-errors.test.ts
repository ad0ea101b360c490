import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { answerClientErrors } from '../../api/client-errors';
import { rawRequest } from '../helpers/raw-http';

/** What Node's HTTP server cannot parse gets the API's error body (the API's and the preview proxy's servers). */
describe('answerClientErrors', () => {
  let server: http.Server;
  let url: string;
  beforeAll(async () => {
    server = http.createServer((_req, res) => res.end('fine'));
    answerClientErrors(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it('answers a 20 KB URL with 431 request_header_fields_too_large and a JSON body', async () => {
    const r = await rawRequest(url, `GET /x?q=${'a'.repeat(20_000)} HTTP/1.1\r\nHost: h\r\n\r\n`);
    expect(r.status).toBe(431);
    expect(r.headers['content-type']).toMatch(/^application\/json/);
    expect(Number(r.headers['content-length'])).toBe(Buffer.byteLength(r.body));
    const body = JSON.parse(r.body);
    expect(body.error.type).toBe('request_header_fields_too_large');
    expect(body.error.message).toContain(String(http.maxHeaderSize));
  });

  it('answers a 1 MB header sent in pieces once, and closes the connection', async () => {
    const r = await rawRequest(url, `GET / HTTP/1.1\r\nHost: h\r\nX-Big: ${'b'.repeat(1 << 20)}\r\n\r\n`);
    expect([r.status, JSON.parse(r.body).error.type]).toEqual([431, 'request_header_fields_too_large']);
    // One answer only, though the parser reports every later chunk.
    expect(r.body.match(/"error"/g)).toHaveLength(1);
  });

  it('answers other parse errors with 400 invalid_request and a JSON body', async () => {
    for (const req of [
      'NOT HTTP AT ALL\r\n\r\n',
      'GET / HTTP/1.1\r\nHost: h\r\nBad Header Name: x\r\n\r\n',
      'GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n',
    ]) {
      const r = await rawRequest(url, req);
      expect([r.status, JSON.parse(r.body).error.type]).toEqual([400, 'invalid_request']);
    }
  });

  it('still serves ordinary requests', async () => {
    const r = await rawRequest(url, 'GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n');
    expect([r.status, r.body]).toEqual([200, 'fine']);
  });
});
