/**
 * The default provider: each sandbox is a small Linux machine built from namespaces (bubblewrap),
 * overlayfs and cgroups.
 *
 * On disk, `${dataDir}/sandboxes/<id>/`:
 *   state.json               what the host knows (see SandboxState)
 *   upper/root, upper/usr    the writable layer (what a checkpoint captures)
 *   work/root, work/usr      overlayfs work directories
 *   rootfs, usrfs            the merged trees, mounted on the host: `/` and `/usr` of the sandbox
 *   init.log                 stderr of the mount + bwrap start
 *   entrypoint.{out,err,exit}
 *
 * The root overlay stacks the checkpoint layers (`${dataDir}/layers/<id>/root`) over a base skeleton
 * (`${dataDir}/base`); the /usr overlay stacks their `usr` parts over the host's /usr.
 * Each sandbox runs one long-lived init (bwrap with `sleep infinity`) that owns the pid, mount, net, ipc,
 * uts and cgroup namespaces. It is started by `sap-sandbox-init` (tools/sandbox-init: joins the cgroups,
 * enters a private mount namespace of its own, mounts both overlays there and execs bwrap, in one
 * process) or, where that helper was not built, by sh + mount. Through the helper, the overlays are
 * never in the host's mount table (which every new bwrap copies and parses, and whose size would grow
 * with the number of live sandboxes): they live in the sandbox's namespaces only and vanish with its
 * last process. The sh path mounts them on the host (`state.hostMounts`); teardown unmounts those.
 * The host reaches the sandbox's files through /proc/<init pid>/root (see rootMap and paths.ts).
 * One helper is kept started ahead of the next create, already in cgroups of its own (see prepareSpare).
 * Every other process (patches, entrypoint, exec) enters them and drops all capabilities through
 * `sap-sandbox-enter` (tools/sandbox-enter: cgroups, namespaces, root, capabilities, environment,
 * timeout and exit file in one exec) or, where that helper was not built, through sh + nsenter +
 * setpriv + env (+ timeout). All processes of a sandbox are in its cgroups, which is also how
 * destroy finds and kills them.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, constants as fsc, openSync, readSync, closeSync } from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { promisify } from 'node:util';
import type { Spawner } from './spawner';
import { PROJECT_ROOT } from '../config';
import { BaseProvider, DEFAULT_ENV, assertId, cgroupJoin, envPairs, shq, type EnterOptions, type SandboxState } from './base';
import { SandboxError } from './errors';
import type { RootMap } from './paths';
import { isAlive, procRef, SandboxCgroups, signalRef, type ProcRef } from './procs';
import type { ProviderOptions, SpawnOptions } from './provider';

const execFileP = promisify(execFile);

const BASE_DIRS = ['root', 'tmp', 'workspace', 'home', 'proc', 'dev', 'usr', 'opt', 'var', 'var/tmp', 'run', 'mnt', 'srv', 'etc'];
const BASE_LINKS: [string, string][] = [
  ['bin', 'usr/bin'],
  ['lib', 'usr/lib'],
  ['lib64', 'usr/lib64'],
  ['sbin', 'usr/sbin'],
];

/** Mount points under `dir` in the host's mount namespace, deepest first. */
async function mountsUnder(dir: string): Promise<string[]> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  const prefix = dir.endsWith('/') ? dir : dir + '/';
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const mp = line.split(' ')[4];
    if (!mp) continue;
    const decoded = mp.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (decoded.startsWith(prefix)) out.push(decoded);
  }
  return out.sort((a, b) => b.length - a.length);
}

/**
 * Unmounts everything under `dir` (umount2 through the spawner: no process per unmount), lazily
 * when a plain unmount fails. Throws internal if something stays mounted.
 */
async function unmountUnder(dir: string, spawner: Spawner): Promise<void> {
  const mounts = await mountsUnder(dir);
  if (mounts.length === 0) return;
  let failed = await spawner.umount(mounts);
  if (failed.length === 0) return;
  failed = await spawner.umount(failed.map((f) => f.path), { lazy: true });
  if (failed.length > 0) throw new SandboxError('internal', `could not unmount ${failed.map((f) => `${f.path} (${f.error})`).join(', ')}`);
}

/** Cgroup names of spare init helpers: `spare-<host pid>-<n>`. */
const SPARE_PREFIX = 'spare-';

/**
 * A spare init helper: its cgroups (named `name` until claimed), how the host reaches it once started
 * (its pipes when the host forked it; its connection to the host's socket when the spawner started
 * it), and whether it has joined its cgroups.
 */
interface Spare {
  name: string;
  cgroups: SandboxCgroups | null;
  child: ChildProcess | null;
  /** Started by the spawner: the helper's process, its key (what it says when it connects) and its connection. */
  proc: ProcRef | null;
  key: string | null;
  sock: net.Socket | null;
  ready: boolean;
  /** Set once a create has taken it: failures are then that create's to report. */
  claimed: boolean;
  /** Set once the host has stopped it on purpose (closing, or a failed claim). */
  discarded: boolean;
  /** Reports the spare as failed (before it is claimed). */
  failed?: (why: string) => void;
}

/**
 * An init being started, whose bwrap info (the sandbox's pid) is still to come: the helper's pid,
 * how to hand it its remaining arguments, the stream bwrap's --info-fd writes to, and its end.
 */
interface Starting {
  pid: number | undefined;
  /** Hands a waiting helper (-w) its remaining arguments. */
  send(args: Buffer): void;
  info: NodeJS.ReadableStream & { destroy(): void; resume(): unknown };
  /** Calls back when the helper is gone before its info came. */
  onGone(cb: (why: string) => void): void;
  /** Lets go of the process and its streams once the sandbox runs. */
  release(): void;
}

/** A Starting for a helper (or sh) the host forked: its stdin, its descriptor 3, its exit. */
function startingOfChild(child: ChildProcess): Starting {
  return {
    pid: child.pid,
    send: (args) => child.stdin!.end(args),
    info: child.stdio[3] as Starting['info'],
    onGone: (cb) => {
      child.on('exit', (code) => cb(`exit code ${code}`));
      child.on('error', (err) => cb(err.message));
    },
    release: () => {
      child.removeAllListeners('exit');
      child.removeAllListeners('error');
      child.unref();
      for (const stream of [child.stdin, child.stdout, child.stdio[3]]) stream?.destroy();
    },
  };
}

/** A Starting for a helper started by the spawner, connected to the host's socket (its descriptor 3). */
function startingOfSocket(pid: number, sock: net.Socket): Starting {
  return {
    pid,
    // Shuts down the host's side: the helper reads its arguments to the end.
    send: (args) => sock.end(args),
    info: sock,
    onGone: (cb) => sock.on('close', () => cb('the init helper closed its connection')),
    release: () => {
      sock.removeAllListeners('close');
      sock.destroy();
    },
  };
}

/** Where scripts/toolchain.sh puts the init helper (tools/sandbox-init). */
const DEFAULT_INIT_HELPER = path.join(PROJECT_ROOT, '.tools', 'bin', 'sap-sandbox-init');
/** Where scripts/toolchain.sh puts the entry helper (tools/sandbox-enter). */
const DEFAULT_ENTER_HELPER = path.join(PROJECT_ROOT, '.tools', 'bin', 'sap-sandbox-enter');

/** `option` if given (null: none), else `fallback`; null unless executable. Throws when a given path is not. */
async function resolveHelper(option: string | null | undefined, fallback: string, what: string): Promise<string | null> {
  const helper = option === undefined ? fallback : option;
  const usable = !!helper && (await fsp.access(helper, fsc.X_OK).then(() => true, () => false));
  if (helper && !usable && option !== undefined) throw new Error(`${what} ${helper} is not executable`);
  return usable ? helper : null;
}

/** Namespaced sandboxes with a copy-on-write root; see the module comment. */
export class BwrapProvider extends BaseProvider {
  readonly kind = 'bwrap' as const;
  private readonly initHelperOption: string | null | undefined;
  /** The init helper in use (resolved by prepare), or null for sh + mount. */
  private initHelper: string | null = null;
  private readonly enterHelperOption: string | null | undefined;
  /** The entry helper in use (resolved by prepare), or null for sh + nsenter + setpriv + env. */
  private enterHelper: string | null = null;
  /** The spare init helper started ahead of the next create (see prepareSpare). */
  private spare: Spare | null = null;
  private spareSeq = 0;
  private spareFailures = 0;
  private closed = false;
  /** Where init helpers started by the spawner connect (listenForHelpers), and who waits for which key. */
  private helperServer: net.Server | null = null;
  private helperSocket: string | null = null;
  private readonly helperWaiters = new Map<string, (sock: net.Socket) => void>();
  /** Per sandbox: the mount ids of its `/` and `/usr`, read once per init (key: pid and start time). */
  private readonly mountIds = new Map<string, { key: string; ids: ReadonlySet<number> }>();

  constructor(opts: ProviderOptions) {
    super(opts);
    this.initHelperOption = opts.initHelper;
    this.enterHelperOption = opts.enterHelper;
  }

  private baseDir(): string {
    return path.join(this.dataDir, 'base');
  }

  protected async prepare(): Promise<void> {
    this.initHelper = await resolveHelper(this.initHelperOption, DEFAULT_INIT_HELPER, 'init helper');
    this.log.info({ initHelper: this.initHelper ?? '/bin/sh + mount' }, 'sandboxes start through');
    if (this.initHelper && !this.closed) await this.listenForHelpers();
    this.enterHelper = await resolveHelper(this.enterHelperOption, DEFAULT_ENTER_HELPER, 'enter helper');
    this.log.info({ enterHelper: this.enterHelper ?? '/bin/sh + nsenter + setpriv + env' }, 'processes enter sandboxes through');
    // Cgroups of spare helpers whose host process is gone (a live host's spare is in use and stays).
    await SandboxCgroups.removeGroups((n) => n.startsWith(SPARE_PREFIX) && !signalable(Number(n.slice(SPARE_PREFIX.length).split('-')[0])));
    this.prepareSpare();
    const base = this.baseDir();
    if (await fsp.stat(base).then(() => true, () => false)) return;
    const tmp = `${base}.tmp-${process.pid}`;
    await fsp.rm(tmp, { recursive: true, force: true });
    for (const d of BASE_DIRS) await fsp.mkdir(path.join(tmp, d), { recursive: true, mode: 0o755 });
    await fsp.chmod(path.join(tmp, 'tmp'), 0o1777);
    await fsp.chmod(path.join(tmp, 'var/tmp'), 0o1777);
    await fsp.chmod(path.join(tmp, 'root'), 0o700);
    for (const [name, target] of BASE_LINKS) await fsp.symlink(target, path.join(tmp, name));
    const etc = path.join(tmp, 'etc');
    await fsp.writeFile(
      path.join(etc, 'passwd'),
      'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n',
    );
    await fsp.writeFile(path.join(etc, 'group'), 'root:x:0:\nnogroup:x:65534:\n');
    await fsp.writeFile(path.join(etc, 'hosts'), '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n');
    await fsp.writeFile(path.join(etc, 'resolv.conf'), '# no network inside the sandbox\n');
    await fsp.writeFile(path.join(etc, 'nsswitch.conf'), 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n');
    await fsp.symlink('../usr/lib/os-release', path.join(etc, 'os-release'));
    await fsp.copyFile('/etc/ld.so.cache', path.join(etc, 'ld.so.cache')).catch(() => undefined);
    // The alternatives system's symlinks (e.g. /usr/bin/awk → /etc/alternatives/awk → /usr/bin/mawk).
    try {
      await fsp.mkdir(path.join(etc, 'alternatives'));
      for (const name of await fsp.readdir('/etc/alternatives')) {
        const src = path.join('/etc/alternatives', name);
        const st = await fsp.lstat(src);
        if (st.isSymbolicLink()) await fsp.symlink(await fsp.readlink(src), path.join(etc, 'alternatives', name));
      }
    } catch {
      /* no alternatives on this machine */
    }
    try {
      await fsp.rename(tmp, base);
    } catch (err) {
      // Another host process built it first.
      await fsp.rm(tmp, { recursive: true, force: true });
      if (!(await fsp.stat(base).then(() => true, () => false))) throw err;
    }
    this.log.info({ base }, 'base filesystem created');
  }

  /**
   * The sandbox's tree as its init sees it: /proc/<init>/root, with /usr mounted inside, in the
   * sandbox's mount namespace. Every descriptor opened there must be on the sandbox's own `/` or `/usr`
   * (their mount ids, from /proc/<init>/mountinfo), never on its /proc or /dev.
   */
  protected async rootMap(state: SandboxState): Promise<RootMap> {
    const ns = state.init?.ns;
    const notRunning = () => new SandboxError('conflict', `sandbox ${state.id} is not running`);
    if (!ns || !isAlive(ns)) throw notRunning();
    const key = `${ns.pid}:${ns.start}`;
    let cached = this.mountIds.get(state.id);
    if (cached?.key !== key) {
      const text = await fsp.readFile(`/proc/${ns.pid}/mountinfo`, 'utf8').catch(() => '');
      // Read from the right process only if it is still the same one afterwards (pids are reused).
      if (!isAlive(ns)) throw notRunning();
      const ids = sandboxMountIds(text);
      if (ids.size === 0) throw new SandboxError('internal', `sandbox ${state.id} has no overlay root in its mount table`);
      cached = { key, ids };
      this.mountIds.set(state.id, cached);
    }
    return {
      mounts: [{ at: '/', dir: `/proc/${ns.pid}/root` }],
      mountIds: cached.ids,
      // The root opened through the pid is the sandbox's only if the init is still that process.
      verifyRoot: () => {
        if (!isAlive(ns)) throw notRunning();
      },
    };
  }

  protected isLive(state: SandboxState): boolean {
    return isAlive(state.init?.ns);
  }

  /**
   * Listens on `${dataDir}/init.sock` for init helpers started by the spawner (`-w -s`): each connects
   * once it has joined its cgroups and says which it is ("ready KEY"). Without it (a data directory
   * path too long for a unix socket) spares are forked by the host and bursts wait for an info file.
   */
  private async listenForHelpers(): Promise<void> {
    const sockPath = path.join(this.dataDir, 'init.sock');
    if (Buffer.byteLength(sockPath) >= 100) {
      this.log.warn({ sockPath }, 'data directory path too long for the init helpers\' socket; spares are forked');
      return;
    }
    await fsp.rm(sockPath, { force: true });
    const server = net.createServer({ allowHalfOpen: true }, (sock) => this.helperConnected(sock));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(sockPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    server.on('error', (err) => this.log.warn({ err: err.message }, 'init helpers\' socket failed'));
    await fsp.chmod(sockPath, 0o600);
    server.unref();
    this.helperServer = server;
    this.helperSocket = sockPath;
  }

  /** A helper's connection: its first line names the spare (or the create) waiting for it. */
  private helperConnected(sock: net.Socket): void {
    sock.unref();
    sock.on('error', () => undefined);
    let text = '';
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const nl = text.indexOf('\n');
      if (nl < 0) {
        if (text.length > 200) sock.destroy();
        return;
      }
      sock.off('data', onData);
      // Until a create reads bwrap's info from it.
      sock.pause();
      const key = /^ready (\S+)$/.exec(text.slice(0, nl))?.[1];
      const waiter = key ? this.helperWaiters.get(key) : undefined;
      if (!key || !waiter) return void sock.destroy();
      this.helperWaiters.delete(key);
      waiter(sock);
    };
    sock.on('data', onData);
  }

  /**
   * Starts `sap-sandbox-init -w -s SOCKET KEY` in the given cgroups through the spawner (no fork of
   * the host); `connected` is called with its connection once it is in them.
   */
  private async startLinkedHelper(key: string, cgroups: SandboxCgroups, connected: (sock: net.Socket) => void): Promise<ProcRef> {
    this.helperWaiters.set(key, connected);
    try {
      const pid = await this.spawner.spawn({
        argv: [this.initHelper!, '-w', '-s', this.helperSocket!, key, ...cgroups.procsFiles().flatMap((f) => ['-c', f])],
        env: { PATH: DEFAULT_ENV.PATH },
      });
      return procRef(pid) ?? { pid, start: -1 };
    } catch (err) {
      this.helperWaiters.delete(key);
      throw err;
    }
  }

  /**
   * Starts a spare init helper (`sap-sandbox-init -w`) in cgroups of its own, unless one is there or
   * starting. Joining cgroups waits for a kernel RCU grace period (5–15 ms), so it is done ahead of
   * the next create, which renames the groups to its sandbox's and hands the helper the rest of its
   * arguments. Started through the spawner when the host listens for helpers (listenForHelpers),
   * else forked. Gives up after three failures in a row (creates then start a helper each time).
   */
  private prepareSpare(): void {
    if (!this.initHelper || this.spare || this.closed || this.spareFailures >= 3) return;
    const name = `${SPARE_PREFIX}${process.pid}-${++this.spareSeq}`;
    const pending: Spare = { name, child: null, proc: null, key: null, sock: null, cgroups: null, ready: false, claimed: false, discarded: false };
    this.spare = pending;
    let done = false;
    const failed = (why: string) => {
      if (done || pending.discarded || pending.claimed) return;
      done = true;
      if (this.spare === pending) this.spare = null;
      this.spareFailures++;
      this.log.warn({ why, failures: this.spareFailures }, 'spare sandbox init failed');
      void this.discardSpare(pending);
    };
    pending.failed = failed;
    const isReady = () => {
      pending.ready = true;
      this.spareFailures = 0;
    };
    void (async () => {
      const cgroups = await SandboxCgroups.create(name, { maxProcesses: 512 });
      pending.cgroups = cgroups;
      if (this.spare !== pending) return void this.discardSpare(pending);
      if (this.helperSocket) {
        pending.key = `${name}.${randomBytes(8).toString('hex')}`;
        const connected = (sock: net.Socket) => {
          if (pending.discarded || done) return void sock.destroy();
          pending.sock = sock;
          sock.on('close', () => failed('the init helper closed its connection'));
          isReady();
        };
        pending.proc = await this.startLinkedHelper(pending.key, cgroups, connected);
        // One timer, not a poll: a helper that has not connected by then is taken as failed.
        setTimeout(() => {
          if (!pending.ready) failed('no connection from the init helper within 10 s');
        }, 10_000).unref();
        return;
      }
      const child = spawn(this.initHelper!, ['-w', ...cgroups.procsFiles().flatMap((f) => ['-c', f])], {
        stdio: ['pipe', 'pipe', 'ignore', 'pipe'],
        detached: true,
        env: { PATH: DEFAULT_ENV.PATH },
      });
      pending.child = child;
      // A spare must not keep the host's event loop alive.
      child.unref();
      for (const stream of [child.stdin, child.stdout, child.stdio[3]]) (stream as unknown as { unref?(): void } | null)?.unref?.();
      child.on('error', (err) => failed(err.message));
      child.on('exit', (code) => failed(`exit code ${code}`));
      child.stdout!.once('data', (chunk: Buffer) => {
        if (chunk.toString() !== 'ready\n') return failed(`unexpected output ${JSON.stringify(chunk.toString().slice(0, 100))}`);
        isReady();
      });
    })().catch((err: Error) => failed(err.message));
  }

  /**
   * The ready spare helper, now in sandbox `id`'s cgroups (renamed) with its limits, or null when
   * there is none (the caller starts a helper of its own). The next spare is started by provision.
   */
  private async claimSpare(id: string, limits: SandboxState['limits']): Promise<Starting | null> {
    const spare = this.spare;
    if (!spare?.ready || !spare.cgroups) return null;
    if (spare.child && spare.child.exitCode !== null) return null;
    if (!spare.child && (!spare.sock || spare.sock.destroyed || !spare.proc)) return null;
    this.spare = null;
    spare.claimed = true;
    spare.child?.removeAllListeners('exit');
    spare.child?.removeAllListeners('error');
    spare.sock?.removeAllListeners('close');
    try {
      const cgroups = await spare.cgroups.renameTo(id);
      await cgroups.applyLimits(limits);
    } catch (err) {
      this.log.warn({ sandboxId: id, err: (err as Error).message }, 'could not use the spare sandbox init');
      await this.discardSpare(spare, id);
      return null;
    }
    if (spare.sock) {
      spare.sock.ref();
      return startingOfSocket(spare.proc!.pid, spare.sock);
    }
    const child = spare.child!;
    child.ref();
    for (const stream of [child.stdin, child.stdout, child.stdio[3]]) (stream as unknown as { ref?(): void } | null)?.ref?.();
    return startingOfChild(child);
  }

  /** Kills a spare helper and removes its cgroups (under its own name and, if given, the name it was renamed to). */
  private async discardSpare(spare: Spare, renamedTo?: string): Promise<void> {
    spare.discarded = true;
    if (spare.key) this.helperWaiters.delete(spare.key);
    if (spare.child && spare.child.exitCode === null && spare.child.signalCode === null) {
      const exited = new Promise((r) => spare.child!.once('exit', r));
      spare.child.ref();
      spare.child.kill('SIGKILL');
      await exited;
    }
    spare.sock?.destroy();
    if (spare.proc) {
      signalRef(spare.proc, 'SIGKILL');
      await this.waitGone([spare.proc]);
    }
    await SandboxCgroups.of(spare.name).remove();
    if (renamedTo) await SandboxCgroups.of(renamedTo).remove();
  }

  /** Stops the spare helper and the helpers' socket; sandboxes keep running. */
  override async close(): Promise<void> {
    this.closed = true;
    const spare = this.spare;
    this.spare = null;
    if (spare) await this.discardSpare(spare);
    const server = this.helperServer;
    this.helperServer = null;
    if (server) {
      await new Promise((r) => server.close(r));
      if (this.helperSocket) await fsp.rm(this.helperSocket, { force: true });
    }
    this.helperSocket = null;
    await super.close();
  }

  protected async provision(state: SandboxState): Promise<void> {
    const id = state.id;
    const dir = this.dirOf(id);
    const sub = (p: string) => path.join(dir, p);
    const layerPart = (part: 'root' | 'usr') => state.layers.map((l) => path.join(this.layersDir(), l, part));
    const overlay = (lowers: string[], part: 'root' | 'usr', target: string) => ({
      target,
      options: `lowerdir=${lowers.join(':')},upperdir=${sub('upper/' + part)},workdir=${sub('work/' + part)}`,
    });
    const overlays = [
      overlay([...layerPart('root'), this.baseDir()], 'root', sub('rootfs')),
      overlay([...layerPart('usr'), '/usr'], 'usr', sub('usrfs')),
    ];
    const source = `sap-${id}`;
    const bwrap = [
      'bwrap',
      '--bind', sub('rootfs'), '/',
      '--bind', sub('usrfs'), '/usr',
      '--proc', '/proc',
      '--dev', '/dev',
      '--unshare-pid', '--unshare-net', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try',
      '--hostname', id,
      '--chdir', '/workspace',
      '--clearenv',
      '--setenv', 'HOME', '/root',
      '--setenv', 'PATH', DEFAULT_ENV.PATH,
      '--new-session',
      '--cap-drop', 'ALL',
      '--info-fd', '3',
      '--', '/usr/bin/sleep', 'infinity',
    ];
    const dirs = ['upper', 'upper/root', 'upper/usr', 'work', 'work/root', 'work/usr', 'rootfs', 'usrfs'].map(sub);
    // What the helper does after joining the cgroups: directories, both overlays, exec bwrap. Its log
    // (`-l`) comes first, so that any failure is in init.log.
    const helperArgs = () => [
      ...dirs.flatMap((d) => ['-d', d]),
      '-n',
      ...overlays.flatMap((o) => ['-o', source, o.target, o.options]),
      '--',
      ...bwrap,
    ];
    // The same for a helper that waits (-w): its log first, each argument ended by a NUL byte.
    const waitingHelperArgs = () => Buffer.from(['-l', sub('init.log'), ...helperArgs()].map((a) => a + '\0').join(''));
    const failure = async (why: string) => {
      const logText = await fsp.readFile(sub('init.log'), 'utf8').catch(() => '');
      return new SandboxError('internal', `sandbox ${id} failed to start (${why}): ${logText.trim().slice(-1000)}`);
    };
    let starting: Starting;
    // Through the helper, the overlays are mounted in the sandbox's own mount namespace (-n).
    state.hostMounts = false;
    const spare = await this.claimSpare(id, state.limits);
    if (spare) {
      starting = spare;
      starting.send(waitingHelperArgs());
    } else if (this.initHelper && this.helperSocket) {
      // No spare ready (a burst): a helper of its own through the spawner, over the socket like a spare.
      const cgroups = await SandboxCgroups.create(id, state.limits);
      const key = `${id}.${randomBytes(8).toString('hex')}`;
      let connected!: (sock: net.Socket) => void;
      const sockP = new Promise<net.Socket>((r) => (connected = r));
      const proc = await this.startLinkedHelper(key, cgroups, connected);
      let timer: NodeJS.Timeout | undefined;
      const sock = await Promise.race([
        sockP,
        new Promise<never>((_r, reject) => {
          timer = setTimeout(() => reject(new Error('no connection from the init helper within 15 s')), 15_000);
        }),
      ])
        .catch(async (err: Error) => {
          this.helperWaiters.delete(key);
          signalRef(proc, 'SIGKILL');
          throw await failure(err.message);
        })
        .finally(() => clearTimeout(timer));
      starting = startingOfSocket(proc.pid, sock);
      starting.send(waitingHelperArgs());
    } else if (this.initHelper) {
      // No spare ready and no socket: start a helper through the spawner (no fork of the host). bwrap
      // writes its info (the init's pid) to a file instead of a pipe.
      const cgroups = await SandboxCgroups.create(id, state.limits);
      const args = ['-l', sub('init.log'), ...cgroups.procsFiles().flatMap((f) => ['-c', f]), ...helperArgs()];
      const infoFile = sub('init.info');
      const outerPid = await this.spawner.spawn({ argv: [this.initHelper, ...args], env: { PATH: DEFAULT_ENV.PATH }, fd3: infoFile });
      const outerRef = procRef(outerPid);
      const nsPid = await waitForInfoFile(infoFile, outerPid, 15_000).catch(async (err: Error) => {
        throw await failure(err.message);
      });
      await waitForInitChild(nsPid, 15_000).catch(async (err: Error) => {
        throw await failure(err.message);
      });
      const ns = procRef(nsPid);
      if (!outerRef || !ns || !isAlive(outerRef)) throw new SandboxError('internal', `sandbox ${id} init exited right after start`);
      this.prepareSpare();
      state.init = { outer: outerRef, ns };
      return;
    } else {
      state.hostMounts = true;
      const [, cgroups] = await Promise.all([
        Promise.all(dirs.map((d) => fsp.mkdir(d, { recursive: true }))),
        SandboxCgroups.create(id, state.limits),
      ]);
      const script =
        overlays.map((o) => `mount -t overlay ${shq(source)} -o ${shq(o.options)} ${shq(o.target)}`).join(' && ') +
        ` && { ${cgroupJoin(cgroups.procsFiles())} exec "$@"; }`;
      const log = await fsp.open(sub('init.log'), 'a');
      try {
        starting = startingOfChild(
          spawn('/bin/sh', ['-c', script, 'sh', ...bwrap], {
            stdio: ['ignore', log.fd, log.fd, 'pipe'],
            detached: true,
            env: { PATH: DEFAULT_ENV.PATH },
          }),
        );
      } finally {
        await log.close();
      }
    }
    this.prepareSpare();
    const info = starting.info;
    const nsPid = await new Promise<number>((resolve, reject) => {
      let text = '';
      const fail = async (why: string) => {
        reject(await failure(why));
      };
      const timer = setTimeout(() => void fail('timeout'), 15000);
      info.on('data', (chunk: Buffer) => {
        text += chunk.toString('utf8');
        try {
          const parsed = JSON.parse(text) as { 'child-pid'?: number };
          clearTimeout(timer);
          if (parsed['child-pid']) resolve(parsed['child-pid']);
          else void fail('no child pid');
        } catch {
          /* incomplete JSON so far */
        }
      });
      // A socket paused since its helper connected.
      info.resume();
      starting.onGone((why) => {
        clearTimeout(timer);
        void fail(why);
      });
    }).finally(() => starting.release());
    // bwrap reports the child's pid right after clone, before the child has mounted the new root.
    // Entering it before then would enter the host's filesystem: wait until it has forked sleep.
    await waitForInitChild(nsPid, 15_000).catch(async (err: Error) => {
      throw await failure(err.message);
    });
    const outer = procRef(starting.pid);
    const ns = procRef(nsPid);
    if (!outer || !ns) throw new SandboxError('internal', `sandbox ${id} init exited right after start`);
    state.init = { outer, ns };
  }

  /** The init to enter, the working directory and the environment of a process to run in the sandbox. */
  private target(state: SandboxState, opts: SpawnOptions): { nsPid: number; cwd: string; env: string[] } {
    const ns = state.init?.ns;
    if (!ns || !isAlive(ns)) throw new SandboxError('conflict', `sandbox ${state.id} is not running`);
    if (!opts.argv.length) throw new SandboxError('invalid_request', 'argv must not be empty');
    const cwd = opts.cwd ?? state.cwd ?? '/workspace';
    if (!cwd.startsWith('/')) throw new SandboxError('invalid_request', `cwd must be absolute: ${cwd}`);
    return { nsPid: ns.pid, cwd, env: envPairs(DEFAULT_ENV, { HOSTNAME: state.id }, state.envs, opts.env) };
  }

  protected innerArgv(state: SandboxState, opts: SpawnOptions): string[] {
    const { nsPid, cwd, env } = this.target(state, opts);
    return [
      '/usr/bin/nsenter', '-t', String(nsPid), '-m', '-u', '-i', '-n', '-p', '-C', '-r', '-w',
      '/usr/bin/setpriv', '--bounding-set=-all', '--inh-caps=-all', '--ambient-caps=-all', '--no-new-privs', '--',
      '/usr/bin/env', '-i', '-C', cwd, '--', ...env,
      ...opts.argv,
    ];
  }

  /** `sap-sandbox-enter` does what the shell wrapper + innerArgv do, in one exec (tools/sandbox-enter). */
  protected override enterArgv(state: SandboxState, opts: SpawnOptions, how: EnterOptions): string[] | null {
    if (!this.enterHelper) return null;
    const { nsPid, cwd, env } = this.target(state, opts);
    return [
      this.enterHelper,
      ...how.cgroupProcs.flatMap((f) => ['-c', f]),
      '-n', String(nsPid),
      '-w', cwd,
      ...env.flatMap((e) => ['-e', e]),
      ...(how.ownGroup ? ['-g'] : []),
      ...(how.timeoutSeconds ? ['-t', String(how.timeoutSeconds), '-k', String(how.killAfterSeconds ?? 0)] : []),
      ...(how.exitFile ? ['-x', how.exitFile] : []),
      '--',
      ...opts.argv,
    ];
  }

  protected override networkPrefix(state: SandboxState): string[] {
    return ['/usr/bin/nsenter', '-t', String(state.init!.ns.pid), '-n', '--'];
  }

  protected async teardown(id: string, state: SandboxState | undefined): Promise<void> {
    const cgroups = SandboxCgroups.of(id);
    signalRef(state?.init?.ns, 'SIGKILL');
    signalRef(state?.init?.outer, 'SIGKILL');
    // The init's death takes every process of its pid namespace with it; wait for that first, so
    // that the cgroups are usually empty by the time they are checked.
    await this.waitGone([state?.init?.ns, state?.init?.outer]);
    await cgroups.killAll();
    await this.waitGone([state?.entrypoint?.wrapper]);
    this.mountIds.delete(id);
    // Overlays mounted in the sandbox's own namespace went with its processes. Those on the host: a
    // sandbox of the sh path or of an older host (no hostMounts), or one whose state is unknown.
    if (!state?.init || state.hostMounts !== false) await unmountUnder(this.dirOf(id), this.spawner);
    await cgroups.remove();
  }

  override async checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[] }> {
    assertId(layerId, 'layer id');
    const state = this.stateOf(id);
    const target = path.join(this.layersDir(), layerId);
    if (await fsp.stat(target).then(() => true, () => false)) throw new SandboxError('conflict', `layer ${layerId} exists`);
    const tmp = `${target}.tmp-${process.pid}-${Date.now()}`;
    const cgroups = SandboxCgroups.of(id);
    await fsp.mkdir(tmp, { recursive: true });
    try {
      // Freeze the sandbox so the copy is consistent; cp -a keeps whiteouts (0/0 char devices) and
      // the trusted.overlay.* xattrs that mark opaque directories.
      await cgroups.pause();
      try {
        await execFileP('cp', ['-a', path.join(this.dirOf(id), 'upper', 'root'), path.join(this.dirOf(id), 'upper', 'usr'), tmp]);
      } finally {
        await cgroups.resume();
      }
      const parents = [...state.layers];
      await fsp.writeFile(
        path.join(tmp, 'layer.json'),
        JSON.stringify({ id: layerId, parents, sandboxId: id, createdAt: new Date().toISOString() }),
      );
      await fsp.rename(tmp, target);
      return { layerId, parents };
    } catch (err) {
      await fsp.rm(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  override async layerHash(layerId: string): Promise<string> {
    assertId(layerId, 'layer id');
    const dir = path.join(this.layersDir(), layerId);
    if (!(await fsp.stat(path.join(dir, 'layer.json')).then(() => true, () => false))) {
      throw new SandboxError('not_found', `layer ${layerId} not found`);
    }
    const hash = createHash('sha256');
    const walk = async (rel: string): Promise<void> => {
      const names = (await fsp.readdir(path.join(dir, rel))).sort();
      for (const name of names) {
        const r = rel ? `${rel}/${name}` : name;
        if (r === 'layer.json') continue;
        const abs = path.join(dir, r);
        const st = await fsp.lstat(abs);
        const mode = (st.mode & 0o7777).toString(8);
        if (st.isDirectory()) {
          hash.update(`d ${r} ${mode}\n`);
          await walk(r);
        } else if (st.isSymbolicLink()) {
          hash.update(`l ${r} ${await fsp.readlink(abs)}\n`);
        } else if (st.isFile()) {
          hash.update(`f ${r} ${mode} ${st.size}\n`);
          const fh = await fsp.open(abs, fsc.O_RDONLY | fsc.O_NOFOLLOW);
          try {
            const buf = Buffer.alloc(1 << 16);
            for (;;) {
              const { bytesRead } = await fh.read(buf, 0, buf.length, null);
              if (!bytesRead) break;
              hash.update(buf.subarray(0, bytesRead));
            }
          } finally {
            await fh.close();
          }
          hash.update('\n');
        } else {
          // Whiteouts (character devices 0/0) and other special files: type and device number.
          hash.update(`s ${r} ${mode} ${st.rdev}\n`);
        }
      }
    };
    await walk('');
    return hash.digest('hex');
  }
}

/**
 * Resolves once the sandbox's pid-1 (bwrap's own init, `pid`) has forked its command, which it
 * does only after the new root is mounted: rereads /proc/<pid>/task/<pid>/children every millisecond
 * (bwrap needs ~5–15 ms; polling on timers leaves the CPU to it).
 */
async function waitForInitChild(pid: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let fd: number;
  try {
    fd = openSync(`/proc/${pid}/task/${pid}/children`, 'r');
  } catch {
    throw new Error(`init process ${pid} is gone`);
  }
  try {
    const buf = Buffer.alloc(64);
    for (;;) {
      // A read at offset 0 makes procfs regenerate the list. It is read synchronously: a procfs
      // read never waits for a disk, and costs less than a trip through the thread pool.
      let bytesRead: number;
      try {
        bytesRead = readSync(fd, buf, 0, buf.length, 0);
      } catch {
        bytesRead = -1;
      }
      if (bytesRead > 0 && buf.subarray(0, bytesRead).toString('latin1').trim() !== '') return;
      if (bytesRead < 0 || !signalable(pid)) throw new Error(`init process ${pid} is gone`);
      if (Date.now() > deadline) throw new Error(`init did not start within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 1));
    }
  } finally {
    closeSync(fd);
  }
}

/** The init's pid from bwrap's info file (`--info-fd` written to a file), once `outerPid` has written it. */
async function waitForInfoFile(file: string, outerPid: number, timeoutMs: number): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let delay = 1;
  for (;;) {
    const text = await fsp.readFile(file, 'utf8').catch(() => '');
    try {
      const pid = (JSON.parse(text) as { 'child-pid'?: number })['child-pid'];
      if (pid) return pid;
      throw new Error('no child pid in bwrap info');
    } catch (err) {
      if (!(err instanceof SyntaxError)) throw err;
    }
    if (!signalable(outerPid)) {
      // It may have written the info just before exiting.
      const last = await fsp.readFile(file, 'utf8').catch(() => '');
      if (!last.includes('child-pid')) throw new Error('exited before starting');
    }
    if (Date.now() > deadline) throw new Error('timeout');
    // 1 ms at first (bwrap answers within a few), then less often: each look is a file read.
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 1.5, 8);
  }
}

/**
 * The ids of the overlay mounts on `/` and `/usr` in a mountinfo table: a sandbox's own trees. (Its
 * processes have no capability to mount anything else there.)
 */
export function sandboxMountIds(mountinfo: string): Set<number> {
  const ids = new Set<number>();
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-', 6);
    if (sep < 0 || f[sep + 1] !== 'overlay') continue;
    if (f[4] === '/' || f[4] === '/usr') ids.add(Number(f[0]));
  }
  return ids;
}

/** True while a process with this pid exists (signal 0 checks without sending anything). */
function signalable(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
