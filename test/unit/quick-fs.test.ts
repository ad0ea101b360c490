/**
 * The host's synchronous file calls (sandbox/quick-fs.ts): what they remove, what they leave to the
 * pool, and what they never follow.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { existsNoFollow, readlinkOrNull, removeDir, renameIfThere, rmdirIfEmpty, writeSmallAtomically } from '../../sandbox/quick-fs';

describe('quick-fs', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'quick-fs-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('removes a directory of small files, links and empty directories, and a tree or a large file through the pool', async () => {
    const small = path.join(dir, 'small');
    mkdirSync(path.join(small, 'm'), { recursive: true });
    writeFileSync(path.join(small, 'state.json'), '{}');
    symlinkSync('/nowhere', path.join(small, 'link'));
    await removeDir(small);
    expect(existsSync(small)).toBe(false);

    const big = path.join(dir, 'big');
    mkdirSync(path.join(big, 'tree', 'deeper'), { recursive: true });
    writeFileSync(path.join(big, 'tree', 'deeper', 'f'), 'x');
    writeFileSync(path.join(big, 'entrypoint.out'), Buffer.alloc(2 * 1024 * 1024));
    await removeDir(big);
    expect(existsSync(big)).toBe(false);
  });

  it('removes a link in place of the directory, never what it points to; a directory already gone is fine', async () => {
    const target = path.join(dir, 'target');
    mkdirSync(target);
    writeFileSync(path.join(target, 'keep'), 'k');
    const link = path.join(dir, 'link');
    symlinkSync(target, link);
    await removeDir(link);
    expect(existsNoFollow(link)).toBe(false);
    expect(readFileSync(path.join(target, 'keep'), 'utf8')).toBe('k');
    // A dangling link (its scratch directory gone with a reboot) goes too.
    symlinkSync(path.join(dir, 'gone'), link);
    expect(readlinkOrNull(link)).toBe(path.join(dir, 'gone'));
    await removeDir(link);
    expect(existsNoFollow(link)).toBe(false);
    await expect(removeDir(path.join(dir, 'never-there'))).resolves.toBeUndefined();
  });

  it('writes atomically, renames only what is there, and removes only empty directories', () => {
    const file = path.join(dir, 'state.json');
    writeSmallAtomically(file, '{"a":1}');
    expect(readFileSync(file, 'utf8')).toBe('{"a":1}');
    expect(existsSync(`${file}.tmp`)).toBe(false);
    expect(renameIfThere(path.join(dir, 'absent'), path.join(dir, 'b'))).toBe(false);
    expect(renameIfThere(file, path.join(dir, 'moved.json'))).toBe(true);
    mkdirSync(path.join(dir, 'full'));
    writeFileSync(path.join(dir, 'full', 'f'), '');
    expect(rmdirIfEmpty(path.join(dir, 'full'))).toBe(false);
    expect(rmdirIfEmpty(path.join(dir, 'absent'))).toBe(true);
    expect(readlinkOrNull(path.join(dir, 'full'))).toBeNull();
  });
});
