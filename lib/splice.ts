import type { Duplex } from 'node:stream';

/**
 * Joins two byte streams both ways (a proxied upgrade, a tunnel): what one reads the other writes,
 * and either one closing or failing ends both.
 */
export function splice(a: Duplex, b: Duplex): void {
  a.pipe(b);
  b.pipe(a);
  a.on('error', () => b.destroy());
  a.on('close', () => b.destroy());
  b.on('error', () => a.destroy());
  b.on('close', () => a.destroy());
}
