import pino from 'pino';
import { IdSlots } from '../../sandbox/id-slots';
import { normaliseEgress, parseCidr, SandboxNetwork } from '../../sandbox/network';

describe('sandbox network', () => {
  it('gives each id slot its own /31 of the pool, and refuses slots past it', () => {
    const n = new SandboxNetwork({ cidr: '100.127.0.0/16', log: pino({ level: 'silent' }) });
    expect(n.linkFor(0)).toEqual({ ifname: 'sap0', gateway: '100.127.0.0', address: '100.127.0.1', prefix: 31 });
    expect(n.linkFor(300)).toEqual({ ifname: 'sap300', gateway: '100.127.2.88', address: '100.127.2.89', prefix: 31 });
    expect(n.capacity).toBe(32768);
    expect(n.linkFor(32767).address).toBe('100.127.255.255');
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
});
