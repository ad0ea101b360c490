/**
 * A sandbox's files (/api/sandboxes/{id}/files): paths, queries, bodies and views.
 */
import { z } from './zod'; // zod with .openapi()

export const SandboxPath = z
  .string()
  .min(1, 'must be an absolute path')
  .max(4096)
  .refine((p) => p.startsWith('/'), 'must be an absolute path')
  .refine((p) => !p.includes('\0'), 'must not contain NUL bytes')
  .refine((p) => !p.split('/').includes('..'), "must not contain '..'");

export const PathQuery = z.object({ path: SandboxPath.describe('Absolute path inside the sandbox') });

export const OptionalPathQuery = z.object({ path: SandboxPath.optional() });

export const Bool = z.enum(['true', 'false']).transform((v) => v === 'true');

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

export const RenameBody = z.object({ from: SandboxPath, to: SandboxPath }).strict().openapi('RenameFile');

export const SignedUrlBody = z
  .object({
    path: SandboxPath,
    expiresIn: z.number().int().min(1).max(86_400).default(3600).describe('Seconds the URL works (default 3600, at most 86400)'),
  })
  .strict()
  .openapi('FileUrlRequest');

export const SignedUrlView = z.object({ url: z.string(), expiresAt: z.string() }).openapi('FileUrl');

/** The token of a signed file URL. */
export const FileTokenParams = z.object({ token: z.string().min(10).max(16_384) });
