/** The sandbox host's request schemas (one per route) and their parser: a bad request is a SandboxError `invalid_request`. */
import type { Request } from 'express';
import { z } from 'zod';
import { networkSchema } from '../../contract/network';
import { SandboxError } from '../../contract/errors';
import { MIN_MEMORY_MB } from '../../contract/limits';

const stringMap = z.record(z.string(), z.string());
const idParam = z.object({ id: z.string().min(1) });

const entrypointSchema = z.object({
  argv: z.array(z.string()).min(1),
  env: stringMap.optional(),
  cwd: z.string().startsWith('/').optional(),
  timeoutSeconds: z.number().positive().optional(),
});

export const schemas = {
  create: z.object({
    body: z.object({
      id: z.string().min(1),
      orgId: z.string(),
      owner: z.object({ kind: z.enum(['session', 'instance', 'api', 'snapshot']), id: z.string() }).optional(),
      layers: z.array(z.string()).optional(),
      envs: stringMap.optional(),
      sealedSecrets: z
        .array(
          z.object({
            name: z.string().min(1).max(200),
            value: z.string().min(1).max(32768),
            allowedHosts: z.array(z.string().max(253)).min(1).max(32),
            injectInto: z.array(z.string().max(100)).min(1).max(16).optional(),
          }),
        )
        .max(256)
        .optional(),
      cwd: z.string().startsWith('/').optional(),
      user: z.enum(['root', 'sandbox']).optional(),
      memoryMB: z.number().int().positive().optional(),
      // 0: no CFS quota (an equal cpu.shares weight).
      cpuCount: z.number().min(0).optional(),
      maxProcesses: z.number().int().positive().optional(),
      diskMB: z.number().int().positive().optional(),
      network: networkSchema(z).optional(),
      files: stringMap.optional(),
      patches: z.array(z.object({ id: z.string().min(1), script: z.string() })).optional(),
      keepOnPatchFailure: z.boolean().optional(),
      entrypoint: entrypointSchema.optional(),
      metadata: stringMap.optional(),
      awaitExit: z
        .object({
          waitMs: z.number().int().min(0),
          readFile: z.object({ path: z.string().min(1), maxBytes: z.number().int().positive() }).optional(),
          readLog: z.object({ maxBytes: z.number().int().positive() }).optional(),
        })
        .optional(),
    }),
  }),
  list: z.object({ query: z.object({ owner: z.string().optional() }) }),
  byId: z.object({ params: idParam }),
  setNetwork: z.object({ params: idParam, body: networkSchema(z) }),
  scale: z.object({
    params: idParam,
    body: z
      .object({ memoryMB: z.number().int().min(MIN_MEMORY_MB).optional(), cpuCount: z.number().min(0).max(4096).optional() })
      .strict()
      .refine((b) => b.memoryMB !== undefined || b.cpuCount !== undefined, 'give memoryMB, cpuCount or both'),
  }),
  sandboxMetrics: z.object({ query: z.object({ limit: z.coerce.number().int().min(0).max(1000).default(100) }) }),
  writeFile: z.object({
    params: idParam,
    body: z.object({
      path: z.string().min(1),
      content: z.string(),
      encoding: z.enum(['utf8', 'base64']).optional(),
      mode: z.number().int().min(0).max(0o7777).optional(),
    }),
  }),
  readFile: z.object({
    params: idParam,
    query: z.object({ path: z.string().min(1), maxBytes: z.coerce.number().int().positive().optional() }),
  }),
  startEntrypoint: z.object({ params: idParam, body: entrypointSchema }),
  entrypointStatus: z.object({ params: idParam, query: z.object({ waitMs: z.coerce.number().int().min(0).optional() }) }),
  entrypointLog: z.object({
    params: idParam,
    query: z.object({
      maxBytes: z.coerce
        .number()
        .int()
        .positive()
        .max(64 * 1024 * 1024)
        .default(1024 * 1024),
      sinceStdout: z.coerce.number().int().min(0).optional(),
      sinceStderr: z.coerce.number().int().min(0).optional(),
    }),
  }),
  entrypointOutput: z.object({
    params: idParam,
    query: z.object({ stream: z.enum(['stdout', 'stderr']).default('stdout'), maxBytes: z.coerce.number().int().positive().optional() }),
  }),
  checkpoint: z.object({ params: idParam, body: z.object({ checkpointId: z.string().min(1) }) }),
  hibernate: z.object({ params: idParam, body: z.object({ layerId: z.string().min(1) }) }),
  wake: z.object({
    params: idParam,
    body: z.object({ patches: z.array(z.object({ id: z.string().min(1), script: z.string() })).default([]), keepOnPatchFailure: z.boolean().default(false) }),
  }),
  restore: z.object({
    params: idParam,
    body: z.object({ layerId: z.string().min(1), patches: z.array(z.object({ id: z.string().min(1), script: z.string() })).default([]) }),
  }),
  layer: z.object({ params: z.object({ layerId: z.string().min(1) }) }),
  fetchLayer: z.object({ params: z.object({ layerId: z.string().min(1) }), body: z.object({ from: z.url({ protocol: /^https?$/ }) }) }),
  port: z.object({ params: z.object({ id: z.string().min(1), port: z.coerce.number().int().min(1).max(65535) }) }),
};

/** Parses `{ params, query, body }` of a request with a route schema; throws invalid_request. */
export function parse<S extends z.ZodType>(schema: S, req: Request): z.infer<S> {
  const r = schema.safeParse({ params: req.params, query: req.query, body: req.body });
  if (!r.success) {
    const msg = r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new SandboxError('invalid_request', msg);
  }
  return r.data;
}
