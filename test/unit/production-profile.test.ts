import { cpuPerSession } from '../../scripts/bench-cpu';
import { splitCidr, uiServerConfig } from '../../scripts/production';

describe('the production profile: each host gets half of the network', () => {
  it.each([
    ['100.113.0.0/20', ['100.113.0.0/21', '100.113.8.0/21']],
    ['100.64.16.0/20', ['100.64.16.0/21', '100.64.24.0/21']],
    ['10.0.0.0/8', ['10.0.0.0/9', '10.128.0.0/9']],
    ['100.127.255.248/29', ['100.127.255.248/30', '100.127.255.252/30']],
  ])('%s → %j', (cidr, halves) => {
    expect(splitCidr(cidr)).toEqual(halves);
  });

  it.each(['100.113.0.0', '100.113.0.0/30', 'fd00::/64', '100.113.0.0/20; rm -rf /', ''])('refuses %j', (cidr) => {
    expect(() => splitCidr(cidr)).toThrow(/SANDBOX_NET_CIDR/);
  });
});

describe('bench --cpu', () => {
  it('gives CPU per session of each process name and of the whole stack, leaving out what is under 0.1 ms', () => {
    const a = { total: 1000, byName: { temporal: 400, api: 100, idle: 50 } };
    const b = { total: 3000, byName: { temporal: 1400, api: 300, idle: 50, postgres: 500 } };
    expect(cpuPerSession(a, b, 100)).toEqual({ total: 20, temporal: 10, api: 2, postgres: 5 });
  });
});

describe("the production profile's Temporal UI (an operator's tool)", () => {
  const base = { temporalAddress: '127.0.0.1:7233', port: 8233 };
  it('listens on loopback without a login, and refuses another address unless OIDC is configured', () => {
    const plain = uiServerConfig({ ...base, env: {} });
    expect(plain).toContain('host: 127.0.0.1\n');
    expect(plain).not.toContain('auth:');
    expect(() => uiServerConfig({ ...base, env: { TEMPORAL_UI_HOST: '0.0.0.0' } })).toThrow(/no login/);
  });
  it('turns on its OIDC login when configured, and then may listen elsewhere', () => {
    const env = {
      TEMPORAL_UI_HOST: '0.0.0.0',
      TEMPORAL_UI_OIDC_ISSUER: 'https://sso.example.com',
      TEMPORAL_UI_OIDC_CLIENT_ID: 'temporal-ui',
      TEMPORAL_UI_OIDC_CLIENT_SECRET: 's3cret',
      TEMPORAL_UI_OIDC_CALLBACK_URL: 'https://temporal.example.com/auth/sso/callback',
    };
    const yaml = uiServerConfig({ ...base, env });
    expect(yaml).toContain('host: 0.0.0.0\n');
    expect(yaml).toContain('auth:\n  enabled: true\n  providers:\n    - label: sso\n      type: oidc\n      providerUrl: "https://sso.example.com"');
    expect(() => uiServerConfig({ ...base, env: { ...env, TEMPORAL_UI_OIDC_CLIENT_SECRET: undefined } })).toThrow(/CLIENT_SECRET/);
  });
});
