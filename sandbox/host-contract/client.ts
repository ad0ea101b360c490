/**
 * Typed client of the sandbox host's HTTP API, over node:http with a keep-alive agent. Each call goes
 * to the method and path its route declares in ./wire.ts; its request and answer types are the
 * declaration's (the request's inferred from the schema the host validates it with).
 * Every method throws HostError for an error answer; a network failure is thrown as node:http reports
 * it (an Error with `code`, e.g. ECONNREFUSED).
 */
import type { HostCapacity } from '../../contract/hosts';
import * as http from 'node:http';
import * as https from 'node:https';
import { WebSocket } from 'ws';
import { ExecStream, type ExecStreamHandlers } from './exec-stream';
import { ExecFramesReader, type ExecFramesHandlers } from './exec-frames-reader';
import { hostErrorOf } from './host-error';
import type { Readable } from 'node:stream';
import { HostError } from '../../contract/errors';
import type { CreateSandboxRequest, EntrypointSpec, ExecRequest, PtyInfo, ScaleRequest, SandboxEntry, SandboxInfo } from './types';
import { hostPath, hostRoutes, hostSockets, TUNNEL_PROTOCOL, type HostRoute, type RouteAnswer, type RouteRequest } from './wire';

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
    if (res.status < 200 || res.status > 299) throw hostErrorOf(res.status, res.text);
    try {
      return (res.text ? JSON.parse(res.text) : undefined) as T;
    } catch {
      return undefined as T;
    }
  }

  /** Sends a declared route's request (`params` fill its path); resolves with its JSON answer. */
  private request<R extends HostRoute>(route: R, req: RouteRequest<R>, opts: { signal?: AbortSignal } = {}): Promise<RouteAnswer<R>> {
    const { params, query, body } = req as { params?: Record<string, unknown>; query?: Query; body?: unknown };
    return this.call<RouteAnswer<R>>(route.method, hostPath(route.path, params), { body, query, signal: opts.signal });
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
    return this.request(hostRoutes.health, {}, opts);
  }

  /** Creates a sandbox (idempotent on `req.id`: an existing one is returned as is). Throws HostError patch_failed, not_found (layer), invalid_request. */
  createSandbox(req: CreateSandboxRequest) {
    return this.request(hostRoutes.createSandbox, { body: req });
  }

  /** Sandboxes of the host; `owner` is an owner kind (`session`) or `kind:id`. */
  listSandboxes(filter: { owner?: string } = {}) {
    return this.request(hostRoutes.listSandboxes, { query: { owner: filter.owner } });
  }

  /** The sandbox, or null when the host does not know it. */
  async getSandbox(id: string): Promise<SandboxInfo | null> {
    try {
      return await this.request(hostRoutes.getSandbox, { params: { id } });
    } catch (err) {
      if (err instanceof HostError && err.status === 404) return null;
      throw err;
    }
  }

  /** Replaces a running sandbox's egress policy at once; answers the sandbox with its new policy. */
  async setNetwork(id: string, network: { egress: 'internet' | 'none' | { allow: string[] } }): Promise<SandboxInfo> {
    return this.request(hostRoutes.setNetwork, { params: { id }, body: network });
  }

  /** A running sandbox's metrics (see SandboxMetrics); 409 when it is not running. */
  sandboxMetrics = (id: string) => this.request(hostRoutes.sandboxMetrics, { params: { id } });
  /** Resizes a running sandbox's memory and CPU limits at once; answers the limits in force. */
  scaleSandbox = (id: string, req: ScaleRequest) => this.request(hostRoutes.scaleSandbox, { params: { id }, body: req });
  /** The metrics of at most `limit` running sandboxes of the host, the largest memory users first, and how many run. */
  busiestSandboxes = (limit: number) => this.request(hostRoutes.busiestSandboxes, { query: { limit } });

  /** Kills everything in the sandbox and removes it; false when it did not exist. */
  async destroySandbox(id: string): Promise<boolean> {
    const r = await this.request(hostRoutes.destroySandbox, { params: { id } });
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
  portForward(id: string, port: number) {
    return this.request(hostRoutes.openPortForward, { params: { id, port } });
  }

  /** Streams layer `layerId` as a tar archive, with the content hash the receiver checks. Throws HostError not_found. */
  layerArchive(layerId: string): Promise<{ sha256: string; stream: http.IncomingMessage }> {
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(this.base + hostPath(hostRoutes.layerArchive.path, { layerId }), {
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
  fetchLayer(layerId: string, from: string) {
    return this.request(hostRoutes.fetchLayer, { params: { layerId }, body: { from } });
  }

  /**
   * A raw byte pipe to 127.0.0.1:`port` inside sandbox `id`, through the host's HTTP port (an upgrade
   * to `sap-tunnel`): for a client on another machine than the host. Throws HostError for the host's
   * error answer (not_found, conflict for a hibernated sandbox, internal when nothing listens).
   */
  openTunnel(id: string, port: number, timeoutMs = 10_000): Promise<import('node:net').Socket> {
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(this.base + hostPath(hostSockets.tunnel, { id, port }), {
        headers: { authorization: `Bearer ${this.token}`, connection: 'Upgrade', upgrade: TUNNEL_PROTOCOL },
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
    await this.request(hostRoutes.closePortForward, { params: { id, port } });
  }

  /** Writes a file (parents created) at an absolute path inside the sandbox. */
  async writeFile(id: string, path: string, content: string | Buffer, opts: { mode?: number } = {}): Promise<void> {
    const body =
      typeof content === 'string'
        ? { path, content, encoding: 'utf8' as const, mode: opts.mode }
        : { path, content: content.toString('base64'), encoding: 'base64' as const, mode: opts.mode };
    await this.request(hostRoutes.writeFile, { params: { id }, body });
  }

  /** Reads a file; null when it (or the sandbox) does not exist. Throws HostError payload_too_large over maxBytes. */
  async readFile(id: string, path: string, opts: { maxBytes?: number } = {}): Promise<Buffer | null> {
    try {
      const r = await this.request(hostRoutes.readFile, { params: { id }, query: { path, maxBytes: opts.maxBytes } });
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
    return this.raw(hostRoutes.downloadFile, { params: { id }, query: { path } }, undefined, opts.signal);
  }

  /** Streams `body` into a file of the sandbox (parents created, truncated first); resolves with its size. */
  async uploadFile(id: string, path: string, body: Readable, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<{ path: string; size: number }> {
    const res = await this.raw(hostRoutes.uploadFile, { params: { id }, query: { path, mode: opts.mode?.toString(8) } }, body, opts.signal);
    return JSON.parse((await readAll(res)).toString('utf8')) as RouteAnswer<typeof hostRoutes.uploadFile>;
  }

  /** Entries of a directory of the sandbox (lstat of each). */
  listDir(id: string, path: string): Promise<SandboxEntry[]> {
    return this.request(hostRoutes.listDir, { params: { id }, query: { path } });
  }

  /** stat of a path of the sandbox (`noFollow`: lstat). Throws HostError not_found. */
  statPath(id: string, path: string, opts: { noFollow?: boolean } = {}): Promise<SandboxEntry> {
    return this.request(hostRoutes.statPath, { params: { id }, query: { path, noFollow: opts.noFollow ? 'true' : undefined } });
  }

  /** mkdir -p inside the sandbox; answers the directory's entry. */
  makeDir(id: string, path: string): Promise<SandboxEntry> {
    return this.request(hostRoutes.makeDir, { params: { id }, body: { path } });
  }

  /** Renames a path inside the sandbox; answers the entry at its new path. */
  renamePath(id: string, from: string, to: string): Promise<SandboxEntry> {
    return this.request(hostRoutes.renamePath, { params: { id }, body: { from, to } });
  }

  /** Removes a path (a tree too, unless `recursive` is false). Throws HostError not_found. */
  async removePath(id: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.request(hostRoutes.removePath, { params: { id }, query: { path, recursive: opts.recursive === false ? 'false' : undefined } });
  }

  /** A request whose answer is streamed back (2xx) or thrown as HostError; `body` is streamed out. */
  private raw<R extends HostRoute>(
    route: R,
    args: RouteRequest<R>,
    body: Readable | undefined,
    signal: AbortSignal | undefined,
  ): Promise<http.IncomingMessage> {
    const { method } = route;
    const { params, query = {} } = args as { params?: Record<string, unknown>; query?: Query };
    const q = Object.entries(query).filter(([, v]) => v !== undefined) as [string, string | number][];
    const url =
      this.base + hostPath(route.path, params) + (q.length ? '?' + new URLSearchParams(q.map(([k, v]): [string, string] => [k, String(v)])).toString() : '');
    const headers: Record<string, string> = { authorization: `Bearer ${this.token}` };
    if (body) headers['content-type'] = 'application/octet-stream';
    return new Promise((resolve, reject) => {
      const req = (this.secure ? https : http).request(url, { method, headers, agent: this.agent, signal }, (res) => {
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) return resolve(res);
        // Refused (a full disk, say), maybe before the body's end: the rest of the body is not sent,
        // so the caller's own client is not read further either (the API answers it with
        // `Connection: close`, api/app.ts) instead of the whole body passing through to be dropped.
        if (body) body.unpipe(req);
        readAll(res).then((buf) => {
          let err: { type?: string; message?: string } | undefined;
          try {
            err = (JSON.parse(buf.toString('utf8')) as { error?: { type?: string; message?: string } }).error;
          } catch {
            err = undefined;
          }
          reject(new HostError(err?.type ?? 'internal', status, err?.message ?? `host answered ${status}`));
          // A request whose body will never end cannot be followed by another on its connection: drop it.
          if (body && !req.writableEnded) req.destroy();
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
  startEntrypoint(id: string, spec: EntrypointSpec) {
    return this.request(hostRoutes.startEntrypoint, { params: { id }, body: spec });
  }

  /** The entrypoint's status; with `waitMs` (max 30000) the host waits for a running entrypoint to exit. */
  entrypointStatus(id: string, opts: { waitMs?: number; signal?: AbortSignal } = {}) {
    return this.request(hostRoutes.entrypointStatus, { params: { id }, query: { waitMs: opts.waitMs } }, opts);
  }

  /** The entrypoint's stdout and stderr in the order written: the last `maxBytes` of each. */
  entrypointLog(id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}) {
    return this.request(hostRoutes.entrypointLog, { params: { id }, query: { maxBytes, sinceStdout: since.stdout, sinceStderr: since.stderr } });
  }

  /** The last `maxBytes` (default 1 MiB) of the entrypoint's stdout or stderr. */
  async entrypointOutput(id: string, opts: { stream?: 'stdout' | 'stderr'; maxBytes?: number } = {}): Promise<Buffer> {
    const r = await this.request(hostRoutes.entrypointOutput, { params: { id }, query: { stream: opts.stream, maxBytes: opts.maxBytes } });
    return Buffer.from(r.content, 'base64');
  }

  /** Captures the sandbox's writable layer as read-only layer `checkpointId`. Throws HostError conflict when it exists. */
  createCheckpoint(id: string, checkpointId: string) {
    return this.request(hostRoutes.createCheckpoint, { params: { id }, body: { checkpointId } });
  }

  /** Hibernates a running sandbox into layer `layerId` (see BaseProvider.hibernate); idempotent. */
  hibernate(id: string, layerId: string) {
    return this.request(hostRoutes.hibernate, { params: { id }, body: { layerId } });
  }

  /**
   * Wakes a hibernated sandbox, running `patches` first. Throws HostError not_found, conflict,
   * patch_failed (not with `keepOnPatchFailure`: the chain stops and the answer's `patches` say where).
   */
  wake(id: string, patches: { id: string; script: string }[] = [], opts: { keepOnPatchFailure?: boolean } = {}): Promise<SandboxInfo> {
    return this.request(hostRoutes.wake, { params: { id }, body: { patches, ...opts } });
  }

  /** Puts a running sandbox back to checkpoint layer `layerId` in place (its processes end), then runs `patches`. */
  restore(id: string, layerId: string, patches: { id: string; script: string }[] = []): Promise<SandboxInfo> {
    return this.request(hostRoutes.restore, { params: { id }, body: { layerId, patches } });
  }

  /** Deletes a layer (kept until its last user on the host is gone); false when it did not exist. */
  async deleteLayer(layerId: string): Promise<boolean> {
    const r = await this.request(hostRoutes.deleteLayer, { params: { layerId } });
    return r.deleted;
  }

  /** sha256 (hex) over the layer's own files. Throws HostError not_found. */
  async layerHash(layerId: string): Promise<string> {
    const r = await this.request(hostRoutes.layerHash, { params: { layerId } });
    return r.sha256;
  }

  /** Starts an exec session inside the sandbox; attach to its output with `execWebSocketUrl`. */
  createExec(id: string, req: ExecRequest) {
    return this.request(hostRoutes.createExec, { params: { id }, body: req });
  }

  /** Exec sessions' exits as they happen (see ExecExitsAnswer); waits up to waitMs (≤ 30000) for one. */
  execExits(opts: { epoch?: string; after: number; waitMs?: number; signal?: AbortSignal }) {
    return this.request(hostRoutes.execExits, { query: { epoch: opts.epoch, after: opts.after, waitMs: opts.waitMs } }, opts);
  }

  /** Exec sessions of a sandbox. */
  listExec(id: string) {
    return this.request(hostRoutes.listExec, { params: { id } });
  }

  /** One exec session. Throws HostError not_found. */
  getExec(id: string, sessionId: string) {
    return this.request(hostRoutes.getExec, { params: { id, sid: sessionId } });
  }

  /** An exec session with its output so far (the last 1 MiB of each stream); `waitMs` (≤ 30000) waits for its exit first. */
  execResult(id: string, sessionId: string, opts: { waitMs?: number; signal?: AbortSignal } = {}) {
    return this.request(hostRoutes.execResult, { params: { id, sid: sessionId }, query: { waitMs: opts.waitMs } }, opts);
  }

  /** Signals an exec session's process group (default SIGKILL). */
  killExec(id: string, sessionId: string, signal?: string) {
    return this.request(hostRoutes.killExec, { params: { id, sid: sessionId }, body: { signal } });
  }

  /** Runs a command to completion and returns its output; a non-zero exit is a result, not an error. */
  execRun(id: string, req: ExecRequest & { stdin?: string }, opts: { signal?: AbortSignal } = {}) {
    return this.request(hostRoutes.execRun, { params: { id }, body: req }, opts);
  }

  /** Starts a login shell on a terminal of the sandbox. */
  createPty(id: string, req: RouteRequest<typeof hostRoutes.createPty>['body']): Promise<PtyInfo> {
    return this.request(hostRoutes.createPty, { params: { id }, body: req });
  }

  /** A terminal of the sandbox. Throws HostError not_found. */
  getPty(id: string, sessionId: string): Promise<PtyInfo> {
    return this.request(hostRoutes.getPty, { params: { id, sid: sessionId } });
  }

  /** Opens a WebSocket attached to a terminal: binary frames of output; send keystrokes or a resize message. */
  openPtySocket(id: string, sessionId: string): WebSocket {
    const url = this.base.replace(/^http/, 'ws') + hostPath(hostSockets.pty, { id, sid: sessionId });
    return new WebSocket(url, { headers: { authorization: `Bearer ${this.token}` }, perMessageDeflate: false });
  }

  /** Opens a WebSocket attached to an exec session (decode its messages with `decodeExecFrame`). */
  openExecSocket(id: string, sessionId: string): WebSocket {
    return new WebSocket(this.execWebSocketUrl(id, sessionId), { headers: { authorization: `Bearer ${this.token}` }, perMessageDeflate: false });
  }

  /**
   * Reads an exec session's frames as an HTTP answer on the kept-alive connections (`execFrames`):
   * no new connection and no upgrade before the first byte. `awaitStartMs`: the session's create is
   * on its way with this id; the host waits that long (at most 10 s) for the start.
   */
  openExecFrames(id: string, sessionId: string, opts: { awaitStartMs?: number }, handlers: ExecFramesHandlers): ExecFramesReader {
    const q = opts.awaitStartMs ? `?awaitStartMs=${opts.awaitStartMs}` : '';
    return new ExecFramesReader(this.base + hostPath(hostRoutes.execFrames.path, { id, sid: sessionId }) + q, this.token, this.agent, handlers);
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
    return this.base.replace(/^http/, 'ws') + hostPath(hostSockets.exec, { id, sid: sessionId });
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
