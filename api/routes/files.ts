import { posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { IncomingMessage } from 'node:http';
import type { Request, Response } from 'express';
import { z } from 'zod';
import type { ApiDeps } from '../deps';
import { publicBase, type RouteTable } from '../http';
import { invalid } from '../../contract/errors';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { SandboxParams } from '../../contract/sandboxes';
import { SandboxPath, PathQuery, OptionalPathQuery, Bool, FileEntry, RenameBody, SignedUrlBody, SignedUrlView, FileTokenParams } from '../../contract/files';

/*
 * A sandbox's filesystem (OpenComputer's `sandbox.files`): content streamed both ways through the API
 * and the sandbox host (never held whole in memory by either), directory listings, stat, mkdir, rename
 * and remove, and signed URLs that download or upload one file without an API key.
 *
 * Paths are absolute paths inside the sandbox, resolved as the sandbox sees them (a symlink to /etc is
 * the sandbox's /etc); `..` components are refused (400), as are the sandbox's /proc and /dev.
 */

/**
 * Streams a file of the sandbox (opened by `open`, aborted with the client) as the answer, with
 * Content-Length from the host. Its bytes are the sandbox's, so the answer is a download and nothing
 * else: application/octet-stream and `Content-Disposition: attachment` (never rendered in a tab), beside
 * the `nosniff` and sandboxing CSP that every answer gets (api/answer-headers.ts: never run as a script
 * of this origin, which the console shares); see docs/threat-model.md, "The console's origin".
 */
async function sendFile(res: Response, open: (signal: AbortSignal) => Promise<{ upstream: IncomingMessage; path: string }>): Promise<void> {
  const ac = new AbortController();
  res.on('close', () => ac.abort());
  const { upstream, path } = await open(ac.signal);
  res.status(200);
  res.setHeader('content-type', 'application/octet-stream');
  res.setHeader('content-disposition', attachmentOf(path));
  if (upstream.headers['content-length']) res.setHeader('content-length', upstream.headers['content-length']);
  await pipeline(upstream, res).catch(() => {
    upstream.destroy();
    res.destroy();
  });
}

/** `attachment` with the file's name: ASCII in filename= (quotes and controls replaced), UTF-8 in filename*=. */
export function attachmentOf(path: string): string {
  const name = posix.basename(path) || 'file';
  const ascii = name.replace(/[^\x20-\x7e]|["\\]/g, '_');
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encodeURIComponent(name)}`;
}

/** Whether the client asked for the async wake (X-OSB-Async-Wake: 1, see services/sandboxes/files.ts). */
const asyncWake = (req: Request): boolean => req.header('x-osb-async-wake') === '1';

/** /api/sandboxes/:id/files…: the sandbox's filesystem. */
export function registerFileRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const tag = 'files';
  const files = sandbox.files;

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
      await sendFile(res, async (signal) => ({ upstream: await files.download(org.id, params.id, query.path, signal, asyncWake(req)), path: query.path }));
    },
  });

  t.add({
    method: 'put',
    path: '/api/sandboxes/:id/files',
    tag,
    summary: 'Upload a file (the body, streamed, any size up to the sandbox disk); parent directories are created',
    params: SandboxParams,
    query: PathQuery.extend({
      mode: z
        .string()
        .regex(/^[0-7]{3,4}$/, 'must be octal, e.g. 644')
        .optional(),
    }),
    rawBody: { contentType: 'application/octet-stream', description: 'The file content (any content type is accepted)' },
    responses: { 204: { description: 'Written (no body, as OpenComputer answers)' } },
    errors: [409, 502, 503],
    handler: async ({ params, query, org, req, res }) => {
      await files.upload(org.id, params.id, query.path, req, query.mode ? parseInt(query.mode, 8) : undefined, asyncWake(req));
      res.status(204).end();
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
      await files.remove(org.id, params.id, query.path, query.recursive, asyncWake(req));
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
      res.json(await files.list(org.id, params.id, query.path, asyncWake(req)));
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
      res.json(await files.stat(org.id, params.id, query.path, query.noFollow));
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
      res.json(await files.mkdir(org.id, params.id, p, asyncWake(req)));
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
      res.json(await files.rename(org.id, params.id, body.from, body.to));
    },
  });

  for (const [kind, method] of [
    ['download', 'GET'],
    ['upload', 'PUT'],
  ] as const) {
    t.add({
      method: 'post',
      path: `/api/sandboxes/:id/files/${kind}-url`,
      tag,
      summary: `A URL that ${kind === 'download' ? 'downloads (GET)' : 'uploads (PUT)'} one file without an API key, until it expires`,
      params: SandboxParams,
      body: SignedUrlBody,
      responses: { 200: { description: 'The signed URL', schema: SignedUrlView } },
      handler: async ({ params, body, org, req, res }) => {
        const { token, expiresAt } = await files.signUrl(org.id, params.id, body.path, method, body.expiresIn);
        res.json({ url: `${publicBase(deps, req)}/api/files/${token}`, expiresAt: expiresAt.toISOString() });
      },
    });
  }

  t.add({
    method: 'get',
    path: '/api/files/:token',
    tag,
    summary: 'Download through a signed URL',
    public: true,
    params: FileTokenParams,
    responses: { 200: { description: 'The file' } },
    handler: async ({ params, res }) => {
      await sendFile(res, (signal) => files.downloadByToken(params.token, signal));
    },
  });
  t.add({
    method: 'put',
    path: '/api/files/:token',
    tag,
    summary: 'Upload through a signed URL',
    public: true,
    params: FileTokenParams,
    rawBody: { contentType: 'application/octet-stream', description: 'The file content' },
    responses: { 204: { description: 'Written (no body)' } },
    handler: async ({ params, req, res }) => {
      await files.uploadByToken(params.token, req);
      res.status(204).end();
    },
  });
}
