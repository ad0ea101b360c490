/**
 * The filesystem of a live sandbox over the host's HTTP API: streamed download and upload, list, stat,
 * mkdir, rename and remove. Every path goes through ../paths (the sandbox's own view: symlinks resolved
 * inside it, `..` refused, descriptors checked to lie on the sandbox's mounts), so nothing here reaches
 * a file of the host. Content is streamed both ways through one file descriptor: a 1 GB file costs
 * the host a few 64 KiB buffers, never its size.
 *
 * A tree (a directory that is not empty) is removed by `rm -rf` run inside the sandbox, as its root:
 * walking a tree the sandbox can change under us from the host, as host root, is what ../paths exists
 * to avoid.
 *
 *   GET    /sandboxes/:id/fs?path=            the file's bytes (application/octet-stream, Content-Length)
 *   PUT    /sandboxes/:id/fs?path=&mode=      body → file (parents created, truncated first)  → { path, size }
 *   GET    /sandboxes/:id/fs/list?path=       SandboxEntry[] (lstat of each)
 *   GET    /sandboxes/:id/fs/stat?path=       SandboxEntry (stat; &noFollow=true: lstat)
 *   POST   /sandboxes/:id/fs/mkdir            { path }        mkdir -p
 *   POST   /sandboxes/:id/fs/rename           { from, to }
 *   DELETE /sandboxes/:id/fs?path=&recursive= (recursive default true)
 */
import { pipeline } from 'node:stream/promises';
import type express from 'express';
import type { Request, Response, NextFunction } from 'express';
import { z } from 'zod';
import { writeCharged } from '../charged-write';
import { SandboxError } from '../../contract/errors';
import {
  fsError,
  listSandboxDir,
  makeSandboxDir,
  openSandboxFileForRead,
  openSandboxFileForWrite,
  removeSandboxEntry,
  renameSandboxPath,
  statSandboxPath,
} from '../paths';
import type { SandboxProvider } from '../driver';

type Wrap = (fn: (req: Request, res: Response) => Promise<void>) => (req: Request, res: Response, next: NextFunction) => void;
type Parse = <S extends z.ZodType>(schema: S, req: Request) => z.infer<S>;

const REMOVE_TREE_TIMEOUT_MS = 120_000;
const idParams = z.object({ id: z.string().min(1) });
const pathQuery = z.object({ path: z.string().min(1) });
const bool = z.enum(['true', 'false']).transform((v) => v === 'true');
/** The file routes' request schemas, built once (a schema built per request costs zod's compile each time). */
const routeSchemas = {
  path: z.object({ params: idParams, query: pathQuery }),
  write: z.object({
    params: idParams,
    query: pathQuery.extend({
      mode: z
        .string()
        .regex(/^[0-7]{3,4}$/, 'must be octal, e.g. 644')
        .optional(),
    }),
  }),
  stat: z.object({ params: idParams, query: pathQuery.extend({ noFollow: bool.optional() }) }),
  mkdir: z.object({ params: idParams, body: z.object({ path: z.string().min(1) }) }),
  rename: z.object({ params: idParams, body: z.object({ from: z.string().min(1), to: z.string().min(1) }) }),
  remove: z.object({ params: idParams, query: pathQuery.extend({ recursive: bool.default(true) }) }),
};

/** ENOSPC and EDQUOT: the sandbox's writable layer is full. */
function diskFull(err: unknown): SandboxError | null {
  const code = (err as NodeJS.ErrnoException)?.code;
  if (code === 'ENOSPC' || code === 'EDQUOT') return new SandboxError('payload_too_large', "the sandbox's disk is full (its diskMB limit)");
  return null;
}

/** Runs `rm -rf -- path` inside the sandbox; throws conflict with its stderr (sandbox paths only) when it fails. */
function removeTree(provider: SandboxProvider, id: string, p: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = provider.spawn(id, { argv: ['/bin/rm', '-rf', '--', p], cwd: '/' });
    let stderr = '';
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        /* gone */
      }
    }, REMOVE_TREE_TIMEOUT_MS);
    child.stdin?.end();
    child.stdout?.resume();
    child.stderr?.on('data', (b: Buffer) => {
      if (stderr.length < 4096) stderr += b.toString('utf8');
    });
    child.on('error', () => {
      clearTimeout(timer);
      reject(new SandboxError('internal', `could not run rm in the sandbox to remove ${p}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new SandboxError('conflict', `rm -rf ${p} failed (${signal ?? `exit ${code}`}): ${stderr.trim().slice(0, 500)}`));
    });
  });
}

/** Registers the filesystem routes on the host's app. */
export function fileRoutes(app: express.Express, provider: SandboxProvider, h: Wrap, parse: Parse): void {
  app.get(
    '/sandboxes/:id/fs',
    h(async (req, res) => {
      const { params, query } = parse(routeSchemas.path, req);
      const { fh, size } = await openSandboxFileForRead(await provider.fileRoot(params.id), query.path);
      try {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': size });
        if (size === 0) {
          res.end();
          return;
        }
        // The size read at open: a file that grows meanwhile is cut there, one that shrinks ends the
        // answer short (the client sees a truncated body, never bytes of another file).
        await pipeline(fh.createReadStream({ start: 0, end: size - 1, autoClose: true, highWaterMark: 256 * 1024 }), res).catch(() => {
          res.destroy();
        });
      } finally {
        await fh.close().catch(() => undefined);
      }
    }),
  );

  app.put(
    '/sandboxes/:id/fs',
    h(async (req, res) => {
      const { params, query } = parse(routeSchemas.write, req);
      const root = await provider.fileRoot(params.id);
      const fh = await openSandboxFileForWrite(root, query.path, query.mode ? parseInt(query.mode, 8) : 0o644);
      let size = 0;
      try {
        if (root.charge) {
          // Written by a helper in the sandbox's cgroups: the bytes count against its memory (../charged-write).
          size = await writeCharged(req, fh, root.charge, query.path).catch((err) => {
            // Answered before the body's end: the rest of it is read and dropped, so the answer reaches the client.
            req.resume();
            throw err;
          });
        } else {
          req.on('data', (b: Buffer) => (size += b.length));
          await pipeline(req, fh.createWriteStream({ autoClose: true, highWaterMark: 256 * 1024 })).catch((err) => {
            throw diskFull(err) ?? (req.aborted || req.destroyed ? new SandboxError('invalid_request', 'upload interrupted') : fsError(err, query.path));
          });
        }
      } finally {
        await fh.close().catch(() => undefined);
      }
      res.json({ path: query.path, size });
    }),
  );

  app.get(
    '/sandboxes/:id/fs/list',
    h(async (req, res) => {
      const { params, query } = parse(routeSchemas.path, req);
      res.json(await listSandboxDir(await provider.fileRoot(params.id), query.path));
    }),
  );

  app.get(
    '/sandboxes/:id/fs/stat',
    h(async (req, res) => {
      const { params, query } = parse(routeSchemas.stat, req);
      res.json(await statSandboxPath(await provider.fileRoot(params.id), query.path, { noFollow: query.noFollow }));
    }),
  );

  app.post(
    '/sandboxes/:id/fs/mkdir',
    h(async (req, res) => {
      const { params, body } = parse(routeSchemas.mkdir, req);
      const root = await provider.fileRoot(params.id);
      await makeSandboxDir(root, body.path);
      res.json(await statSandboxPath(root, body.path));
    }),
  );

  app.post(
    '/sandboxes/:id/fs/rename',
    h(async (req, res) => {
      const { params, body } = parse(routeSchemas.rename, req);
      const root = await provider.fileRoot(params.id);
      await renameSandboxPath(root, body.from, body.to);
      res.json(await statSandboxPath(root, body.to, { noFollow: true }));
    }),
  );

  app.delete(
    '/sandboxes/:id/fs',
    h(async (req, res) => {
      const { params, query } = parse(routeSchemas.remove, req);
      const outcome = await removeSandboxEntry(await provider.fileRoot(params.id), query.path);
      if (outcome === 'notEmpty') {
        if (!query.recursive) throw new SandboxError('conflict', `directory not empty: ${query.path} (remove with recursive=true)`);
        await removeTree(provider, params.id, query.path);
      }
      res.json({ removed: true, path: query.path });
    }),
  );
}
