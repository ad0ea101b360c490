/**
 * The bench's command line (`npm run bench -- …`): --help, an unknown option, an option without its
 * value, a missing or unknown bench give the usage (which main prints before exiting 2), not a stack
 * trace; the usage names every bench and every option.
 */
import { BENCH_OPTIONS, BENCH_PARTS, USAGE, parseBenchArgs } from '../../scripts/bench';

describe('bench command line', () => {
  it('names every bench and every option in its usage', () => {
    for (const part of BENCH_PARTS) expect(USAGE).toMatch(new RegExp(`^  ${part} `, 'm'));
    for (const option of Object.keys(BENCH_OPTIONS)) expect(USAGE).toContain(`--${option}`);
  });

  it('gives the usage alone for --help and -h, wherever they stand', () => {
    for (const argv of [['--help'], ['-h'], ['sessions', '--help'], ['spawn', '--n', '5', '-h']]) {
      expect(parseBenchArgs(argv)).toEqual({ usage: USAGE });
    }
  });

  it('gives the usage after what was wrong for an unknown option, a missing value, a missing or unknown bench', () => {
    const cases: [string[], RegExp][] = [
      [['sessions', '--bogus'], /'--bogus'/],
      [['--x'], /'--x'/],
      [['sessions', '--n'], /--n/],
      [[], /name a bench/],
      [['sesions'], /no bench named "sesions"/],
      [['sessions', 'batch'], /one bench at a time/],
    ];
    for (const [argv, error] of cases) {
      const r = parseBenchArgs(argv);
      expect(r).toHaveProperty('usage');
      const usage = (r as { usage: string }).usage;
      expect(usage.startsWith('bench: ')).toBe(true);
      expect(usage.split('\n')[0]).toMatch(error);
      expect(usage.endsWith(USAGE)).toBe(true);
    }
  });

  it('passes a well-formed command line through', () => {
    expect(parseBenchArgs(['spawn', '--n', '5', '--only', 'create,burst', '--cpu'])).toEqual({
      name: 'spawn',
      values: { n: '5', only: 'create,burst', cpu: true },
    });
  });
});
