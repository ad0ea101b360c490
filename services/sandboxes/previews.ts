/**
 * Previews, the bookkeeping side: creating and removing preview records (a sandbox port served at a
 * hostname), and where a preview's requests go. The HTTP proxying itself is api/preview-proxy.ts.
 *
 * Path of a request: Host → preview record (`_id` lookup, cached 2 s; dropped at once on delete here)
 * → bearer check → the Unix socket of the sandbox port's forwarder on the sandbox host (see
 * sandbox/host/forward.ts; asked for once, then cached) → 127.0.0.1:<port> inside the sandbox.
 * When the API and the host do not share a machine (or PREVIEW_TRANSPORT=tcp), each connection is a
 * tunnel through the host's HTTP port instead (HostClient.openTunnel: authenticated with HOST_TOKEN,
 * then a byte pipe to the same forwarder): not kept alive, one more hop.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { ApiError, conflict, invalid, notFound } from '../../contract/errors';
import { hashSecret, randomId } from '../../lib/ids';
import { machineName } from '../../lib/machine';
import type { HostClient } from '../../sandbox';
import { isDuplicateKey } from '../../store';
import { deletePreview, findPreview, insertPreview, listSandboxPreviews, type PreviewDoc } from '../../store/previews';
import { findSandbox, markSandboxPreviewed, type SandboxDoc } from '../../store/sandboxes';
import type { SandboxDeps } from '../deps';

export type { PreviewDoc };

/** How the proxy reaches a sandbox port: the forwarder's Unix socket, or a tunnel through its host. */
export type PortRoute = { socketPath: string } | { tunnel: HostClient; sandboxId: string; port: number };

const CACHE_MS = 2_000;

/** The hostname (lowercase, no port) of a Host header. */
export function hostnameOf(host: string | undefined): string {
  if (!host) return '';
  const h = host.toLowerCase();
  const i = h.lastIndexOf(':');
  return i > 0 && !h.endsWith(']') ? h.slice(0, i) : h;
}

/** What POST /preview asks for (parsed). */
export interface PreviewRequest {
  port: number;
  domain?: string;
  authConfig?: { type?: 'bearer'; token?: string };
}

/**
 * The previews of one API process: preview records by hostname (cached), the forwarder sockets of
 * sandbox ports, and the operations on them. Built once (services/sandboxes/sandbox-services.ts); the routes
 * and the proxy share it, so a delete here applies to the proxy at once.
 */
export class PreviewService {
  private readonly records = new Map<string, { doc: PreviewDoc | null; until: number }>();
  private readonly sockets = new Map<string, PortRoute>();

  constructor(private readonly deps: SandboxDeps) {}

  /** Forgets a hostname (after create or delete on this process), so the change applies at once. */
  invalidate(hostname: string): void {
    this.records.delete(hostname);
  }

  /** Remembers where a sandbox port's forwarder listens. */
  private rememberSocket(sandboxId: string, port: number, socketPath: string, machine: string | undefined, host: HostClient): void {
    this.sockets.set(`${sandboxId}:${port}`, this.routeFor(sandboxId, port, socketPath, machine, host));
  }

  /** The Unix socket when it is reachable from here (and PREVIEW_TRANSPORT allows), else a tunnel through the host. */
  private routeFor(sandboxId: string, port: number, socketPath: string, machine: string | undefined, host: HostClient): PortRoute {
    const transport = this.deps.cfg.PREVIEW_TRANSPORT;
    const local = transport === 'unix' || (transport === 'auto' && machine === machineName());
    return local ? { socketPath } : { tunnel: host, sandboxId, port };
  }

  /** Forgets a sandbox port's socket (the preview is gone). */
  private forgetSocket(sandboxId: string, port: number): void {
    this.sockets.delete(`${sandboxId}:${port}`);
  }

  private async lookup(hostname: string): Promise<PreviewDoc | null> {
    if (!hostname) return null;
    const now = Date.now();
    const hit = this.records.get(hostname);
    if (hit && hit.until > now) return hit.doc;
    const doc = await findPreview(this.deps.store, hostname);
    if (this.records.size > 10_000) this.records.clear();
    this.records.set(hostname, { doc, until: now + CACHE_MS });
    return doc;
  }

  /** Checks the request's bearer token against the preview's; throws 401. */
  private authorize(doc: PreviewDoc, headers: IncomingHttpHeaders): void {
    if (!doc.auth) return;
    const auth = headers.authorization;
    const presented =
      (typeof headers['x-preview-token'] === 'string' ? headers['x-preview-token'] : undefined) ??
      (auth && /^bearer\s+/i.test(auth) ? auth.replace(/^bearer\s+/i, '').trim() : undefined);
    if (!presented) throw new ApiError('unauthorized', 'this preview needs a token: send Authorization: Bearer <token> or X-Preview-Token');
    const a = Buffer.from(hashSecret(presented), 'hex');
    const b = Buffer.from(doc.auth.tokenHash, 'hex');
    if (a.length !== b.length || !timingSafeEqual(a, b)) throw new ApiError('unauthorized', 'invalid preview token');
  }

  /** The route to the preview's port; asks the sandbox host when not known (or `fresh`). */
  async routeOf(doc: PreviewDoc, fresh = false): Promise<PortRoute> {
    const key = `${doc.sandboxId}:${doc.port}`;
    const known = this.sockets.get(key);
    if (known && !fresh) return known;
    const host = await this.deps.hosts.get(doc.hostId);
    try {
      const { socketPath, machine } = await host.portForward(doc.sandboxId, doc.port);
      const route = this.routeFor(doc.sandboxId, doc.port, socketPath, machine, host);
      this.sockets.set(key, route);
      return route;
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'not_found') throw new ApiError('bad_gateway', `sandbox ${doc.sandboxId} is not running`);
      // Hibernated (or stopping): the host says which; waking it brings the preview back.
      if (e.type === 'conflict') throw new ApiError('unavailable', e.message ?? `sandbox ${doc.sandboxId} is not running`);
      throw new ApiError('bad_gateway', `could not reach sandbox ${doc.sandboxId}: ${e.message ?? String(err)}`);
    }
  }

  /** The preview of `hostname` and the route to its port, once the request may pass: 404 or 401 otherwise. */
  async admit(hostname: string, headers: IncomingHttpHeaders): Promise<{ doc: PreviewDoc; route: PortRoute }> {
    const doc = await this.lookup(hostname);
    if (!doc) throw new ApiError('not_found', `preview ${hostname} not found`);
    this.authorize(doc, headers);
    return { doc, route: await this.routeOf(doc) };
  }

  /**
   * Exposes a port of a running sandbox at `<sandbox id>-p<port>.<domain>` (409 when it is not
   * running or the port has a preview). Answers the record and the bearer token (shown once).
   */
  async create(sandbox: SandboxDoc, body: PreviewRequest): Promise<{ doc: PreviewDoc; token?: string }> {
    const { deps } = this;
    if (sandbox.status !== 'running') throw conflict(`sandbox ${sandbox._id} is ${sandbox.status}`);
    if (body.authConfig?.token && !body.authConfig.type) throw invalid('body.authConfig.type: must be "bearer" when a token is given');
    const bearer = body.authConfig?.type === 'bearer';
    const token = bearer ? (body.authConfig?.token ?? `pvt_${randomBytes(32).toString('base64url')}`) : undefined;
    const base = body.domain ?? deps.cfg.PREVIEW_DOMAIN;
    const hostname = `${sandbox._id}-p${body.port}.${base}`;
    const doc: PreviewDoc = {
      _id: hostnameOf(hostname),
      id: `pv-${randomId()}`,
      orgId: sandbox.orgId,
      sandboxId: sandbox._id,
      hostId: sandbox.hostId,
      port: body.port,
      domain: body.domain ?? null,
      hostname,
      auth: token ? { type: 'bearer', tokenHash: hashSecret(token) } : null,
      createdAt: new Date(),
    };
    // Marked before the port opens: the sandbox's delete from now on looks for its previews.
    if (!(await markSandboxPreviewed(deps.store, sandbox._id))) throw conflict(`sandbox ${sandbox._id} is not running`);
    // The port becomes reachable only now: open its forwarder first, so a failure leaves no record.
    const host = await deps.hosts.get(sandbox.hostId);
    let forward: { socketPath: string; machine?: string };
    try {
      forward = await host.portForward(sandbox._id, body.port);
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'not_found' || e.type === 'conflict') throw conflict(`sandbox ${sandbox._id} is not running`);
      throw new ApiError('bad_gateway', `could not open the port on the sandbox host: ${e.message ?? String(err)}`);
    }
    try {
      await insertPreview(deps.store, doc);
    } catch (err) {
      if (isDuplicateKey(err)) throw conflict(`port ${body.port} already has a preview at ${hostname}; delete it first`);
      throw err;
    }
    // A delete may have destroyed the sandbox while its port opened, and looked for its previews
    // before this insert: it marks the record stopped before it looks, so this read sees it, and
    // the preview it missed goes here.
    const after = await findSandbox(deps.store, sandbox._id);
    if (!after || (after.status !== 'running' && after.status !== 'hibernated')) {
      await deletePreview(deps.store, doc);
      this.invalidate(doc._id);
      throw conflict(`sandbox ${sandbox._id} is ${after?.status ?? 'gone'}`);
    }
    this.rememberSocket(sandbox._id, body.port, forward.socketPath, forward.machine, host);
    this.invalidate(doc._id);
    return { doc, token };
  }

  /** The sandbox's previews, by port. */
  list(sandbox: SandboxDoc): Promise<PreviewDoc[]> {
    return listSandboxPreviews(this.deps.store, sandbox._id);
  }

  /** Removes the previews of a port (404 when it has none) and closes its forwarder. */
  async removePort(sandbox: SandboxDoc, port: number): Promise<void> {
    const { deps } = this;
    const docs = (await listSandboxPreviews(deps.store, sandbox._id)).filter((p) => p.port === port);
    if (docs.length === 0) throw notFound(`preview of port ${port} on sandbox ${sandbox._id}`);
    for (const d of docs) {
      await deletePreview(deps.store, d);
      this.invalidate(d._id);
    }
    this.forgetSocket(sandbox._id, port);
    // Close the port's forwarder so nothing reaches it any more; the sandbox may already be gone.
    if (sandbox.status === 'running') {
      await deps.hosts
        .get(sandbox.hostId)
        .then((h) => h.closePortForward(sandbox._id, port))
        .catch((err: Error) => deps.logger.warn({ err, sandboxId: sandbox._id }, 'could not close the forwarded port'));
    }
  }

  /**
   * Removes every preview of a sandbox (when it is destroyed), on this process at once.
   * Best effort towards the host: its forwarder goes with the sandbox anyway.
   */
  async removeAll(sandboxId: string): Promise<number> {
    const docs = await listSandboxPreviews(this.deps.store, sandboxId);
    for (const d of docs) {
      await deletePreview(this.deps.store, d);
      this.invalidate(d._id);
      this.forgetSocket(d.sandboxId, d.port);
    }
    return docs.length;
  }
}
