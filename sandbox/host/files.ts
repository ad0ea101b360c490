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
 * (declared, with their schemas, in ../host-contract/wire.ts)
 */
import { pipeline } from 'node:stream/promises';
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
import { hostRoutes } from '../host-contract/wire';
import type { Serve } from './serve';

const REMOVE_TREE_TIMEOUT_MS = 120_000;

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
export function fileRoutes(serve: Serve, provider: SandboxProvider): void {
  serve(hostRoutes.downloadFile, async ({ params, query }, res) => {
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
  });

  serve(hostRoutes.uploadFile, async ({ params, query }, res, req) => {
    const root = await provider.fileRoot(params.id);
    const fh = await openSandboxFileForWrite(root, query.path, query.mode ? parseInt(query.mode, 8) : 0o644);
    let size = 0;
    try {
      if (root.charge) {
        // Written by a helper in the sandbox's cgroups: the bytes count against its memory (../charged-write).
        size = await writeCharged(req, fh, root.charge, query.path).catch((err) => {
          // Refused before the body's end: the rest of it is read and dropped once the answer is out, so
          // that the answer reaches the client and the connection stays usable. Not before: draining
          // while the answer waited (on the file's close, say) let the client send the whole body
          // first, and the API, having read it to its end, answered the refusal with keep-alive.
          res.once('finish', () => req.resume());
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
  });

  serve(hostRoutes.listDir, async ({ params, query }, res) => {
    res.json(await listSandboxDir(await provider.fileRoot(params.id), query.path));
  });

  serve(hostRoutes.statPath, async ({ params, query }, res) => {
    res.json(await statSandboxPath(await provider.fileRoot(params.id), query.path, { noFollow: query.noFollow }));
  });

  serve(hostRoutes.makeDir, async ({ params, body }, res) => {
    const root = await provider.fileRoot(params.id);
    await makeSandboxDir(root, body.path);
    res.json(await statSandboxPath(root, body.path));
  });

  serve(hostRoutes.renamePath, async ({ params, body }, res) => {
    const root = await provider.fileRoot(params.id);
    await renameSandboxPath(root, body.from, body.to);
    res.json(await statSandboxPath(root, body.to, { noFollow: true }));
  });

  serve(hostRoutes.removePath, async ({ params, query }, res) => {
    const outcome = await removeSandboxEntry(await provider.fileRoot(params.id), query.path);
    if (outcome === 'notEmpty') {
      if (!query.recursive) throw new SandboxError('conflict', `directory not empty: ${query.path} (remove with recursive=true)`);
      await removeTree(provider, params.id, query.path);
    }
    res.json({ removed: true, path: query.path });
  });
}
