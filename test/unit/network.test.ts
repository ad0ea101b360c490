import pino from 'pino';
import { IdSlots } from '../../sandbox/id-slots';
import { normaliseAllowEntry, normaliseEgress, parseCidr, SandboxNetwork, splitAllow } from '../../sandbox/network';
import { nameMatches, parseUpstream } from '../../sandbox/dns';

describe('sandbox network', () => {
  it("gives each id slot its own /31 of the pool, and refuses slots past it (the last /31 holds the resolver's and proxy's address)", () => {
    const n = new SandboxNetwork({ cidr: '100.127.0.0/16', log: pino({ level: 'silent' }) });
    expect(n.linkFor(0)).toEqual({ ifname: 'sap0', gateway: '100.127.0.0', address: '100.127.0.1', prefix: 31 });
    expect(n.linkFor(300)).toEqual({ ifname: 'sap300', gateway: '100.127.2.88', address: '100.127.2.89', prefix: 31 });
    expect(n.capacity).toBe(32767);
    expect(n.linkFor(32766).address).toBe('100.127.255.253');
    expect(() => n.linkFor(32767)).toThrow(/no room/);
    expect(() => n.linkFor(32768)).toThrow(/no room/);
  });

  it('normalises CIDRs and refuses malformed ones', () => {
    expect(parseCidr('198.18.3.7/15', 'x').text).toBe('198.18.0.0/15');
    expect(parseCidr('198.18.3.7', 'x').text).toBe('198.18.3.7/32');
    for (const bad of ['198.18.0.0/33', '300.1.1.1', 'example.com', '::1', '1.2.3/8']) expect(() => parseCidr(bad, 'x')).toThrow(/IPv4/);
    expect(normaliseEgress(undefined)).toBe('internet');
    expect(normaliseEgress('none')).toBe('none');
    expect(normaliseEgress({ allow: ['198.18.0.9/31', '198.18.0.8/31'] })).toEqual({ allow: ['198.18.0.8/31'] });
    expect(() => new SandboxNetwork({ cidr: '100.127.0.0/31', log: pino({ level: 'silent' }) })).toThrow(/too small/);
  });

  it('takes id slots round the ring, within the network pool, so a freed slot is not reused at once', () => {
    const slots = new IdSlots(1 << 30, 3);
    const a = slots.allocate();
    slots.release(a);
    const b = slots.allocate();
    expect(b).not.toBe(a);
    const c = slots.allocate();
    expect(slots.allocate()).toBe(a); // the ring wraps to the freed slot
    expect(() => slots.allocate()).toThrow(/no free/);
    slots.release(c);
    expect(slots.allocate()).toBe(c);
  });

  it('takes host names and wildcards in allow lists, lower-cased, and refuses anything else', () => {
    expect(normaliseAllowEntry('API.Example.COM.', 'x')).toBe('api.example.com');
    expect(normaliseAllowEntry('*.GitHub.com', 'x')).toBe('*.github.com');
    expect(normaliseAllowEntry('198.18.0.1', 'x')).toBe('198.18.0.1/32');
    for (const bad of ['*', '*.', 'a..b', 'bad name', 'x.*.com', '-a.com', 'a_b.com', '198.18.0.0/40', `${'a'.repeat(64)}.com`]) {
      expect(() => normaliseAllowEntry(bad, 'x')).toThrow();
    }
    expect(splitAllow(['1.2.3.4/32', 'a.com', '*.b.com'])).toEqual({ cidrs: ['1.2.3.4/32'], names: ['a.com', '*.b.com'] });
    expect(normaliseEgress({ allow: ['A.com', 'a.com', '198.18.0.1'] })).toEqual({ allow: ['a.com', '198.18.0.1/32'] });
  });

  it('matches names: a wildcard covers names under its domain, not the domain itself', () => {
    expect(nameMatches(['*.example.com'], 'a.example.com')).toBe(true);
    expect(nameMatches(['*.example.com'], 'a.b.Example.com.')).toBe(true);
    expect(nameMatches(['*.example.com'], 'example.com')).toBe(false);
    expect(nameMatches(['*.example.com'], 'badexample.com')).toBe(false);
    expect(nameMatches(['example.com'], 'example.com')).toBe(true);
    expect(nameMatches(['example.com'], 'a.example.com')).toBe(false);
    expect(nameMatches([], 'example.com')).toBe(false);
  });

  it('reads upstream name servers with an optional port', () => {
    expect(parseUpstream('10.0.0.2')).toEqual({ host: '10.0.0.2', port: 53 });
    expect(parseUpstream('127.0.0.1:5300')).toEqual({ host: '127.0.0.1', port: 5300 });
    for (const bad of ['dns.google', '1.2.3.4:0', '1.2.3.4:70000', '::1']) expect(() => parseUpstream(bad)).toThrow();
  });
});
