import { HostClient } from '../sandbox/host/client';
import type { Store } from '../store';
import { hostsOf, HostDoc } from '../store/hosts';
import { ApiError } from '../lib/errors';

/**
 * Finds the sandbox host that owns a sandbox (hosts register themselves in MongoDB through the
 * worker beside them) and gives a client for it. All hosts share one token (HOST_TOKEN).
 */
export class HostDirectory {
  private readonly clients = new Map<string, { client: HostClient; doc: HostDoc; at: number }>();

  constructor(
    private readonly store: Store,
    private readonly token: string,
  ) {}

  /** The client of host `hostId`; 503 when the host is unknown. */
  async get(hostId: string): Promise<HostClient> {
    const hit = this.clients.get(hostId);
    if (hit && Date.now() - hit.at < 60_000) return hit.client;
    const doc = await hostsOf(this.store).findOne({ _id: hostId });
    if (!doc) throw new ApiError('unavailable', `sandbox host ${hostId} is not registered`);
    const client = hit?.doc.url === doc.url ? hit.client : new HostClient({ url: doc.url, token: this.token });
    this.clients.set(hostId, { client, doc, at: Date.now() });
    return client;
  }

  private picked: { value: { hostId: string; client: HostClient; taskQueue: string }; at: number } | undefined;

  /**
   * A host to place a new sandbox on: the most recently seen one (the choice is kept for 5 s,
   * so creating sandboxes does not query the hosts collection each time). 503 when none is registered.
   */
  async pick(): Promise<{ hostId: string; client: HostClient; taskQueue: string }> {
    if (this.picked && Date.now() - this.picked.at < 5_000) return this.picked.value;
    const docs = await hostsOf(this.store).find({}).sort({ updatedAt: -1 }).limit(1).toArray();
    const doc = docs[0];
    if (!doc) throw new ApiError('unavailable', 'no sandbox host is registered; is a worker running?');
    const value = { hostId: doc._id, client: await this.get(doc._id), taskQueue: doc.taskQueue };
    this.picked = { value, at: Date.now() };
    return value;
  }
}
