import type { Store } from './index';

/** A sandbox host, registered by the worker beside it at start. */
export interface HostDoc {
  _id: string;
  url: string;
  taskQueue: string;
  updatedAt: Date;
}

export const hostsOf = (store: Store) => store.db.collection<HostDoc>('hosts');

/** Records (or refreshes) where a host is reachable and which task queue serves it. */
export async function registerHost(store: Store, host: { id: string; url: string; taskQueue: string }): Promise<void> {
  await hostsOf(store).updateOne({ _id: host.id }, { $set: { url: host.url, taskQueue: host.taskQueue, updatedAt: new Date() } }, { upsert: true });
}
