/** The exec bench's integrity check: the stream must be the pattern, byte for byte, from offset 0. */
import { matchesPattern } from '../../scripts/bench-exec';

const LINE = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n';
const stream = Buffer.from(LINE.repeat(70_000)); // 4.4 MB, like `yes … | head -c`

/** Feeds chunks as a client would receive them; true when every chunk matched at its offset. */
function check(chunks: Buffer[]): boolean {
  let off = 0;
  for (const c of chunks) {
    if (!matchesPattern(c, off)) return false;
    off += c.length;
  }
  return true;
}

const cut = (b: Buffer, size: number) => Array.from({ length: Math.ceil(b.length / size) }, (_, i) => b.subarray(i * size, (i + 1) * size));

describe('matchesPattern', () => {
  it('accepts the stream however it is cut, chunks larger than its window included', () => {
    for (const size of [1, 63, 64, 4096, 65_536, 65_537, 3_000_000]) expect(check(cut(stream.subarray(0, size === 1 ? 5000 : undefined), size))).toBe(true);
  });

  it('refuses a dropped, repeated or reordered chunk, and a changed byte', () => {
    const chunks = cut(stream, 65_536);
    expect(check([...chunks.slice(0, 3), ...chunks.slice(4)])).toBe(false);
    expect(check([...chunks.slice(0, 4), chunks[3]!, ...chunks.slice(4)])).toBe(false);
    expect(check([chunks[1]!, chunks[0]!, ...chunks.slice(2)])).toBe(false);
    const bad = Buffer.from(stream);
    bad[3_333_333] ^= 1;
    expect(check(cut(bad, 65_536))).toBe(false);
  });
});
