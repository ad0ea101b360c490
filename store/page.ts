import type { Collection, Filter } from 'mongodb';
import { invalid } from '../contract/errors';

/** Position after the last item of a page, ordered by (created_at desc, _id desc). */
export interface PagePosition {
  t: string;
  id: string;
}

export function encodeCursor(pos: PagePosition): string {
  return Buffer.from(JSON.stringify(pos)).toString('base64url');
}

/** Decodes a cursor from a previous page, or throws 400. */
export function decodeCursor(cursor: string): PagePosition {
  try {
    const pos = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as PagePosition;
    if (typeof pos.t !== 'string' || typeof pos.id !== 'string' || Number.isNaN(Date.parse(pos.t))) throw new Error();
    return pos;
  } catch {
    throw invalid('query.cursor: not a cursor returned by this API');
  }
}

/** MongoDB filter for the items after `cursor` in (created_at desc, _id desc) order. */
export function afterCursor(cursor: string | undefined): Record<string, unknown> {
  if (!cursor) return {};
  const pos = decodeCursor(cursor);
  const t = new Date(pos.t);
  return { $or: [{ created_at: { $lt: t } }, { created_at: t, _id: { $lt: pos.id } }] };
}

/**
 * One page of `collection` matching `filter`, newest first by (created_at, _id), after `cursor`;
 * `next_cursor` is null on the last page.
 */
export async function pageOf<T extends { _id: string; created_at: Date }>(
  collection: Collection<T>,
  filter: Record<string, unknown>,
  limit: number,
  cursor: string | undefined,
): Promise<{ page: T[]; next_cursor: string | null }> {
  const docs = (await collection
    .find({ ...filter, ...afterCursor(cursor) } as Filter<T>)
    .sort({ created_at: -1, _id: -1 })
    .limit(limit + 1)
    .toArray()) as T[];
  const page = docs.slice(0, limit);
  const last = page[page.length - 1];
  return { page, next_cursor: docs.length > limit && last ? encodeCursor({ t: last.created_at.toISOString(), id: last._id }) : null };
}
