/**
 * Forwarded sandbox ports, on the host's side: one forwarder process per sandbox (see forwarder.ts),
 * started lazily when a port is first opened, inside the sandbox's network namespace. The preview proxy
 * (in the API, on the same machine) connects to the Unix socket `open` returns. A multi-machine
 * deployment would instead proxy through the host over TCP (the host relaying to the same sockets).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as readline from 'node:readline';
import type { Logger } from 'pino';
import { SandboxError } from '../../contract/errors';
import type { SandboxProvider } from '../driver';
import type { ForwarderCommand, ForwarderReply } from './forwarder';

/** Longest Unix socket path that fits sockaddr_un on Linux (108 bytes with the NUL), with margin. */
const MAX_SOCKET_PATH = 100;
const REPLY_TIMEOUT_MS = 10_000;

interface Forwarder {
  child: ChildProcess;
  ports: Set<number>;
  pending: Map<number, (r: ForwarderReply) => void>;
  seq: number;
}

/** The host's forwarded ports, by sandbox. */
export class PortForwarder {
  private readonly procs = new Map<string, Forwarder>();
  private readonly dir: string;
  /** Whether `dir` is a directory of its own under the temp dir (removed by closeAll), not the data dir's `fwd`. */
  private readonly dirIsTemp: boolean;

  constructor(
    private readonly provider: SandboxProvider,
    dataDir: string,
    private readonly log: Logger,
  ) {
    const preferred = path.join(dataDir, 'fwd');
    // Socket paths must stay short; a deep data dir gets a private directory under the temp dir.
    this.dirIsTemp = preferred.length + 40 > MAX_SOCKET_PATH;
    this.dir = this.dirIsTemp ? path.join(os.tmpdir(), `sap-fwd-${createHash('sha256').update(dataDir).digest('hex').slice(0, 12)}`) : preferred;
    fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    fs.chmodSync(this.dir, 0o700);
  }

  /** Where the socket of a sandbox port lives. */
  socketPath(id: string, port: number): string {
    return path.join(this.dir, `${id}.${port}.sock`);
  }

  /**
   * Makes `port` of sandbox `id` reachable at a Unix socket and returns its path. Idempotent.
   * Throws not_found for an unknown sandbox, conflict for a stopped one.
   */
  async open(id: string, port: number): Promise<string> {
    const prefix = this.provider.networkArgv(id);
    const socket = this.socketPath(id, port);
    let f = this.procs.get(id);
    if (f && f.ports.has(port) && fs.existsSync(socket)) return socket;
    if (!f || f.child.exitCode !== null || f.child.signalCode !== null) f = this.start(id, prefix);
    await this.send(f, { op: 'open', port, path: socket });
    f.ports.add(port);
    return socket;
  }

  /** Stops forwarding `port`; its socket disappears. */
  async close(id: string, port: number): Promise<void> {
    const f = this.procs.get(id);
    if (!f || !f.ports.has(port)) return;
    f.ports.delete(port);
    await this.send(f, { op: 'close', port }).catch(() => undefined);
    fs.rmSync(this.socketPath(id, port), { force: true });
    if (f.ports.size === 0) this.stop(id);
  }

  /** Stops the sandbox's forwarder (its sandbox is being destroyed). */
  dropSandbox(id: string): void {
    this.stop(id);
  }

  /** Stops every forwarder (the host is shutting down); a directory of its own under the temp dir goes too, once empty. */
  closeAll(): void {
    for (const id of [...this.procs.keys()]) this.stop(id);
    if (this.dirIsTemp) {
      try {
        fs.rmdirSync(this.dir);
      } catch {
        /* not empty (another host process with the same data dir), or gone */
      }
    }
  }

  private stop(id: string): void {
    const f = this.procs.get(id);
    if (!f) return;
    this.procs.delete(id);
    f.child.stdin?.end();
    f.child.kill('SIGTERM');
    for (const port of f.ports) fs.rmSync(this.socketPath(id, port), { force: true });
  }

  private start(id: string, prefix: string[]): Forwarder {
    const script = path.join(__dirname, 'forwarder.js');
    const argv = [...prefix, process.execPath, script];
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    const f: Forwarder = { child, ports: new Set(), pending: new Map(), seq: 0 };
    const failAll = (why: string) => {
      for (const [seq, resolve] of f.pending) resolve({ seq, ok: false, error: why });
      f.pending.clear();
    };
    readline.createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const r = JSON.parse(line) as ForwarderReply;
        f.pending.get(r.seq)?.(r);
        f.pending.delete(r.seq);
      } catch {
        /* not a reply */
      }
    });
    let stderr = '';
    child.stderr!.on('data', (b: Buffer) => {
      stderr = (stderr + b.toString('utf8')).slice(-2000);
    });
    child.on('error', (err) => failAll(`forwarder failed to start: ${err.message}`));
    child.on('exit', (code, signal) => {
      failAll(`forwarder exited (${signal ?? code}): ${stderr.trim()}`);
      if (this.procs.get(id) === f) this.procs.delete(id);
      if (code !== 0 && signal !== 'SIGTERM') this.log.warn({ sandboxId: id, code, signal, stderr: stderr.trim() }, 'port forwarder exited');
    });
    this.procs.set(id, f);
    return f;
  }

  private send(f: Forwarder, cmd: { op: 'open'; port: number; path: string } | { op: 'close'; port: number }): Promise<void> {
    const seq = ++f.seq;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        f.pending.delete(seq);
        reject(new SandboxError('internal', 'port forwarder did not answer'));
      }, REPLY_TIMEOUT_MS);
      f.pending.set(seq, (r) => {
        clearTimeout(timer);
        if (r.ok) resolve();
        else reject(new SandboxError('internal', `port forwarding failed: ${r.error}`));
      });
      const line: ForwarderCommand = { ...cmd, seq };
      f.child.stdin!.write(`${JSON.stringify(line)}\n`);
    });
  }
}
