import { hostEnvironment } from '../../scripts/launcher';
import { stackNet } from '../global-setup';

/** [first, last] of an IPv4 CIDR as numbers. */
function range(cidr: string): [number, number] {
  const [addr, len] = cidr.split('/');
  const start = addr!.split('.').reduce((n, o) => n * 256 + Number(o), 0);
  return [start, start + 2 ** (32 - Number(len)) - 1];
}
const overlap = (a: [number, number], b: [number, number]) => a[0] <= b[1] && b[0] <= a[1];
/** A host's user-namespace ids: 2048 slots of 65536 from its base (two-host stacks) or 16384 (a /16's links). */
const ids = (base: string, slots: number): [number, number] => [Number(base), Number(base) + slots * 65536 - 1];

describe('the test suite’s stacks on one machine (two jest workers)', () => {
  const saved = { ...process.env };
  afterEach(() => {
    process.env = { ...saved };
  });

  it('gives the second global stack a table, a pool and ids of its own', () => {
    delete process.env.SANDBOX_NET_NAME;
    delete process.env.SANDBOX_NET_CIDR;
    expect(stackNet(1)).toEqual({});
    const two = stackNet(2);
    expect(two).toEqual({ SANDBOX_NET_NAME: 't2sap', SANDBOX_NET_CIDR: '100.126.0.0/16', SANDBOX_ID_BASE: String(2 ** 31 + 2 ** 29) });
    // A table matches its links by prefix: neither name may start the other.
    expect('t2sap'.startsWith('sap') || 'sap'.startsWith('t2sap')).toBe(false);
    process.env.SANDBOX_NET_NAME = 'w3';
    process.env.SANDBOX_NET_CIDR = '100.113.0.0/20';
    expect(stackNet(2)).toMatchObject({ SANDBOX_NET_NAME: 't2w3', SANDBOX_NET_CIDR: '100.112.240.0/20' });
  });

  it('lays the two-host stacks of the two workers (SAP_STACK_SLOT) apart from each other and from the global stacks', () => {
    const env = (slot?: string): Record<string, string> => (slot ? { SAP_STACK_SLOT: slot } : {});
    const hosts = ['1', '2'].flatMap((slot) => [1, 2].map((i) => hostEnvironment(`/tmp/sap-scale-${slot}`, env(slot), i, 7000 + i)));
    const pools = hosts.map((h) => range(h.SANDBOX_NET_CIDR!));
    const idRanges = hosts.map((h) => ids(h.SANDBOX_ID_BASE!, 2048));
    // The global stacks: the first's defaults (100.127.0.0/16, ids from 2^30), the second's (above).
    pools.push(range('100.127.0.0/16'), range('100.126.0.0/16'));
    idRanges.push(ids(String(2 ** 30), 16384), ids(String(2 ** 31 + 2 ** 29), 16384));
    for (let a = 0; a < pools.length; a++)
      for (let b = a + 1; b < pools.length; b++) {
        expect(overlap(pools[a]!, pools[b]!)).toBe(false);
        expect(overlap(idRanges[a]!, idRanges[b]!)).toBe(false);
      }
    expect(Math.max(...idRanges.map((r) => r[1]))).toBeLessThan(2 ** 32);
    // Without a slot: picked by the data directory, as before.
    const [x, y] = [hostEnvironment('/tmp/a', {}, 1, 1), hostEnvironment('/tmp/a', {}, 1, 1)];
    expect(x.SANDBOX_NET_CIDR).toBe(y.SANDBOX_NET_CIDR);
    expect(x.SANDBOX_ID_BASE).toBe(String(2 ** 31));
  });
});
