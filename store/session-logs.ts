import { isDuplicateKey, type Store } from './index';

/**
 * A session's entrypoint output, kept after its sandbox is gone: the last SESSION_LOG_MAX_BYTES of
 * stdout and of stderr, in the order written, one document per session that printed anything
 * (`_id` is the session's id; a silent session has none, and costs no write). Written once, when
 * the session ends (the first ending recorded wins, as for its result).
 */
export interface SessionLogDoc {
  _id: string;
  /** Pieces in order: stream, time the entry helper read it (null: unknown), text (UTF-8). */
  chunks: { s: 'stdout' | 'stderr'; t: Date | null; d: string; /** where it starts in its stream, in bytes */ o?: number }[];
  /** Each stream's whole size in bytes, and whether what is kept starts after its beginning. */
  bytes: { stdout: number; stderr: number };
  truncated: { stdout: boolean; stderr: boolean };
  created_at: Date;
}

export const sessionLogsOf = (store: Store) => store.db.collection<SessionLogDoc>('session_logs');

/** A log as the sandbox host answers it (chunk bytes in base64). */
export interface HostLog {
  chunks: { stream: 'stdout' | 'stderr'; at: number | null; offset?: number; data: string }[];
  bytes: { stdout: number; stderr: number };
  truncated: { stdout: boolean; stderr: boolean };
}

/**
 * The document for a host's log: neighbouring chunks of one stream merged before decoding, so a
 * UTF-8 character split between two reads stays whole. Null when nothing was printed.
 */
export function sessionLogDoc(sessionId: string, log: HostLog): SessionLogDoc | null {
  const merged: { s: 'stdout' | 'stderr'; t: number | null; o?: number; parts: Buffer[] }[] = [];
  for (const c of log.chunks) {
    const data = Buffer.from(c.data, 'base64');
    if (!data.length) continue;
    const last = merged[merged.length - 1];
    if (last && last.s === c.stream) last.parts.push(data);
    else merged.push({ s: c.stream, t: c.at, ...(c.offset !== undefined ? { o: c.offset } : {}), parts: [data] });
  }
  if (!merged.length) return null;
  return {
    _id: sessionId,
    chunks: merged.map((m) => ({
      s: m.s,
      t: m.t === null ? null : new Date(m.t),
      d: Buffer.concat(m.parts).toString('utf8'),
      ...(m.o !== undefined ? { o: m.o } : {}),
    })),
    bytes: log.bytes,
    truncated: log.truncated,
    created_at: new Date(),
  };
}

/** Stores a session's log once (a retry after a crash finds it there and keeps it). */
export async function saveSessionLog(store: Store, doc: SessionLogDoc): Promise<void> {
  try {
    await sessionLogsOf(store).insertOne(doc);
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
  }
}

/** The last lines of stderr, at most `maxChars` characters, for a failed session's message. */
export function stderrTail(doc: SessionLogDoc | null, maxChars = 2048): string {
  if (!doc) return '';
  const text = doc.chunks
    .filter((c) => c.s === 'stderr')
    .map((c) => c.d)
    .join('')
    .replace(/\s+$/, '');
  if (text.length <= maxChars) return text;
  const cut = text.slice(-maxChars);
  const nl = cut.indexOf('\n');
  return nl >= 0 && nl < cut.length - 1 ? cut.slice(nl + 1) : cut;
}

/** The stored log of a session that has ended; null when none was stored. */
export function readSessionLog(store: Store, sessionId: string): Promise<SessionLogDoc | null> {
  return sessionLogsOf(store).findOne({ _id: sessionId });
}
