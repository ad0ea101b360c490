import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError, invalid, notFound } from '../../lib/errors';
import { effectiveResources, MIN_MEMORY_MB, overMaximum } from '../../config/limits';
import { randomId } from '../../lib/ids';
import { fromJsonText } from '../../store';
import { deleteSandboxPreviews } from '../preview-proxy';
import { findOrgSandbox, SandboxDoc, sandboxesOf } from '../../store/sandboxes';
import { hibernateSandbox } from '../../services/hibernation';
import { findOrgCheckpoint, listPatches } from '../../store/checkpoints';
import { ImageError, resolveImage } from '../../store/checkpoints';
import { findSecretStore, secretEnvOf, SecretStoreMissing, SecretUnreadable } from '../../store/secrets';
import { assertStoreUnused, removeSecretStore } from './secret-stores';
import { normaliseEgress } from '../../sandbox';
import { networkSchema } from '../../contract/network';
import { ImageManifestSchema } from '../../contract/image-schema';
import { imageSnapshot, sseIfAsked } from './snapshots';

const EgressView = z.union([z.enum(['internet', 'none']), z.object({ allow: z.array(z.string()) })]);
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

/** The create body of the OpenComputer client (`Sandbox.create`); fields we do not use are ignored. */
export const CreateSandboxBody = z
  .object({
    templateID: z.string().min(1).max(200).default('base'),
    snapshot: z.string().min(1).max(200).optional(),
    image: ImageManifestSchema.optional().describe(
      'An image manifest (the client\'s Image): built once per manifest and cached as the snapshot image-<hash>, then the sandbox starts from it. ' +
        'With Accept: text/event-stream the answer streams build_log events and ends with result (the sandbox) or error.',
    ),
    envs: z.record(EnvName, z.string().max(32768)).default({}),
    secretStore: z
      .string()
      .min(1)
      .max(100)
      .optional()
      .describe("Name of a secret store: its secrets become environment variables (the body's envs win on a clash)"),
    metadata: z.record(z.string(), z.string().max(4096)).default({}),
    timeout: z.number().int().min(0).max(30 * 24 * 3600).default(0).describe('Idle seconds before the sandbox is destroyed (or hibernated: onTimeout); 0 = never'),
    onTimeout: z.enum(['kill', 'hibernate']).default('kill').describe('What an idle timeout does: kill (default) or hibernate (wake brings it back)'),
    memoryMB: z
      .number()
      .int()
      .min(MIN_MEMORY_MB)
      .optional()
      .describe('Memory limit in MB; default SANDBOX_MEMORY_MB (2048), at most SANDBOX_MAX_MEMORY_MB (the machine\'s memory)'),
    cpuCount: z.number().min(0.1).optional().describe('CPUs of CFS quota; default SANDBOX_CPU_COUNT (0: no quota, an equal share), at most SANDBOX_MAX_CPU_COUNT'),
    diskMB: z
      .number()
      .int()
      .min(1)
      .optional()
      .describe('Size of the writable layer in MB (writes past it get ENOSPC); default SANDBOX_DISK_MB (2048), at most SANDBOX_MAX_DISK_MB (20480)'),
    previewAuth: z.unknown().optional().describe('Not implemented (501): protect previews per URL with authConfig at POST /preview'),
    webhooks: z.unknown().optional().describe('Not implemented (501): sandbox lifecycle webhooks'),
    network: networkSchema(z)
      .optional()
.describe(
        "What the sandbox may reach: egress 'internet' (default), 'none', or { allow: [IPv4 address, CIDR, host name or *.wildcard…] }; the host, link-local, other sandboxes and private ranges are always refused",
      ),
  })
  .openapi('CreateSandbox');

export const SandboxView = z
  .object({
    sandboxID: z.string(),
    status: z.enum(['running', 'hibernated', 'stopped', 'error']),
    templateID: z.string(),
    metadata: z.record(z.string(), z.string()),
    timeout: z.number().int(),
    onTimeout: z.enum(['kill', 'hibernate']),
    hibernatedAt: z.string().nullable().describe('When it was hibernated (status hibernated), else null'),
    memoryMB: z.number().nullable().describe('The effective memory limit in MB (null: a sandbox created before limits were recorded)'),
    cpuCount: z.number().nullable().describe('The effective CPU quota; 0: no quota, an equal share of the machine'),
    diskMB: z.number().nullable().describe('The effective size of the writable layer in MB'),
    fromCheckpoint: z.string().nullable(),
    snapshot: z.string().nullable(),
    sandboxDomain: z.string(),
    network: z.object({ egress: EgressView }).describe('Its egress policy now (PUT /api/sandboxes/{id}/network changes it)'),
    createdAt: z.string(),
  })
  .openapi('Sandbox');

/** `GET /api/sandboxes/{id}/allowed-hosts`: OpenComputer's AllowedHostsInfo, plus the policy itself. */
export const AllowedHostsView = z
  .object({
    sandboxID: z.string(),
    secretStore: z.string().optional(),
    egressAllowlist: z.array(z.string()).describe('The allow list of its policy (names, wildcards and CIDRs); empty under internet and none: see network'),
    perSecretAllowedHosts: z.record(z.string(), z.array(z.string())).describe('Always empty: secrets are not sealed (see the README)'),
    network: z.object({ egress: EgressView }),
  })
  .openapi('AllowedHosts');

export const SandboxParams = z.object({ id: z.string().regex(/^sb-[a-z0-9-]{1,64}$/, 'must be a sandbox id (sb-…)') });

/** The public form of a sandbox (OpenComputer's shape: `sandboxID`, camelCase fields). */
export function sandboxView(deps: ApiDeps, s: SandboxDoc): z.infer<typeof SandboxView> {
  return {
    sandboxID: s._id,
    status: s.status,
    templateID: s.templateID,
    metadata: fromJsonText<Record<string, string>>(s.metadata) ?? {},
    timeout: s.timeout,
    onTimeout: s.onTimeout ?? 'kill',
    hibernatedAt: s.status === 'hibernated' && s.hibernation ? s.hibernation.at.toISOString() : null,
    memoryMB: s.memoryMB,
    cpuCount: s.cpuCount,
    diskMB: s.diskMB ?? null,
    fromCheckpoint: s.fromCheckpoint,
    snapshot: s.snapshot,
    sandboxDomain: deps.cfg.PREVIEW_DOMAIN,
    network: s.network ?? { egress: 'internet' },
    createdAt: s.createdAt.toISOString(),
  };
}

/** The organisation's sandbox, or 404. */
export async function getOrgSandbox(deps: ApiDeps, orgId: string, id: string): Promise<SandboxDoc> {
  const doc = await findOrgSandbox(deps.store, orgId, id);
  if (!doc) throw notFound(`sandbox ${id}`);
  return doc;
}

/** What a new sandbox is made from, besides the base image. */
export interface SandboxOrigin {
  layers?: string[];
  patches?: { id: string; script: string }[];
  fromCheckpoint?: string | null;
  snapshot?: string | null;
  instanceId?: string | null;
  /** The host that has the layers (a sandbox placed elsewhere gets them from it first). */
  hostId?: string;
  /** Environment from the image (the caller's envs override it) and its default working directory. */
  envs?: Record<string, string>;
  cwd?: string | null;
}

/** Where a sandbox started from a snapshot comes from (its layer, patches, env, workdir and host). 400 for an unusable snapshot. */
export async function snapshotOrigin(deps: ApiDeps, orgId: string, ref: string): Promise<SandboxOrigin> {
  try {
    const img = await resolveImage(deps.store, orgId, ref);
    return {
      layers: img.layers,
      patches: img.patches,
      snapshot: img.snapshotId,
      fromCheckpoint: img.checkpointId,
      hostId: img.hostId,
      envs: img.env,
      cwd: img.workdir,
    };
  } catch (err) {
    if (err instanceof ImageError) throw new ApiError('invalid_request', `body.snapshot: ${err.message}`);
    throw err;
  }
}

/** 501 for create options of the client this server does not implement: ignoring them would leave previews public or events undelivered while the caller thinks otherwise. */
function refuseUnsupported(body: { previewAuth?: unknown; webhooks?: unknown }): void {
  if (body.previewAuth !== undefined) throw new ApiError('not_implemented', 'Sandbox.create({ previewAuth }) is not implemented by this server: protect each preview URL with authConfig at POST /api/sandboxes/{id}/preview');
  if (body.webhooks !== undefined) throw new ApiError('not_implemented', 'Sandbox.create({ webhooks }) is not implemented by this server: no sandbox lifecycle webhooks (sessions have webhooks: see the README)');
}

/**
 * Records a sandbox and creates it on a host. The record's insert and the host's create run at the
 * same time; if either fails, the other is undone (the host sandbox destroyed, the record removed) and
 * the error passed on. A sandbox left on a host without a record (the API died between the two) is
 * destroyed by the worker's reaper once it is older than its grace period (worker/reaper.ts).
 * Limits above the operator's maxima are refused (400) before anything is created; absent ones get
 * the defaults, and the record holds the effective values the host is asked to apply.
 */
export async function provisionSandbox(
  deps: ApiDeps,
  orgId: string,
  body: z.infer<typeof CreateSandboxBody>,
  origin: SandboxOrigin = {},
): Promise<SandboxDoc> {
  refuseUnsupported(body);
  const over = overMaximum(deps.cfg.limits, body, 'body.');
  if (over) throw invalid(over);
  const limits = effectiveResources(deps.cfg.limits, body);
  let secretEnv: Record<string, string> = {};
  try {
    secretEnv = await secretEnvOf(deps.store, deps.secrets, orgId, body.secretStore);
  } catch (err) {
    if (err instanceof SecretStoreMissing) throw invalid(`body.secretStore: no secret store named ${err.storeName}`);
    if (err instanceof SecretUnreadable) throw new ApiError('internal', err.message);
    throw err;
  }
  const { hostId, client } = await deps.hosts.pick();
  if (origin.hostId && origin.layers?.length && origin.hostId !== hostId) await deps.hosts.bringLayers(hostId, origin.hostId, origin.layers);
  const now = new Date();
  const doc: SandboxDoc = {
    _id: `sb-${randomId()}`,
    orgId,
    hostId,
    status: 'running',
    templateID: body.templateID,
    metadata: JSON.stringify(body.metadata),
    fromCheckpoint: origin.fromCheckpoint ?? null,
    snapshot: origin.snapshot ?? null,
    timeout: body.timeout,
    onTimeout: body.onTimeout,
    memoryMB: limits.memoryMB,
    cpuCount: limits.cpuCount,
    diskMB: limits.diskMB,
    instanceId: origin.instanceId ?? null,
    network: body.network ? { egress: normaliseEgress(body.network.egress) } : null,
    secretStore: body.secretStore ?? null,
    createdAt: now,
    updatedAt: now,
  };
  const [recorded, created] = await Promise.allSettled([
    sandboxesOf(deps.store).insertOne(doc),
    client.createSandbox({
      id: doc._id,
      orgId,
      owner: origin.instanceId ? { kind: 'instance', id: origin.instanceId } : { kind: 'api', id: doc._id },
      // Image env, then the store's secrets, then the caller's envs (the most specific wins).
      envs: { ...origin.envs, ...secretEnv, ...body.envs },
      ...(origin.cwd ? { cwd: origin.cwd } : {}),
      memoryMB: limits.memoryMB,
      cpuCount: limits.cpuCount,
      diskMB: limits.diskMB,
      layers: origin.layers,
      patches: origin.patches,
      ...(body.network ? { network: body.network } : {}),
      metadata: body.metadata,
    }),
  ]);
  if (recorded.status === 'rejected') {
    if (created.status === 'fulfilled') {
      await client.destroySandbox(doc._id).catch((err) => deps.logger.warn({ err: String(err), sandboxId: doc._id }, 'could not destroy an unrecorded sandbox; the reaper will'));
    }
    throw recorded.reason;
  }
  if (created.status === 'rejected') {
    await sandboxesOf(deps.store).deleteOne({ _id: doc._id });
    const e = created.reason as { type?: string; message?: string };
    if (e.type === 'patch_failed') throw new ApiError('conflict', e.message ?? 'a patch failed');
    if (e.type === 'invalid_request' || e.type === 'not_found') throw new ApiError('invalid_request', e.message ?? 'invalid sandbox request');
    throw new ApiError('unavailable', `could not create the sandbox: ${e.message ?? String(created.reason)}`);
  }
  return doc;
}

/** Destroys a sandbox on its host and marks its record stopped. Idempotent. */
export async function destroySandbox(deps: ApiDeps, doc: SandboxDoc): Promise<SandboxDoc> {
  if (doc.status !== 'stopped') {
    const host = await deps.hosts.get(doc.hostId);
    await host.destroySandbox(doc._id);
    await deleteSandboxPreviews(deps, doc._id);
    const now = new Date();
    await sandboxesOf(deps.store).updateOne({ _id: doc._id }, { $set: { status: 'stopped', updatedAt: now } });
    return { ...doc, status: 'stopped', updatedAt: now };
  }
  return doc;
}

/** Wakes a hibernated sandbox on its host (running `patches` first) and records it running; answers the fields it set. */
async function wakeSandbox(deps: ApiDeps, doc: SandboxDoc, patches: { id: string; script: string }[], timeout?: number): Promise<Partial<SandboxDoc>> {
  const host = await deps.hosts.get(doc.hostId);
  try {
    await host.wake(doc._id, patches);
  } catch (err) {
    const e = err as { type?: string; message?: string };
    if (e.type === 'patch_failed') throw new ApiError('conflict', `sandbox ${doc._id} stays hibernated: ${e.message}`);
    // Already awake on the host (a wake whose record was not written): record it below.
    if (e.type !== 'conflict') throw new ApiError('unavailable', `could not wake the sandbox: ${e.message ?? String(err)}`);
  }
  const now = new Date();
  const set = { status: 'running' as const, hibernation: null, lastActiveAt: now, updatedAt: now, ...(timeout !== undefined ? { timeout } : {}) };
  await sandboxesOf(deps.store).updateOne({ _id: doc._id }, { $set: set });
  return set;
}

/** Wakes a hibernated sandbox with the on_wake patches of the checkpoint it stands on; answers the fields it set. */
export async function wakeWithPatches(deps: ApiDeps, doc: SandboxDoc, timeout?: number): Promise<Partial<SandboxDoc>> {
  const cp = doc.fromCheckpoint ? await findOrgCheckpoint(deps.store, doc.orgId, doc.fromCheckpoint) : null;
  const patches = cp ? (await listPatches(deps.store, cp)).map((p) => ({ id: p._id, script: p.script })) : [];
  return wakeSandbox(deps, doc, patches, timeout);
}

/** Wakes in flight, by sandbox: concurrent requests that wake one sandbox share one wake. */
const waking = new Map<string, Promise<unknown>>();

/**
 * Starts waking a hibernated sandbox in the background (at most one wake per sandbox at a time), for
 * the client's async wake: its requests are answered 503 `{ waking: true }` and retried.
 */
export function wakeInBackground(deps: ApiDeps, doc: SandboxDoc): void {
  if (waking.has(doc._id)) return;
  const p = wakeWithPatches(deps, doc)
    .catch((err: unknown) => deps.logger.warn({ err: String(err), sandboxId: doc._id }, 'background wake failed'))
    .finally(() => waking.delete(doc._id));
  waking.set(doc._id, p);
}

/** Hibernates a running sandbox (its record too); 409 when it is not running. */
async function hibernateOrgSandbox(deps: ApiDeps, doc: SandboxDoc): Promise<SandboxDoc> {
  if (doc.status !== 'running') throw new ApiError('conflict', `sandbox ${doc._id} is ${doc.status}; only a running sandbox can hibernate`);
  const host = await deps.hosts.get(doc.hostId);
  try {
    return await hibernateSandbox(deps.store, host, doc);
  } catch (err) {
    const e = err as { type?: string; message?: string };
    if (e.type === 'conflict' || e.type === 'not_found' || e.type === 'invalid_request') throw new ApiError('conflict', `sandbox ${doc._id} cannot hibernate: ${e.message}`);
    throw new ApiError('unavailable', `could not hibernate the sandbox: ${e.message ?? String(err)}`);
  }
}

/** /api/sandboxes: create, list, read, kill (the OpenComputer API's shapes). */
export function registerSandboxRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'post',
    path: '/api/sandboxes',
    tag: 'sandboxes',
    summary: 'Create a sandbox from the base image',
    body: CreateSandboxBody,
    responses: { 201: { description: 'The running sandbox', schema: SandboxView } },
    errors: [503, 507],
    handler: async ({ body, org, req, res }) => {
      if (body.templateID !== 'base') throw new ApiError('invalid_request', `body.templateID: unknown template ${body.templateID}; only "base" exists`);
      if (body.image && body.snapshot) throw new ApiError('invalid_request', 'body: give at most one of image and snapshot');
      refuseUnsupported(body);
      if (body.image) {
        const image = body.image;
        const builderMB = image.builderMemoryMB;
        if (builderMB !== undefined && builderMB > deps.cfg.limits.maxMemoryMB) {
          throw invalid(`body.image.builderMemoryMB: ${builderMB} is above the maximum of ${deps.cfg.limits.maxMemoryMB} MB (SANDBOX_MAX_MEMORY_MB)`);
        }
        const stream = sseIfAsked(req, res);
        if (!stream) {
          const snap = await imageSnapshot(deps, org.id, image, () => undefined);
          const doc = await provisionSandbox(deps, org.id, body, await snapshotOrigin(deps, org.id, snap._id));
          res.status(201).json(sandboxView(deps, doc));
          return;
        }
        // The answer has begun (200, text/event-stream): failures become an error event.
        try {
          const snap = await imageSnapshot(deps, org.id, image, (e) => stream.send('build_log', e));
          const doc = await provisionSandbox(deps, org.id, body, await snapshotOrigin(deps, org.id, snap._id));
          stream.send('result', sandboxView(deps, doc));
        } catch (err) {
          stream.send('error', { error: (err as Error).message, type: err instanceof ApiError ? err.type : 'internal' });
        } finally {
          stream.end();
        }
        return;
      }
      const doc = body.snapshot
        ? await provisionSandbox(deps, org.id, body, await snapshotOrigin(deps, org.id, body.snapshot))
        : await provisionSandbox(deps, org.id, body);
      res.status(201).json(sandboxView(deps, doc));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes',
    tag: 'sandboxes',
    summary: "List the organisation's running and hibernated sandboxes",
    responses: { 200: { description: 'Sandboxes, newest first', schema: z.array(SandboxView) } },
    handler: async ({ org, res }) => {
      const docs = await sandboxesOf(deps.store)
        .find({ orgId: org.id, status: { $in: ['running', 'hibernated'] } })
        .sort({ createdAt: -1 })
        .limit(1000)
        .toArray();
      res.json(docs.map((d) => sandboxView(deps, d)));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id',
    tag: 'sandboxes',
    summary: 'Get a sandbox',
    params: SandboxParams,
    responses: { 200: { description: 'The sandbox', schema: SandboxView } },
    handler: async ({ params, org, res }) => {
      res.json(sandboxView(deps, await getOrgSandbox(deps, org.id, params.id)));
    },
  });

  t.add({
    method: 'put',
    path: '/api/sandboxes/:id/network',
    tag: 'sandboxes',
    summary: "Change a running sandbox's egress policy; it takes effect at once",
    params: SandboxParams,
    body: networkSchema(z),
    responses: { 200: { description: 'The sandbox with its new policy', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      if (doc.status !== 'running') throw new ApiError('conflict', `sandbox ${doc._id} is ${doc.status}`);
      const host = await deps.hosts.get(doc.hostId);
      let info;
      try {
        info = await host.setNetwork(doc._id, body);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'conflict' || e.type === 'not_found') throw new ApiError('conflict', e.message ?? `sandbox ${doc._id} cannot change its policy`);
        if (e.type === 'invalid_request') throw new ApiError('invalid_request', e.message ?? 'invalid policy');
        throw err;
      }
      const network = info.network ?? body;
      const now = new Date();
      await sandboxesOf(deps.store).updateOne({ _id: doc._id }, { $set: { network, updatedAt: now } });
      res.json(sandboxView(deps, { ...doc, network, updatedAt: now }));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/allowed-hosts',
    tag: 'sandboxes',
    summary: "What the sandbox may reach (OpenComputer's getAllowedHosts)",
    params: SandboxParams,
    responses: { 200: { description: 'Its allow list and policy', schema: AllowedHostsView } },
    handler: async ({ params, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      const network = doc.network ?? { egress: 'internet' as const };
      res.json({
        sandboxID: doc._id,
        ...(doc.secretStore ? { secretStore: doc.secretStore } : {}),
        egressAllowlist: typeof network.egress === 'object' ? network.egress.allow : [],
        perSecretAllowedHosts: {},
        network,
      });
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/hibernate',
    tag: 'sandboxes',
    summary: 'Hibernate: save its files (its writable layer) and end its processes, releasing memory and cgroups; wake brings it back',
    params: SandboxParams,
    responses: { 200: { description: 'The sandbox, now hibernated', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      if (doc.status === 'hibernated') return void res.json(sandboxView(deps, doc));
      const after = await hibernateOrgSandbox(deps, doc);
      res.json(sandboxView(deps, after));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/wake',
    tag: 'sandboxes',
    summary: "Wake a hibernated sandbox: same id, files, env, limits, network policy, metadata and previews; its checkpoint's on_wake patches run first, in sequence order",
    params: SandboxParams,
    body: z.object({ timeout: z.number().int().min(0).max(30 * 24 * 3600).optional().describe('A new idle timeout in seconds (0 = none)') }).passthrough(),
    responses: { 200: { description: 'The running sandbox', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      if (doc.status !== 'hibernated') {
        const why = doc.status === 'running' ? 'is running' : doc.status === 'stopped' ? 'was killed' : `is ${doc.status}`;
        throw new ApiError('conflict', `sandbox ${doc._id} ${why}; only a hibernated sandbox can be woken`);
      }
      const set = await wakeWithPatches(deps, doc, body.timeout);
      res.json(sandboxView(deps, { ...doc, ...set }));
    },
  });

  for (const [call, path] of [['reboot', 'reboot'], ['powerCycle', 'power-cycle']] as const) {
    t.add({
      method: 'post',
      path: `/api/sandboxes/:id/${path}`,
      tag: 'sandboxes',
      summary: `${call === 'reboot' ? 'Reboot' : 'Power-cycle'}: every process of the sandbox ends and it starts again with the same id, files, env and previews (a hibernate and a wake, without patches)`,
      params: SandboxParams,
      responses: { 200: { description: 'The running sandbox', schema: SandboxView } },
      errors: [409, 503],
      handler: async ({ params, org, res }) => {
        const doc = await hibernateOrgSandbox(deps, await getOrgSandbox(deps, org.id, params.id));
        const set = await wakeSandbox(deps, doc, []);
        res.json(sandboxView(deps, { ...doc, ...set }));
      },
    });
  }

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/timeout',
    tag: 'sandboxes',
    summary: 'Set the idle timeout in seconds (0 = none), counted from now',
    params: SandboxParams,
    body: z.object({ timeout: z.number().int().min(0).max(30 * 24 * 3600) }).strict(),
    responses: { 200: { description: 'The sandbox', schema: SandboxView } },
    errors: [409],
    handler: async ({ params, body, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      if (doc.status === 'stopped') throw new ApiError('conflict', `sandbox ${doc._id} was killed`);
      const now = new Date();
      const set = { timeout: body.timeout, lastActiveAt: now, updatedAt: now };
      await sandboxesOf(deps.store).updateOne({ _id: doc._id }, { $set: set });
      res.json(sandboxView(deps, { ...doc, ...set }));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/:id',
    tag: 'sandboxes',
    summary: "Kill a sandbox: its processes are killed and its files removed (a hibernated one's saved files too)",
    params: SandboxParams,
    query: z.object({
      deleteSecretStore: z.enum(['true', 'false']).optional().describe("true: also delete the secret store it was created with (409, and nothing killed, while an agent names that store)"),
    }),
    responses: { 200: { description: 'The sandbox, now stopped', schema: SandboxView } },
    errors: [409],
    handler: async ({ params, query, org, res }) => {
      const doc = await getOrgSandbox(deps, org.id, params.id);
      const store = query.deleteSecretStore === 'true' && doc.secretStore ? await findSecretStore(deps.store, org.id, doc.secretStore) : null;
      if (store) await assertStoreUnused(deps, store);
      const after = await destroySandbox(deps, doc);
      if (store) await removeSecretStore(deps, store);
      res.json(sandboxView(deps, after));
    },
  });
}
