/**
 * Typed client of the sandbox host's HTTP API (see server.ts), over node:http with a keep-alive agent.
 * Every method throws HostError for an error answer; a network failure is thrown as node:http reports
 * it (an Error with `code`, e.g. ECONNREFUSED).
 */
import type { HostCapacity } from '../../contract/hosts';
import * as http from 'node:http';
import * as https from 'node:https';
import { WebSocket } from 'ws';
import { ExecStream, type ExecStreamHandlers } from './exec-stream';
import type { Readable } from 'node:stream';
import type { SandboxEntry } from './types';
import { HostError } from '../../contract/errors';
import type {
  CreatedSandbox,
  CreateSandboxRequest,
  EntrypointSpec,
  EntrypointStatus,
  ExecRequest,
  ExecRunResult,
  ExecExitsAnswer,
  ExecSessionInfo,
  SandboxInfo,
  SandboxMetrics,
  SandboxMetricsEntry,
  ScaleRequest,
  ScaleResult,
  WireEntrypointLog,
} from './types';

export { HostError };

export { decodeExecFrame, encodeStdinFrame, type ExecFrame } from './exec-frames';

/** The HostError of an error answer read whole (its `{ error: { type, message } }` body, else `fallback`). */
function errorOf(res: http.IncomingMessage, fallback: string): Promise<HostError> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('error', () => resolve(new HostError('internal', res.statusCode ?? 0, fallback)));
    res.on('end', () => {
      let err: { type?: string; message?: string } | undefined;
      try {
        err = (JSON.parse(Buffer.concat(chunks).toString('utf8')) as { error?: { type?: string; message?: string } }).error;
      } catch {
        /* not our error body */
      }
      resolve(new HostError(err?.type ?? 'internal', res.statusCode ?? 0, err?.message ?? fallback));
    });
  });
}

/** Where the host is and how to authenticate. */
export interface HostClientOptions {
  /** e.g. http://127.0.0.1:7300 */
  url: string;
  token: string;
}

type Query = Record<string, string | number | undefined>;

/** How many times a request is sent when each try lands on a kept-alive connection the host had closed. */
const STALE_SOCKET_RETRIES = 16;

/** Client of one sandbox host. */
export class HostClient {
  private readonly base: string;
  private readonly token: string;
  private readonly secure: boolean;
  /** Keeps connections to the host open between calls (idle sockets do not keep the process alive). */
  private readonly agent: http.Agent;

  constructor(opts: HostClientOptions) {
    this.base = opts.url.replace(/\/+$/, '');
    this.token = opts.token;
    this.secure = this.base.startsWith('https:');
    this.agent = new (this.secure ? https : http).Agent({ keepAlive: true });
  }

  /** The base URL of the host (e.g. for building WebSocket addresses). */
  get url(): string {
    return this.base;
  }

  private async call<T>(method: string, path: string, opts: { body?: unknown; query?: Query; signal?: AbortSignal } = {}): Promise<T> {
    let url = this.base + path;
    const q = Object.entries(opts.query ?? {}).filter(([, v]) => v !== undefined) as [string, string | number][];
    if (q.length) url += '?' + new URLSearchParams(q.map(([k, v]): [string, string] => [k, String(v)])).toString();
    const body = opts.body === undefined ? undefined : Buffer.from(JSON.stringify(opts.body));
    const headers: Record<string, string | number> = { authorization: `Bearer ${this.token}` };
    if (body) Object.assign(headers, { 'content-type': 'application/json', 'content-length': body.length });
    let res: { status: number; text: string } | undefined;
    // The host closes kept-alive connections that sat idle: a request sent on one just as it was
    // closed never reached the host, and is sent again (on the next pooled one, then a new one).
    for (let attempt = 1; !res; attempt++) {
      try {
        res = await this.send(url, method, headers, body, opts.signal);
      } catch (err) {
        const e = err as { code?: string; reusedSocket?: boolean };
        if (!(e.reusedSocket && e.code === 'ECONNRESET' && attempt < STALE_SOCKET_RETRIES)) throw err;
      }
    }
    let parsed: unknown;
    try {
      parsed = res.text ? JSON.parse(res.text) : undefined;
    } catch {
      parsed = undefined;
    }
    if (res.status < 200 || res.status > 299) {
      const err = (parsed as { error?: { type?: string; message?: string } } | undefined)?.error;
      throw new HostError(err?.type ?? 'internal', res.status, err?.message ?? `host answered ${res.status}: ${res.text.slice(0, 200)}`);
    }
    return parsed as T;
  }

  /** One HTTP exchange on the client's keep-alive agent; resolves with the status and the body as text. */
  private send(
    url: string,
    method: string,
    headers: Record<string, string | number>,
    body: Buffer | undefined,
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; text: string }> {
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(url, { method, headers, agent: this.agent, signal }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
      });
      req.on('error', (err: Error & { reusedSocket?: boolean }) => {
        err.reusedSocket = req.reusedSocket;
        reject(err);
      });
      req.end(body);
    });
  }

  /** Liveness of the host; `signal` bounds the wait (readiness probes). */
  health(opts: { signal?: AbortSignal } = {}): Promise<{ ok: boolean; hostId: string; provider: string } & HostCapacity> {
    return this.call('GET', '/healthz', { signal: opts.signal });
  }

  /** Creates a sandbox (idempotent on `req.id`: an existing one is returned as is). Throws HostError patch_failed, not_found (layer), invalid_request. */
  createSandbox(req: CreateSandboxRequest): Promise<CreatedSandbox> {
    return this.call('POST', '/sandboxes', { body: req });
  }

  /** Sandboxes of the host; `owner` is an owner kind (`session`) or `kind:id`. */
  listSandboxes(filter: { owner?: string } = {}): Promise<SandboxInfo[]> {
    return this.call('GET', '/sandboxes', { query: { owner: filter.owner } });
  }

  /** The sandbox, or null when the host does not know it. */
  async getSandbox(id: string): Promise<SandboxInfo | null> {
    try {
      return await this.call<SandboxInfo>('GET', `/sandboxes/${encodeURIComponent(id)}`);
    } catch (err) {
      if (err instanceof HostError && err.status === 404) return null;
      throw err;
    }
  }

  /** Replaces a running sandbox's egress policy at once; answers the sandbox with its new policy. */
  async setNetwork(id: string, network: { egress: 'internet' | 'none' | { allow: string[] } }): Promise<SandboxInfo> {
    return this.call<SandboxInfo>('PUT', `/sandboxes/${encodeURIComponent(id)}/network`, { body: network });
  }

  /** A running sandbox's metrics (see SandboxMetrics); 409 when it is not running. */
  sandboxMetrics = (id: string) => this.call<SandboxMetrics>('GET', `/sandboxes/${encodeURIComponent(id)}/metrics`);
  /** Resizes a running sandbox's memory and CPU limits at once; answers the limits in force. */
  scaleSandbox = (id: string, req: ScaleRequest) => this.call<ScaleResult>('POST', `/sandboxes/${encodeURIComponent(id)}/scale`, { body: req });
  /** The metrics of at most `limit` running sandboxes of the host, the largest memory users first, and how many run. */
  busiestSandboxes = (limit: number) => this.call<{ total: number; sandboxes: SandboxMetricsEntry[] }>('GET', '/metrics/sandboxes', { query: { limit } });

  /** Kills everything in the sandbox and removes it; false when it did not exist. */
  async destroySandbox(id: string): Promise<boolean> {
    const r = await this.call<{ destroyed: boolean }>('DELETE', `/sandboxes/${encodeURIComponent(id)}`);
    return r.destroyed;
  }

  /**
   * Makes `port` inside the sandbox reachable at a Unix socket on the host's machine and returns its
   * path (idempotent). Only for a client on the same machine as the host (the preview proxy).
   */
  async openPortForward(id: string, port: number): Promise<string> {
    return (await this.portForward(id, port)).socketPath;
  }

  /** Like openPortForward, with the name of the host's machine (lib/machine.ts), to tell whether the socket is reachable from here. */
  portForward(id: string, port: number): Promise<{ socketPath: string; machine?: string }> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/ports/${port}/forward`);
  }

  /** Streams layer `layerId` as a tar archive, with the content hash the receiver checks. Throws HostError not_found. */
  layerArchive(layerId: string): Promise<{ sha256: string; stream: http.IncomingMessage }> {
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(`${this.base}/layers/${encodeURIComponent(layerId)}/archive`, {
        headers: { authorization: `Bearer ${this.token}` },
      });
      req.once('response', (res) => {
        const sha256 = res.headers['x-layer-sha256'];
        if (res.statusCode === 200 && typeof sha256 === 'string') return resolve({ sha256, stream: res });
        errorOf(res, `host answered ${res.statusCode} for layer ${layerId}`).then(reject);
      });
      req.once('error', reject);
      req.end();
    });
  }

  /** Makes layer `layerId` (and its parents) present on this host, fetched from the host at `from` when missing. */
  fetchLayer(layerId: string, from: string): Promise<{ layerId: string; fetched: string[]; ms: number }> {
    return this.call('POST', `/layers/${encodeURIComponent(layerId)}/fetch`, { body: { from } });
  }

  /**
   * A raw byte pipe to 127.0.0.1:`port` inside sandbox `id`, through the host's HTTP port (an upgrade
   * to `sap-tunnel`): for a client on another machine than the host. Throws HostError for the host's
   * error answer (not_found, conflict for a hibernated sandbox, internal when nothing listens).
   */
  openTunnel(id: string, port: number, timeoutMs = 10_000): Promise<import('node:net').Socket> {
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(`${this.base}/sandboxes/${encodeURIComponent(id)}/ports/${port}/tunnel`, {
        headers: { authorization: `Bearer ${this.token}`, connection: 'Upgrade', upgrade: 'sap-tunnel' },
        timeout: timeoutMs,
      });
      req.once('upgrade', (_res, socket, head) => {
        socket.setTimeout(0);
        if (head.length) socket.unshift(head);
        resolve(socket as import('node:net').Socket);
      });
      req.once('response', (res) => {
        errorOf(res, `host answered ${res.statusCode} to a tunnel`).then(reject);
      });
      req.once('timeout', () => req.destroy(new Error(`host ${this.base} did not open a tunnel within ${timeoutMs} ms`)));
      req.once('error', reject);
      req.end();
    });
  }

  /** Stops forwarding `port`: its socket is removed. */
  async closePortForward(id: string, port: number): Promise<void> {
    await this.call('DELETE', `/sandboxes/${encodeURIComponent(id)}/ports/${port}/forward`);
  }

  /** Writes a file (parents created) at an absolute path inside the sandbox. */
  async writeFile(id: string, path: string, content: string | Buffer, opts: { mode?: number } = {}): Promise<void> {
    const body =
      typeof content === 'string'
        ? { path, content, encoding: 'utf8', mode: opts.mode }
        : { path, content: content.toString('base64'), encoding: 'base64', mode: opts.mode };
    await this.call('PUT', `/sandboxes/${encodeURIComponent(id)}/files`, { body });
  }

  /** Reads a file; null when it (or the sandbox) does not exist. Throws HostError payload_too_large over maxBytes. */
  async readFile(id: string, path: string, opts: { maxBytes?: number } = {}): Promise<Buffer | null> {
    try {
      const r = await this.call<{ content: string }>('GET', `/sandboxes/${encodeURIComponent(id)}/files`, {
        query: { path, maxBytes: opts.maxBytes },
      });
      return Buffer.from(r.content, 'base64');
    } catch (err) {
      if (err instanceof HostError && err.type === 'not_found') return null;
      throw err;
    }
  }

  /**
   * Opens a file of the sandbox for streaming: resolves with the host's answer (its body the file's
   * bytes, `content-length` its size) once the host has found the file; the caller reads or destroys
   * it. Throws HostError (not_found, invalid_request for a directory…).
   */
  openFileStream(id: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<http.IncomingMessage> {
    return this.raw('GET', `/sandboxes/${encodeURIComponent(id)}/fs`, { path }, undefined, opts.signal);
  }

  /** Streams `body` into a file of the sandbox (parents created, truncated first); resolves with its size. */
  async uploadFile(id: string, path: string, body: Readable, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<{ path: string; size: number }> {
    const res = await this.raw('PUT', `/sandboxes/${encodeURIComponent(id)}/fs`, { path, mode: opts.mode?.toString(8) }, body, opts.signal);
    return JSON.parse((await readAll(res)).toString('utf8')) as { path: string; size: number };
  }

  /** Entries of a directory of the sandbox (lstat of each). */
  listDir(id: string, path: string): Promise<SandboxEntry[]> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/fs/list`, { query: { path } });
  }

  /** stat of a path of the sandbox (`noFollow`: lstat). Throws HostError not_found. */
  statPath(id: string, path: string, opts: { noFollow?: boolean } = {}): Promise<SandboxEntry> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/fs/stat`, { query: { path, noFollow: opts.noFollow ? 'true' : undefined } });
  }

  /** mkdir -p inside the sandbox; answers the directory's entry. */
  makeDir(id: string, path: string): Promise<SandboxEntry> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/fs/mkdir`, { body: { path } });
  }

  /** Renames a path inside the sandbox; answers the entry at its new path. */
  renamePath(id: string, from: string, to: string): Promise<SandboxEntry> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/fs/rename`, { body: { from, to } });
  }

  /** Removes a path (a tree too, unless `recursive` is false). Throws HostError not_found. */
  async removePath(id: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.call('DELETE', `/sandboxes/${encodeURIComponent(id)}/fs`, { query: { path, recursive: opts.recursive === false ? 'false' : undefined } });
  }

  /** A request whose answer is streamed back (2xx) or thrown as HostError; `body` is streamed out. */
  private raw(method: string, path: string, query: Query, body: Readable | undefined, signal: AbortSignal | undefined): Promise<http.IncomingMessage> {
    const q = Object.entries(query).filter(([, v]) => v !== undefined) as [string, string | number][];
    const url = this.base + path + (q.length ? '?' + new URLSearchParams(q.map(([k, v]): [string, string] => [k, String(v)])).toString() : '');
    const headers: Record<string, string> = { authorization: `Bearer ${this.token}` };
    if (body) headers['content-type'] = 'application/octet-stream';
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(url, { method, headers, agent: this.agent, signal }, (res) => {
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) return resolve(res);
        readAll(res).then((buf) => {
          let err: { type?: string; message?: string } | undefined;
          try {
            err = (JSON.parse(buf.toString('utf8')) as { error?: { type?: string; message?: string } }).error;
          } catch {
            err = undefined;
          }
          reject(new HostError(err?.type ?? 'internal', status, err?.message ?? `host answered ${status}`));
        }, reject);
      });
      req.on('error', reject);
      if (!body) {
        req.end();
        return;
      }
      body.on('error', (err) => req.destroy(err));
      body.pipe(req);
    });
  }

  /** Starts the sandbox's entrypoint. Throws HostError conflict when one was started already. */
  startEntrypoint(id: string, spec: EntrypointSpec): Promise<EntrypointStatus> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/entrypoint`, { body: spec });
  }

  /** The entrypoint's status; with `waitMs` (max 30000) the host waits for a running entrypoint to exit. */
  entrypointStatus(id: string, opts: { waitMs?: number; signal?: AbortSignal } = {}): Promise<EntrypointStatus> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/entrypoint`, { query: { waitMs: opts.waitMs }, signal: opts.signal });
  }

  /** The entrypoint's stdout and stderr in the order written: the last `maxBytes` of each. */
  entrypointLog(id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}): Promise<WireEntrypointLog> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/entrypoint/log`, {
      query: { maxBytes, sinceStdout: since.stdout, sinceStderr: since.stderr },
    });
  }

  /** The last `maxBytes` (default 1 MiB) of the entrypoint's stdout or stderr. */
  async entrypointOutput(id: string, opts: { stream?: 'stdout' | 'stderr'; maxBytes?: number } = {}): Promise<Buffer> {
    const r = await this.call<{ content: string }>('GET', `/sandboxes/${encodeURIComponent(id)}/entrypoint/output`, {
      query: { stream: opts.stream, maxBytes: opts.maxBytes },
    });
    return Buffer.from(r.content, 'base64');
  }

  /** Captures the sandbox's writable layer as read-only layer `checkpointId`. Throws HostError conflict when it exists. */
  createCheckpoint(id: string, checkpointId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/checkpoints`, { body: { checkpointId } });
  }

  /** Hibernates a running sandbox into layer `layerId` (see BaseProvider.hibernate); idempotent. */
  hibernate(id: string, layerId: string): Promise<{ layerId: string; parents: string[] }> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/hibernate`, { body: { layerId } });
  }

  /**
   * Wakes a hibernated sandbox, running `patches` first. Throws HostError not_found, conflict,
   * patch_failed (not with `keepOnPatchFailure`: the chain stops and the answer's `patches` say where).
   */
  wake(id: string, patches: { id: string; script: string }[] = [], opts: { keepOnPatchFailure?: boolean } = {}): Promise<SandboxInfo> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/wake`, { body: { patches, ...opts } });
  }

  /** Puts a running sandbox back to checkpoint layer `layerId` in place (its processes end), then runs `patches`. */
  restore(id: string, layerId: string, patches: { id: string; script: string }[] = []): Promise<SandboxInfo> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/restore`, { body: { layerId, patches } });
  }

  /** Deletes a layer (kept until its last user on the host is gone); false when it did not exist. */
  async deleteLayer(layerId: string): Promise<boolean> {
    const r = await this.call<{ deleted: boolean }>('DELETE', `/layers/${encodeURIComponent(layerId)}`);
    return r.deleted;
  }

  /** sha256 (hex) over the layer's own files. Throws HostError not_found. */
  async layerHash(layerId: string): Promise<string> {
    const r = await this.call<{ sha256: string }>('GET', `/layers/${encodeURIComponent(layerId)}/hash`);
    return r.sha256;
  }

  /** Starts an exec session inside the sandbox; attach to its output with `execWebSocketUrl`. */
  createExec(id: string, req: ExecRequest): Promise<ExecSessionInfo> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/exec`, { body: req });
  }

  /** Exec sessions' exits as they happen (see ExecExitsAnswer); waits up to waitMs (≤ 30000) for one. */
  execExits(opts: { epoch?: string; after: number; waitMs?: number; signal?: AbortSignal }): Promise<ExecExitsAnswer> {
    return this.call('GET', '/exec-exits', { query: { epoch: opts.epoch, after: opts.after, waitMs: opts.waitMs }, signal: opts.signal });
  }

  /** Exec sessions of a sandbox. */
  listExec(id: string): Promise<ExecSessionInfo[]> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/exec`);
  }

  /** One exec session. Throws HostError not_found. */
  getExec(id: string, sessionId: string): Promise<ExecSessionInfo> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/exec/${encodeURIComponent(sessionId)}`);
  }

  /** An exec session with its output so far (the last 1 MiB of each stream); `waitMs` (≤ 30000) waits for its exit first. */
  execResult(
    id: string,
    sessionId: string,
    opts: { waitMs?: number; signal?: AbortSignal } = {},
  ): Promise<ExecSessionInfo & { timedOut: boolean; stdout: string; stderr: string; truncated?: boolean }> {
    return this.call('GET', `/sandboxes/${encodeURIComponent(id)}/exec/${encodeURIComponent(sessionId)}/result`, {
      query: { waitMs: opts.waitMs },
      signal: opts.signal,
    });
  }

  /** Signals an exec session's process group (default SIGKILL). */
  killExec(id: string, sessionId: string, signal?: string): Promise<ExecSessionInfo> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/exec/${encodeURIComponent(sessionId)}/kill`, { body: { signal } });
  }

  /** Runs a command to completion and returns its output; a non-zero exit is a result, not an error. */
  execRun(id: string, req: ExecRequest & { stdin?: string }, opts: { signal?: AbortSignal } = {}): Promise<ExecRunResult> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/exec/run`, { body: req, signal: opts.signal });
  }

  /** Starts a login shell on a terminal of the sandbox (see ./pty). */
  createPty(id: string, req: { cols?: number; rows?: number; envs?: Record<string, string>; cwd?: string }): Promise<import('../host/pty').PtyInfo> {
    return this.call('POST', `/sandboxes/${encodeURIComponent(id)}/pty`, { body: req });
  }

  /** Opens a WebSocket attached to a terminal: binary frames of output; send keystrokes or a resize message. */
  openPtySocket(id: string, sessionId: string): WebSocket {
    const url = `${this.base.replace(/^http/, 'ws')}/sandboxes/${encodeURIComponent(id)}/pty/${encodeURIComponent(sessionId)}/ws`;
    return new WebSocket(url, { headers: { authorization: `Bearer ${this.token}` }, perMessageDeflate: false });
  }

  /** Opens a WebSocket attached to an exec session (decode its messages with `decodeExecFrame`). */
  openExecSocket(id: string, sessionId: string): WebSocket {
    return new WebSocket(this.execWebSocketUrl(id, sessionId), { headers: { authorization: `Bearer ${this.token}` }, perMessageDeflate: false });
  }

  /**
   * Opens an exec session's WebSocket for relaying: frames arrive as received, undecoded and
   * uncopied (see ExecStream). Use openExecSocket to read frames as messages.
   */
  openExecStream(id: string, sessionId: string, handlers: ExecStreamHandlers): ExecStream {
    return new ExecStream(this.execWebSocketUrl(id, sessionId), this.token, handlers);
  }

  /** The WebSocket address to attach to an exec session (send the same bearer token in `authorization`). */
  execWebSocketUrl(id: string, sessionId: string): string {
    return `${this.base.replace(/^http/, 'ws')}/sandboxes/${encodeURIComponent(id)}/exec/${encodeURIComponent(sessionId)}/ws`;
  }
}

/** Reads an answer's body whole (error bodies and small JSON answers only). */
function readAll(res: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('error', reject);
    res.on('end', () => resolve(Buffer.concat(chunks)));
  });
}
