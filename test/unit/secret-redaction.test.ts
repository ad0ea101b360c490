/**
 * What keeps secret values out of workflow arguments and log lines: agents' env sealed per
 * organisation, agent and name; URLs scrubbed of signed-file tokens and credential parameters.
 */
import { randomBytes } from 'node:crypto';
import { SecretBox } from '../../lib/secret-box';
import { scrubUrl } from '../../lib/logger';
import { AgentEnvUnreadable, openAgentEnv, sealAgentEnv } from '../../store/agent-env';

const box = new SecretBox(randomBytes(32));

describe('agent env sealing', () => {
  it('seals every value and opens it only for the same organisation, agent and name', () => {
    const sealed = sealAgentEnv(box, 'org-a', 'agt-1', { TOKEN: 'hunter2-value', EMPTY: '' });
    expect(Object.keys(sealed)).toEqual(['TOKEN', 'EMPTY']);
    expect(JSON.stringify(sealed)).not.toContain('hunter2-value');
    expect(openAgentEnv(box, 'org-a', 'agt-1', sealed, true)).toEqual({ TOKEN: 'hunter2-value', EMPTY: '' });
    // Copied into another organisation's or agent's run spec, or under another name: it does not open.
    for (const [org, agent, env] of [
      ['org-b', 'agt-1', sealed],
      ['org-a', 'agt-2', sealed],
      ['org-a', 'agt-1', { OTHER: sealed.TOKEN! }],
    ] as const) {
      let err: unknown;
      try {
        openAgentEnv(box, org, agent, env, true);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(AgentEnvUnreadable);
      expect((err as Error).message).not.toContain(sealed.TOKEN!);
    }
    // Another key (SECRETS_KEY changed) does not open it either.
    expect(() => openAgentEnv(new SecretBox(randomBytes(32)), 'org-a', 'agt-1', sealed, true)).toThrow(AgentEnvUnreadable);
  });

  it('passes plain values of a run spec written before values were sealed', () => {
    expect(openAgentEnv(box, 'o', 'a', { A: 'plain' }, undefined)).toEqual({ A: 'plain' });
    expect(openAgentEnv(box, 'o', 'a', undefined, true)).toEqual({});
  });
});

describe('scrubUrl', () => {
  const token = 'eyJvIjoiZGVmYXVsdCJ9.c2lnbmF0dXJlLXZhbHVl';
  it.each([
    [`/api/files/${token}`, '/api/files/[redacted]'],
    [`/api/files/${token}?download=1`, '/api/files/[redacted]?download=1'],
    [`http://127.0.0.1:8080/api/files/${token}`, 'http://127.0.0.1:8080/api/files/[redacted]'],
    ['/v1/agents?api_key=sk-live-1&limit=2', '/v1/agents?api_key=[redacted]&limit=2'],
    ['/preview?token=abc&x=1&access_token=def', '/preview?token=[redacted]&x=1&access_token=[redacted]'],
    ['/v1/agents/a/sessions/sess_1', '/v1/agents/a/sessions/sess_1'],
  ])('%s', (url, want) => {
    expect(scrubUrl(url)).toBe(want);
  });

  // A server decodes a parameter's name before reading it (api%5Fkey is api_key): so does the scrub.
  it.each([
    'api_key',
    'api%5Fkey',
    'api%5fkey',
    '%61pi_key',
    '%61%70%69%5F%6B%65%79',
    'API_KEY',
    'Api%5FKey',
    'api%255Fkey',
    'to%6Ben',
    'acc%65ss_token',
    'apikey',
  ])('scrubs the credential under the name %s, keeping the name as written', (name) => {
    const url = `/api/sandboxes/sb-1/exec/es-1?a=1&${name}=sk-live-secret-9&b=2`;
    expect(scrubUrl(url)).toBe(`/api/sandboxes/sb-1/exec/es-1?a=1&${name}=[redacted]&b=2`);
    expect(scrubUrl(JSON.stringify({ req: { url } }))).not.toContain('sk-live-secret-9');
  });

  it('leaves parameters that only look like credentials', () => {
    expect(scrubUrl('/x?monkey=1&keys=2&api_keyx=3&path=/a%5Fb')).toBe('/x?monkey=1&keys=2&api_keyx=3&path=/a%5Fb');
  });

  it('scrubs a whole JSON log line, wherever the URL sits in it', () => {
    const line = JSON.stringify({
      msg: `GET /api/files/${token} failed`,
      req: { url: `/api/files/${token}` },
      err: { message: `fetch http://h/api/files/${token}?token=qtok-secret-1` },
    });
    const out = scrubUrl(line);
    expect(out).not.toContain(token.split('.')[1]);
    expect(out).not.toContain('qtok-secret-1');
    expect(() => JSON.parse(out)).not.toThrow();
  });
});
