/**
 * A request longer than Node's header limit (a 20 KB URL, a big header) gets the API's error body:
 * 431 request_header_fields_too_large, not Node's empty answer; a request that is not HTTP gets
 * 400 invalid_request. The API keeps serving afterwards.
 */
import { api, T } from '../../helpers/env';
import { rawRequest } from '../../helpers/raw-http';

describe('requests over the header limit', () => {
  it('answers a 20 KB URL with 431 and the error body', async () => {
    const host = new URL(T.api()).host;
    const r = await rawRequest(T.api(), `GET /api/sandboxes?q=${'a'.repeat(20_000)} HTTP/1.1\r\nHost: ${host}\r\nX-API-Key: ${T.key()}\r\n\r\n`);
    expect(r.status).toBe(431);
    expect(r.headers['content-type']).toMatch(/^application\/json/);
    expect(r.headers.connection).toBe('close');
    const body = JSON.parse(r.body);
    expect(body).toEqual({ error: { type: 'request_header_fields_too_large', message: expect.stringContaining('shorten the URL or the headers') } });
  });

  it('answers the same through fetch (a long query string) and for a big header, and stays up', async () => {
    const viaFetch = await api('GET', `/api/sandboxes?q=${'z'.repeat(20_000)}`);
    expect([viaFetch.status, viaFetch.body?.error?.type]).toEqual([431, 'request_header_fields_too_large']);
    // Before the key is read: a caller without a key learns nothing more than the limit.
    const big = await rawRequest(T.api(), `GET /api/sandboxes HTTP/1.1\r\nHost: x\r\nCookie: ${'c'.repeat(64 * 1024)}\r\n\r\n`);
    expect([big.status, JSON.parse(big.body).error.type]).toEqual([431, 'request_header_fields_too_large']);
    // A preview host name does not change it: the server answers before it reads the Host.
    const preview = await rawRequest(T.api(), `GET /${'p'.repeat(20_000)} HTTP/1.1\r\nHost: sb-abc-p3000.localhost\r\n\r\n`);
    expect([preview.status, JSON.parse(preview.body).error.type]).toEqual([431, 'request_header_fields_too_large']);
    const bad = await rawRequest(T.api(), 'THIS IS NOT HTTP\r\n\r\n');
    expect([bad.status, JSON.parse(bad.body).error.type]).toEqual([400, 'invalid_request']);
    expect((await api('GET', '/api/sandboxes')).status).toBe(200);
  });
});
