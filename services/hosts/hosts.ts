import { HostClient } from '../../sandbox';
import type { Store } from '../../store';
import { findHost, type HostDoc } from '../../store/hosts';
import { chooseHost, hostAlive, HostView } from './placement';
import { ApiError } from '../../contract/errors';

/** How long a direct probe of a host whose heartbeat is late may take, and how long its answer is kept. */
const PROBE_TIMEOUT_MS = 1_500;
const PROBE_KEEP_MS = 2_000;

/**
 * Finds the sandbox host that owns a sandbox (hosts register themselves in MongoDB through the
 * worker beside them, and heartbeat there) and gives a client for it. All hosts share one token
 * (HOST_TOKEN). A host is lost when its heartbeat is older than HOST_DEAD_AFTER and it does not
 * answer a direct probe either (a host whose worker alone is down still serves its sandboxes).
 */
export class HostDirectory {
  private readonly clients = new Map<string, { client: HostClient; url: string }>();
  private readonly view: HostView;
  private readonly probes = new Map<string, { alive: Promise<boolean>; at: number }>();

  constructor(
    private readonly store: Store,
    private readonly token: string,
    private readonly deadAfterMs = 15_000,
  ) {
    this.view = new HostView(store, 1_000);
  }

  private clientOf(doc: HostDoc): HostClient {
    const hit = this.clients.get(doc._id);
    if (hit?.url === doc.url) return hit.client;
    const client = new HostClient({ url: doc.url, token: this.token });
    this.clients.set(doc._id, { client, url: doc.url });
    return client;
  }

  private async docOf(hostId: string): Promise<HostDoc | null> {
    const doc = (await this.view.all()).find((d) => d._id === hostId);
    // Registered after the view was read: ask for it alone.
    return doc ?? (await findHost(this.store, hostId));
  }

  /** True when the host answers /healthz (asked at most every PROBE_KEEP_MS). */
  private probe(doc: HostDoc): Promise<boolean> {
    const hit = this.probes.get(doc._id);
    if (hit && Date.now() - hit.at < PROBE_KEEP_MS) return hit.alive;
    const alive = this.clientOf(doc)
      .health({ signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) })
      .then((h) => h.hostId === doc._id)
      .catch(() => false);
    this.probes.set(doc._id, { alive, at: Date.now() });
    return alive;
  }

  /**
   * Why host `hostId` is lost, or null while it is not (or is not registered): marked lost by a
   * worker's host watch and not rejoined yet, or silent for HOST_DEAD_AFTER without answering a
   * probe. Costs the cached host view (read at most once a second) and, for a silent host only, a
   * probe kept PROBE_KEEP_MS: what a sandbox's view asks on every read.
   */
  async lostReason(hostId: string): Promise<string | null> {
    const doc = await this.docOf(hostId);
    return doc ? this.lostReasonOf(doc) : null;
  }

  private async lostReasonOf(cached: HostDoc): Promise<string | null> {
    if (!cached.lostAt && hostAlive(cached, this.deadAfterMs)) return null;
    // Lost as the cached view has it: read again before saying so (a host that rejoined a moment ago
    // is back at once; the view is up to a second old, and a 410 is rare enough to afford the read).
    const doc = (await findHost(this.store, cached._id)) ?? cached;
    if (doc.lostAt)
      return `sandbox host ${doc._id} is lost (since ${new Date(doc.lostAt).toISOString()}, not rejoined yet): its sandboxes are gone while it is`;
    if (hostAlive(doc, this.deadAfterMs) || (await this.probe(doc))) return null;
    return `sandbox host ${doc._id} is lost (not heard of for ${Math.round((Date.now() - new Date(doc.updatedAt).getTime()) / 1000)} s): its sandboxes are gone while it is`;
  }

  /** The client of host `hostId`; 503 when the host is unknown, 410 when it is lost (see lostReason). */
  async get(hostId: string): Promise<HostClient> {
    const doc = await this.docOf(hostId);
    if (!doc) throw new ApiError('unavailable', `sandbox host ${hostId} is not registered`);
    const lost = await this.lostReasonOf(doc);
    if (lost) throw new ApiError('gone', lost);
    return this.clientOf(doc);
  }

  /**
   * Makes `layers` (checkpoint or snapshot layers, with their parents) present on host `to`, fetched
   * host to host from `from` (streamed, checksummed, then cached on `to`) when missing there.
   * 503 when `from` is lost and `to` lacks them: their only copy is gone with it.
   */
  async bringLayers(to: string, from: string, layers: string[]): Promise<void> {
    const target = await this.get(to);
    let source: HostClient;
    try {
      source = await this.get(from);
    } catch (err) {
      if (err instanceof ApiError && err.type === 'gone') {
        // The target may hold copies from earlier fetches: a fetch that finds everything present asks nobody.
        const present = await Promise.all(
          layers.map((l) =>
            target.fetchLayer(l, 'http://lost.invalid').then(
              () => true,
              () => false,
            ),
          ),
        );
        if (present.every(Boolean)) return;
        throw new ApiError('unavailable', `the layers of this checkpoint or snapshot were only on sandbox host ${from}, which is lost: ${err.message}`);
      }
      throw err;
    }
    for (const layer of layers) {
      try {
        await target.fetchLayer(layer, source.url);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'not_found') throw new ApiError('conflict', `layer ${layer} is not on sandbox host ${from} any more: ${e.message}`);
        throw new ApiError('bad_gateway', `could not copy layer ${layer} from sandbox host ${from} to ${to}: ${e.message ?? String(err)}`);
      }
    }
  }

  /** The clients of the registered hosts whose heartbeat is fresh (for what every host is told, e.g. a released layer). */
  async liveHosts(): Promise<{ hostId: string; client: HostClient }[]> {
    const docs = await this.view.all();
    return docs.filter((d) => hostAlive(d, this.deadAfterMs)).map((d) => ({ hostId: d._id, client: this.clientOf(d) }));
  }

  /**
   * A host to place a new sandbox on: a live one, at random in proportion to its free capacity
   * (services/hosts/placement.ts chooseHost). 503 when none is registered or none has room.
   */
  async pick(): Promise<{ hostId: string; client: HostClient; taskQueue: string }> {
    let docs = await this.view.all(true);
    let doc = chooseHost(docs, this.deadAfterMs);
    if (!doc) {
      // The view may be a few seconds old (a host registered since, or its room freed): read again first.
      this.view.invalidate();
      docs = await this.view.all();
      doc = chooseHost(docs, this.deadAfterMs);
    }
    if (docs.length === 0) throw new ApiError('unavailable', 'no sandbox host is registered; is a worker running?');
    if (!doc) {
      // No heartbeat is fresh (workers down, say): hosts that answer a probe themselves still count.
      const answering = (await Promise.all(docs.map(async (d) => ((await this.probe(d)) ? { ...d, updatedAt: new Date() } : null)))).filter(
        (d): d is HostDoc => d !== null,
      );
      doc = chooseHost(answering, this.deadAfterMs);
    }
    if (!doc) throw new ApiError('unavailable', 'no live sandbox host has room for a new sandbox (HOST_MAX_SANDBOXES), or none is heard of');
    return { hostId: doc._id, client: this.clientOf(doc), taskQueue: doc.taskQueue };
  }
}
