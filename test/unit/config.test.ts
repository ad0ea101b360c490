import { loadConfig, ConfigError, bootstrapApiKey, sandboxProviderWarning } from '../../config';

describe('configuration', () => {
  it('has local defaults', () => {
    const cfg = loadConfig({});
    expect(cfg.PORT).toBe(8080);
    expect(cfg.API_KEY_CACHE_MS).toBe(30_000);
    expect(cfg.TASK_QUEUE).toBe('sandbox-agents');
    expect(cfg.MONGO_URL).toMatch(/^mongodb:\/\//);
    expect(bootstrapApiKey(cfg)).toBe('dev-key');
  });

  it('has no default key in production', () => {
    expect(bootstrapApiKey(loadConfig({ NODE_ENV: 'production' }))).toBeUndefined();
  });

  it('runs the namespaces provider by default', () => {
    expect(loadConfig({}).SANDBOX_PROVIDER).toBe('namespaces');
    expect(loadConfig({ SANDBOX_PROVIDER: 'process' }).SANDBOX_PROVIDER).toBe('process');
    expect(sandboxProviderWarning({})).toBeUndefined();
  });

  it('accepts SANDBOX_PROVIDER=bwrap, the old name of namespaces, with one warning', () => {
    expect(loadConfig({ SANDBOX_PROVIDER: 'bwrap' }).SANDBOX_PROVIDER).toBe('namespaces');
    expect(sandboxProviderWarning({ SANDBOX_PROVIDER: 'bwrap' })).toBe('SANDBOX_PROVIDER=bwrap is the old name of namespaces');
    expect(sandboxProviderWarning({ SANDBOX_PROVIDER: 'namespaces' })).toBeUndefined();
  });

  it.each([
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['MONGO_URL', 'http://example'],
    ['TEMPORAL_ADDRESS', 'no-port'],
    ['TASK_QUEUE', 'has space'],
    ['SANDBOX_PROVIDER', 'docker'],
    ['RESULT_MAX_BYTES', '-1'],
    ['API_KEY_CACHE_MS', '50'],
    ['API_KEY_CACHE_MS', 'soon'],
  ])('names the variable when %s=%s is bad', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(name));
  });
});

describe('published default secrets', () => {
  const defaults = { API_KEY: 'dev-key', HOST_TOKEN: 'change-me-host-token', POSTGRES_PASSWORD: 'change-me-postgres' };

  it.each(['production', 'test'])('refuses to start with NODE_ENV=%s while any of them is in use, naming each', (NODE_ENV) => {
    for (const [name, value] of Object.entries(defaults)) {
      expect(() => loadConfig({ NODE_ENV, [name]: value })).toThrow(ConfigError);
      expect(() => loadConfig({ NODE_ENV, [name]: value })).toThrow(
        new RegExp(`${name}: is the published default '${value}', refused with NODE_ENV=${NODE_ENV}`),
      );
    }
    let message = '';
    try {
      loadConfig({ NODE_ENV, ...defaults });
    } catch (err) {
      message = (err as Error).message;
    }
    for (const name of Object.keys(defaults)) expect(message).toContain(`${name}: is the published default`);
    expect(message).toContain('NODE_ENV=development');
  });

  it('accepts them in the development profile, and secrets of ones own anywhere', () => {
    expect(loadConfig({ NODE_ENV: 'development', ...defaults }).API_KEY).toBe('dev-key');
    expect(loadConfig({ ...defaults }).HOST_TOKEN).toBe('change-me-host-token');
    const own = { API_KEY: 'a-key-of-my-own', HOST_TOKEN: 'a-host-token-of-my-own', POSTGRES_PASSWORD: 'pg-of-my-own' };
    expect(loadConfig({ NODE_ENV: 'production', ...own }).API_KEY).toBe('a-key-of-my-own');
  });

  it('has no default key outside development', () => {
    expect(bootstrapApiKey(loadConfig({ NODE_ENV: 'test' }))).toBeUndefined();
    expect(bootstrapApiKey(loadConfig({ NODE_ENV: 'production', API_KEY: 'mine' }))).toBe('mine');
  });
});
