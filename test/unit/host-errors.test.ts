/**
 * fromHostError: how a failure of a sandbox host call reaches an API caller. The codes the registry
 * relays keep their type and status; every other host code is a 502; an unreachable host is a 503.
 */
import { API_ERROR_STATUS, HOST_ERROR_STATUS, HostError, relayedFromHost, type HostErrorType } from '../../contract/errors';
import { ApiError } from '../../contract/errors';
import { fromHostError } from '../../services/hosts/host-errors';

describe('fromHostError', () => {
  const hostCodes = Object.keys(HOST_ERROR_STATUS) as HostErrorType[];

  it.each(hostCodes)('maps the host code %s by the registry', (code) => {
    const e = fromHostError(new HostError(code, HOST_ERROR_STATUS[code], 'the host said so'), 'sandbox sb-1');
    if (relayedFromHost(code)) {
      expect(e.toBody()).toEqual({ error: { type: code, message: 'the host said so' } });
      expect(e.status).toBe(API_ERROR_STATUS[code]);
    } else {
      expect(e.type).toBe('bad_gateway');
      expect(e.status).toBe(502);
      expect(e.message).toContain('the host said so');
    }
  });

  it('relays the codes a caller can act on, and hides the host-only ones', () => {
    expect(hostCodes.filter((c) => relayedFromHost(c)).sort()).toEqual([
      'conflict',
      'invalid_request',
      'not_found',
      'payload_too_large',
      'rate_limited',
      'unavailable',
    ]);
    expect(fromHostError(new HostError('unauthorized', 401, 'bad token'), 'x').status).toBe(502);
  });

  it('passes an ApiError through and makes an unreachable host a 503', () => {
    const own = new ApiError('gone', 'gone already');
    expect(fromHostError(own, 'x')).toBe(own);
    const down = fromHostError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:7300'), { code: 'ECONNREFUSED' }), 'x');
    expect(down.toBody()).toEqual({ error: { type: 'unavailable', message: 'sandbox host unreachable: connect ECONNREFUSED 127.0.0.1:7300' } });
  });
});
