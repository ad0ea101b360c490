import { execFileSync } from 'node:child_process';
import { promises as fsp, existsSync, readdirSync, readlinkSync, realpathSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { envPairs, shq } from '../../sandbox/base';
import { HOST_ERROR_STATUS } from '../../contract/errors';
import {
  fsError,
  hostPathOf,
  pathLimits,
  statSandboxPath,
  mountIdOf,
  readSandboxFile,
  resolveSandboxPath,
  sandboxPathComponents,
  writeSandboxFile,
  type RootMap,
} from '../../sandbox/paths';
import { bearerMatches, splitListen } from '../../sandbox/host/server';

describe('sandbox path resolution', () => {
  let tmp: string;
  let map: RootMap;
  let outside: string;

  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-paths-'));
    const root = path.join(tmp, 'root');
    const usr = path.join(tmp, 'usr');
    outside = path.join(tmp, 'outside');
    await fsp.mkdir(path.join(root, 'etc'), { recursive: true });
    await fsp.mkdir(path.join(root, 'usr'), { recursive: true });
    await fsp.mkdir(path.join(usr, 'bin'), { recursive: true });
    await fsp.mkdir(outside);
    await fsp.writeFile(path.join(outside, 'secret'), 'host secret');
    await fsp.writeFile(path.join(root, 'etc', 'passwd'), 'sandbox passwd');
    await fsp.writeFile(path.join(usr, 'bin', 'tool'), 'tool');
    await fsp.symlink('usr/bin', path.join(root, 'bin'));
    await fsp.symlink('/etc/passwd', path.join(root, 'abs-link'));
    await fsp.symlink('../../../../../../etc/passwd', path.join(root, 'etc', 'dotdot-link'));
    await fsp.symlink(outside, path.join(root, 'host-outside'));
    await fsp.symlink('loop2', path.join(root, 'loop1'));
    await fsp.symlink('loop1', path.join(root, 'loop2'));
    map = {
      mounts: [
        { at: '/', dir: root },
        { at: '/usr', dir: usr },
      ],
    };
  });

  afterAll(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('splits absolute paths and refuses relative paths, NUL and ..', () => {
    expect(sandboxPathComponents('/a//b/./c')).toEqual(['a', 'b', 'c']);
    expect(() => sandboxPathComponents('a/b')).toThrow(/absolute/);
    expect(() => sandboxPathComponents('/a/../../etc')).toThrow(/\.\./);
    expect(() => sandboxPathComponents('/a\0b')).toThrow(/NUL/);
  });

  it('maps to the longest matching mount', () => {
    expect(hostPathOf(map, ['usr', 'bin', 'x'])).toBe(path.join(tmp, 'usr', 'bin', 'x'));
    expect(hostPathOf(map, ['usrx'])).toBe(path.join(tmp, 'root', 'usrx'));
    expect(hostPathOf(map, [])).toBe(path.join(tmp, 'root'));
  });

  it('follows symlinks as the sandbox would, never out of it', async () => {
    expect((await resolveSandboxPath(map, '/bin/tool')).hostPath).toBe(path.join(tmp, 'usr', 'bin', 'tool'));
    expect((await resolveSandboxPath(map, '/abs-link')).hostPath).toBe(path.join(tmp, 'root', 'etc', 'passwd'));
    expect((await resolveSandboxPath(map, '/etc/dotdot-link')).hostPath).toBe(path.join(tmp, 'root', 'etc', 'passwd'));
    // A link to a host path is read as a path inside the sandbox, where it does not exist.
    await expect(readSandboxFile(map, '/host-outside/secret', 100)).rejects.toMatchObject({ type: 'not_found' });
    await expect(resolveSandboxPath(map, '/loop1')).rejects.toMatchObject({ type: 'invalid_request' });
  });

  it('reads with a size limit and writes with parents created', async () => {
    expect((await readSandboxFile(map, '/abs-link', 100)).toString()).toBe('sandbox passwd');
    await expect(readSandboxFile(map, '/etc/passwd', 3)).rejects.toMatchObject({ type: 'payload_too_large' });
    await expect(readSandboxFile(map, '/nope', 3)).rejects.toMatchObject({ type: 'not_found' });
    await expect(readSandboxFile(map, '/etc', 3)).rejects.toMatchObject({ type: 'invalid_request' });
    await writeSandboxFile(map, '/a/b/c.txt', Buffer.from('hi'));
    expect(await fsp.readFile(path.join(tmp, 'root', 'a', 'b', 'c.txt'), 'utf8')).toBe('hi');
    await writeSandboxFile(map, '/host-outside/secret', Buffer.from('overwritten?'));
    expect(await fsp.readFile(path.join(outside, 'secret'), 'utf8')).toBe('host secret');
  });
});

describe("sandbox path resolution with a mount-id guard (the namespaces provider's kind of map)", () => {
  // The map's root is one mount; a tmpfs mounted inside it stands for the sandbox's /proc or /dev.
  let tmp: string;
  let root: string;
  let outside: string;
  let map: RootMap;

  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-paths-mnt-'));
    root = path.join(tmp, 'root');
    outside = path.join(tmp, 'outside');
    await fsp.mkdir(path.join(root, 'etc'), { recursive: true });
    await fsp.mkdir(path.join(root, 'dev'));
    await fsp.mkdir(path.join(root, 'workspace'));
    await fsp.mkdir(outside);
    await fsp.writeFile(path.join(outside, 'secret'), 'host secret');
    await fsp.writeFile(path.join(root, 'etc', 'passwd'), 'sandbox passwd');
    execFileSync('mount', ['-t', 'tmpfs', 'sap-test', path.join(root, 'dev')]);
    await fsp.writeFile(path.join(root, 'dev', 'node'), 'on another mount');
    // ../../.. from /workspace/up climbs past the root: clamped there.
    await fsp.symlink('../../../../..', path.join(root, 'workspace', 'up'));
    await fsp.symlink(outside, path.join(root, 'workspace', 'host-dir'));
    await fsp.symlink('/dev', path.join(root, 'workspace', 'devlink'));
    execFileSync('mkfifo', [path.join(root, 'workspace', 'fifo')]);
    const fh = await fsp.open(root, 'r');
    const rootMount = await mountIdOf(fh.fd);
    await fh.close();
    map = { mounts: [{ at: '/', dir: root }], mountIds: new Set([rootMount]) };
  });

  afterAll(async () => {
    execFileSync('umount', [path.join(root, 'dev')]);
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('clamps `..` of link targets at the root and refuses it in paths', async () => {
    expect((await readSandboxFile(map, '/workspace/up/etc/passwd', 100)).toString()).toBe('sandbox passwd');
    await expect(readSandboxFile(map, '/workspace/../etc/passwd', 100)).rejects.toMatchObject({ type: 'invalid_request' });
  });

  it('reads a symlinked parent pointing to an absolute host path inside the sandbox, never on the host', async () => {
    await expect(readSandboxFile(map, '/workspace/host-dir/secret', 100)).rejects.toMatchObject({ type: 'not_found' });
    await writeSandboxFile(map, '/workspace/host-dir/secret', Buffer.from('sandbox copy'));
    expect(await fsp.readFile(path.join(outside, 'secret'), 'utf8')).toBe('host secret');
    expect(await fsp.readFile(path.join(root, outside, 'secret'), 'utf8')).toBe('sandbox copy');
  });

  it('refuses files and directories on any other mount, before creating anything there', async () => {
    await expect(readSandboxFile(map, '/dev/node', 100)).rejects.toMatchObject({ type: 'invalid_request', message: expect.stringMatching(/escapes/) });
    await expect(readSandboxFile(map, '/workspace/devlink/node', 100)).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(writeSandboxFile(map, '/dev/node', Buffer.from('x'))).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(writeSandboxFile(map, '/dev/new/dir/file', Buffer.from('x'))).rejects.toMatchObject({ type: 'invalid_request' });
    expect(await fsp.readFile(path.join(root, 'dev', 'node'), 'utf8')).toBe('on another mount');
    expect(existsSync(path.join(root, 'dev', 'new'))).toBe(false);
  });

  it('never blocks on a FIFO and writes only regular files', async () => {
    await expect(readSandboxFile(map, '/workspace/fifo', 100)).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(writeSandboxFile(map, '/workspace/fifo', Buffer.from('x'))).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(writeSandboxFile(map, '/workspace', Buffer.from('x'))).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(readSandboxFile(map, '/', 100)).rejects.toMatchObject({ type: 'invalid_request' });
  });
});

describe('sandbox path walks: descriptors, limits and errors', () => {
  let tmp: string;
  let map: RootMap;
  const deepRel = Array.from({ length: 200 }, () => 'd').join('/');

  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-paths-deep-'));
    const root = path.join(tmp, 'root');
    await fsp.mkdir(path.join(root, deepRel), { recursive: true });
    await fsp.writeFile(path.join(root, deepRel, 'f'), 'bottom');
    // Back up 150 levels and down again: `..` of a link target, resolved without holding the parents.
    await fsp.symlink(`${'../'.repeat(150)}${'d/'.repeat(150)}f`, path.join(root, deepRel, 'up'));
    // 60 more levels below, and a link to the 100th: /jump/ + 160 components resolves 260 deep.
    await fsp.mkdir(path.join(root, deepRel, ...Array.from({ length: 60 }, () => 'd')), { recursive: true });
    await fsp.symlink(`/${Array.from({ length: 100 }, () => 'd').join('/')}`, path.join(root, 'jump'));
    await fsp.symlink('x'.repeat(300), path.join(root, 'long-link'));
    map = { mounts: [{ at: '/', dir: root }] };
  });

  afterAll(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  /**
   * Descriptors of this process open on the walked tree. Only those: jest's process opens and
   * closes others of its own meanwhile (sockets of earlier test files collected late).
   */
  const fds = () => {
    const under = realpathSync(tmp) + '/';
    let n = 0;
    for (const fd of readdirSync('/proc/self/fd')) {
      try {
        if ((readlinkSync(`/proc/self/fd/${fd}`) + '/').startsWith(under)) n++;
      } catch {
        // closed between the listing and the look
      }
    }
    return n;
  };

  it('holds a few descriptors per walk, whatever its depth', async () => {
    const before = fds();
    let peak = before;
    let walking = true;
    const sampler = (async () => {
      while (walking) {
        peak = Math.max(peak, fds());
        await new Promise((r) => setImmediate(r));
      }
    })();
    try {
      const entries = await Promise.all(Array.from({ length: 10 }, () => statSandboxPath(map, `/${deepRel}/f`)));
      for (const e of entries) expect(e).toMatchObject({ type: 'file', size: 6 });
    } finally {
      walking = false;
      await sampler;
    }
    // One descriptor per component held 10 × 200 here.
    expect(peak - before).toBeLessThan(10 * 4);
    expect(fds()).toBe(before);
    expect((await readSandboxFile(map, `/${deepRel}/up`, 100)).toString()).toBe('bottom');
  });

  it('refuses paths past the depth, length and component limits with invalid_request', async () => {
    expect(pathLimits).toEqual({ maxDepth: 256, maxBytes: 4096 });
    const tooDeep = '/' + Array.from({ length: 2000 }, () => 'a').join('/');
    await expect(statSandboxPath(map, tooDeep)).rejects.toMatchObject({ type: 'invalid_request', message: expect.stringMatching(/SANDBOX_PATH_MAX_DEPTH/) });
    await expect(statSandboxPath(map, '/' + 'é'.repeat(2100))).rejects.toMatchObject({ type: 'invalid_request', message: expect.stringMatching(/bytes/) });
    await expect(statSandboxPath(map, `/${'a'.repeat(256)}`)).rejects.toMatchObject({ type: 'invalid_request', message: expect.stringMatching(/255 bytes/) });
    // Under the limit as asked, past it once a link is followed: refused, not walked.
    const viaJump = (n: number) => `/jump/${Array.from({ length: n }, () => 'd').join('/')}`;
    await expect(statSandboxPath(map, viaJump(150))).resolves.toMatchObject({ type: 'dir' });
    await expect(statSandboxPath(map, viaJump(160))).rejects.toMatchObject({
      type: 'invalid_request',
      message: expect.stringMatching(/deeper than 256/),
    });
  });

  it('answers a component over 255 bytes in a link target with invalid_request, naming no host path', async () => {
    const err = await statSandboxPath(map, '/long-link/x').then(
      () => null,
      (e: Error) => e,
    );
    expect(err).toMatchObject({ name: 'SandboxError', type: 'invalid_request' });
    expect(err!.message).not.toMatch(/\/proc\/self|sap-paths/);
    expect(err!.message).toContain('/long-link/x');
  });

  it('maps every errno to a SandboxError that names only the sandbox path, 4xx but for host faults', () => {
    const hostFaults = new Set(['EMFILE', 'ENFILE', 'EIO']);
    const codes = Object.keys(os.constants.errno);
    expect(codes.length).toBeGreaterThan(50);
    for (const code of [...codes, 'EWHATEVER']) {
      const raw = Object.assign(new Error(`${code}: failed, open '/proc/self/fd/70/${'a'.repeat(300)}' in ${tmp}`), { code, path: `/proc/self/fd/70/x` });
      const e = fsError(raw, '/workspace/x');
      const status = HOST_ERROR_STATUS[e.type];
      expect({ code, ok: hostFaults.has(code) ? status === 503 : status >= 400 && status < 500 }).toEqual({ code, ok: true });
      expect({ code, message: e.message.includes('/proc') || e.message.includes(tmp) }).toEqual({ code, message: false });
      expect(e.message).toContain('/workspace/x');
    }
    // Not an errno: internal, and its message is not passed on.
    const other = fsError(new Error(`something at /proc/self/fd/3 in ${tmp}`), '/workspace/x');
    expect(other.type).toBe('internal');
    expect(other.message).not.toMatch(/\/proc|sap-paths/);
  });
});

describe('host helpers', () => {
  it('checks bearer tokens', () => {
    expect(bearerMatches('Bearer abc', 'abc')).toBe(true);
    expect(bearerMatches('Bearer abd', 'abc')).toBe(false);
    expect(bearerMatches(undefined, 'abc')).toBe(false);
    expect(bearerMatches('abc', 'abc')).toBe(false);
  });

  it('parses listen addresses', () => {
    expect(splitListen('127.0.0.1:7300')).toEqual(['127.0.0.1', '7300']);
    expect(splitListen('[::1]:80')).toEqual(['::1', '80']);
    expect(() => splitListen('nope')).toThrow();
  });

  it('quotes for sh and validates env names', () => {
    expect(shq("it's")).toBe(`'it'\\''s'`);
    expect(envPairs({ A: '1' }, { A: '2', B: 'x=y' })).toEqual(['A=2', 'B=x=y']);
    expect(() => envPairs({ 'A=B': '1' })).toThrow(/invalid environment/);
  });
});
