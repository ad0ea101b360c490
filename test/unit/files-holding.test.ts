import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { filesHolding } from '../helpers/files-holding';

describe('filesHolding: which files hold a value, sparse disk images included', () => {
  let dir: string;
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-holding-'));
  });
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('finds the value in a 10 GiB sparse image, across a chunk boundary, and nowhere else', () => {
    const needle = `sk-test-${process.pid}-value`;
    fs.mkdirSync(path.join(dir, 'disks'));
    const img = (name: string) => path.join(dir, 'disks', name);
    for (const name of ['deep.img', 'straddle.img', 'clean.img']) fs.closeSync(fs.openSync(img(name), 'w'));
    for (const name of ['deep.img', 'straddle.img', 'clean.img']) fs.truncateSync(img(name), 10 * 1024 ** 3);
    const write = (name: string, offset: number, data: Buffer) => {
      const fd = fs.openSync(img(name), 'r+');
      fs.writeSync(fd, data, 0, data.length, offset);
      fs.closeSync(fd);
    };
    write('deep.img', 9 * 1024 ** 3 + 12345, Buffer.from(`..${needle}..`));
    // 16 MiB written at 1 GiB, the value across its first 8 MiB (the scan's chunk).
    const block = Buffer.alloc(16 << 20, 0x61);
    block.write(needle, (8 << 20) - 5);
    write('straddle.img', 1024 ** 3, block);
    write('clean.img', 1024 ** 3, Buffer.alloc(16 << 20, 0x61));
    fs.writeFileSync(path.join(dir, 'log.txt'), `a line with ${needle} in it\n`);
    fs.writeFileSync(path.join(dir, 'other.txt'), needle.slice(0, -1));
    fs.symlinkSync(path.join(dir, 'log.txt'), path.join(dir, 'link-to-log'));
    expect(filesHolding(needle, [dir]).sort()).toEqual([img('deep.img'), img('straddle.img'), path.join(dir, 'log.txt')].sort());
    expect(filesHolding('not-there-at-all', [dir])).toEqual([]);
  });
});
