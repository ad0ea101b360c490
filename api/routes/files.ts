import { posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Request, Response } from 'express';
import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError, invalid, notFound } from '../../lib/errors';
import type { HostClient } from '../../sandbox';
import { findOrgSandbox } from '../../store/sandboxes';
import { fromHostError, sandboxHost } from './exec';
import { SandboxParams, wakeInBackground } from './sandboxes';

/*
 * A sandbox's filesystem (OpenComputer's `sandbox.files`): content streamed both ways through the API
 * and the sandbox host (never held whole in memory by either), directory listings, stat, mkdir, rename
 * and remove, and signed URLs that download or upload one file without an API key.
 *
 * Paths are absolute paths inside the sandbox, resolved as the sandbox sees them (a symlink to /etc is
 * the sandbox's /etc); `..` components are refused (400), as are the sandbox's /proc and /dev.
 */

const SandboxPath = z
  .string()
  .min(1, 'must be an absolute path')
  .max(4096)
  .refine((p) => p.startsWith('/'), 'must be an absolute path')
  .refine((p) => !p.includes('\0'), 'must not contain NUL bytes')
  .refine((p) => !p.split('/').includes('..'), "must not contain '..'");

const PathQuery = z.object({ path: SandboxPath.describe('Absolute path inside the sandbox') });
const OptionalPathQuery = z.object({ path: SandboxPath.optional() });
const Bool = z.enum(['true', 'false']).transform((v) => v === 'true');

export const FileEntry = z
  .object({
    name: z.string(),
    path: z.string(),
    isDir: z.boolean(),
    type: z.enum(['file', 'dir', 'symlink', 'other']),
    size: z.number().int().describe('Bytes (0 for directories)'),
    mode: z.number().int().describe('Permission bits (e.g. 420 = 0644)'),
    modTime: z.string(),
    target: z.string().optional().describe('Where a symlink points'),
  })
  .openapi('FileEntry');

const RenameBody = z.object({ from: SandboxPath, to: SandboxPath }).strict().openapi('RenameFile');
const SignedUrlBody = z
  .object({
    path: SandboxPath,
    expiresIn: z.number().int().min(1).max(86_400).default(3600).describe('Seconds the URL works (default 3600, at most 86400)'),
  })
  .strict()
  .openapi('FileUrlRequest');
const SignedUrlView = z.object({ url: z.string(), expiresAt: z.string() }).openapi('FileUrl');

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

function signGrant(deps: ApiDeps, g: FileGrant): string {
  const payload = Buffer.from(JSON.stringify(g), 'utf8').toString('base64url');
  return `${payload}.${deps.secrets.sign(payload, SIGN_PURPOSE)}`;
}

/** The grant of a token, or 403 when it is forged, for another method, or expired. */
function openGrant(deps: ApiDeps, token: string, method: 'GET' | 'PUT'): FileGrant {
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

/** The API's address as the caller reached it (PUBLIC_API_URL when set). */
function publicBase(deps: ApiDeps, req: Request): string {
  if (deps.cfg.PUBLIC_API_URL) return deps.cfg.PUBLIC_API_URL.replace(/\/+$/, '');
  const first = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v)?.split(',')[0]?.trim();
  const proto = first(req.headers['x-forwarded-proto']) ?? 'http';
  const host = first(req.headers['x-forwarded-host']) ?? req.headers.host ?? `127.0.0.1:${deps.cfg.PORT}`;
  return `${proto === 'https' ? 'https' : 'http'}://${host}`;
}

/** Streams a file of the sandbox as the answer (Content-Length from the host; aborted with the client). */
async function sendFile(host: HostClient, sandboxId: string, path: string, res: Response, opts: { attachment?: boolean } = {}): Promise<void> {
  const ac = new AbortController();
  res.on('close', () => ac.abort());
  let upstream: import('node:http').IncomingMessage;
  try {
    upstream = await host.openFileStream(sandboxId, path, { signal: ac.signal });
  } catch (err) {
    throw fromHostError(err, `file ${path}`);
  }
  res.status(200);
  res.setHeader('content-type', 'application/octet-stream');
  if (upstream.headers['content-length']) res.setHeader('content-length', upstream.headers['content-length']);
  if (opts.attachment) res.setHeader('content-disposition', `attachment; filename="${posix.basename(path).replace(/["\\\r\n]/g, '_') || 'file'}"`);
  await pipeline(upstream, res).catch(() => {
    upstream.destroy();
    res.destroy();
  });
}

/** Streams the request body into a file of the sandbox. */
async function receiveFile(host: HostClient, sandboxId: string, path: string, req: Request, mode?: number): Promise<{ path: string; size: number }> {
  try {
    return await host.uploadFile(sandboxId, path, req, { mode });
  } catch (err) {
    throw fromHostError(err, `file ${path}`);
  }
}

/** The host of a sandbox named by a signed grant (404 when it is gone or changed hands). */
async function grantHost(deps: ApiDeps, g: FileGrant): Promise<HostClient> {
  const doc = await findOrgSandbox(deps.store, g.o, g.s);
  if (!doc) throw notFound(`sandbox ${g.s}`);
  return deps.hosts.get(doc.hostId);
}

/**
 * The client's async wake (`X-OSB-Async-Wake: 1`, sent by its Filesystem): a call on a hibernated
 * sandbox starts waking it and is answered 503 `{ waking: true }`, which the client retries until
 * the sandbox is up. Without the header the call gets the 409 (hibernated; wake it first).
 */
async function orWake<T>(deps: ApiDeps, req: Request, orgId: string, sandboxId: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const e = err as { status?: number; message?: string };
    if (e.status === 409 && /hibernated/.test(e.message ?? '') && req.header('x-osb-async-wake') === '1') {
      const doc = await findOrgSandbox(deps.store, orgId, sandboxId);
      if (doc?.status === 'hibernated') wakeInBackground(deps, doc);
      throw new WakingError(sandboxId);
    }
    throw err;
  }
}

/** 503 with `waking: true` next to the error body (what the client's retry loop looks for). */
class WakingError extends ApiError {
  constructor(sandboxId: string) {
    super('unavailable', `sandbox ${sandboxId} is waking; retry`);
  }
  override toBody(): ReturnType<ApiError['toBody']> & { waking: true } {
    return { ...super.toBody(), waking: true };
  }
}

/** /api/sandboxes/:id/files…: the sandbox's filesystem. */
export function registerFileRoutes(t: RouteTable, deps: ApiDeps): void {
  const tag = 'files';
  const hostOf = (orgId: string, id: string) => sandboxHost(deps, orgId, id);
  const call = async <T>(what: string, fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      throw fromHostError(err, what);
    }
  };

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/files',
    tag,
    summary: "Download a file's bytes (streamed)",
    params: SandboxParams,
    query: PathQuery,
    responses: { 200: { description: 'The file', schema: z.string().openapi({ format: 'binary' }), contentType: 'application/octet-stream' } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, req, res }) => {
      const host = await hostOf(org.id, params.id);
      await orWake(deps, req, org.id, params.id, () => sendFile(host, params.id, query.path, res));
    },
  });

  t.add({
    method: 'put',
    path: '/api/sandboxes/:id/files',
    tag,
    summary: 'Upload a file (the body, streamed, any size up to the sandbox disk); parent directories are created',
    params: SandboxParams,
    query: PathQuery.extend({ mode: z.string().regex(/^[0-7]{3,4}$/, 'must be octal, e.g. 644').optional() }),
    rawBody: { contentType: 'application/octet-stream', description: 'The file content (any content type is accepted)' },
    responses: { 200: { description: 'Written', schema: z.object({ path: z.string(), size: z.number().int() }) } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, req, res }) => {
      const host = await hostOf(org.id, params.id);
      res.json(await orWake(deps, req, org.id, params.id, () => receiveFile(host, params.id, query.path, req, query.mode ? parseInt(query.mode, 8) : undefined)));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/:id/files',
    tag,
    summary: 'Remove a file, a symlink or a directory (with what is in it unless recursive=false)',
    params: SandboxParams,
    query: PathQuery.extend({ recursive: Bool.optional().describe('default true') }),
    responses: { 200: { description: 'Removed', schema: z.object({ removed: z.literal(true), path: z.string() }) } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, req, res }) => {
      const host = await hostOf(org.id, params.id);
      await orWake(deps, req, org.id, params.id, () => call(`file ${query.path}`, () => host.removePath(params.id, query.path, { recursive: query.recursive })));
      res.json({ removed: true, path: query.path });
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/files/list',
    tag,
    summary: 'List a directory (default /); symlinks are listed as such',
    params: SandboxParams,
    query: OptionalPathQuery,
    responses: { 200: { description: 'Its entries, by name', schema: z.array(FileEntry) } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, req, res }) => {
      const host = await hostOf(org.id, params.id);
      res.json(await orWake(deps, req, org.id, params.id, () => call(`directory ${query.path ?? '/'}`, () => host.listDir(params.id, query.path ?? '/'))));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/files/stat',
    tag,
    summary: 'Metadata of a path (symlinks followed unless noFollow=true)',
    params: SandboxParams,
    query: PathQuery.extend({ noFollow: Bool.optional() }),
    responses: { 200: { description: 'The entry', schema: FileEntry } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, res }) => {
      const host = await hostOf(org.id, params.id);
      res.json(await call(`file ${query.path}`, () => host.statPath(params.id, query.path, { noFollow: query.noFollow })));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/files/mkdir',
    tag,
    summary: 'Make a directory and its parents (mkdir -p); the path in the query or the body',
    params: SandboxParams,
    query: OptionalPathQuery,
    body: z.object({ path: SandboxPath.optional() }).strict().optional(),
    responses: { 200: { description: 'The directory', schema: FileEntry } },
    errors: [409, 502, 503],
    handler: async ({ params, query, body, org, req, res }) => {
      const p = query.path ?? body?.path;
      if (!p) throw invalid('query.path: required (or body.path)');
      const host = await hostOf(org.id, params.id);
      res.json(await orWake(deps, req, org.id, params.id, () => call(`directory ${p}`, () => host.makeDir(params.id, p))));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/files/rename',
    tag,
    summary: 'Rename or move a path (parents of the destination are created)',
    params: SandboxParams,
    body: RenameBody,
    responses: { 200: { description: 'The entry at its new path', schema: FileEntry } },
    errors: [409, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const host = await hostOf(org.id, params.id);
      res.json(await call(`file ${body.from}`, () => host.renamePath(params.id, body.from, body.to)));
    },
  });

  for (const [kind, method] of [['download', 'GET'], ['upload', 'PUT']] as const) {
    t.add({
      method: 'post',
      path: `/api/sandboxes/:id/files/${kind}-url`,
      tag,
      summary: `A URL that ${kind === 'download' ? 'downloads (GET)' : 'uploads (PUT)'} one file without an API key, until it expires`,
      params: SandboxParams,
      body: SignedUrlBody,
      responses: { 200: { description: 'The signed URL', schema: SignedUrlView } },
      handler: async ({ params, body, org, req, res }) => {
        const doc = await findOrgSandbox(deps.store, org.id, params.id);
        if (!doc) throw notFound(`sandbox ${params.id}`);
        const e = Math.floor(Date.now() / 1000) + body.expiresIn;
        const token = signGrant(deps, { o: org.id, s: params.id, p: body.path, m: method, e });
        res.json({ url: `${publicBase(deps, req)}/api/files/${token}`, expiresAt: new Date(e * 1000).toISOString() });
      },
    });
  }

  const TokenParams = z.object({ token: z.string().min(10).max(16_384) });
  t.add({
    method: 'get',
    path: '/api/files/:token',
    tag,
    summary: 'Download through a signed URL',
    public: true,
    params: TokenParams,
    responses: { 200: { description: 'The file' } },
    handler: async ({ params, res }) => {
      const g = openGrant(deps, params.token, 'GET');
      await sendFile(await grantHost(deps, g), g.s, g.p, res, { attachment: true });
    },
  });
  t.add({
    method: 'put',
    path: '/api/files/:token',
    tag,
    summary: 'Upload through a signed URL',
    public: true,
    params: TokenParams,
    rawBody: { contentType: 'application/octet-stream', description: 'The file content' },
    responses: { 200: { description: 'Written' } },
    handler: async ({ params, req, res }) => {
      const g = openGrant(deps, params.token, 'PUT');
      res.json(await receiveFile(await grantHost(deps, g), g.s, g.p, req));
    },
  });
}
