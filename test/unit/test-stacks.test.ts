import { parseCidr } from '../../contract/network';
import { hostEnvironment } from '../../scripts/launcher';
import { runsProductionTest, stackNet } from '../global-setup';

/** [first, last] of an IPv4 CIDR as numbers. */
function range(cidr: string): [number, number] {
  const { base, bits } = parseCidr(cidr, 'pool');
  return [base, base + 2 ** (32 - bits) - 1];
}
const overlap = (a: [number, number], b: [number, number]) => a[0] <= b[1] && b[0] <= a[1];
/** A host's user-namespace ids: `slots` of 65536 from its base (a pool of n addresses has n/2 links, one slot each). */
const ids = (base: string, slots: number): [number, number] => [Number(base), Number(base) + slots * 65536 - 1];

describe('the test suite’s stacks on one machine (two jest workers)', () => {
  const saved = { ...process.env };
  afterEach(() => {
    process.env = { ...saved };
  });

  it('gives each global stack a table, a pool and ids of its own, none a default stack’s', () => {
    delete process.env.SANDBOX_NET_NAME;
    delete process.env.SANDBOX_NET_CIDR;
    delete process.env.SANDBOX_ID_BASE;
    expect(stackNet(1)).toEqual({ SANDBOX_NET_NAME: 't1sap', SANDBOX_NET_CIDR: '100.126.0.0/18', SANDBOX_ID_BASE: String(2 ** 31 + 2 ** 29) });
    expect(stackNet(2)).toEqual({ SANDBOX_NET_NAME: 't2sap', SANDBOX_NET_CIDR: '100.126.64.0/18', SANDBOX_ID_BASE: String(2 ** 31 + 2 ** 30) });
    // A table matches its links by prefix: no name may start another (the default stack's is `sap`).
    const names = ['sap', 't1sap', 't2sap'];
    for (const a of names) for (const b of names) if (a !== b) expect(b.startsWith(a)).toBe(false);
    // Set for stack 1: taken as they are; stack 2 goes below them.
    Object.assign(process.env, { SANDBOX_NET_NAME: 'w3', SANDBOX_NET_CIDR: '100.113.0.0/20', SANDBOX_ID_BASE: String(2 ** 30) });
    expect(stackNet(1)).toEqual({ SANDBOX_NET_NAME: 'w3', SANDBOX_NET_CIDR: '100.113.0.0/20', SANDBOX_ID_BASE: String(2 ** 30) });
    expect(stackNet(2)).toEqual({ SANDBOX_NET_NAME: 't2w3', SANDBOX_NET_CIDR: '100.112.240.0/20', SANDBOX_ID_BASE: String(2 ** 30 + 2048 * 65536) });
    // Never out of 100.64.0.0/10: at its bottom, the block above.
    process.env.SANDBOX_NET_CIDR = '100.64.0.0/20';
    expect(stackNet(2).SANDBOX_NET_CIDR).toBe('100.64.16.0/20');
  });

  it('lays the two-host stacks of the two workers (SAP_STACK_SLOT) apart from each other and from the global stacks', () => {
    const env = (slot?: string): Record<string, string> => (slot ? { SAP_STACK_SLOT: slot } : {});
    const hosts = ['1', '2'].flatMap((slot) => [1, 2].map((i) => hostEnvironment(`/tmp/sap-scale-${slot}`, env(slot), i, 7000 + i)));
    const pools = hosts.map((h) => range(h.SANDBOX_NET_CIDR!));
    const idRanges = hosts.map((h) => ids(h.SANDBOX_ID_BASE!, 2048));
    // The test suite's two stacks (8192 links each), and a default stack beside them (100.127.0.0/16, ids from 2^30).
    delete process.env.SANDBOX_NET_NAME;
    delete process.env.SANDBOX_NET_CIDR;
    delete process.env.SANDBOX_ID_BASE;
    for (const k of [1, 2]) {
      pools.push(range(stackNet(k).SANDBOX_NET_CIDR!));
      idRanges.push(ids(stackNet(k).SANDBOX_ID_BASE!, 8192));
    }
    pools.push(range('100.127.0.0/16'));
    idRanges.push(ids(String(2 ** 30), 16384));
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

describe('the production toolchain in the global setup', () => {
  const file = '/repo/test/integration/ops/production.test.ts';
  it('is run when the production test may be among the files: all of them, or a pattern that matches it', () => {
    for (const pattern of [
      undefined,
      '',
      'test/integration/ops/production.test.ts',
      'production',
      'PRODUCTION',
      'test/integration/(exec|ops)/(exec|production)\\.test\\.ts',
    ]) {
      expect(runsProductionTest(pattern, file)).toBe(true);
    }
  });
  it('is not run when only other files are', () => {
    for (const pattern of ['test/integration/exec/exec.test.ts', 'test/unit', 'test/integration/(exec|security)/(exec|network)\\.test\\.ts']) {
      expect(runsProductionTest(pattern, file)).toBe(false);
    }
  });
});
