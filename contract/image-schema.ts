import { z } from './zod'; // zod with .openapi()

/* The image manifest of snapshots and of sandboxes created with an image (the open API's shape). */

const noDotDot = (p: string) => !p.split('/').includes('..');
const AbsPath = z.string().min(2).max(4096).startsWith('/', 'must be an absolute path').refine(noDotDot, 'must not contain ..');
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');
const Packages = (re: RegExp) => z.array(z.string().min(1).max(200).regex(re, 'must be a package name (no spaces, no leading -)')).min(1).max(500);

/** One manifest step, in the open API's shape (`{ type, args }`). */
export const ImageStepSchema = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('run'),
    args: z.object({
      commands: z
        .array(
          z
            .string()
            .min(1)
            .max(64 * 1024),
        )
        .min(1)
        .max(200),
    }),
  }),
  z.object({ type: z.literal('apt_install'), args: z.object({ packages: Packages(/^[A-Za-z0-9][A-Za-z0-9+.:=~_-]*$/) }) }),
  z.object({ type: z.literal('pip_install'), args: z.object({ packages: Packages(/^[A-Za-z0-9][^\s]*$/) }) }),
  z.object({ type: z.literal('env'), args: z.object({ vars: z.record(EnvName, z.string().max(32 * 1024)) }) }),
  z.object({ type: z.literal('workdir'), args: z.object({ path: AbsPath }) }),
  z.object({
    type: z.literal('add_file'),
    args: z.object({ path: AbsPath, content: z.string(), encoding: z.enum(['base64', 'utf8']).default('base64') }),
  }),
  z.object({
    type: z.literal('add_dir'),
    args: z.object({
      path: AbsPath,
      files: z
        .array(
          z.object({
            relativePath: z
              .string()
              .min(1)
              .max(4096)
              .refine((p) => !p.startsWith('/') && noDotDot(p), 'must be a relative path without ..'),
            content: z.string(),
          }),
        )
        .max(10_000),
    }),
  }),
]);

/** An image manifest: the base image and its build steps. */
export const ImageManifestSchema = z
  .object({
    base: z.literal('base', { message: 'only the "base" image exists' }).default('base'),
    steps: z.array(ImageStepSchema).max(500).default([]),
    builderMemoryMB: z
      .number()
      .int()
      .min(64)
      .optional()
      .describe('Memory limit of the build sandbox in MB; default SANDBOX_MEMORY_MB, at most SANDBOX_MAX_MEMORY_MB'),
  })
  .openapi('ImageManifest');
