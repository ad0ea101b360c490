import { hostAllowed, normaliseAllowedHost, withoutOverridden } from '../../contract/sealed';
import { swapPlaceholders, type SealedEntry } from '../../sandbox/seal/proxy';

const P1 = `osb_sealed_${'a'.repeat(32)}`;
const P2 = `osb_sealed_${'b'.repeat(32)}`;
const entries = new Map<string, SealedEntry>([
  [P1, { placeholder: P1, name: 'ANTHROPIC_API_KEY', hosts: ['api.anthropic.com'], box: 'k1' }],
  [P2, { placeholder: P2, name: 'GH_TOKEN', hosts: ['*.github.com'], box: 'k2' }],
]);
const opened: string[] = [];
const open = (e: SealedEntry) => (opened.push(e.name), `value-of-${e.box}`);
const swap = (text: string, host: string) => swapPlaceholders(text, host, (p) => entries.get(p), open);

describe('sealed secrets: allowed hosts', () => {
  it('normalises names and wildcards; refuses addresses, bare and single-label patterns, junk', () => {
    expect(normaliseAllowedHost(' API.Anthropic.com. ')).toBe('api.anthropic.com');
    expect(normaliseAllowedHost('*.GitHub.com')).toBe('*.github.com');
    for (const bad of ['*', '*.com', 'localhost', '10.0.0.1', '*.10.0.0.1', 'a b.com', 'a..b', '-a.com', 'x'.repeat(254), '', 'exa_mple.com', 'http://a.com']) {
      expect(() => normaliseAllowedHost(bad)).toThrow();
    }
  });

  it('matches exact names and proper subdomains of wildcards only', () => {
    expect(hostAllowed(['api.anthropic.com'], 'API.anthropic.com.')).toBe(true);
    expect(hostAllowed(['api.anthropic.com'], 'anthropic.com')).toBe(false);
    expect(hostAllowed(['api.anthropic.com'], 'api.anthropic.com.evil.test')).toBe(false);
    expect(hostAllowed(['api.anthropic.com'], 'evilapi.anthropic.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], 'api.github.com')).toBe(true);
    expect(hostAllowed(['*.github.com'], 'a.b.github.com')).toBe(true);
    expect(hostAllowed(['*.github.com'], 'github.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], 'evilgithub.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], '.github.com')).toBe(false);
  });

  it('a more specific env replaces a sealed secret of the same name', () => {
    const specs = [
      { name: 'A', value: 'x', allowedHosts: ['a.test'] },
      { name: 'B', value: 'y', allowedHosts: ['b.test'] },
    ];
    expect(withoutOverridden(specs, { B: 'mine' }, undefined).map((s) => s.name)).toEqual(['A']);
  });
});

describe('sealed secrets: swapping placeholders', () => {
  beforeEach(() => (opened.length = 0));

  it('puts the value in toward an allowed host, every occurrence', () => {
    expect(swap(`Bearer ${P1}`, 'api.anthropic.com')).toEqual({ text: 'Bearer value-of-k1' });
    expect(swap(`${P2},${P2}`, 'api.github.com')).toEqual({ text: 'value-of-k2,value-of-k2' });
    expect(swap('no placeholder here', 'api.anthropic.com')).toEqual({ text: 'no placeholder here' });
  });

  it('refuses, naming the secret, toward any other host, and opens nothing', () => {
    expect(swap(`Bearer ${P1}`, 'api.github.com')).toEqual({ refused: 'ANTHROPIC_API_KEY' });
    // One allowed and one not in the same header: refused as a whole.
    expect(swap(`${P2} ${P1}`, 'api.github.com')).toEqual({ refused: 'ANTHROPIC_API_KEY' });
    expect(opened.filter((n) => n === 'ANTHROPIC_API_KEY')).toEqual([]);
  });

  it("refuses a placeholder that is not the sandbox's (another sandbox's, or mangled)", () => {
    expect(swap(`osb_sealed_${'c'.repeat(32)}`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(swap(`${P1.slice(0, -1)}`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(swap(`${P1}X`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(opened).toEqual([]);
  });
});
