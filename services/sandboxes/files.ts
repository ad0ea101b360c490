/**
 * A sandbox's filesystem (OpenComputer's `sandbox.files`): content streamed both ways through the API
 * and the sandbox host (never held whole in memory by either), directory listings, stat, mkdir, rename
 * and remove, and signed URLs that download or upload one file without an API key.
 */
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { ApiError, notFound } from '../../contract/errors';
import type { HostClient } from '../../sandbox';
import { findOrgSandbox } from '../../store/sandboxes';
import type { ExecLive } from '../exec/exec-live';
import { fromHostError } from '../hosts/host-errors';
import type { SandboxDeps } from '../deps';
import type { SandboxService } from './sandboxes';

/** What a signed file URL carries (signed with the secrets key, purpose `file-url`). */
interface FileGrant {
  /** organisation, sandbox, path, method, expiry (epoch seconds) */
  o: string;
  s: string;
  p: string;
  m: 'GET' | 'PUT';
  e: number;
}

const SIGN_PURPOSE = 'file-url';

/** 503 with `waking: true` next to the error body (what the client's retry loop looks for). */
export class WakingError extends ApiError {
  constructor(sandboxId: string) {
    super('unavailable', `sandbox ${sandboxId} is waking; retry`);
  }
  override toBody(): ReturnType<ApiError['toBody']> & { waking: true } {
    return { ...super.toBody(), waking: true };
  }
}

/** Runs a host call, mapping its failure (`what` names the object). */
async function call<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw fromHostError(err, what);
  }
}

/**
 * The file operations of the API. `asyncWake` is the client's async wake (`X-OSB-Async-Wake: 1`,
 * sent by its Filesystem): a call on a hibernated sandbox starts waking it and is answered 503
 * `{ waking: true }`, which the client retries until the sandbox is up. Without it the call gets the
 * 409 (hibernated; wake it first).
 */
export function createFileService(deps: SandboxDeps, live: ExecLive, sandboxes: SandboxService) {
  function signGrant(g: FileGrant): string {
    const payload = Buffer.from(JSON.stringify(g), 'utf8').toString('base64url');
    return `${payload}.${deps.secrets.sign(payload, SIGN_PURPOSE)}`;
  }

  /** The grant of a token, or 403 when it is forged, for another method, or expired. */
  function openGrant(token: string, method: 'GET' | 'PUT'): FileGrant {
    const [payload, sig] = token.split('.');
    if (!payload || !sig || !deps.secrets.verify(payload, SIGN_PURPOSE, sig)) throw new ApiError('forbidden', 'invalid file URL signature');
    let g: FileGrant;
    try {
      g = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as FileGrant;
    } catch {
      throw new ApiError('forbidden', 'invalid file URL');
    }
    if (g.m !== method) throw new ApiError('forbidden', `this URL is for ${g.m === 'GET' ? 'downloading' : 'uploading'} (${g.m})`);
    if (g.e * 1000 < Date.now()) throw new ApiError('forbidden', 'this file URL has expired');
    return g;
  }

  /** The host of a sandbox named by a signed grant (404 when it is gone or changed hands). */
  async function grantHost(g: FileGrant): Promise<HostClient> {
    const doc = await findOrgSandbox(deps.store, g.o, g.s);
    if (!doc) throw notFound(`sandbox ${g.s}`);
    return deps.hosts.get(doc.hostId);
  }

  /** The sandbox's host (404), then `fn` on it; a hibernated sandbox is woken in the background when `asyncWake`. */
  async function onHost<T>(orgId: string, sandboxId: string, asyncWake: boolean | null, fn: (host: HostClient) => Promise<T>): Promise<T> {
    const host = await live.sandboxHost(orgId, sandboxId);
    if (asyncWake === null) return fn(host);
    try {
      return await fn(host);
    } catch (err) {
      const e = err as { status?: number; message?: string };
      if (e.status === 409 && /hibernated/.test(e.message ?? '') && asyncWake) {
        const doc = await findOrgSandbox(deps.store, orgId, sandboxId);
        if (doc?.status === 'hibernated') sandboxes.wakeInBackground(doc);
        throw new WakingError(sandboxId);
      }
      throw err;
    }
  }

  const openStream = (host: HostClient, sandboxId: string, path: string, signal: AbortSignal) =>
    call(`file ${path}`, () => host.openFileStream(sandboxId, path, { signal }));
  const upload = (host: HostClient, sandboxId: string, path: string, body: Readable, mode?: number) =>
    call(`file ${path}`, () => host.uploadFile(sandboxId, path, body, { mode }));

  return {
    /** Opens a file of the sandbox for reading (the host's answer, streamed; aborted with `signal`). */
    download: (orgId: string, id: string, path: string, signal: AbortSignal, asyncWake: boolean): Promise<IncomingMessage> =>
      onHost(orgId, id, asyncWake, (h) => openStream(h, id, path, signal)),
    /** Streams `body` into a file of the sandbox (parents created). */
    upload: (orgId: string, id: string, path: string, body: Readable, mode: number | undefined, asyncWake: boolean) =>
      onHost(orgId, id, asyncWake, (h) => upload(h, id, path, body, mode)),
    remove: (orgId: string, id: string, path: string, recursive: boolean | undefined, asyncWake: boolean) =>
      onHost(orgId, id, asyncWake, (h) => call(`file ${path}`, () => h.removePath(id, path, { recursive }))),
    list: (orgId: string, id: string, path: string | undefined, asyncWake: boolean) =>
      onHost(orgId, id, asyncWake, (h) => call(`directory ${path ?? '/'}`, () => h.listDir(id, path ?? '/'))),
    stat: (orgId: string, id: string, path: string, noFollow: boolean | undefined) =>
      onHost(orgId, id, null, (h) => call(`file ${path}`, () => h.statPath(id, path, { noFollow }))),
    mkdir: (orgId: string, id: string, path: string, asyncWake: boolean) =>
      onHost(orgId, id, asyncWake, (h) => call(`directory ${path}`, () => h.makeDir(id, path))),
    rename: (orgId: string, id: string, from: string, to: string) => onHost(orgId, id, null, (h) => call(`file ${from}`, () => h.renamePath(id, from, to))),

    /** A token that downloads (GET) or uploads (PUT) one file of the sandbox until `expiresIn` seconds from now. */
    async signUrl(orgId: string, id: string, path: string, method: 'GET' | 'PUT', expiresIn: number): Promise<{ token: string; expiresAt: Date }> {
      const doc = await findOrgSandbox(deps.store, orgId, id);
      if (!doc) throw notFound(`sandbox ${id}`);
      // Rounded up: a URL never expires before `expiresIn` seconds have passed (rounding down cut up to a second off).
      const e = Math.ceil(Date.now() / 1000) + expiresIn;
      return { token: signGrant({ o: orgId, s: id, p: path, m: method, e }), expiresAt: new Date(e * 1000) };
    },

    /** Opens the file of a download token (403 for a bad token); answers the stream and the file's path. */
    async downloadByToken(token: string, signal: AbortSignal): Promise<{ upstream: IncomingMessage; path: string }> {
      const g = openGrant(token, 'GET');
      return { upstream: await openStream(await grantHost(g), g.s, g.p, signal), path: g.p };
    },

    /** Streams `body` into the file of an upload token (403 for a bad token). */
    async uploadByToken(token: string, body: Readable): Promise<{ path: string; size: number }> {
      const g = openGrant(token, 'PUT');
      return upload(await grantHost(g), g.s, g.p, body);
    },
  };
}

/** The file operations (see createFileService). */
export type FileService = ReturnType<typeof createFileService>;
