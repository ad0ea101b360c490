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
