/** Bearer-token check shared by the HTTP routes and the WebSocket upgrade. */
import { createHash, timingSafeEqual } from 'node:crypto';

/** Constant-time check of an `Authorization: Bearer <token>` header. */
export function bearerMatchesHeader(header: string | undefined, token: string): boolean {
  const given = header?.startsWith('Bearer ') ? header.slice(7) : '';
  const a = createHash('sha256').update(given).digest();
  const b = createHash('sha256').update(token).digest();
  return timingSafeEqual(a, b) && given.length > 0;
}
