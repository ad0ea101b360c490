import type { Store } from './index';

/** A terminal started through the API (`pty-…`, the host's id): who owns it, so any API process can attach a client. */
export interface PtyDoc {
  _id: string;
  orgId: string;
  sandboxId: string;
  createdAt: Date;
}

const ptySessionsOf = (store: Store) => store.db.collection<PtyDoc>('pty_sessions');

/** Records a terminal. */
export async function insertPty(store: Store, doc: PtyDoc): Promise<void> {
  await ptySessionsOf(store).insertOne(doc);
}

/** A terminal's record by id, or null. */
export function findPty(store: Store, id: string): Promise<PtyDoc | null> {
  return ptySessionsOf(store).findOne({ _id: id });
}
