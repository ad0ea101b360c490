import { loadConfig, ConfigError, bootstrapApiKey } from '../../config';

describe('configuration', () => {
  it('has local defaults', () => {
    const cfg = loadConfig({});
    expect(cfg.PORT).toBe(8080);
    expect(cfg.TASK_QUEUE).toBe('sandbox-agents');
    expect(cfg.MONGO_URL).toMatch(/^mongodb:\/\//);
    expect(bootstrapApiKey(cfg)).toBe('dev-key');
  });

  it('has no default key in production', () => {
    expect(bootstrapApiKey(loadConfig({ NODE_ENV: 'production' }))).toBeUndefined();
  });

  it.each([
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['MONGO_URL', 'http://example'],
    ['TEMPORAL_ADDRESS', 'no-port'],
    ['TASK_QUEUE', 'has space'],
    ['SANDBOX_PROVIDER', 'docker'],
    ['RESULT_MAX_BYTES', '-1'],
  ])('names the variable when %s=%s is bad', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(name));
  });
});
